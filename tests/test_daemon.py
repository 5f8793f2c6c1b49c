"""Real daemons on 127.0.0.1 (ephemeral ports), real gRPC, real hivemind DHT where marked.

Each test drives daemons in one event loop inside `async with running(...)` (swarm_utils): start,
serve for a bounded number of rounds (or call run_round directly), assert; the daemons are shut
down in reverse order whatever happens.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace

import pytest
import torch
from swarm_utils import daemon_config, link_static, running, trajectory_config, wait_until

from swarmd.averaging.compact import compact_decoding
from swarmd.averaging.state import relative_distance
from swarmd.errors import ConfigMismatch, DataError
from swarmd.protocol import PeerState
from swarmd.transport import PeerClient
from swarmd.v1 import swarm_pb2 as pb
from swarmd.wire import to_proto

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.swarm
def test_three_daemons_on_the_real_dht_complete_two_rounds_and_replicas_converge(tmp_path):
    reports: list[list] = []

    async def scenario():
        async with running(daemon_config(tmp_path, 0, seed=0, max_rounds=2, min_peers=3), reports=reports) as (d0,):
            multiaddrs = tuple(d0.discovery.multiaddrs())
            async with running(
                daemon_config(tmp_path, 0, seed=1, initial_peers=multiaddrs, max_rounds=2, min_peers=3),
                daemon_config(tmp_path, -1, seed=2, initial_peers=multiaddrs, max_rounds=2, min_peers=3, eval_every=1),
                reports=reports,
            ) as (d1, d2):
                daemons = [d0, d1, d2]
                await asyncio.wait_for(asyncio.gather(*(d.serve() for d in daemons)), 90)
        return daemons

    d0, d1, d2 = asyncio.run(scenario())
    assert d2.state.block_index == 1  # --block auto: block 1 had no throughput
    assert [d.state.round for d in (d0, d1, d2)] == [2, 2, 2]
    # same-block replicas drifted apart during local steps, and are bit-identical after each merge
    assert all(r.premerge_distance > 0 for r in reports[0])
    assert d0.state.block_hash == d1.state.block_hash
    assert relative_distance(d0.state.base_block, d1.state.base_block) == 0.0
    assert d0.state.emb_hash == d1.state.emb_hash == d2.state.emb_hash
    assert all(r.participation == 1.0 for log in reports for r in log)
    assert d0.metrics.consensus_distance == 0.0  # from d1's status sketch at the same round
    assert d0.metrics.bytes_sent > 0 and d0.metrics.bytes_received > 0
    assert (
        0 < d2.metrics.last_ce < 10 and d2.service.status().last_ce == d2.metrics.last_ce
    )  # pulled block 0, measured the assembled model


@pytest.mark.swarm
def test_client_mode_peer_gossips_without_a_server(tmp_path):
    reports: list[list] = []

    async def scenario():
        async with running(daemon_config(tmp_path, 0, seed=0, max_rounds=2, min_peers=2), reports=reports) as (server,):
            multiaddrs = tuple(server.discovery.multiaddrs())
            config = daemon_config(
                tmp_path, 0, seed=1, initial_peers=multiaddrs, client_mode=True, max_rounds=2, min_peers=2
            )
            async with running(config) as (client,):
                await asyncio.wait_for(asyncio.gather(server.serve(), client.serve()), 90)
        return server, client

    server, client = asyncio.run(scenario())
    assert client.server is None and client.service.status().address == "" and client.service.status().client_mode
    assert client.state.round == server.state.round == 2
    assert client.state.block_hash == server.state.block_hash and client.state.emb_hash == server.state.emb_hash
    assert all(r.accepted_block for r in reports[0])  # the server merged the client's delta (it was dialled)


def test_a_peer_killed_mid_round_does_not_stall_the_others(tmp_path):
    configs = [daemon_config(tmp_path, 0, seed=i, discovery="static", deadline_max_s=3.0) for i in range(3)]

    async def scenario():
        async with running(*configs) as daemons:
            addresses = [d.server.address for d in daemons]
            for d in daemons:
                d.discovery.addresses = addresses
            a, b, victim = daemons

            killed = []

            async def die(incoming):  # the victim's process "dies" while a caller streams to it
                if not killed:
                    killed.append(asyncio.create_task(victim.server.stop(0)))
                await asyncio.Event().wait()

            victim.gossip.handle_exchange = die
            try:
                start = time.monotonic()
                reports = await asyncio.wait_for(asyncio.gather(a.run_round(), b.run_round()), 30)
                return reports, time.monotonic() - start, a, b
            finally:
                if killed:
                    await asyncio.wait_for(killed[0], 10)
                    victim.server = None  # already gone

    (ra, rb), seconds, a, b = asyncio.run(scenario())
    assert seconds < 3.0 + 8.0  # deadline_max_s plus training and slack
    # whoever expected the victim (dialled it, or waited for its call) lost its contribution; a peer
    # that looked the swarm up after the victim died did not expect it at all
    assert ra.participation < 1.0 or rb.participation < 1.0
    assert len(ra.accepted_block) == 1 and len(rb.accepted_block) == 1  # a and b still averaged together
    assert a.state.block_hash == b.state.block_hash


def test_checkpoint_on_stop_and_resume_with_the_same_dir(tmp_path):
    async def first_run():
        async with running(daemon_config(tmp_path, 1, seed=0, discovery="static", checkpoint=True)) as (d,):
            task = asyncio.create_task(d.serve())
            try:
                await wait_until(lambda: d.state.round >= 2, 60, what="two rounds")
                d.gossip.standing.probation.observe(1, {"a-peer-it-knew"}, set())  # whom its standing knows
                d.stop()  # what SIGINT / SIGTERM do
                await asyncio.wait_for(task, 30)
            finally:
                if not task.done():
                    task.cancel()
        return d

    async def second_run():
        async with running(daemon_config(tmp_path, -1, seed=0, discovery="static", checkpoint=True)) as (d,):
            resumed = (
                d.state.round,
                d.state.block_hash,
                d.state.emb_hash,
                d.state.trainer.step_count,
                {k: v.clone() for k, v in d.state.trainer.opt.state_dict()["state"][0].items()},
            )
            knew.append(d.gossip.standing.probation.to_rows())
            await d.run_round()
            return resumed, d.state.round

    async def start_only(config):
        async with running(config):
            pass

    knew: list = []
    d = asyncio.run(first_run())
    body = json.loads((tmp_path / "ckpt0" / "config.json").read_text())
    assert body["kind"] == "swarm-peer" and body["block_index"] == 1 and body["round"] == d.state.round
    saved_opt = {k: v.clone() for k, v in d.state.trainer.opt.state_dict()["state"][0].items()}
    (round, block_hash, emb_hash, steps, opt_state), after = asyncio.run(second_run())
    assert (round, block_hash, emb_hash, steps) == (
        d.state.round,
        d.state.block_hash,
        d.state.emb_hash,
        d.state.trainer.step_count,
    )
    assert all(torch.equal(opt_state[k], saved_opt[k]) for k in saved_opt)  # AdamW moments survive a restart
    assert after == round + 1
    assert knew == [d.gossip.standing.probation.to_rows()] and knew[0][0][:4] == ["a-peer-it-knew", 1, 1, 1]
    with pytest.raises(ConfigMismatch, match="trains block 1, not --block 0"):
        asyncio.run(start_only(daemon_config(tmp_path, 0, seed=0, discovery="static", checkpoint=True)))


def test_bad_data_fails_before_anything_starts(tmp_path):
    cfg = replace(daemon_config(tmp_path, 0, discovery="hivemind"), data_path=str(tmp_path / "missing.txt"))

    async def start_only():
        async with running(cfg):
            pass

    with pytest.raises(DataError, match="does not exist"):
        asyncio.run(start_only())


def test_a_joiner_downloads_state_before_its_first_step_and_the_peer_serves_status_and_forward(tmp_path):
    async def scenario():
        async with running(daemon_config(tmp_path, 0, seed=0, discovery="static")) as (d0,):
            for _ in range(2):
                await d0.run_round()
            joiner = daemon_config(tmp_path, 0, seed=1, discovery="static", initial_peers=(d0.server.address,))
            async with running(joiner) as (d1,):
                before = d1.state.block_hash
                pulled = await d1.gossip.sync(await d1.records())
                client = PeerClient()
                try:
                    st = await client.status(d0.server.address, 5)
                    cfg = await client.swarm_config(d0.server.address, 5)
                    session = client.forward_session(d0.server.address, 10)
                    request = pb.ForwardRequest(
                        session_id="s",
                        block_index=0,
                        config_hash=d0.cfg.config_hash(),
                        context=to_proto(torch.randint(0, 256, (1, 4), dtype=torch.uint8)),
                        z=to_proto(torch.randn(1, 4, 32)),
                        sigma=5.0,
                        sigma_next=2.0,
                        start_position=0,
                    )
                    reply = await session.step(request)
                    await session.close()
                finally:
                    await client.close()
                return d0, d1, before, pulled, st, cfg, reply

    d0, d1, before, pulled, st, cfg, reply = asyncio.run(scenario())
    assert list(reply.z.shape) == [1, 4, 32] and reply.peer_id == d0.peer_id  # Forward is delegated to BlockServing
    assert pulled == ["block", "embedding"] and before != d0.state.block_hash
    assert (d1.state.round, d1.state.block_hash, d1.state.emb_hash) == (2, d0.state.block_hash, d0.state.emb_hash)
    assert (
        isinstance(st, pb.PeerStatus)
        and st.round == 2
        and st.block_index == 0
        and len(st.sketch) == 256
        and st.param_norm > 0
    )
    assert st.base_hash == d0.state.block_hash and st.emb_hash == d0.state.emb_hash
    assert PeerState.from_pb(st.state) in ("training", "averaging")
    assert cfg.config_hash == d0.cfg.config_hash() and json.loads(cfg.model_config_json)["d_model"] == 32


def test_trajectory_training_pulls_the_earlier_blocks_at_round_start(tmp_path):
    """--trajectory-prob 1: the block-2 peer trains on the sampler's own states, which needs the
    merged weights of blocks 0 and 1 from their peers; gradients stay in its own block."""

    async def scenario():
        # one pull a round: the round-start state stays (mid-round pulls: tests/test_predecessor_pulls.py); int8
        # pulls, each the same decoding of an unchanged state (along a chain: tests/test_pull_chain.py)
        configs = [trajectory_config(tmp_path, b, predecessor_pulls=1) for b in range(3)]
        configs = [replace(c, gossip=replace(c.gossip, pull_codec="int8")) for c in configs]
        async with running(*configs) as daemons:
            link_static(daemons)
            last = daemons[2]
            loaded = await last.load_predecessors()
            before = {b: {k: v.clone() for k, v in daemons[b].state.snapshot()[1].items()} for b in (0, 1)}
            await asyncio.wait_for(asyncio.gather(*(d.run_round() for d in daemons)), 60)
            return loaded, before, last

    loaded, before, last = asyncio.run(scenario())
    assert loaded == 2
    trainer = last.state.trainer
    assert trainer.train_cfg.trajectory_prob == 1.0 and sorted(trainer.others) == [0, 1]
    for b in (0, 1):  # the frozen copies are the predecessors' merged weights from the round start, as pulled
        pulled = compact_decoding(before[b], b)  # GossipConfig.pull_codec "int8" (swarmd.averaging.compact)
        for k in before[b]:
            assert torch.equal(trainer.others[b].state_dict()[k], pulled[k])
        assert all(p.grad is None for p in trainer.others[b].parameters())


def test_trajectory_training_without_a_predecessor_falls_back_to_noisy_targets(tmp_path):
    cfg = daemon_config(tmp_path, 1, blocks=3, seed=0, discovery="static")
    cfg = replace(cfg, train=replace(cfg.train, trajectory_prob=1.0))

    async def scenario():
        async with running(cfg) as (d,):
            loaded = await d.load_predecessors()
            await asyncio.wait_for(d.run_round(), 60)
            return loaded, d

    loaded, d = asyncio.run(scenario())
    assert loaded == 0 and d.state.trainer.train_cfg.trajectory_prob == 0.0 and d.state.round == 1


def test_daemon_config_round_trips_through_json_and_python_m_swarmd_refuses_a_bad_one(tmp_path):
    import subprocess
    import sys

    from swarmd.node.config import DaemonConfig

    cfg = daemon_config(tmp_path, 1, initial_peers=("127.0.0.1:1", "127.0.0.1:2"), discovery="static")
    assert DaemonConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**cfg.to_dict(), "block": 5}))
    out = subprocess.run(
        [sys.executable, "-m", "swarmd", "--config", str(bad)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2 and out.stderr.startswith("error: ") and "Traceback" not in out.stderr
    assert "block must be -1 (auto) or in [0, 2)" in out.stderr


def test_peers_without_a_peer_seed_draw_different_batches(tmp_path):
    configs = [replace(daemon_config(tmp_path, 0, discovery="static"), peer_seed=None) for _ in range(2)]

    async def scenario():
        async with running(*configs) as daemons:
            return [next(d.batches)[0] for d in daemons], [d.peer_id for d in daemons]

    (a, b), (id_a, id_b) = asyncio.run(scenario())
    assert id_a != id_b and not torch.equal(a, b)  # the seed comes from the peer id
