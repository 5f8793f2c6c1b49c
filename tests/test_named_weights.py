"""Answers checked against the weights that produced them: Forward replies name their weights' hashes, a server
keeps the last few serving snapshots pullable by hash, and the tie-break recomputes from exactly those
(swarmd.serve.snapshots, swarmd.node.served, swarmd.serve.tiebreak, swarmd.serve.verify.between)."""

import asyncio
import gc
from types import SimpleNamespace

import pytest
import torch

from swarmd.averaging.delta import encode
from swarmd.averaging.state import weights_hash
from swarmd.core.model import ByteEmbedding, DenoisingBlock, euler_step
from swarmd.errors import NotFound, PeerUnavailable, ValidationError
from swarmd.membership.identity import Identity
from swarmd.membership.trust import sign_payload
from swarmd.protocol import Codec, PayloadKind
from swarmd.serve.serving import BlockServing
from swarmd.serve.snapshots import ServedWeights, valid_hash
from swarmd.serve.tiebreak import MAX_INCONCLUSIVE, TieBreaker
from swarmd.serve.verify import (
    OTHER_BASE_TOL,
    SAME_BASE_TOL,
    Answer,
    Hop,
    VerifyStats,
    alike,
    between,
    named_weights,
)
from swarmd.v1 import swarm_pb2 as pb
from swarmd.wire import from_proto, to_proto
from tests.test_inference import CFG
from tests.test_verified_inference import state_checks


def weights(cfg, seed):
    torch.manual_seed(seed)
    block, emb = DenoisingBlock(cfg).state_dict(), ByteEmbedding(cfg).state_dict()
    return block, emb, weights_hash(block), weights_hash(emb)


def forward_request(cfg, b=1, seed=0):
    x = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(seed))
    z = 3.0 * torch.randn((2, 8, cfg.d_model), generator=torch.Generator().manual_seed(seed + 1))
    r = pb.ForwardRequest(block_index=b, config_hash=cfg.config_hash(), sigma=2.0, sigma_next=1.0, step_index=0)
    r.context.CopyFrom(to_proto(x.to(torch.uint8)))
    r.z.CopyFrom(to_proto(z))
    return r, Hop(z, 2.0, 1.0)


def answer_of(cfg, block_sd, emb_sd, request, hop, named=True):
    block = DenoisingBlock(cfg)
    block.load_state_dict(block_sd)
    x = from_proto(request.context).long()
    with torch.no_grad():
        table_hat = torch.nn.functional.normalize(emb_sd["table"].float(), dim=-1)
        _, z_next, message = euler_step(block.eval(), table_hat, x, hop.z, hop.sigma, hop.sigma_next)
    names = (weights_hash(block_sd), weights_hash(emb_sd)) if named else ("", "")
    return Answer(z_next, message, names)


# -- the plain logic ------------------------------------------------------------------------------------


def test_valid_hash_and_named_weights_refuse_hostile_names():
    assert valid_hash("0123abcd") and not valid_hash("") and not valid_hash("ABCD") and not valid_hash("a" * 65)
    assert named_weights(pb.ForwardReply()) == ("", "")
    assert named_weights(pb.ForwardReply(block_hash="ab12", emb_hash="cd34")) == ("ab12", "cd34")
    for bad in (pb.ForwardReply(block_hash="ab12"), pb.ForwardReply(block_hash="x" * 10, emb_hash="ab")):
        with pytest.raises(ValidationError, match="malformed hashes"):
            named_weights(bad)


def test_tolerance_between_answers_goes_by_the_weights_they_name():
    z = torch.zeros(1, 1, 4)
    rec = SimpleNamespace(base_hash="aa", emb_hash="bb")
    other = SimpleNamespace(base_hash="cc", emb_hash="bb")
    a, a2, b = Answer(z, None, ("11", "22")), Answer(z, None, ("11", "22")), Answer(z, None, ("33", "22"))
    unnamed = Answer(z, None)
    assert between(rec, a, rec, a2) == SAME_BASE_TOL and alike(rec, a, other, a2)  # named: the records do not matter
    assert between(rec, a, rec, b) == OTHER_BASE_TOL and not alike(rec, a, rec, b)  # a merge landed between
    assert between(rec, unnamed, rec, a) == SAME_BASE_TOL and between(rec, unnamed, other, a) == OTHER_BASE_TOL
    assert a.tail(1).weights == ("11", "22") and a.named and not unnamed.named


