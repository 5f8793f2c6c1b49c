"""Gossip rounds in memory: merge math, validation rejects, deadlines, client mode, re-sync.

Peers are real Gossip + BlockState objects on a tiny model; the transport is an in-process
stand-in with PeerClient's semantics (tests/swarm_utils.MemoryTransport), so no sockets here.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest
import torch
from swarm_utils import memory_round, memory_swarm

from swarmd.averaging.config import GossipConfig
from swarmd.averaging.context import BLOCK, EMB
from swarmd.averaging.deadline import DeadlinePolicy
from swarmd.averaging.delta import ErrorFeedback, encode
from swarmd.averaging.exchange import dials
from swarmd.averaging.merge import merge_mean
from swarmd.averaging.sketch import count_sketch, sketch_distance
from swarmd.averaging.state import relative_distance, weights_hash
from swarmd.errors import NotReady, SwarmdError
from swarmd.membership.identity import Identity
from swarmd.membership.quorum import rank, reference
from swarmd.membership.records import PeerRecord
from swarmd.membership.trust import sign_payload, sign_record
from swarmd.protocol import PayloadKind
from swarmd.transport.framing import Encoded
from swarmd.transport.server import ANSWER_MARGIN_S, answer_by

pytestmark = pytest.mark.usefixtures("one_thread")


def rand(seed: int, shapes=(("w", (4, 3)), ("b", (3,)))) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(s, generator=g) for k, s in shapes}


# -- pure functions ---------------------------------------------------------------------------
def test_merge_mean_is_the_uniform_mean_in_any_insertion_order():
    deltas = {f"p{i}": rand(i) for i in range(4)}
    expected = {k: torch.stack([d[k] for d in deltas.values()]).mean(0) for k in ("w", "b")}
    forward = merge_mean(deltas)
    backward = merge_mean(dict(reversed(list(deltas.items()))))
    for k in expected:
        assert torch.allclose(forward[k], expected[k], atol=1e-6)
        assert torch.equal(forward[k], backward[k])  # fixed summation order: same bits everywhere
    with pytest.raises(ValueError):
        merge_mean({})


def test_merge_preserves_the_mean_of_the_replicas():
    base = rand(10)
    live = [{k: base[k] + d[k] for k in base} for d in (rand(1), rand(2), rand(3))]
    deltas = {f"p{i}": {k: live[i][k] - base[k] for k in base} for i in range(3)}
    merged = {k: base[k] + v for k, v in merge_mean(deltas).items()}
    for k in base:
        assert torch.allclose(merged[k], torch.stack([x[k] for x in live]).mean(0), atol=1e-6)


def test_dial_rule_exactly_one_side_dials_and_client_mode_always_dials():
    a = PeerRecord("a", "h:1", 0, 0, 0, "c", "", False, "s")
    b = PeerRecord("b", "h:2", 0, 0, 0, "c", "", False, "s")
    c = PeerRecord("c", "", 0, 0, 0, "c", "", True, "s")
    assert dials(a, b) and not dials(b, a)
    assert dials(c, a) and dials(c, b) and not dials(a, c) and not dials(b, c)


def test_reference_is_highest_round_then_server_then_peer_id():
    me = PeerRecord("m", "h:1", 0, 3, 0, "c", "x", False, "s")
    higher_round = PeerRecord("a", "h:2", 0, 4, 0, "c", "y", False, "s")
    same_round_bigger_id = PeerRecord("z", "h:3", 0, 3, 0, "c", "y", False, "s")
    client = PeerRecord("zz", "", 0, 3, 0, "c", "y", True, "s")
    assert reference(me, [same_round_bigger_id, client]).peer_id == "z"
    assert reference(me, [same_round_bigger_id, higher_round]).peer_id == "a"
    assert reference(me, [client]).peer_id == "m"  # nobody can pull from a client-mode peer
    assert rank(me) < rank(same_round_bigger_id)
    # a lone diverged peer with the highest id does not impose its weights on the majority
    a = PeerRecord("a", "h:4", 0, 3, 0, "c", "y", False, "s")
    b = PeerRecord("b", "h:5", 0, 3, 0, "c", "y", False, "s")
    loner = PeerRecord("zz9", "h:6", 0, 3, 0, "c", "x", False, "s")
    assert reference(a, [b, loner]).peer_id == "a" and reference(b, [a, loner]).peer_id == "b"
    assert reference(loner, [a, b]).peer_id == "b"


def test_deadline_follows_arrival_lag_within_bounds():
    cfg = GossipConfig(deadline_min_s=1.0, deadline_max_s=10.0, deadline_factor=3.0)
    policy = DeadlinePolicy(cfg)
    assert policy.deadline_s() == 10.0  # nothing measured yet: the upper bound
    policy.observe(0.01)
    assert policy.deadline_s() == 1.0
    for _ in range(30):
        policy.observe(2.0)
    assert 5.5 < policy.deadline_s() <= 6.0
    for _ in range(30):
        policy.observe(100.0)
    assert policy.deadline_s() == 10.0
    # a peer that was the slowest (lag ~0) still waits for the others' training when it is fast
    swapped = DeadlinePolicy(cfg)
    for _ in range(30):
        swapped.observe(0.0, round_s=6.0)  # rounds took 6 s from start to the last arrival
    assert swapped.deadline_s(ready_after_open_s=1.0) == pytest.approx(8.0)  # 1.5 x 6 - 1
    assert swapped.deadline_s(ready_after_open_s=9.0) == 1.0  # slowest this time: the floor


def test_count_sketch_estimates_relative_distance():
    a = {"w": torch.randn(20000)}
    b = {"w": a["w"] + 0.1 * torch.randn(20000)}
    exact = relative_distance(a, b)
    est = sketch_distance(count_sketch(a), count_sketch(b), float(a["w"].norm()))
    assert abs(est - exact) / exact < 0.35
    assert sketch_distance(count_sketch(a), count_sketch(a), 1.0) == 0.0


# -- rounds in memory -------------------------------------------------------------------------
def test_same_block_replicas_end_bit_identical_and_embedding_is_averaged_over_all_blocks():
    async def scenario():
        peers, _, board = memory_swarm([0, 0, 1], codec="fp32", merge="mean")  # robust merge: tests/test_robust.py
        base_emb = peers[0].state.base_emb["table"].clone()
        base_block = peers[0].state.base_block
        base_block = {k: v.clone() for k, v in base_block.items()}
        for g in peers:
            await g.open_round()
        for i, g in enumerate(peers):
            from swarm_utils import batches

            await asyncio.to_thread(g.state.train_steps, 2, batches(i))
        live = [await asyncio.to_thread(g.state.current) for g in peers]
        reports = await asyncio.gather(*(g.average(list(board.values())) for g in peers))
        return peers, live, reports, base_emb, base_block

    peers, live, reports, _base_emb, base_block = asyncio.run(scenario())
    a, b, c = peers
    assert all(r.participation == 1.0 for r in reports)
    # block 0: both replicas hold base + mean(delta_a, delta_b), bit for bit
    for k in a.state.base_block:
        assert torch.equal(a.state.base_block[k], b.state.base_block[k])
    mean_live = {k: (live[0][0][k] + live[1][0][k]) / 2 for k in base_block}
    assert relative_distance(a.state.base_block, mean_live) < 1e-6  # fp32 codec == direct average
    assert reports[0].premerge_distance > 0  # replicas drifted apart during local steps ...
    assert relative_distance(a.state.base_block, b.state.base_block) == 0.0  # ... and agree after the merge
    # the byte table: every peer of every block holds base + mean of all three deltas
    mean_table = torch.stack([x[1]["table"] for x in live]).mean(0)
    for g in peers:
        assert torch.equal(g.state.base_emb["table"], a.state.base_emb["table"])
        assert torch.allclose(g.state.base_emb["table"], mean_table, atol=1e-6)
    assert c.state.block_hash != a.state.block_hash and a.state.round == b.state.round == c.state.round == 1


@pytest.mark.parametrize("codec", ["bf16", "int8"])
def test_lossy_codecs_still_give_identical_replicas(codec):
    async def scenario():
        peers, _, board = memory_swarm([0, 0], codec=codec)
        for _ in range(2):
            await memory_round(peers, board)
        return peers

    a, b = asyncio.run(scenario())
    assert a.state.block_hash == b.state.block_hash and a.state.emb_hash == b.state.emb_hash
    assert a.metrics.raw_bytes_sent > 0 and a.metrics.bytes_sent < a.metrics.raw_bytes_sent


INTRUDER = Identity.generate(bytes([99]) * 32)  # signs its deltas and holds a signed record: the schema is what fails


def _tampered(g, kind=BLOCK, signer: Identity = INTRUDER, **override) -> Encoded:
    rs = g.current
    hdr = dict(
        swarm_id=g.me.swarm_id,
        config_hash=g.me.config_hash,
        kind=kind,
        block_index=g.me.block_index if kind == BLOCK else -1,
        round=rs.round,
        base_hash=rs.hashes[kind],
        peer_id=signer.peer_id,
    )
    tensors = {
        k: torch.zeros(v) for k, v in (g.state.block_shapes() if kind == BLOCK else g.state.emb_shapes()).items()
    }
    shapes_override = override.pop("tensors", None)
    hdr.update(override)
    return sign_payload(encode(shapes_override or tensors, "fp32", **hdr), signer)


def test_bad_deltas_are_rejected_and_leave_theta_bit_identical():
    async def scenario():
        peers, _, _board = memory_swarm([0], codec="fp32")
        (g,) = peers
        await g.open_round()
        await g.publish()
        # one signer per bad payload: a peer gets one delta per round and kind judged, each must fail on its own check
        signers = [INTRUDER, *(Identity.generate(bytes([90 + i]) * 32) for i in range(6))]
        g.remember([sign_record(replace(g.record(), peer_id=s.peer_id, address="mem:x"), s, 300) for s in signers])
        before = (weights_hash(g.state.current()[0]), weights_hash(g.state.current()[1]))
        good_shapes = g.state.block_shapes()
        bad = [
            _tampered(g, config_hash="other", signer=signers[0]),
            _tampered(g, swarm_id="other-swarm", signer=signers[1]),
            _tampered(g, round=7, signer=signers[2]),
            _tampered(g, base_hash="not-our-base", signer=signers[3]),
            _tampered(g, tensors={k: torch.zeros((*tuple(s), 1)) for k, s in good_shapes.items()}, signer=signers[4]),
            _tampered(g, kind=BLOCK, block_index=1, signer=signers[5]),
        ]
        nan = _tampered(g, signer=signers[6])
        nan.payload = encode(
            {k: torch.zeros(s) for k, s in good_shapes.items()},
            "fp32",
            zstd=False,
            kind=PayloadKind.from_pb(nan.header.kind),
            **{
                f: getattr(nan.header, f)
                for f in ("swarm_id", "config_hash", "block_index", "round", "base_hash", "peer_id")
            },
        ).payload
        nan.header.zstd = False
        nan.payload = bytes(nan.payload[:-4]) + bytes.fromhex("0000c07f")  # last float := NaN
        nan.header.payload_bytes = len(nan.payload)
        nan._sha256 = ""
        bad.append(sign_payload(nan, signers[6]))
        errors = []
        for enc in bad:
            try:
                await g.handle_exchange(enc)
            except SwarmdError as exc:
                errors.append(type(exc).__name__)
        after = (weights_hash(g.state.current()[0]), weights_hash(g.state.current()[1]))
        inbox = {k: dict(v) for k, v in g.current.inbox.items()}
        report = await g.average([])
        return before, after, errors, inbox, g, report

    before, after, errors, inbox, g, report = asyncio.run(scenario())
    assert len(errors) >= 6, errors  # the base-mismatch one is answered (so the caller can re-sync) but not stashed
    assert before == after
    assert inbox == {BLOCK: {}, EMB: {}}
    assert g.metrics.rejected >= 7
    assert report.accepted_block == [] and report.accepted_emb == []


def test_a_dead_peer_costs_its_contribution_not_the_round():
    async def scenario():
        peers, transport, board = memory_swarm([0, 0, 0, 1], codec="int8", deadline_max_s=1.5)
        transport.dead.add(peers[3].me.address)  # dies before the round: calls to it fail fast
        # peer02 (index 2) is alive in the records but never trains or dials (hangs)
        start = time.monotonic()
        reports = await memory_round(peers, board, skip={2, 3})
        merged = [g.metrics.round_history[-1]["merged_block"] for g in peers[:2]]
        return reports, time.monotonic() - start, merged, [g.me.peer_id for g in peers]

    reports, seconds, merged, ids = asyncio.run(scenario())
    assert seconds < 1.5 + 2.0  # the deadline bounds the round
    a, b = reports
    assert a.accepted_block == [ids[1]] and b.accepted_block == [ids[0]]
    assert merged == [sorted(ids[:2])] * 2  # the round history names whose block deltas each merge took (own too)
    assert a.participation < 1.0 and b.participation < 1.0


def test_a_caller_one_round_ahead_is_not_waited_for_in_our_round():
    # it closed our round before it dialled us with the next: nothing more of ours comes from it, and waiting for it
    # to the deadline would keep both peers' rounds at the deadline from then on (each late for the other's)
    async def scenario():
        peers, _, _ = memory_swarm([0], codec="fp32", deadline_max_s=30.0)
        (g,) = peers
        await g.open_round()
        await g.publish()
        ahead = Identity.generate(bytes([77]) * 32)
        g.remember([sign_record(replace(g.record(), peer_id=ahead.peer_id, address="mem:x"), ahead, 300)])
        rs, expected = g.current, {BLOCK: {ahead.peer_id}, EMB: set()}
        assert not rs.complete(expected)
        call = asyncio.create_task(g.handle_exchange(_tampered(g, round=rs.round + 1, signer=ahead)))
        await asyncio.wait_for(rs.collect(expected, time.monotonic() + 30.0), 5.0)  # ends at once, not at 30 s
        judged = set(rs.failed[BLOCK])
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        return judged, ahead.peer_id

    judged, ahead_id = asyncio.run(scenario())
    assert judged == {ahead_id}


def test_a_delta_whose_sender_stops_waiting_before_our_answer_reaches_it_is_merged_on_neither_side():
    # soak logs: a callee that answered after its caller's deadline merged the caller's delta, while the caller merged
    # nothing of the callee's: two states out of one round, a split that took rounds to heal
    async def scenario():
        peers, _, _ = memory_swarm([0], codec="fp32", deadline_max_s=30.0)
        (g,) = peers
        await g.open_round()
        await g.publish()
        late, in_time = Identity.generate(bytes([78]) * 32), Identity.generate(bytes([79]) * 32)
        g.remember(
            [sign_record(replace(g.record(), peer_id=i.peer_id, address="mem:x"), i, 300) for i in (late, in_time)]
        )
        too_late = _tampered(g, signer=late)
        too_late.answer_by = time.monotonic() - 0.01
        with pytest.raises(NotReady, match="after its deadline"):
            await g.handle_exchange(too_late)
        ok = _tampered(g, signer=in_time)
        ok.answer_by = time.monotonic() + 5.0
        reply = await g.handle_exchange(ok)
        return set(g.current.inbox[BLOCK]), reply.header.peer_id, g.me.peer_id, in_time.peer_id

    inbox, replied_by, me, in_time_id = asyncio.run(scenario())
    assert inbox == {in_time_id} and replied_by == me


def test_an_answer_is_due_before_the_callers_deadline_by_its_payloads_arrival_or_the_margin():
    now = time.monotonic()
    assert answer_by(None, 0.1) is None  # a caller without a deadline
    assert abs(answer_by(5.0, 0.01) - (now + 5.0 - ANSWER_MARGIN_S)) < 0.5
    assert abs(answer_by(5.0, 2.0) - (now + 3.0)) < 0.5


def test_the_server_tells_the_handler_when_its_callers_deadline_leaves_no_time_for_an_answer():
    """Over real gRPC: the handler sees answer_by from the caller's own call timeout."""
    from swarmd.transport import PeerClient, start_server

    seen: list[float | None] = []

    class Handler:
        async def exchange(self, incoming):
            seen.append(incoming.answer_by)
            return incoming

    async def main():
        server = await start_server(Handler())
        client = PeerClient()
        try:
            enc = encode(
                {"w": torch.zeros(4)}, "fp32", swarm_id="s", config_hash="c", kind=BLOCK, block_index=0, round=1
            )
            sent = time.monotonic()
            await client.exchange(server.address, enc, timeout_s=4.0)
            return sent
        finally:
            await client.close()
            await server.stop(0)

    sent = asyncio.run(main())
    assert len(seen) == 1 and seen[0] is not None
    assert sent + 4.0 - 1.5 < seen[0] < sent + 4.0 - ANSWER_MARGIN_S + 0.05


