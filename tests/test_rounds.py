"""`--rounds N` (DaemonConfig.max_rounds): N rounds counted from where this run starts (a resumed round, else 0).

Real daemons (static discovery, one peer) checkpointing into tmp_path; each run serves until it
stops by itself, bounded by asyncio.wait_for.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from swarm_utils import batches, daemon_config, memory_round, memory_swarm, running
from typer.testing import CliRunner

from cli.main import app
from swarmd.averaging.config import GossipConfig
from swarmd.averaging.exchange import out_of_reach
from swarmd.errors import ConfigError
from swarmd.node.config import DaemonConfig
from swarmd.node.rounds import PlainRounds

pytestmark = pytest.mark.usefixtures("one_thread")


async def serve_until_done(config: DaemonConfig) -> tuple[int, int, int]:
    """(round at start, round at the end, rounds merged) of one run that stops by itself."""
    async with running(config) as (d,):
        start = d.state.round
        await asyncio.wait_for(d.serve(), 120)
        return start, d.state.round, d.metrics.rounds


def test_rounds_count_from_the_resume_point(tmp_path):
    config = daemon_config(tmp_path, 0, seed=0, discovery="static", checkpoint=True, max_rounds=2)
    assert asyncio.run(serve_until_done(config)) == (0, 2, 2)
    assert asyncio.run(serve_until_done(config)) == (2, 4, 2)  # resumed at 2: two more, not none
    # the swarm-counter limit (LocalSwarm's peers stop together) counts from zero; the nearer limit wins
    assert asyncio.run(serve_until_done(replace(config, max_rounds=3, stop_at_round=5))) == (4, 5, 1)
    assert asyncio.run(serve_until_done(replace(config, max_rounds=1, stop_at_round=9))) == (5, 6, 1)


def test_stop_at_round_is_validated():
    with pytest.raises(ConfigError, match="stop_at_round must be >= 0"):
        DaemonConfig(stop_at_round=-1)
    assert DaemonConfig.from_dict(DaemonConfig(stop_at_round=3).to_dict()).stop_at_round == 3


def test_rounds_help_says_where_the_count_starts():
    result = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "counted from where this run starts" in " ".join(result.output.split())


@pytest.mark.parametrize("idle", [False, True])
def test_a_round_this_peer_did_not_train_waits_for_the_training_peers(idle):
    """A pipelined peer's idle round (Exchange.idle, set by the round loop when it trained nothing) waits up to
    deadline_max_s for a peer that is still training; a normal round closes at the policy's short deadline."""

    async def scenario():
        peers, _, board = memory_swarm([0, 0], codec="fp32", deadline_max_s=6.0)
        waiting, training = peers
        records = list(board.values())
        for g in peers:
            await g.sync(records)
            await g.open_round()
        for _ in range(3):  # rounds whose deltas all came at once: the policy's deadline is deadline_min_s
            waiting.rounds.deadline.observe(0.01, 0.05)
            waiting.rounds.deadline.observe_arrivals([0.02], 0, 0.05)
        waiting.rounds.idle = idle

        async def still_training():
            await asyncio.sleep(1.5)  # the other peer's local steps (injected lateness, not a wait for a condition)
            return await training.average(records)

        report, _ = await asyncio.gather(waiting.average(records), still_training())
        return report

    report = asyncio.run(scenario())
    assert report.participation == (1.0 if idle else 0.0)


def test_an_idle_peers_zero_deltas_are_not_averaged_into_the_trainers_update():
    """Pipelined: block 1's peer trained nothing this round (Exchange.idle): its deltas carry weight 0, so both
    peers land the training peer's byte-table delta whole (not halved by the idle zeros) and hold one table; the
    idle peer's block stays where it was."""

    async def scenario():
        peers, _, board = memory_swarm([0, 1], codec="fp32", merge="mean")
        trainer, idle = peers
        records = list(board.values())
        for g in peers:
            await g.sync(records)
            await g.open_round()
        table_before = trainer.state.snapshot()[2]
        idle_block_before = idle.state.snapshot()[1]
        await asyncio.to_thread(trainer.state.train_steps, 2, batches(0))
        _, trained_table = trainer.state.current()
        idle.rounds.idle = True
        reports = await asyncio.gather(*(g.average(records) for g in peers))
        return trainer, idle, table_before, trained_table, idle_block_before, reports

    trainer, idle, before, trained, idle_block, reports = asyncio.run(scenario())
    assert all(r.participation == 1.0 for r in reports)  # the idle peer's deltas arrived: nothing was waited for
    assert trainer.state.emb_hash == idle.state.emb_hash
    landed = trainer.state.snapshot()[2]["table"]
    assert torch.allclose(landed, trained["table"])  # the whole step, not the mean with a zero
    assert not torch.allclose(landed, before["table"])
    assert all(torch.equal(v, idle_block[k]) for k, v in idle.state.snapshot()[1].items())


