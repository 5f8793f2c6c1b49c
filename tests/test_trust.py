"""Issue 9 trust: Ed25519 peer identity, signed discovery records (validator and on read), signed payloads,
deltas only from peers with a signed record, and a re-sync that needs a quorum.

Fast: in-memory Gossip peers (tests/swarm_utils.memory_swarm) and hivemind's validator called directly.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import replace

import pytest
import torch
from swarm_utils import memory_round, memory_swarm, peer_identities

from swarmd.averaging.context import BLOCK
from swarmd.averaging.delta import encode
from swarmd.errors import ConfigError, SwarmdError, ValidationError
from swarmd.membership.dht import record_validator
from swarmd.membership.discovery import MemoryDiscovery, StaticDiscovery
from swarmd.membership.identity import Identity, peer_id_of, public_key_of, verify
from swarmd.membership.quorum import agreeing, quorum
from swarmd.membership.records import PeerRecord, block_key
from swarmd.membership.trust import is_valid, record_bytes, record_problem, sign_payload, sign_record, verify_payload
from swarmd.v1 import swarm_pb2 as pb

pytestmark = pytest.mark.usefixtures("one_thread")


# -- identity ---------------------------------------------------------------------------------------
def test_identity_is_created_once_with_0600_and_a_restart_keeps_the_peer_id(tmp_path):
    path = tmp_path / "ckpt" / "identity.key"
    first = Identity.load_or_create(path)
    assert path.stat().st_mode & 0o777 == 0o600
    again = Identity.load_or_create(path)
    assert again.peer_id == first.peer_id and first.peer_id.startswith("12D3KooW")
    assert public_key_of(first.peer_id) == first.public_key and peer_id_of(first.public_key) == first.peer_id
    sig = first.sign(b"hello")
    assert verify(first.peer_id, b"hello", sig) and not verify(first.peer_id, b"hellO", sig)
    assert not verify(Identity.generate().peer_id, b"hello", sig) and not verify("peer00", b"hello", sig)
    assert [p.name for p in path.parent.iterdir()] == ["identity.key"]  # no temporary file left


def test_a_corrupt_identity_file_is_a_one_line_error(tmp_path):
    path = tmp_path / "identity.key"
    path.write_bytes(b"not a key")
    os.chmod(path, 0o600)
    with pytest.raises(ConfigError) as err:
        Identity.load_or_create(path)
    assert "not a readable Ed25519 private key" in str(err.value) and "\n" not in str(err.value)


# -- records ------------------------------------------------------------------------------------------
def _record(identity: Identity, **kw) -> PeerRecord:
    base = PeerRecord(identity.peer_id, "h:1", 0, 3, 0.0, "c", "hash", False, "s", "emb")
    return replace(base, **kw)


def test_records_are_valid_only_signed_by_the_peer_they_name():
    me, other = Identity.generate(), Identity.generate()
    good = sign_record(_record(me), me, 30)
    assert record_problem(good) == "" and is_valid(good)
    assert PeerRecord.from_value(good.to_value()) == good  # the DHT round trip keeps it valid
    assert record_problem(PeerRecord.from_value(good.to_value())) == ""
    assert record_problem(_record(me)) == "unsigned"
    tampered = replace(good, round=1_000_000)
    assert "signature" in record_problem(tampered) and not is_valid(tampered)
    forged = replace(sign_record(_record(other), other, 30), peer_id=me.peer_id)  # other's key, my id
    assert record_problem(forged) and not is_valid(forged)
    with pytest.raises(ValueError):
        sign_record(_record(me), other, 30)  # nobody signs another peer's record
    assert record_problem(sign_record(_record(me), me, 30, now=time.time() - 3600)) == "expired"
    made_up = replace(good, peer_id="made-up-peer")
    assert record_problem(made_up).startswith("malformed")
    # the schema: wrong types and unknown fields do not parse
    assert PeerRecord.from_value({**good.to_value(), "round": "3"}) is None
    assert PeerRecord.from_value({**good.to_value(), "extra": 1}) is None
    assert PeerRecord.from_value("garbage") is None


def test_the_dht_validator_refuses_unsigned_forged_misplaced_and_schema_invalid_records():
    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import DHTRecord
    from hivemind.utils.serializer import MSGPackSerializer as M

    me, other = Identity.generate(), Identity.generate()
    validator = record_validator("s")
    key0, key_all = (DHTID.generate(source=block_key("s", b)).to_bytes() for b in (0, None))
    good = sign_record(_record(me), me, 30)

    def ok(rec_value, key=key0, subkey=me.peer_id, expiration=good.expires) -> bool:
        return validator.validate(DHTRecord(key, M.dumps(subkey), M.dumps(rec_value), expiration))

    assert ok(good.to_value()) and ok(good.to_value(), key=key_all)
    assert not ok(_record(me).to_value())  # unsigned
    assert not ok(replace(good, round=1_000_000).to_value())  # tampered
    assert not ok(replace(sign_record(_record(other), other, 30), peer_id=me.peer_id).to_value())  # forged
    assert not ok(good.to_value(), subkey=other.peer_id)  # under another peer's subkey
    assert not ok(good.to_value(), key=DHTID.generate(source=block_key("s", 1)).to_bytes())  # another block's key
    assert not ok(good.to_value(), expiration=good.expires + 3600)  # replayed to live longer than signed
    assert not ok({"peer_id": me.peer_id, "round": 1})  # schema
    assert validator.validate(DHTRecord(b"another app's key", b"x", b"\x01", 0.0))  # other keys pass untouched


def test_discovery_reads_drop_unsigned_and_forged_records():
    async def scenario():
        me, other = Identity.generate(), Identity.generate()
        board = {
            "good": sign_record(_record(me), me, 30),
            "unsigned": _record(other),
            "forged": replace(sign_record(_record(other), other, 30), round=1_000_000),
        }
        mem = await MemoryDiscovery(board).find_all()

        async def status(address):
            rec = board[address]
            return pb.PeerStatus(peer_id=rec.peer_id, swarm_id="s", signed_record=json.dumps(rec.to_value()))

        static = await StaticDiscovery(list(board), status, "s").find_all()
        return me, mem, static

    me, mem, static = asyncio.run(scenario())
    assert [r.peer_id for r in mem] == [me.peer_id] and [r.peer_id for r in static] == [me.peer_id]


# -- payloads -----------------------------------------------------------------------------------------
def _delta(identity: Identity, **header) -> object:
    hdr = dict(swarm_id="s", config_hash="c", kind="block_delta", block_index=0, round=1, peer_id=identity.peer_id)
    return encode({"w": torch.ones(4, 3)}, "fp32", **(hdr | header))


def test_payload_signatures_cover_the_header_and_the_bytes():
    me, other = Identity.generate(), Identity.generate()
    enc = sign_payload(_delta(me), me)
    verify_payload(enc)
    with pytest.raises(ValidationError, match="unsigned"):
        verify_payload(_delta(me))
    for change in (
        lambda e: setattr(e.header, "round", 2),
        lambda e: setattr(e.header, "base_hash", "x"),
        lambda e: setattr(e.header, "peer_id", other.peer_id),
        lambda e: setattr(e.header, "weight", 1000.0),
        lambda e: setattr(e, "_sha256", "0" * 64),  # other bytes (read_payload checked them against this digest)
    ):
        bad = sign_payload(_delta(me), me)
        change(bad)
        with pytest.raises(ValidationError):
            verify_payload(bad)
    with pytest.raises(ValueError):
        sign_payload(_delta(me), other)


def test_gossip_rejects_unsigned_tampered_and_recordless_deltas_before_decoding():
    async def scenario():
        peers, _, board = memory_swarm([0, 0], codec="fp32")
        a, b = peers

        def fit(identity, **h):  # a well-formed block delta for a's swarm, config and block, from `identity`
            zeros = {k: torch.zeros(v) for k, v in a.state.block_shapes().items()}
            hdr = dict(swarm_id=a.me.swarm_id, config_hash=a.me.config_hash, kind="block_delta", block_index=0)
            return encode(zeros, "fp32", peer_id=identity.peer_id, **hdr, **h)

        records = list(board.values())
        for g in peers:
            await g.open_round()
        a.remember(records)  # what average() does first
        await a.publish()
        rs = a.current
        h = dict(base_hash=rs.hashes[BLOCK], round=rs.round)
        garbage = sign_payload(fit(b.identity, **h), b.identity)
        garbage.payload = b"\x00" * len(garbage.payload)  # would fail to decode: signature checked first
        garbage._sha256 = ""
        stranger = Identity.generate()  # a valid signature, but no signed record in the swarm
        other_block, other_round = Identity.generate(), Identity.generate()  # signed records, but not for this
        a.remember([sign_record(replace(b.record(), peer_id=other_block.peer_id, block_index=1), other_block, 60)])
        a.remember([sign_record(replace(b.record(), peer_id=other_round.peer_id, round=7), other_round, 60)])
        cases = {
            "unsigned": fit(b.identity, **h),
            "tampered": garbage,
            "no record": sign_payload(fit(stranger, **h), stranger),
            "other block": sign_payload(fit(other_block, **h), other_block),
            "other round": sign_payload(fit(other_round, **h), other_round),
            "good": sign_payload(fit(b.identity, **h), b.identity),
        }
        errors = {}
        for name, enc in cases.items():
            try:
                await a.handle_exchange(enc)
            except SwarmdError as exc:
                errors[name] = str(exc)
        return errors, dict(a.current.inbox[BLOCK]), b.me.peer_id

    errors, inbox, b_id = asyncio.run(scenario())
    assert "unsigned" in errors["unsigned"]
    assert "signature" in errors["tampered"]
    assert "no signed record" in errors["no record"]
    assert "for block 1" in errors["other block"] and "for round 7" in errors["other round"]
    assert "good" not in errors and set(inbox) == {b_id}  # b's own signed delta, with its record: accepted


def test_a_peer_gets_one_delta_judged_per_round_and_a_rejected_one_does_not_hold_the_round():
    """A Byzantine peer whose delta is rejected re-syncs and sends again within the same round (the adversary
    benchmark logged ~2,100 rejections for 72 deltas): the repeat is refused before decoding, and the round
    does not wait for the rejected peer until its deadline."""

    async def scenario():
        peers, _, board = memory_swarm([0, 0, 0], codec="fp32", deadline_max_s=30.0)
        a, b, _c = peers
        for g in peers:
            await g.open_round()
        a.remember(list(board.values()))
        await a.publish()
        h = dict(base_hash=a.current.hashes[BLOCK], round=a.current.round)
        hdr = dict(swarm_id=a.me.swarm_id, config_hash=a.me.config_hash, kind="block_delta", block_index=0)
        huge = {k: torch.full(v, 1e3) for k, v in a.state.block_shapes().items()}
        zeros = {k: torch.zeros(v) for k, v in a.state.block_shapes().items()}
        errors = []
        for tensors in (huge, zeros, zeros):
            try:
                await a.handle_exchange(
                    sign_payload(encode(tensors, "fp32", peer_id=b.me.peer_id, **hdr, **h), b.identity)
                )
            except SwarmdError as exc:
                errors.append(str(exc))
        failed = set(a.current.failed[BLOCK])  # judged: average() no longer waits for b's block delta
        return errors, failed, dict(a.current.inbox[BLOCK]), b.me.peer_id, a.metrics.rejected_by_reason

    errors, failed, inbox, b_id, reasons = asyncio.run(scenario())
    assert "exceeds the bound" in errors[0] and all("already judged" in e for e in errors[1:]) and len(errors) == 3
    assert b_id in failed and b_id not in inbox
    assert reasons.get("invalid") == 1 and reasons.get("stale_round") == 2


def test_a_delta_of_a_past_round_is_refused_and_the_round_does_not_wait_for_its_sender():
    """A replayed (or lagging) signed delta of an earlier round: StaleRound, and its sender counts as judged for
    this round (the adversary benchmark's replaying peer held the peer it dialled at the 10 s deadline every
    round); a delta of this round that the sender still sends before the round closes is merged all the same."""

    async def scenario():
        peers, _, board = memory_swarm([0, 0, 0], codec="fp32", deadline_max_s=30.0)
        a, b, _c = peers
        await memory_round(peers, board)  # round 0 done: every peer is at round 1
        for g in peers:
            await g.open_round()
        a.remember(list(board.values()))
        await a.publish()
        hdr = dict(swarm_id=a.me.swarm_id, config_hash=a.me.config_hash, kind="block_delta", block_index=0)
        zeros = {k: torch.zeros(v) for k, v in a.state.block_shapes().items()}
        old = sign_payload(encode(zeros, "fp32", peer_id=b.me.peer_id, base_hash="0" * 16, round=0, **hdr), b.identity)
        with pytest.raises(SwarmdError, match="delta of round 0, ours is 1"):
            await a.handle_exchange(old)
        judged = b.me.peer_id in a.current.failed[BLOCK]
        now = dict(base_hash=a.current.hashes[BLOCK], round=a.current.round)
        await a.handle_exchange(sign_payload(encode(zeros, "fp32", peer_id=b.me.peer_id, **hdr, **now), b.identity))
        return judged, set(a.current.inbox[BLOCK]), b.me.peer_id

    judged, inbox, b_id = asyncio.run(scenario())
    assert judged and inbox == {b_id}


# -- re-sync ------------------------------------------------------------------------------------------
def test_quorum_rule():
    assert [quorum(n) for n in range(6)] == [1, 1, 2, 2, 3, 3]
    ids = peer_identities(4)
    recs = [sign_record(_record(i, round=5, base_hash="h"), i, 30) for i in ids[:3]]
    liar = sign_record(_record(ids[3], round=1_000_000, base_hash="evil"), ids[3], 30)
    assert {r.peer_id for r in agreeing([*recs, liar])} == {r.peer_id for r in recs}


def test_resync_refuses_one_record_claiming_round_a_million_and_follows_a_quorum():
    async def scenario():
        peers, _, board = memory_swarm([0, 0, 0, 0], codec="fp32")
        await memory_round(peers, board)
        a, b, _c, liar = peers
        # the liar announces round 1,000,000 with weights nobody else holds (its own record, validly signed)
        evil = {k: v + 1.0 for k, v in liar.state.base_block.items()}
        liar.state.adopt(evil, None, 1_000_000)
        board[liar.me.peer_id] = liar.record()
        refused = await a.sync(list(board.values()))
        round_after_refusal, hash_after_refusal = a.state.round, a.state.block_hash
        # b and c move on two rounds without a: a quorum (2 of the 3 others) announces their state
        for _ in range(2):
            await memory_round(peers, board, skip={0, 3})
        adopted = await a.sync(list(board.values()))
        return refused, round_after_refusal, hash_after_refusal, adopted, a, b, liar

    refused, round1, hash1, adopted, a, b, liar = asyncio.run(scenario())
    assert refused == [] and round1 == 1 and hash1 != liar.state.block_hash
    assert "block" in adopted and a.state.round == b.state.round == 3 and a.state.block_hash == b.state.block_hash


def test_resync_caps_the_round_jump_and_checks_the_pulled_state_against_the_records():
    async def scenario():
        peers, _, board = memory_swarm([0, 0, 0], codec="fp32")
        a, b, c = peers
        ahead = {k: v + 0.5 for k, v in b.state.base_block.items()}
        for g in (b, c):  # b and c agree on a state far ahead
            g.state.adopt(ahead, None, 5000)
            board[g.me.peer_id] = g.record()
        a.cfg = replace(a.cfg, max_round_jump=100)
        pulled = await a.sync(list(board.values()))
        capped, adopted_hash = a.state.round, a.state.block_hash
        announced = board[c.me.peer_id]
        errors = []
        # c moved on since its record: its state carries another hash than announced -> refused
        c.state.adopt({k: v + 0.25 for k, v in ahead.items()}, None, 5000)
        # ... and a c that claims the announced hash in its (signed) header but serves other weights: refused too
        for lie in (False, True):
            if lie:
                c.state.block_hash = announced.base_hash
            try:
                await a.agreement.pull(announced, BLOCK.state, (announced.base_hash, announced.round))
            except SwarmdError as exc:
                errors.append(str(exc))
        return pulled, capped, adopted_hash, b.state.block_hash, errors, a.state.block_hash

    pulled, capped, adopted_hash, b_hash, errors, final_hash = asyncio.run(scenario())
    assert "block" in pulled and capped == 100 and adopted_hash == b_hash
    assert len(errors) == 2 and "records announce" in errors[0] and "hashes to" in errors[1]
    assert final_hash == adopted_hash  # nothing was adopted from the liar


def test_a_sybil_of_ten_made_up_peers_without_signed_records_has_no_effect():
    async def scenario():
        (a,), _, board = memory_swarm([0], codec="fp32")
        sybils, forger = [Identity.generate() for _ in range(10)], Identity.generate()
        for i, s in enumerate(sybils):  # records claiming block 0 at round 1,000,000: unsigned, or forged
            fake = _record(s, round=1_000_000, base_hash="evil", swarm_id="test", config_hash=a.me.config_hash)
            forged = replace(sign_record(replace(fake, peer_id=forger.peer_id), forger, 60), peer_id=s.peer_id)
            board[s.peer_id] = fake if i % 2 else forged
        before = (a.state.round, a.state.block_hash)
        pulled = await a.sync(list(board.values()))
        await a.open_round()
        a.remember(list(board.values()))
        await a.publish()
        h = dict(base_hash=a.current.hashes[BLOCK], round=a.current.round)
        zeros = {k: torch.zeros(v) for k, v in a.state.block_shapes().items()}
        hdr = dict(swarm_id=a.me.swarm_id, config_hash=a.me.config_hash, kind="block_delta", block_index=0)
        refused = 0
        for s in sybils:  # each delta is validly signed by its made-up peer, which has no valid record
            try:
                await a.handle_exchange(sign_payload(encode(zeros, "fp32", peer_id=s.peer_id, **hdr, **h), s))
            except SwarmdError:
                refused += 1
        report = await a.average(list(board.values()))
        return before, pulled, refused, report

    before, pulled, refused, report = asyncio.run(scenario())
    assert pulled == [] and refused == 10
    assert report.expected_block == [] and report.accepted_block == [] and report.accepted_emb == []
    assert before[0] == 0


def test_a_lone_signed_stranger_in_a_block_is_not_adopted_against_the_swarms_round():
    """The only other peer of our block is a stranger with its own valid signed record at round 1,000,000; the
    other blocks' peers announce round 1: no adoption. A real lone block peer at the swarm's round is adopted."""

    async def scenario():
        peers, _, board = memory_swarm([0, 0, 1, 1], codec="fp32")
        await memory_round(peers, board)
        a, liar = peers[:2]
        evil = {k: v + 1.0 for k, v in liar.state.base_block.items()}
        liar.state.adopt(evil, None, 1_000_000)
        board[liar.me.peer_id] = liar.record()
        evil_hash = liar.state.block_hash
        refused = await a.sync(list(board.values()))
        hash_after, round_after = a.state.block_hash, a.state.round
        # now a legitimate case: the block-0 partner trained a round more, and so did blocks 1's peers
        liar.state.adopt({k: v - 1.0 for k, v in evil.items()}, None, 1)
        board[liar.me.peer_id] = liar.record()
        await memory_round(peers, board, skip={0})
        adopted = await a.sync(list(board.values()))
        return refused, hash_after, round_after, evil_hash, adopted, a, liar

    refused, hash_after, round_after, evil_hash, adopted, a, partner = asyncio.run(scenario())
    assert "block" not in refused and hash_after != evil_hash and round_after == 1
    assert "block" in adopted and a.state.block_hash == partner.state.block_hash and a.state.round == 2


def test_another_blocks_state_is_pulled_from_the_weights_most_records_share_first():
    from swarmd.node.peers import pull_order

    def rec(pid: str, block: int, rnd: int, base: str, address: str = "h:1") -> PeerRecord:
        return PeerRecord(pid, address, block, rnd, 0.0, "c", base, False, "s", "emb")

    records = [
        rec("z-liar", 1, 1_000_000, "forged"),  # a lone peer at a far higher round: asked last
        rec("b", 1, 7, "majority"),
        rec("a", 1, 7, "majority"),
        rec("c", 1, 6, "old"),
        rec("d", 1, 6, "old"),
        rec("e", 1, 8, "majority"),
        rec("f", 0, 9, "majority"),  # another block
        rec("g", 1, 9, "majority", address=""),  # client mode: nobody can dial it
    ]
    assert [r.peer_id for r in pull_order(records, 1)] == ["e", "a", "b", "c", "d", "z-liar"]


def test_a_delta_needs_its_senders_signed_record_of_about_its_round():
    """A delta of round r is accepted with its sender's signed record of round r - 1, r or r + 1: a record lags its
    owner by up to a merge, and a sender whose receivers were idle merges at once and announces round r + 1 before
    a receiver still in round r looks it up (the copy task's sequential swarm refused every other round's table
    step that way). Records further off, or of another block, are refused."""
    (a, b), _, _ = memory_swarm([0, 0])
    hdr = pb.PayloadHeader(peer_id=b.me.peer_id, round=5)
    assert "no signed record" in a.sender_problem(hdr, BLOCK)
    for rec_round, ok in ((3, False), (4, True), (5, True), (6, True), (7, False)):
        a.known.clear()
        a.remember([sign_record(replace(b.me, round=rec_round), b.identity, 30)])
        problem = a.sender_problem(hdr, BLOCK)
        assert (problem == "") == ok, (rec_round, problem)
        if not ok:
            assert f"is for round {rec_round}, its delta for round 5" in problem
    a.known.clear()
    a.remember([sign_record(replace(b.me, round=5, block_index=1), b.identity, 30)])
    assert "is for block 1" in a.sender_problem(hdr, BLOCK)


def test_a_training_window_is_signed_read_back_and_absent_while_zero():
    """PeerRecord.train_first/train_last (a pipelined peer's rounds): signed like every field, parsed back, left out of
    the value and the signed bytes while 0 (a record of a peer before them verifies as it did); a window out of range
    does not parse."""
    me = Identity.generate()
    plain = sign_record(_record(me), me, 30)
    assert "train_first" not in plain.to_value() and b"train_first" not in record_bytes(plain)
    assert plain.trains(1) and plain.trains(10_000)  # (0, 0): every round
    windowed = sign_record(_record(me, train_first=5, train_last=8), me, 30)
    parsed = PeerRecord.from_value(windowed.to_value())
    assert parsed == windowed and is_valid(parsed)
    assert [parsed.trains(r) for r in (4, 5, 8, 9)] == [False, True, True, False]
    assert not is_valid(replace(windowed, train_last=9))  # tampered
    assert PeerRecord.from_value({**windowed.to_value(), "train_first": -1}) is None
    assert PeerRecord.from_value({**windowed.to_value(), "train_last": True}) is None
