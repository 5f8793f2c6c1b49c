"""Recovery (issue 9 item 6): one-generation checkpoints, stale temp files, failing checkpoint writes.

Fast tests (default suite): a peer checkpoint is one generation, loaded whole or not at all, and a
crash mid-write leaves the previous one current; stale temp files and unnamed generation folders go
at start; an older flat checkpoint still loads; a failing write (ENOSPC) is one warning per round,
turns gRPC health NOT_SERVING after 3 in a row and SERVING again once a write succeeds, and the
daemon keeps running its rounds. The process-level tests (SIGTERM / SIGINT to the process group,
kill -9 leaves no orphan DHT process or p2pd) are slow: `python -m pytest -m slow tests/test_recovery.py`.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from swarmd.averaging.state import BlockState
from swarmd.core import checkpoint as ck
from swarmd.core.train import BlockTrainer
from swarmd.errors import CheckpointError
from swarmd.membership.quorum import diverged_majority, split_reference
from swarmd.membership.records import PeerRecord
from swarmd.node import checkpoints
from swarmd.tools.launch import LocalSwarm, process_group, wait_group_gone
from swarmd.transport import PeerClient
from tests.swarm_utils import batches, daemon_config, running, tiny_model, tiny_train, write_corpus


def _state(seed: int = 0) -> BlockState:
    return BlockState(BlockTrainer(tiny_model(2), tiny_train(seed), 0, "cpu", worker_seed=seed))


def _train_and_merge(st: BlockState, rounds: int = 1) -> None:
    stream = batches(0)
    for _ in range(rounds):
        st.train_steps(2, stream)
        block, emb = st.deltas()
        st.apply_merge(block, emb)


def _tensors_equal(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_a_peer_checkpoint_is_one_generation_named_by_config_json(tmp_path):
    st = _state()
    _train_and_merge(st)
    st.save(tmp_path)
    body = json.loads((tmp_path / "config.json").read_text())
    gen = tmp_path / body["generation"]
    assert gen.is_dir() and sorted(body["files"]) == sorted(p.name for p in gen.iterdir())
    assert ck.block_file(tmp_path, 0).parent == gen and ck.optim_file(tmp_path, 0).parent == gen
    _train_and_merge(st)
    st.save(tmp_path)
    gens = [p for p in tmp_path.iterdir() if p.name.startswith(ck.GENERATION_PREFIX)]
    assert len(gens) == 1 and gens[0].name == json.loads((tmp_path / "config.json").read_text())["generation"]
    fresh = _state(seed=1)
    fresh.restore(tmp_path)
    assert fresh.round == st.round == 2 and fresh.local_steps == st.local_steps
    assert _tensors_equal(fresh.snapshot()[1], st.snapshot()[1])


def test_a_crash_mid_write_keeps_the_previous_generation_whole(tmp_path, monkeypatch):
    st = _state()
    _train_and_merge(st)
    st.save(tmp_path)
    saved_round, saved_block, saved_steps = st.round, st.snapshot()[1], st.local_steps
    _train_and_merge(st)
    real = ck.save_tensors

    def dies_at_the_optimizer(path, tensors, metadata=None):
        if path.name.startswith("optim_"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, tensors, metadata)

    monkeypatch.setattr(ck, "save_tensors", dies_at_the_optimizer)
    with pytest.raises(OSError):
        st.save(tmp_path)
    monkeypatch.setattr(ck, "save_tensors", real)
    fresh = _state(seed=1)
    fresh.restore(tmp_path)
    assert fresh.round == saved_round and fresh.local_steps == saved_steps
    assert _tensors_equal(fresh.snapshot()[1], saved_block)
    step = max(int(s["step"]) for s in fresh.trainer.opt.state_dict()["state"].values())
    assert step == saved_steps  # the optimizer is of the same generation as the weights


def test_a_corrupt_generation_file_refuses_the_whole_checkpoint(tmp_path):
    st = _state()
    _train_and_merge(st)
    st.save(tmp_path)
    emb = ck.embedding_file(tmp_path)
    data = bytearray(emb.read_bytes())
    data[-1] ^= 0xFF
    emb.write_bytes(bytes(data))
    fresh = _state(seed=1)
    before = fresh.snapshot()
    with pytest.raises(CheckpointError, match=r"embedding\.safetensors is corrupt"):
        fresh.restore(tmp_path)
    after = fresh.snapshot()
    assert after[0] == before[0] == 0 and _tensors_equal(after[1], before[1]) and _tensors_equal(after[2], before[2])
    ck.optim_file(tmp_path, 0).unlink()
    with pytest.raises(CheckpointError, match=r"missing|corrupt"):
        _state(seed=1).restore(tmp_path)


def test_an_older_flat_checkpoint_still_loads_and_the_next_save_moves_it_to_a_generation(tmp_path):
    st = _state()
    _train_and_merge(st, rounds=2)
    _, block, emb = st.snapshot()
    ck.save_optimizer(tmp_path, 0, st.trainer.opt, st.local_steps)  # the layout before generations
    ck.save_block(tmp_path, st.cfg, 0, block, st.local_steps)
    ck.save_embedding(tmp_path, st.cfg, emb)
    ck.write_config(tmp_path, st.cfg, st.train_cfg, kind=ck.PEER_KIND, block_index=0, round=st.round, samples=0)
    fresh = _state(seed=1)
    fresh.restore(tmp_path)
    assert fresh.round == 2 and _tensors_equal(fresh.snapshot()[1], block)
    fresh.save(tmp_path)
    assert not (tmp_path / "block_000.safetensors").exists()  # superseded by the generation
    again = _state(seed=2)
    again.restore(tmp_path)
    assert again.round == 2 and _tensors_equal(again.snapshot()[1], block)


def test_clean_stale_removes_temp_files_and_unnamed_generations_only(tmp_path):
    st = _state()
    st.save(tmp_path)
    current = tmp_path / json.loads((tmp_path / "config.json").read_text())["generation"]
    tmp_files = [tmp_path / ".block_000.safetensors.x1.tmp", current / ".embedding.safetensors.x2.tmp"]
    orphan = tmp_path / f"{ck.GENERATION_PREFIX}00000007-abcdef"
    orphan.mkdir()
    (orphan / "block_000.safetensors").write_bytes(b"half")
    for f in tmp_files:
        f.write_bytes(b"partial")
    keep = tmp_path / "peer.key"
    keep.write_bytes(b"key")
    removed = ck.clean_stale(tmp_path)
    assert set(removed) == {tmp_files[0], orphan}
    assert not tmp_files[0].exists() and not orphan.exists() and keep.exists() and current.is_dir()
    _state(seed=1).restore(tmp_path)  # still loads


def test_failing_checkpoint_writes_warn_once_per_round_flip_health_and_recover(tmp_path, monkeypatch, caplog):
    cfg = daemon_config(tmp_path, 0, blocks=1, discovery="static", checkpoint=True, max_rounds=0)
    asyncio.run(_failing_writes(cfg, monkeypatch, caplog))
    assert not list(Path(cfg.checkpoint_dir).glob(".*.tmp"))


async def _failing_writes(cfg, monkeypatch, caplog) -> None:
    health = PeerClient()
    try:
        async with running(cfg) as (d,):
            Path(cfg.checkpoint_dir).mkdir(parents=True, exist_ok=True)
            (Path(cfg.checkpoint_dir) / ".config.json.abc.tmp").write_bytes(b"")  # removed on the next start
            real = d.state.save
            full = OSError(errno.ENOSPC, "No space left on device")

            def disk_full(*args, **kwargs):
                raise full

            monkeypatch.setattr(d.state, "save", disk_full)
            caplog.set_level(logging.WARNING, logger=checkpoints.__name__)
            statuses = []
            for _ in range(checkpoints.CHECKPOINT_FAILURES_UNHEALTHY):
                caplog.clear()
                assert await d.save_checkpoint() is False
                lines = [r for r in caplog.records if "not written" in r.getMessage()]
                assert len(lines) == 1 and lines[0].exc_info is None and "No space left" in lines[0].getMessage()
                statuses.append(await health.health(d.address))
            assert statuses == ["SERVING", "SERVING", "NOT_SERVING"]
            report = await d.run_round()  # a round still trains and merges while writes fail
            assert report is not None and await health.health(d.address) == "NOT_SERVING"
            monkeypatch.setattr(d.state, "save", real)
            assert await d.save_checkpoint() is True
            assert await health.health(d.address) == "SERVING" and d.checkpoints.failures == 0
    finally:
        await health.close()
    async with running(replace(cfg, max_rounds=1)) as (d2,):
        assert d2.state.round == 1


# -- processes (slow) -------------------------------------------------------------------------------
@pytest.fixture
def one_daemon(tmp_path):
    data = write_corpus(tmp_path)
    swarm = LocalSwarm(1, tiny_model(1), data, tmp_path, rounds=0, steps_per_round=2, batch_size=4)
    with swarm:
        swarm.start(timeout_s=120)
        p = swarm.peers[0]
        deadline = time.monotonic() + 120
        while len(p.rounds_seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)  # polling its printed round lines, with a deadline
        assert len(p.rounds_seen) >= 2, swarm.tail(p)
        comms = [c.split()[1] for c in process_group(p.process.pid)]
        assert "p2pd" in comms and comms.count("python") == 2, comms  # daemon, its DHT process, p2pd
        yield swarm, p


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_process_group_ends_the_daemon_within_seconds(one_daemon, sig):
    swarm, p = one_daemon
    started = time.monotonic()
    os.killpg(p.process.pid, sig)
    p.process.wait(timeout=30)
    took = time.monotonic() - started
    assert wait_group_gone(p.process.pid, 5.0) == []
    assert took < 10.0, f"exited after {took:.1f}s: {swarm.tail(p)}"
    assert p.process.returncode == 0 and "Traceback" not in p.log_path.read_text(errors="replace")


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["daemon", "dht"])
def test_kill_9_leaves_no_orphan_dht_process_or_p2pd(one_daemon, victim):
    """kill -9 of the daemon alone: its DHT process and p2pd end within seconds (watch thread); kill -9 of the
    DHT process alone (an OOM kill): its p2pd ends (parent-death signal)."""
    _, p = one_daemon
    pgid = p.process.pid
    members = {c.split()[1]: int(c.split()[0]) for c in process_group(pgid) if int(c.split()[0]) != pgid}
    os.kill(pgid if victim == "daemon" else members["python"], signal.SIGKILL)
    if victim == "daemon":
        p.process.wait(timeout=10)
        assert wait_group_gone(pgid, 10.0) == []
    else:
        deadline = time.monotonic() + 10
        while any(c.endswith("p2pd") for c in process_group(pgid)) and time.monotonic() < deadline:
            time.sleep(0.1)  # polling for p2pd to end, with a deadline
        assert not any(c.endswith("p2pd") for c in process_group(pgid)), process_group(pgid)


@pytest.mark.slow
def test_a_dht_process_killed_alone_is_restarted_and_the_peer_finds_the_swarm_again(tmp_path):
    """kill -9 of a daemon's DHT process alone (an OOM kill): the daemon notices within an announce period,
    starts its DHT again (same identity and port), and merges with the other peer again."""
    data = write_corpus(tmp_path)
    swarm = LocalSwarm(2, tiny_model(1), data, tmp_path, rounds=0, steps_per_round=2, batch_size=4)
    with swarm:
        swarm.start(timeout_s=120)
        deadline = time.monotonic() + 120
        while any(len(p.rounds_seen) < 2 for p in swarm.peers) and time.monotonic() < deadline:
            time.sleep(0.1)  # polling the printed round lines, with a deadline
        p = swarm.peers[1]
        pgid = p.process.pid
        dht = [int(c.split()[0]) for c in process_group(pgid) if int(c.split()[0]) != pgid and c.split()[1] == "python"]
        assert len(dht) == 1, process_group(pgid)
        os.kill(dht[0], signal.SIGKILL)
        killed = time.time()
        deadline = time.monotonic() + 90

        def merged_again() -> bool:
            hist = _history_since(p, killed)
            return "restarted" in p.log_path.read_text(errors="replace") and any(
                h["expected"] == 2 and h["accepted"] == 2 and h["at_s"] for h in hist
            )

        while not merged_again() and time.monotonic() < deadline:
            time.sleep(0.5)  # polling the log and the checkpointed round history, with a deadline
        comms = [c.split()[1] for c in process_group(pgid)]
        assert merged_again(), swarm.tail(p, 8)
        assert comms.count("python") == 2 and "p2pd" in comms, comms  # daemon, its new DHT process, p2pd
        assert p.alive() and "Traceback" not in p.log_path.read_text(errors="replace")


# -- re-sync after a partition ----------------------------------------------------------------------
def _rec(peer: str, round: int, base: str, address: str = "h:1") -> PeerRecord:
    return PeerRecord(peer, address, 0, round, 1.0, "cfg", base, False, "s", "e")


def test_a_peer_that_ran_ahead_alone_rejoins_the_majority_it_split_from():
    me = _rec("c", 50, "mine")
    majority = [_rec("a", 38, "theirs"), _rec("b", 38, "theirs")]
    history = {r: f"mine{r}" for r in range(35, 51)}
    assert diverged_majority(me, majority, history) == majority[1]  # highest-ranked of the group
    assert diverged_majority(me, majority, {**history, 38: "theirs"}) is None  # only lagging on our trajectory
    assert diverged_majority(me, [majority[0], _rec("b", 38, "other")], history) is None  # no majority
    two_groups = [*majority, _rec("d", 40, "x"), _rec("e", 40, "x")]
    assert diverged_majority(me, two_groups, history) is None  # 2 of 5 is not more than half
    assert diverged_majority(me, [_rec("a", 38, "theirs", ""), _rec("b", 38, "theirs", "")], history) is None


def test_of_two_equal_sides_of_a_split_round_exactly_one_moves():
    """Last round's signed deltas: 2 peers on base X, 2 on base Y. Each side counts itself: the side without the
    highest-ranked peer moves, the other stays (both moving would swap the split instead of healing it)."""
    peers = {p: _rec(p, 9, "x" if p in "ab" else "y") for p in "abcd"}

    def moves(me: str) -> str | None:
        same = {p for p in "abcd" if p != me and peers[p].base_hash == peers[me].base_hash}
        other = {p: peers[p].base_hash for p in "abcd" if p != me and p not in same}
        target = split_reference(peers[me], [r for p, r in peers.items() if p != me], same, other)
        return target.peer_id if target else None

    assert [moves(p) for p in "abcd"] == ["d", "d", None, None]


def test_a_split_rounds_majority_stays_and_strays_on_bases_of_their_own_move_nobody():
    pool = [_rec("a", 9, "x"), _rec("b", 9, "x"), _rec("c", 9, "y"), _rec("d", 9, "z")]
    me = _rec("e", 9, "x")
    assert split_reference(me, pool, {"a", "b"}, {"c": "y", "d": "z"}) is None  # 3 on ours, strays 1 and 1
    lone = _rec("c", 9, "y")
    others = [r for r in pool if r.peer_id != "c"] + [me]
    assert split_reference(lone, others, set(), {"a": "x", "b": "x", "e": "x", "d": "z"}).peer_id == "e"
    assert split_reference(lone, others, set(), {"d": "z"}) is None  # one stray signer is no quorum
    assert split_reference(_rec("d", 9, "z"), pool[:2], set(), {"a": "x", "b": "x"}).peer_id == "b"


def test_a_part_in_pieces_moves_to_its_largest_piece_in_one_round():
    """Eight byte tables in pieces 2 + 2 + 1 + 1 + 1 + 1 (no quorum of 4 anywhere): the quorum rule alone moved
    nobody and the pieces merged apart for good; with the records showing no quorum, every piece but the largest,
    highest-ranked one moves to it, and a majority the records do show is never moved by 2 signers."""
    bases = {"a": "x", "b": "x", "c": "y", "d": "y", "e": "e", "f": "f", "g": "g", "h": "h"}
    peers = {p: _rec(p, 9, b) for p, b in bases.items()}

    def moves(me: str, fragmented: bool) -> str | None:
        same = {p for p in bases if p != me and bases[p] == bases[me]}
        other = {p: bases[p] for p in bases if p != me and p not in same}
        pool = [r for p, r in peers.items() if p != me]
        target = split_reference(peers[me], pool, same, other, fragmented=fragmented)
        return target.peer_id if target else None

    assert [moves(p, fragmented=False) for p in bases] == [None] * 8  # pieces of 2 are no quorum of 7 others
    assert [moves(p, fragmented=True) for p in bases] == ["d", "d", None, None, "d", "d", "d", "d"]  # "d" ranks top
    assert split_reference(peers["e"], list(peers.values()), set(), {"f": "f"}, fragmented=True) is None  # 1 signer


def _history_since(p, since: float) -> list[dict]:
    """A peer's checkpointed round history after the wall-clock time `since`."""
    try:
        body = json.loads((p.checkpoint_dir / "config.json").read_text())
    except (OSError, ValueError):
        return []
    return [h for h in body.get("history", []) if body["started_wall"] + h["at_s"] > since]