def test_client_mode_peer_dials_out_and_is_averaged():
    async def scenario():
        peers, _, board = memory_swarm([0, 0, 1], codec="fp32", client_mode={1})
        reports = await memory_round(peers, board)
        return peers, reports

    peers, reports = asyncio.run(scenario())
    a, client, _c = peers
    assert client.me.address == ""
    assert a.state.block_hash == client.state.block_hash
    assert all(r.participation == 1.0 for r in reports)


def test_a_diverged_replica_re_syncs_from_the_reference():
    async def scenario():
        peers, _, board = memory_swarm([0, 0, 1], codec="fp32")
        await memory_round(peers, board)
        lagging = peers[0]
        await memory_round(peers, board, skip={0})  # peer00 misses a round: behind by one
        assert lagging.state.round == 1 and peers[1].state.round == 2
        pulled = await lagging.sync(list(board.values()))
        return peers, pulled

    peers, pulled = asyncio.run(scenario())
    a, b, c = peers
    assert pulled == ["block", "embedding"]
    assert a.state.block_hash == b.state.block_hash and a.state.emb_hash == c.state.emb_hash and a.state.round == 2


def test_error_feedback_int8_tracks_the_true_sum():
    ef, plain = ErrorFeedback(), ErrorFeedback()
    hdr = dict(swarm_id="s", config_hash="c", kind="block_delta", block_index=0)
    total_true, total_ef, total_plain, first = torch.zeros(64, 8), torch.zeros(64, 8), torch.zeros(64, 8), None
    for i in range(40):
        d = rand(100 + i, (("w", (64, 8)),))["w"] * 1e-3
        total_true += d
        total_ef += ef.compress({"w": d}, "int8", **hdr)[1]["w"]
        plain.reset()
        total_plain += plain.compress({"w": d}, "int8", **hdr)[1]["w"]
        first = first if first is not None else (total_true - total_ef).norm()
    # with error feedback the gap stays at one step's quantisation error; without it, it grows
    assert (total_true - total_ef).norm() < 2 * first
    assert (total_true - total_ef).norm() < 0.5 * (total_true - total_plain).norm()