def test_served_weights_keep_the_last_few_and_those_live_sessions_hold():
    cfg = CFG
    served = ServedWeights(keep=2)
    serving = BlockServing(cfg, 1, keep_snapshots=2)
    serving.served = served
    installed = []
    for seed in range(4):
        block, emb, bh, eh = weights(cfg, seed)
        serving.update_weights(block, emb["table"], bh, eh, emb)
        installed.append((bh, eh))
        if seed == 0:
            held_by_session = serving._snapshot  # as a cached session holds the snapshot it started on
    assert served.held() == [installed[0], installed[2], installed[3]]
    got = served.block_state(installed[0][0])
    assert got is not None and weights_hash(got) == installed[0][0]
    assert weights_hash(served.emb_state(installed[3][1])) == installed[3][1]
    assert served.block_state(installed[1][0]) is None  # neither recent nor held by a session: gone
    del held_by_session
    gc.collect()
    assert served.held() == installed[2:] and served.block_state(installed[0][0]) is None
    serving.update_weights(*weights(cfg, 9)[:1], weights(cfg, 9)[1]["table"])  # unnamed: not pullable by hash
    assert served.held() == installed[2:]


def test_forward_replies_name_the_snapshot_that_computed_them():
    cfg = CFG
    serving = BlockServing(cfg, 1)
    block, emb, bh, eh = weights(cfg, 0)
    serving.update_weights(block, emb["table"], bh, eh, emb)
    request, hop = forward_request(cfg)

    async def answer():
        return await serving.forward(request)

    reply = asyncio.run(answer())
    assert named_weights(reply) == (bh, eh)
    expected = answer_of(cfg, block, emb, request, hop)
    assert torch.allclose(from_proto(reply.z), expected.out, atol=1e-5)


# -- the tie-break by named weights (a stand-in client that answers PullState from a table) ---------------


class Peer:
    """A replica as the tie-breaker sees it: its record, and the signed states it serves by hash."""

    def __init__(self, cfg, seed, address, states):
        self.identity = Identity.generate(bytes([seed + 1]) * 32)
        self.cfg, self.address = cfg, address
        self.states = {}  # weights_hash -> (kind, tensors)
        for block, emb in states:
            self.states[weights_hash(block)] = (PayloadKind.BLOCK_STATE, block)
            self.states[weights_hash(emb)] = (PayloadKind.EMBEDDING_STATE, emb)
        block, emb = states[-1]
        self.record = SimpleNamespace(
            address=address,
            peer_id=self.identity.peer_id,
            base_hash=weights_hash(block),
            emb_hash=weights_hash(emb),
            swarm_id="test",
        )
        self.replica = SimpleNamespace(address=address, record=self.record)
        self.forged: dict[str, dict] = {}  # hash -> tensors sent instead (a liar)
        self.pulls = 0

    def pull(self, request):
        self.pulls += 1
        kind = PayloadKind.from_pb(request.kind)
        if request.weights_hash not in self.states:
            raise NotFound(f"no served {kind.value} of hash {request.weights_hash} is held any more")
        _, tensors = self.states[request.weights_hash]
        tensors = self.forged.get(request.weights_hash, tensors)
        enc = encode(
            tensors,
            Codec.FP32,
            swarm_id="test",
            config_hash=self.cfg.config_hash(),
            kind=kind,
            block_index=request.block_index,
            base_hash=request.weights_hash,
            peer_id=self.identity.peer_id,
        )
        return sign_payload(enc, self.identity)


class Client:
    def __init__(self, peers):
        self.peers = {p.address: p for p in peers}

    async def pull_state(self, address, request, timeout_s):
        if address not in self.peers:
            raise PeerUnavailable(f"{address} cannot be reached")
        return self.peers[address].pull(request)


def tiebreaker(cfg, peers):
    stats = VerifyStats()
    return TieBreaker(cfg, Client(peers), "test", state_checks(), stats), stats


def settle(tb, request, hop, answers, peers):
    replicas = {p.address: p.replica for p in peers}
    return asyncio.run(tb.settle(hop, request, answers, replicas, SAME_BASE_TOL))


def test_an_honest_answer_from_weights_that_moved_since_is_confirmed_and_the_liar_named():
    """The measured bug: the honest replica answered, then a merge landed before the pull. Its answer names the
    weights that computed it, the pull asks for exactly those: confirmed; the liar's answer is not what its named
    weights compute."""
    cfg = CFG
    old, new = weights(cfg, 0), weights(cfg, 1)
    request, hop = forward_request(cfg)
    honest = Peer(cfg, 0, "honest", [old[:2], new[:2]])  # serves `new` now; its record announces `new`
    liar = Peer(cfg, 1, "liar", [old[:2]])
    tb, stats = tiebreaker(cfg, [honest, liar])
    good = answer_of(cfg, old[0], old[1], request, hop)
    bad = Answer(good.out + 0.02, good.message, good.weights)
    drops = settle(tb, request, hop, {"honest": good, "liar": bad}, [honest, liar])
    assert [r.address for r, _ in drops] == ["liar"] and "weights it named" in drops[0][1]
    assert not tb.inconclusive_now and stats.tiebreaks == 1 and stats.state_downloads == 4
    # the same named hashes again: nothing is downloaded again
    assert [r.address for r, _ in settle(tb, request, hop, {"honest": good, "liar": bad}, [honest, liar])] == ["liar"]
    assert stats.state_downloads == 4 and honest.pulls == 2 and liar.pulls == 2