@pytest.mark.slow
def test_a_partition_of_30_s_heals_within_a_minute(text_data, tmp_path):
    from tests.netns_utils import NetnsLab, NetnsSwarm, NetnsUnavailable, _ip, unavailable

    if unavailable():
        pytest.skip(unavailable() or "")
    try:
        lab = NetnsLab(3).create()
    except NetnsUnavailable as exc:
        pytest.skip(f"cannot create network namespaces here: {exc}")
    try:
        swarm = NetnsSwarm(
            lab,
            tiny_model(1),
            text_data / "train.txt",
            tmp_path,
            rounds=0,
            steps_per_round=3,
            batch_size=4,
            deadline_max_s=10.0,
            swarm_id="partition",
        )
        with swarm:
            swarm.start(timeout_s=180)
            swarm.wait_rounds(3, timeout_s=180)
            _ip("-n", lab.bridge, "link", "set", "h2", "down")  # host 2 is cut off
            time.sleep(30)  # the partition itself: 30 s of link down (the scenario, not a wait on a condition)
            _ip("-n", lab.bridge, "link", "set", "h2", "up")
            healed, deadline = time.time(), time.monotonic() + 60
            full = lambda p: any(h["expected"] == 4 and h["accepted"] == 4 for h in _history_since(p, healed))
            while not all(full(p) for p in swarm.peers) and time.monotonic() < deadline:
                time.sleep(0.5)  # polling the peers' checkpointed round history, with a deadline
            assert all(full(p) for p in swarm.peers), [swarm.tail(p) for p in swarm.peers]
    finally:
        lab.destroy()


def test_a_process_entry_point_ends_within_the_grace_even_with_a_thread_still_blocked():
    """runner.arm_process_end: a worker thread stuck after the shutdown (a DHT or disk call in flight) does not keep
    `python -m swarmd` / `blocktrain run` alive; without end_process_after_shutdown (tests, in-process) nothing ends."""
    import subprocess
    import sys

    script = (
        "import threading, time\n"
        "from swarmd.node import runner\n"
        "runner.end_process_after_shutdown()\n"
        "threading.Thread(target=time.sleep, args=(600,)).start()  # non-daemon: the interpreter would wait\n"
        "runner.arm_process_end()\n"
        "print('armed', flush=True)\n"
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "armed" in done.stdout, done.stderr
    assert time.monotonic() - started < 30  # EXIT_GRACE_S after arming, not the thread's 600 s
    assert "ending the process" in done.stderr and "Traceback" not in done.stderr
    from swarmd.node import runner

    assert runner._end_process is False  # this test process never armed itself