def test_replicas_on_different_bases_converge_even_with_stale_records():
    async def scenario():
        peers, _, _board = memory_swarm([0, 0], codec="fp32")
        a, b = peers
        bumped = {k: v + 0.01 for k, v in a.state.base_block.items()}
        a.state.adopt(bumped, None)  # a's block diverged, but the (lagging) DHT says b holds a's hash
        stale = {  # b signed a record naming a's hash (the DHT still holds it)
            a.me.peer_id: a.record(),
            b.me.peer_id: sign_record(replace(a.record(), peer_id=b.me.peer_id, address=b.me.address), b.identity, 300),
        }
        reports = []
        for _ in range(2):
            records = list(stale.values())
            for g in peers:
                await g.sync(records)
                await g.open_round()
            for i, g in enumerate(peers):
                from swarm_utils import batches

                await asyncio.to_thread(g.state.train_steps, 2, batches(i))
            reports.append(await asyncio.gather(*(g.average(records) for g in peers)))
        return a, b, reports

    a, b, reports = asyncio.run(scenario())
    assert [r.accepted_block for r in reports[0]] == [[], []]  # round 1: each rejects the other's block delta
    assert reports[1][0].accepted_block == [b.me.peer_id] and reports[1][1].accepted_block == [
        a.me.peer_id
    ]  # the lower id adopted, then they averaged
    assert a.state.block_hash == b.state.block_hash