@pytest.mark.parametrize(("error", "merged"), [("busy", True), ("unavailable", False)])
def test_a_callee_still_training_is_dialled_again_until_the_deadline(error, merged):
    """A callee whose own delta was not ready within its wait answers Busy (a later block's round is longer): the
    caller dials it again while its round is open and merges its delta; any other failure ends the dial."""
    from swarmd.errors import Busy, PeerUnavailable

    async def scenario():
        peers, _, board = memory_swarm([0, 0], codec="fp32", deadline_max_s=6.0)
        caller, _ = peers
        real, calls = caller.rounds.peer.transport.exchange, []

        async def flaky(address, payload, timeout):  # each kind's (block, table) first two calls fail
            calls.append(payload.header.kind)
            if calls.count(payload.header.kind) <= 2:
                raise (Busy if error == "busy" else PeerUnavailable)("own delta not ready in time")
            return await real(address, payload, timeout)

        caller.rounds.peer.transport.exchange = flaky
        reports = await memory_round(peers, board)
        return reports[0], calls

    report, calls = asyncio.run(scenario())
    assert len(calls) == (2 * 3 if merged else 2)
    assert report.participation == (1.0 if merged else 0.0)


def test_a_peer_sitting_a_round_out_waits_for_the_trainers_only_not_for_another_idle_peer():
    """Sequential schedule, B=3: block 0's peer trains round 1, blocks 1 and 2 sit it out (their records' training
    windows, PeerRecord.train_first/train_last, start later). Block 1's idle round expects only block 0's deltas and
    closes as soon as they came, while block 2's peer, a round out of step, never answers: an idle peer's delta
    carries nothing (weight 0), so no idle peer waits for another (it waited up to its long idle deadline before)."""

    async def scenario():
        peers, _, board = memory_swarm([0, 1, 2], blocks=3, codec="fp32", deadline_max_s=8.0)
        trainer, idle, out_of_step = peers
        for g, window in zip(peers, ((1, 4), (5, 8), (9, 12)), strict=True):
            g.me = replace(g.me, train_first=window[0], train_last=window[1])
            board[g.me.peer_id] = g.record()
        records = list(board.values())
        for g in (trainer, idle):
            await g.sync(records)
            await g.open_round()
        await asyncio.to_thread(trainer.state.train_steps, 2, batches(0))
        idle.rounds.idle = True
        loop = asyncio.get_running_loop()
        started = loop.time()

        async def timed(g):
            return await g.average(records), loop.time() - started

        reports = await asyncio.wait_for(asyncio.gather(trainer.average(records), timed(idle)), 90)
        return reports, trainer, out_of_step

    (for_trainer, (for_idle, seconds)), trainer, out_of_step = asyncio.run(scenario())
    assert for_idle.expected_emb == [trainer.me.peer_id] and for_idle.accepted_emb == [trainer.me.peer_id]
    assert for_idle.participation == 1.0
    assert seconds < 6.0  # well before the idle deadline (2 x deadline_max_s = 16 s) and the trainer's (8 s)
    # the trainer still expects both (an idle peer must fetch its delta); the one out of step is simply missing
    assert out_of_step.me.peer_id in for_trainer.expected_emb


class FakeGossip:
    """A round's gossip whose re-sync adopts a state of round `adopts` (what a peer ahead announced)."""

    def __init__(self, state, adopts: int):
        self.state, self.adopts, self.rounds = state, adopts, SimpleNamespace(idle=False)

    async def sync(self, records):
        self.state.round = self.adopts
        return ["block"]

    async def open_round(self):
        return None

    async def average(self, records):
        self.state.round += 1
        return "merged"