def test_answers_from_different_named_weights_that_each_compute_them_are_no_lie():
    cfg = CFG
    a_w, b_w = weights(cfg, 0), weights(cfg, 1)
    request, hop = forward_request(cfg)
    a, b = Peer(cfg, 0, "a", [a_w[:2]]), Peer(cfg, 1, "b", [b_w[:2]])
    tb, _ = tiebreaker(cfg, [a, b])
    answers = {"a": answer_of(cfg, *a_w[:2], request, hop), "b": answer_of(cfg, *b_w[:2], request, hop)}
    assert settle(tb, request, hop, answers, [a, b]) == []


def test_a_state_that_does_not_hash_to_its_name_is_a_lie():
    cfg = CFG
    w, other = weights(cfg, 0), weights(cfg, 1)
    request, hop = forward_request(cfg)
    honest, liar = Peer(cfg, 0, "honest", [w[:2]]), Peer(cfg, 1, "liar", [w[:2]])
    liar.forged[w[2]] = other[0]  # names the honest weights, sends others
    tb, _ = tiebreaker(cfg, [honest, liar])
    good = answer_of(cfg, *w[:2], request, hop)
    drops = settle(
        tb, request, hop, {"honest": good, "liar": Answer(good.out + 0.02, good.message, good.weights)}, [honest, liar]
    )
    assert [r.address for r, _ in drops] == ["liar"] and "not the one it named" in drops[0][1]


def test_weights_named_and_then_refused_are_inconclusive_until_the_liar_is_dropped():
    """A liar names weights it never serves: each judgement is inconclusive (the caller asks again), never a
    verdict against the honest replica; at MAX_INCONCLUSIVE it is dropped. Each named hash is asked for once."""
    cfg = CFG
    w = weights(cfg, 0)
    request, hop = forward_request(cfg)
    honest, liar = Peer(cfg, 0, "honest", [w[:2]]), Peer(cfg, 1, "liar", [w[:2]])
    tb, stats = tiebreaker(cfg, [honest, liar])
    good = answer_of(cfg, *w[:2], request, hop)
    verdicts = []
    for k in range(MAX_INCONCLUSIVE):
        fake = (f"{k:016x}", f"{k + 100:016x}")  # a new name each time: a pull each, refused
        answers = {"honest": good, "liar": Answer(good.out + 0.02, good.message, fake)}
        verdicts.append((settle(tb, request, hop, answers, [honest, liar]), set(tb.inconclusive_now)))
    for drops, inconclusive in verdicts[:-1]:
        assert drops == [] and inconclusive == {"liar"}
    drops, _ = verdicts[-1]
    assert [r.address for r, _ in drops] == ["liar"] and "keeps naming weights it does not serve" in drops[0][1]
    assert stats.inconclusive == MAX_INCONCLUSIVE and honest.pulls == 2  # the honest weights: pulled once
    assert liar.pulls == MAX_INCONCLUSIVE  # the block pull of each new name; refused, the table is not asked


def test_an_honest_replica_whose_named_weights_are_gone_is_inconclusive_not_a_liar():
    cfg = CFG
    w, gone = weights(cfg, 0), weights(cfg, 1)
    request, hop = forward_request(cfg)
    a, b = Peer(cfg, 0, "a", [w[:2]]), Peer(cfg, 1, "b", [w[:2]])
    tb, _ = tiebreaker(cfg, [a, b])
    good = answer_of(cfg, *w[:2], request, hop)
    stale = answer_of(cfg, *gone[:2], request, hop)  # computed from weights b no longer holds
    assert settle(tb, request, hop, {"a": good, "b": stale}, [a, b]) == [] and tb.inconclusive_now == {"b"}


def test_a_client_against_a_swarm_that_merges_every_round_keeps_a_bounded_number_of_blocks():
    from swarmd.serve.tiebreak import MAX_HELD

    cfg = CFG
    request, hop = forward_request(cfg)
    rounds = [weights(cfg, seed) for seed in range(MAX_HELD + 4)]
    peer = Peer(cfg, 0, "a", [w[:2] for w in rounds])  # serves every round's weights by hash
    tb, stats = tiebreaker(cfg, [peer])
    for w in rounds:
        assert settle(tb, request, hop, {"a": answer_of(cfg, *w[:2], request, hop)}, [peer]) == []
    assert len(tb._blocks) <= MAX_HELD and len(tb._tables) <= MAX_HELD
    assert stats.state_downloads == 2 * len(rounds)  # each new named hash pulled once
