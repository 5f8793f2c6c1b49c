"""Verified inference (issue 21 item 3): liars among the replicas of a block are caught, dropped and routed around.

Every test runs real gRPC servers on 127.0.0.1 ephemeral ports (BlockServing behind ServingOnlyHandler, as
tests/test_serving.py's start_hosts) and a real RemoteSweeper; a lying replica is a BlockServing subclass
defined here (never in shipped code) whose Forward answers are changed after the honest math.
"""

import asyncio
import json
import random

import pytest
import torch

from swarmd.errors import ValidationError
from swarmd.serve.inference import LocalSweeper, generate_bytes, score_windows
from swarmd.serve.remote import BlockRouter, RemoteSweeper
from swarmd.serve.serving import BlockServing, ServingOnlyHandler
from swarmd.serve.verify import DEFAULT_SHARE, Answer, Hop, VerifyPolicy, divergence, judge, out_of_range
from swarmd.v1 import swarm_pb2 as pb
from swarmd.wire import from_proto, to_proto
from tests.test_inference import CFG, text_windows, tiny_model


class LyingServing(BlockServing):
    """A replica that answers Forward with garbage, a small bias, or non-finite values.

    :param lie: "garbage" (random z of the honest scale), "bias" (z + bias on every element), "nan", "huge"
    :param honest_first: answers this many hops honestly before it starts lying
    """

    def __init__(self, *args, lie: str, bias: float = 0.05, honest_first: int = 0, **kw):
        super().__init__(*args, **kw)
        self.lie, self.bias, self.honest_first, self.answered = lie, bias, honest_first, 0

    async def forward(self, request: pb.ForwardRequest) -> pb.ForwardReply:
        reply = await super().forward(request)
        if request.end_session:
            return reply
        self.answered += 1
        if self.answered <= self.honest_first:
            return reply
        field = reply.logits if request.final else reply.z
        t = from_proto(field).clone()
        if self.lie == "garbage":
            t = 4.0 * torch.randn(t.shape, generator=torch.Generator().manual_seed(self.answered))
        elif self.lie == "plausible":  # z' = r z + (1 - r) D for random D in the unit ball: passes the range checks
            r = request.sigma_next / request.sigma
            d = torch.randn(t.shape, generator=torch.Generator().manual_seed(self.answered))
            d = 0.5 * d / d.norm(dim=-1, keepdim=True)
            t = t if request.final else r * from_proto(request.z) + (1 - r) * d
        elif self.lie == "bias":
            t = t + self.bias
        elif self.lie == "nan":
            t[..., 0] = float("nan")
        elif self.lie == "huge":
            t = t * 1e3
        field.CopyFrom(to_proto(t.contiguous()))
        return reply


class BasedHandler(ServingOnlyHandler):
    """An inference-only peer whose status names the base it serves (as a training daemon's record does)."""

    def __init__(self, serving, base_hash: str, **kw):
        super().__init__(serving, **kw)
        self.base_hash = base_hash

    def status(self) -> pb.PeerStatus:
        st = super().status()
        st.base_hash = self.base_hash
        return st