class FakePeer:
    """The RoundPeer parts PlainRounds drives, counting the local steps it is asked for."""

    def __init__(self, round: int, adopts: int):
        self.state = SimpleNamespace(round=round, local_steps=0)
        self.gossip, self.trained, self.stopping = FakeGossip(self.state, adopts), [], asyncio.Event()

    async def records(self):
        return []

    def update_serving(self):
        return None

    async def announce(self):
        return None

    async def load_predecessors(self):
        return 0

    async def train(self, steps):
        self.trained.append(steps)
        return {"samples": 0, "seconds": 0.0, "ce": 0.0}

    async def finish_round(self, report, records, started=None):
        return None


@pytest.mark.parametrize("last, ends", [(30, True), (31, False), (0, False)])
def test_a_resync_to_the_runs_last_round_ends_the_run_there(last, ends):
    """A peer a round behind that adopts, at its last round's re-sync, the state the swarm ended the run with ends
    with it; training and merging one more round alone would leave it a round ahead on weights nobody holds."""
    peer = FakePeer(round=29, adopts=30)
    rounds = PlainRounds(peer, GossipConfig(steps_per_round=4, balance_steps=1.0))  # type: ignore[arg-type]
    rounds.last = last
    report = asyncio.run(rounds.run_round())
    assert (report, peer.trained, peer.state.round) == ((None, [], 30) if ends else ("merged", [4], 31))


class BehindGossip(FakeGossip):
    """A restarted peer's gossip: its re-sync adopts nothing until the `adopts_at`-th call (its fresh DHT view holds
    too few of the swarm's records to back the round its block-mates announce), then the state of round 40."""

    def __init__(self, state, adopts_at: int | None):
        super().__init__(state, 40)
        self.me = SimpleNamespace(peer_id="me", block_index=0, swarm_id="s", config_hash="c")
        self.adopts_at, self.syncs = adopts_at, 0

    async def sync(self, records):
        self.syncs += 1
        return await super().sync(records) if self.syncs == self.adopts_at else []


class BehindPeer(FakePeer):
    def __init__(self, round: int, adopts_at: int | None, mates_at: int):
        super().__init__(round, 40)
        self.gossip = BehindGossip(self.state, adopts_at)
        self.mates_at = mates_at

    async def records(self):
        mate = dict(block_index=0, swarm_id="s", config_hash="c", round=self.mates_at)
        return [SimpleNamespace(peer_id=f"mate{i}", **mate) for i in range(3)]


@pytest.mark.parametrize(
    "adopts_at, mates_at, syncs, trained_at",
    [
        (3, 40, 3, 40),  # soak: a restart merged two rounds alone before its re-sync could adopt; now it waits
        (None, 40, 3, 30),  # nothing adopted after CATCH_UP_TRIES re-syncs: it trains on, the wait is bounded
        (None, 31, 1, 30),  # block-mates a round ahead exchange with us: no wait
    ],
)
def test_a_peer_whose_block_mates_are_all_rounds_ahead_re_syncs_again_before_it_merges_a_round_alone(
    monkeypatch, adopts_at, mates_at, syncs, trained_at
):
    monkeypatch.setattr("swarmd.node.rounds.CATCH_UP_PAUSE_S", 0.01)
    peer = BehindPeer(round=30, adopts_at=adopts_at, mates_at=mates_at)
    report = asyncio.run(PlainRounds(peer, GossipConfig(steps_per_round=4, balance_steps=1.0)).run_round())  # type: ignore[arg-type]
    assert (report, peer.gossip.syncs, peer.trained, peer.state.round) == ("merged", syncs, [4], trained_at + 1)


def test_out_of_reach_counts_our_block_first_and_every_peer_without_block_mates():
    def rec(peer_id, block, round, swarm="s"):
        return SimpleNamespace(peer_id=peer_id, block_index=block, round=round, swarm_id=swarm, config_hash="c")

    me = rec("me", 0, 10)
    assert not out_of_reach(me, 10, [])  # nobody known: nobody to wait for
    assert out_of_reach(me, 10, [rec("a", 0, 12), rec("b", 0, 15), rec("c", 1, 10)])  # our block is ahead
    assert not out_of_reach(me, 10, [rec("a", 0, 11), rec("b", 0, 15)])  # one block-mate a round ahead: reachable
    assert out_of_reach(me, 10, [rec("c", 1, 12)]) and not out_of_reach(me, 10, [rec("c", 1, 10)])  # no mates
    assert not out_of_reach(me, 10, [rec("x", 0, 50, swarm="other"), rec("me", 0, 50)])  # other swarms, ourselves