class SignedHandler(ServingOnlyHandler):
    """An inference peer with an Ed25519 identity, as a training daemon is: its status carries a signed record
    announcing the base_hash / emb_hash of the weights it serves, and it answers PullState with them, fp32 and
    signed (what swarmd.averaging.pulls.StatePulls.state_payload sends), so a client can break a tie by
    recomputation.

    :param served: the block state PullState sends instead (a liar serving weights it does not announce)
    :param serve_state: False: PullState is refused (NotFound), as an inference-only peer refuses it
    """

    def __init__(self, serving, block_state, table, served=None, serve_state=True, seed=0, **kw):
        from swarmd.averaging.state import weights_hash
        from swarmd.membership.identity import Identity

        super().__init__(serving, **kw)
        self.identity = Identity.generate(bytes([seed + 1]) * 32)
        self.peer_id = self.identity.peer_id
        self.block_state = block_state if served is None else served
        self.emb_state = {"table": table.detach().clone()}
        self.base_hash, self.emb_hash = weights_hash(block_state), weights_hash(self.emb_state)
        self.serve_state, self.pulls = serve_state, 0

    def status(self) -> pb.PeerStatus:
        from swarmd.membership.records import PeerRecord
        from swarmd.membership.trust import sign_record

        st = super().status()
        st.base_hash, st.emb_hash = self.base_hash, self.emb_hash
        record = PeerRecord(
            self.peer_id,
            self.address,
            st.block_index,
            0,
            0.0,
            st.config_hash,
            self.base_hash,
            False,
            st.swarm_id,
            self.emb_hash,
        )
        st.signed_record = json.dumps(sign_record(record, self.identity, 60.0).to_value())
        return st

    async def pull_state(self, request: pb.PullStateRequest):
        from swarmd.averaging.delta import encode
        from swarmd.errors import NotFound
        from swarmd.membership.trust import sign_payload
        from swarmd.protocol import Codec, PayloadKind

        self.pulls += 1
        if not self.serve_state:
            raise NotFound("this peer serves inference only")
        block = request.kind == PayloadKind.BLOCK_STATE.to_pb()
        tensors, announced = (self.block_state, self.base_hash) if block else (self.emb_state, self.emb_hash)
        enc = encode(
            tensors,
            Codec.FP32,
            swarm_id=self.swarm_id,
            config_hash=self.serving.config_hash,
            kind=PayloadKind.BLOCK_STATE if block else PayloadKind.EMBEDDING_STATE,
            block_index=self.serving.block_index if block else -1,
            base_hash=announced,
            peer_id=self.peer_id,
        )
        return sign_payload(enc, self.identity)


async def start_hosts(blocks, emb, layout, liars=None, bases=None, weights=None, signed=None):
    """layout: block index per server; liars: server index -> LyingServing kwargs; bases: server index -> the
    base_hash its status names; weights: server index -> another block state to serve; signed: server index ->
    SignedHandler kwargs (every server is signed when it is a dict, even empty; None: none).
    Returns [(server, handler)]."""
    from swarmd.transport.hosting import start_server

    hosts = []
    try:
        for i, b in enumerate(layout):
            lie = (liars or {}).get(i)
            serving = (
                LyingServing(CFG, b, peer_id=f"host{i}", **lie) if lie else BlockServing(CFG, b, peer_id=f"host{i}")
            )
            state = (weights or {}).get(i, blocks[b].state_dict())
            serving.update_weights(state, emb.table)
            base = (bases or {}).get(i)
            if signed is not None:
                handler = SignedHandler(serving, state, emb.table, seed=i, swarm_id="test", **signed.get(i, {}))
            elif base:
                handler = BasedHandler(serving, base, swarm_id="test")
            else:
                handler = ServingOnlyHandler(serving, swarm_id="test")
            server = await start_server(handler)
            handler.address = server.address
            hosts.append((server, handler))
    except BaseException:
        await stop_hosts(hosts)
        raise
    return hosts


async def stop_hosts(hosts):
    for server, _ in hosts:
        await server.stop(0)


def state_checks():
    from swarmd.averaging.delta import decode
    from swarmd.averaging.state import weights_hash
    from swarmd.membership.trust import verify_payload
    from swarmd.serve.tiebreak import StateChecks

    return StateChecks(verify_payload, decode, weights_hash)


async def remote(hosts, share=DEFAULT_SHARE, seed=0, timeout_s=10.0, favour=None):
    from swarmd.membership.discovery import StaticDiscovery
    from swarmd.serve.remote import check_coverage, swarm_model_config
    from swarmd.transport.client import PeerClient

    client = PeerClient()
    discovery = StaticDiscovery([s.address for s, _ in hosts], lambda a: client.status(a, timeout_s=2.0), "test")
    cfg, records = await swarm_model_config(discovery, client, swarm_id="test")
    router = BlockRouter(discovery, client, cfg.config_hash(), "test")
    await check_coverage(router, cfg, records)
    if favour is not None:  # route to this server first (a liar that is the fastest replica, as it would claim)
        address = hosts[favour][0].address
        for replicas in router._replicas.values():
            if address in replicas:
                replicas[address].latency_s = 0.0
    policy = VerifyPolicy(share, rng=random.Random(seed))
    return RemoteSweeper(cfg, router, client, timeout_s=timeout_s, verify=policy, state_checks=state_checks()), client


def address_of(hosts, index):
    return hosts[index][0].address


def run_scoring(
    layout,
    liars=None,
    share=DEFAULT_SHARE,
    seed=0,
    batch_size=4,
    ce_seed=5,
    favour=None,
    bases=None,
    weights=None,
    signed=None,
    handlers=None,
):
    """Score the test windows (several sweeps: batch_size windows each) through a swarm; (result, sweeper, hosts).

    :param handlers: a list that gets the servers' handlers (to read their PullState counts)
    """
    blocks, emb = tiny_model()
    x, y = text_windows(n_bytes=400)

    async def scenario():
        hosts = await start_hosts(blocks, emb, layout, liars, bases, weights, signed)
        if handlers is not None:
            handlers.extend(h for _, h in hosts)
        sweeper, client = await remote(hosts, share, seed, favour=favour)
        try:
            got = await score_windows(sweeper, x, y, seed=ce_seed, batch_size=batch_size)
            return got, sweeper, [s.address for s, _ in hosts]
        finally:
            await sweeper.close()
            await client.close()
            await stop_hosts(hosts)

    return asyncio.run(scenario())


def honest_ce(batch_size=4, ce_seed=5):
    blocks, emb = tiny_model()
    x, y = text_windows(n_bytes=400)
    return asyncio.run(score_windows(LocalSweeper(CFG, blocks, emb), x, y, seed=ce_seed, batch_size=batch_size))["ce"]


# ---------------------------------------------------------------------------------------------
# The math: range checks and the majority, on the honest model's own answers.
# ---------------------------------------------------------------------------------------------
def honest_hop(sigma_next=True):
    from swarmd.core.model import euler_step, sampler_plan

    blocks, emb = tiny_model()
    b, sigma, nxt = sampler_plan(CFG)[0]
    x, _ = text_windows()
    z = 11.0 * torch.randn((*x.shape, CFG.d_model), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, z_next, message = euler_step(blocks[b], emb.normalized(), x, z, sigma, nxt)
    return Hop(z, sigma, nxt), Answer(z_next, message)


def test_range_checks_pass_honest_answers_and_refuse_impossible_ones():
    hop, honest = honest_hop()
    assert out_of_range(CFG, hop, honest) is None
    assert "non-finite" in out_of_range(CFG, hop, Answer(honest.out * float("nan"), honest.message))
    assert "outside the Euler step's reach" in out_of_range(CFG, hop, Answer(honest.out + 1.0, honest.message))
    assert "message" in out_of_range(CFG, hop, Answer(honest.out, honest.message * 1e6))


def test_majority_of_three_names_the_odd_one_out_and_two_alone_have_none():
    hop, honest = honest_hop()
    liar = Answer(honest.out + 0.01, honest.message)
    assert divergence(hop, honest, liar) > 1e-3  # the small bias is far beyond fp32 rounding
    tol = {frozenset((a, b)): 1e-3 for a in "abc" for b in "abc"}
    verdict = judge(hop, {"a": honest, "b": liar, "c": honest}, tol)
    assert verdict.agree == ("a", "c") and verdict.dissent == ("b",)
    assert judge(hop, {"a": honest, "b": liar}, tol).agree == ()


def test_cli_default_share_is_the_library_default():
    from cli.options import SourceOptions

    assert SourceOptions.DEFAULTS["verify_share"] == DEFAULT_SHARE


# ---------------------------------------------------------------------------------------------
# Real servers on loopback.
# ---------------------------------------------------------------------------------------------
def test_garbage_replica_is_caught_in_the_first_sweep_and_the_ce_equals_the_honest_swarms():
    got, sweeper, addresses = run_scoring([0, 1, 1, 2], liars={1: {"lie": "garbage"}})
    liar = addresses[1]
    assert liar in sweeper.stats.dropped and "Euler step's reach" in sweeper.stats.dropped[liar]
    first_sweep = next(h for h in sweeper.trace if h.block_index == 1)
    assert first_sweep.address != liar  # the first sweep was redone on the honest replica
    assert all(h.address != liar for h in sweeper.trace)
    assert got["ce"] == pytest.approx(honest_ce(), abs=1e-4)
    assert sweeper.stats.hops >= 3 * got["sweeps"]


def test_biased_replica_is_caught_within_five_sweeps_and_routed_around():
    """The liar answers its first hop honestly (so the first-answer check passes), then adds a small bias."""
    ref = honest_ce()
    for seed in range(3):  # three RNG seeds of the share draws: every one catches it within 5 sweeps
        liars = {1: {"lie": "bias", "bias": 0.02, "honest_first": 1}}
        got, sweeper, addresses = run_scoring([0, 1, 1, 1, 2], liars=liars, seed=seed, favour=1)
        liar = addresses[1]
        used_liar = [k for k, h in enumerate(h for h in sweeper.trace if h.block_index == 1) if h.address == liar]
        assert liar in sweeper.stats.dropped, sweeper.stats.summary()
        assert "disagreed with the majority" in sweeper.stats.dropped[liar]
        assert len(used_liar) <= 5  # hops of block 1 (one per sweep) answered by the liar before it was dropped
        assert got["ce"] == pytest.approx(ref, abs=1e-4)  # every batch it took part in was scored again
        assert len(sweeper.stats.dropped) == 1


# Two replicas of a block and no third: the tie is broken by recomputing the hop from their signed weights.
PLAUSIBLE = {"lie": "plausible"}  # random answers inside the Euler step's reach: only a comparison catches them
BIAS_LATER = {"lie": "bias", "bias": 0.02, "honest_first": 1}  # honest first hop (the first-answer check passes)


@pytest.mark.parametrize(
    "lie, liar, favour, seed",
    [
        ({"lie": "garbage"}, 1, 1, 0),
        (PLAUSIBLE, 1, 1, 0),
        (PLAUSIBLE, 2, None, 0),
        (BIAS_LATER, 1, 1, 0),
        (BIAS_LATER, 1, 1, 1),
        (BIAS_LATER, 1, 1, 2),
        (BIAS_LATER, 2, 1, 0),  # the liar is the checker: its answers are only ever compared
    ],
)
def test_two_replicas_one_liar_is_dropped_within_five_sweeps_by_recomputation(lie, liar, favour, seed):
    handlers: list = []
    got, sweeper, addresses = run_scoring(
        [0, 1, 1, 2], liars={liar: lie}, favour=favour, seed=seed, signed={}, handlers=handlers
    )
    stats, bad = sweeper.stats, addresses[liar]
    assert list(stats.dropped) == [bad], stats.summary()
    used_liar = [h for h in sweeper.trace if h.block_index == 1 and h.address == bad]
    assert len(used_liar) <= 5  # hops of block 1 (one per sweep) the liar answered before it was dropped
    assert got["ce"] == pytest.approx(honest_ce(), abs=1e-4)
    if lie["lie"] != "garbage":  # garbage is out of range: dropped by the range checks, no tie to break
        assert "recomputation" in stats.dropped[bad] and stats.tiebreaks == 1
        assert stats.state_downloads == 4 and stats.failed_pulls == 0  # each replica's block + byte table, once
        assert sum(h.pulls for h in handlers) == 4
    assert stats.summary()["tiebreaks"] == stats.tiebreaks


def test_honest_pair_is_never_flagged_and_pulls_nothing():
    handlers: list = []
    got, sweeper, _ = run_scoring([0, 1, 1, 2, 2], share=1.0, signed={}, handlers=handlers)
    stats = sweeper.stats
    assert stats.dropped == {} and stats.disagreements == 0 and stats.tiebreaks == 0
    assert stats.state_downloads == 0 and sum(h.pulls for h in handlers) == 0
    assert stats.checked > 0 and got["ce"] == pytest.approx(honest_ce(), abs=1e-4)


def test_liar_serving_weights_it_does_not_announce_is_dropped_and_the_other_replica_pulled():
    """The liar (primary, favoured) biases its answers and, asked for its block, sends other weights than the hash
    its signed record announces: its answers are not what those weights compute, so it is dropped; the honest
    replica answers by the weights it serves."""
    blocks, _ = tiny_model()
    moved = {k: v + 0.05 for k, v in blocks[1].state_dict().items()}
    handlers: list = []
    got, sweeper, addresses = run_scoring(
        [0, 1, 1, 2], liars={1: BIAS_LATER}, favour=1, signed={1: {"served": moved}}, handlers=handlers
    )
    stats = sweeper.stats
    assert list(stats.dropped) == [addresses[1]] and "weights it serves" in stats.dropped[addresses[1]]
    assert stats.failed_pulls == 0 and stats.state_downloads == 4  # each replica's block and table
    assert handlers[1].pulls == 2 and handlers[2].pulls == 2
    assert got["ce"] == pytest.approx(honest_ce(), abs=1e-4)


def test_a_replica_that_merged_since_its_record_is_not_taken_for_the_liar():
    """Training replicas merge rounds between their records and the pull: both serve weights whose hash their
    records do not announce yet (moved by 1e-7; the old rule dropped both, leaving the block unserved). The verdict
    goes by what each answer computes from the weights its sender serves: only the liar is dropped."""
    blocks, _ = tiny_model()
    moved = {k: v + 1e-7 for k, v in blocks[1].state_dict().items()}
    got, sweeper, addresses = run_scoring(
        [0, 1, 1, 2], liars={1: BIAS_LATER}, favour=1, signed={1: {"served": moved}, 2: {"served": moved}}, handlers=[]
    )
    assert list(sweeper.stats.dropped) == [addresses[1]]
    assert got["ce"] == pytest.approx(honest_ce(), abs=1e-4)


def test_tie_break_downloads_a_base_once_however_often_a_liar_disputes():
    """The same dispute settled three times: one download of the block and one of the table; the cached copy
    decides the later ones (a liar cannot make the client download again)."""
    from swarmd.core.model import euler_step, sampler_plan

    blocks, emb = tiny_model()
    b, sigma, nxt = next(step for step in sampler_plan(CFG) if step[0] == 1)

    async def scenario():
        hosts = await start_hosts(blocks, emb, [0, 1, 1, 2], signed={})
        sweeper, client = await remote(hosts)
        try:
            x, _ = text_windows()
            z = 3.0 * torch.randn((*x.shape, CFG.d_model), generator=torch.Generator().manual_seed(0))
            request = pb.ForwardRequest(block_index=b, sigma=sigma, sigma_next=nxt, step_index=1)
            request.context.CopyFrom(to_proto(x.to(torch.uint8)))
            request.z.CopyFrom(to_proto(z))
            with torch.no_grad():
                _, z_next, message = euler_step(blocks[b], emb.normalized(), x, z, sigma, nxt)
            honest = Answer(z_next, message)
            lie = Answer(z_next + 0.02, message)
            a, c = address_of(hosts, 1), address_of(hosts, 2)
            replicas = {r.address: r for r in sweeper.router.known(b)}
            verdicts = [
                await sweeper.checker.tiebreaker.settle(
                    Hop(z, sigma, nxt), request, {a: honest, c: lie}, replicas, 1e-3
                )
                for _ in range(3)
            ]
            return verdicts, sweeper.stats, a, c, [h.pulls for _, h in hosts]
        finally:
            await sweeper.close()
            await client.close()
            await stop_hosts(hosts)

    verdicts, stats, _, liar_address, pulls = asyncio.run(scenario())
    assert all([r.address for r, _ in v] == [liar_address] for v in verdicts)
    assert stats.tiebreaks == 3 and stats.state_downloads == 4 and sum(pulls) == 4  # once per replica


def test_two_replicas_that_disagree_with_no_weights_to_pull_are_refused_with_one_line():
    """No verdict is possible when neither replica serves its state (both pulls fail): the client refuses."""
    none = {"serve_state": False}
    with pytest.raises(ValidationError) as caught:
        run_scoring([0, 1, 1, 2], liars={2: {"lie": "bias", "bias": 0.02}}, share=1.0, signed={1: none, 2: none})
    message = str(caught.value)
    assert "\n" not in message and "block 1 step 1: replicas" in message
    assert "no verified copy of their weights could be pulled" in message


@pytest.mark.parametrize("lie, why", [("nan", "NaN or infinite"), ("huge", "outside the Euler step's reach")])
def test_lone_holder_out_of_range_is_refused_with_one_line(lie, why):
    with pytest.raises(ValidationError) as caught:
        run_scoring([0, 1, 2], liars={1: {"lie": lie}})
    message = str(caught.value)
    assert "\n" not in message and why in message
    assert "the only peer serving it" in message and "refusing an unverifiable answer" in message


def test_honest_replicas_are_never_flagged_in_scoring_and_cached_generation():
    blocks, emb = tiny_model()
    x, y = text_windows(n_bytes=400)
    local = LocalSweeper(CFG, blocks, emb)
    ref_gen = asyncio.run(generate_bytes(local, b"the ", CFG.seq_len + 6, 1.0, seed=8))  # re-windows once

    async def scenario():
        hosts = await start_hosts(blocks, emb, [0, 0, 1, 1, 1, 2, 2])
        sweeper, client = await remote(hosts, share=1.0)
        try:
            got = await score_windows(sweeper, x, y, seed=5, batch_size=4)
            out = await generate_bytes(sweeper, b"the ", CFG.seq_len + 6, 1.0, seed=8)
            return got, out, sweeper
        finally:
            await sweeper.close()
            await client.close()
            await stop_hosts(hosts)

    got, out, sweeper = asyncio.run(scenario())
    stats = sweeper.stats
    assert stats.dropped == {} and stats.disagreements == 0 and stats.redone_sweeps == 0
    assert stats.checked == stats.hops > 0 and stats.unverified_blocks == set()
    assert got["ce"] == pytest.approx(honest_ce(), abs=1e-4) and out == ref_gen


def test_honest_replicas_on_different_bases_are_not_dropped_and_same_base_ones_are_preferred():
    """Block 1: two replicas of base "a" and one of base "b" serving other (moved) weights. The base-"b" replica
    is never dropped: checks prefer a same-base replica, and one across bases uses the loose tolerance."""
    blocks, _ = tiny_model()
    moved = {
        k: v + 0.05 * torch.randn(v.shape, generator=torch.Generator().manual_seed(3))
        for k, v in blocks[1].state_dict().items()
    }
    bases = {1: "a", 2: "a", 3: "b"}
    got, sweeper, _ = run_scoring([0, 1, 1, 1, 2], share=1.0, bases=bases, weights={3: moved}, favour=1)
    assert sweeper.stats.dropped == {} and sweeper.stats.disagreements == 0
    assert sweeper.stats.checked > 0 and sweeper.stats.loose == 0  # the same-base replica checked the primary
    assert got["ce"] == pytest.approx(honest_ce(), abs=1e-4)
    # the primary on base "b" alone with a base-"a" replica: compared loosely, nobody dropped, no error
    _, sweeper, _ = run_scoring([0, 1, 1, 2], share=1.0, bases={1: "a", 2: "b"}, weights={2: moved})
    assert sweeper.stats.dropped == {} and (sweeper.stats.loose > 0 or 1 in sweeper.stats.apart_blocks)


@pytest.mark.parametrize("layout", [[0, 1, 1, 1, 2], [0, 1, 1, 2]])  # a third replica, or a tie-break
def test_generation_drops_a_liar_and_rebuilds_the_session_from_clean_inputs(layout):
    """Generation with a liar in block 1 (the primary) that turns after its first hop: it is dropped and the
    session rebuilt from position 0 (no cache keeps its answers); greedy text equals the honest swarm's."""
    blocks, emb = tiny_model()
    ref = asyncio.run(generate_bytes(LocalSweeper(CFG, blocks, emb), b"the ", 10, 0.0, seed=8))

    async def scenario():
        hosts = await start_hosts(blocks, emb, layout, {1: BIAS_LATER}, signed={})
        sweeper, client = await remote(hosts, share=0.5, favour=1)
        try:
            return await generate_bytes(sweeper, b"the ", 10, 0.0, seed=8), sweeper, hosts[1][0].address
        finally:
            await sweeper.close()
            await client.close()
            await stop_hosts(hosts)

    out, sweeper, liar = asyncio.run(scenario())
    assert list(sweeper.stats.dropped) == [liar] and sweeper.stats.redone_sweeps >= 1
    assert sweeper.stats.tiebreaks == (len(layout) == 4)
    assert out == ref


def test_cli_score_json_reports_checks_drops_and_unverified_blocks(tmp_path):
    from typer.testing import CliRunner

    from cli.main import app
    from tests.swarm_utils import TEXT

    text = tmp_path / "score.txt"
    text.write_bytes(TEXT[:300])
    blocks, emb = tiny_model()

    async def scenario():
        hosts = await start_hosts(blocks, emb, [0, 1, 1, 2], {1: {"lie": "garbage"}})
        try:
            swarm = [a for s, _ in hosts for a in ("--swarm", s.address)]
            args = ["score", *swarm, "--swarm-id", "test", "--timeout-s", "5", str(text)]
            as_json = await asyncio.to_thread(CliRunner().invoke, app, [*args, "--json"])
            as_text = await asyncio.to_thread(CliRunner().invoke, app, args)
            return as_json, as_text, hosts[1][0].address
        finally:
            await stop_hosts(hosts)

    as_json, as_text, liar = asyncio.run(scenario())
    assert as_json.exit_code == 0, as_json.output
    verified = json.loads(as_json.stdout)["verified"]
    assert list(verified["dropped"]) == [liar] and verified["hops"] == 3 and verified["checked"] == 0
    assert verified["unverified_blocks"] == [0, 1, 2]  # one holder each: block 1's other replica was dropped
    assert as_text.exit_code == 0, as_text.output
    last = as_text.stdout.strip().splitlines()[-1]
    assert (
        last.startswith("verified 0 of 3 hops") and f"dropped {liar}" in last and "UNVERIFIED: block(s) 0, 1, 2" in last
    )


def test_cli_score_breaks_a_two_replica_tie_by_recomputation(tmp_path):
    """`blocktrain score --swarm` (cli.common's StateChecks) with two signed replicas of block 1, one lying inside
    the range checks: the liar is dropped by recomputation and the CE equals the checkpoint-free honest swarm's."""
    from typer.testing import CliRunner

    from cli.main import app
    from tests.swarm_utils import TEXT

    text = tmp_path / "score.txt"
    text.write_bytes(TEXT[:300])
    blocks, emb = tiny_model()

    async def scenario(liars):
        hosts = await start_hosts(blocks, emb, [0, 1, 1, 2], liars, signed={})
        try:
            swarm = [a for s, _ in hosts for a in ("--swarm", s.address)]
            args = ["score", *swarm, "--swarm-id", "test", "--timeout-s", "5", "--verify-share", "1", "--json"]
            return await asyncio.to_thread(CliRunner().invoke, app, [*args, str(text)]), hosts[2][0].address
        finally:
            await stop_hosts(hosts)

    lied, liar = asyncio.run(scenario({2: PLAUSIBLE}))
    honest, _ = asyncio.run(scenario(None))
    assert lied.exit_code == 0 and honest.exit_code == 0, lied.output + honest.output
    got, ref = json.loads(lied.stdout), json.loads(honest.stdout)
    assert list(got["verified"]["dropped"]) == [liar] and "recomputation" in got["verified"]["dropped"][liar]
    assert got["verified"]["tiebreaks"] == 1 and got["verified"]["state_downloads"] == 4
    assert ref["verified"]["dropped"] == {} and ref["verified"]["tiebreaks"] == 0
    assert got["ce"] == pytest.approx(ref["ce"], abs=1e-4)


def test_tie_break_pulls_and_verifies_a_real_daemons_state(tmp_path):
    """Against a real training daemon (swarmd.node.daemon: PullState is StatePulls.served_state, its record signed
    by its identity), the tie-breaker's pull verifies (signature, hash = the record's base/emb hash), and the
    recomputation confirms an honest answer and names a biased one."""
    from swarmd.core.model import DenoisingBlock, euler_step, sampler_plan
    from swarmd.membership.discovery import connect_discovery
    from swarmd.serve.remote import connect_swarm
    from tests.test_serving import start_daemons, stop_daemons

    async def scenario():
        daemons = await start_daemons(tmp_path, [0, 1, 2])
        try:
            remote, closer = await connect_swarm(
                [d.server.address for d in daemons],
                "test",
                connect_discovery,
                timeout_s=5.0,
                state_checks=state_checks(),
            )
            try:
                cfg = remote.cfg
                b, sigma, nxt = sampler_plan(cfg)[0]  # step 0: no message comes in (the config passes one on)
                _, block_sd, emb_sd = daemons[b].state.snapshot()
                block = DenoisingBlock(cfg)
                block.load_state_dict(block_sd)
                x = torch.randint(0, 256, (2, cfg.seq_len), generator=torch.Generator().manual_seed(0))
                z = 3.0 * torch.randn((*x.shape, cfg.d_model), generator=torch.Generator().manual_seed(1))
                with torch.no_grad():
                    table_hat = torch.nn.functional.normalize(emb_sd["table"].float(), dim=-1)
                    _, z_next, message = euler_step(block.eval(), table_hat, x, z, sigma, nxt)
                request = pb.ForwardRequest(block_index=b, sigma=sigma, sigma_next=nxt, step_index=0)
                request.context.CopyFrom(to_proto(x.to(torch.uint8)))
                request.z.CopyFrom(to_proto(z))
                replica = remote.router.known(b)[0]
                hop, tiebreaker = Hop(z, sigma, nxt), remote.checker.tiebreaker
                honest = await tiebreaker.settle(
                    hop, request, {replica.address: Answer(z_next, message)}, {replica.address: replica}, 1e-3
                )
                lie = await tiebreaker.settle(
                    hop, request, {replica.address: Answer(z_next + 0.02, message)}, {replica.address: replica}, 1e-3
                )
                return honest, lie, replica, remote.stats
            finally:
                await closer()
        finally:
            await stop_daemons(daemons)

    honest, lie, replica, stats = asyncio.run(scenario())
    assert replica.record.base_hash and replica.record.emb_hash and replica.record.signature
    assert honest == [] and [r.address for r, _ in lie] == [replica.address]
    assert stats.state_downloads == 2 and stats.failed_pulls == 0 and stats.tiebreaks == 2


def test_a_score_worse_than_uniform_with_unchecked_blocks_warns():
    from cli.score import worse_than_uniform

    lone = {"ce": 28.6, "verified": {"unverified_blocks": [1]}}
    assert "worse than a uniform guess" in worse_than_uniform(lone) and "block(s) 1" in worse_than_uniform(lone)
    assert worse_than_uniform({"ce": 2.6, "verified": {"unverified_blocks": [1]}}) == ""  # plausible: no claim
    assert worse_than_uniform({"ce": 28.6, "verified": {"unverified_blocks": []}}) == ""  # checked: it is the model
    assert worse_than_uniform({"ce": 28.6}) == ""  # a checkpoint: nothing was served
