"""The soak benchmark (benchmarks/soak.py): its plain logic here (the fault schedule, merging groups and splits,
stuck rounds, growth windows, /proc samples), and a 5-minute run of real daemons under churn in the slow suite."""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.harness.churn import FAULTS, Churn, draw_schedule
from benchmarks.harness.procs import Sampler, growth, proc_sample, windows
from benchmarks.harness.rounds import merge_groups, splits, stuck_rounds
from swarmd.tools.launch import PeerProc

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("BLOCKTRAIN_DATA", "/work/shared/data/wikitext-2"))


def test_the_fault_schedule_is_seeded_spaced_within_bounds_and_ends_before_the_run():
    a = draw_schedule(7, 3600, (60, 180))
    assert a == draw_schedule(7, 3600, (60, 180)) and a != draw_schedule(8, 3600, (60, 180))
    times = [0.0] + [f["t"] for f in a]
    assert all(59.9 <= b - x <= 180.1 for x, b in itertools.pairwise(times))
    assert times[-1] < 3600 and 3600 - times[-1] <= 180
    assert 20 <= len(a) <= 60
    kinds = [f["kind"] for f in a]
    assert all(sorted(kinds[i : i + 6]) == sorted(FAULTS) for i in range(0, len(kinds) - 5, 6))  # each six: every kind
    assert draw_schedule(0, 30, (60, 180)) == []


def test_merge_groups_join_sets_that_share_a_peer():
    assert merge_groups([["a", "b"], ["b", "c"], ["c"]]) == [["a", "b", "c"]]
    assert merge_groups([["a", "b"], ["a", "b"], ["c", "d"], ["d"]]) == [["a", "b"], ["c", "d"]]
    assert merge_groups([["x"], ["a", "b", "c"]]) == [["a", "b", "c"], ["x"]]  # a peer that merged alone


def test_splits_are_runs_of_rounds_with_disjoint_groups_and_those_over_three_rounds_are_unhealed():
    one, two = [["a", "b"], ["a", "b"]], [["a"], ["b"]]
    rounds = {1: one, 2: two, 3: one, 4: two, 5: two, 6: two, 7: two, 8: one, 10: two}
    found = splits(rounds)
    assert [(s["first_round"], s["rounds"], s["healed"], s["unhealed"]) for s in found] == [
        (2, 1, True, False),
        (4, 4, True, True),
        (10, 1, False, False),  # the last round seen: not (yet) healed, not over three rounds
    ]
    assert found[0]["groups"] == [["a"], ["b"]]
    assert splits({1: one, 2: one}) == []
    # a gap in the rounds seen ends a run without saying it healed
    assert [(s["rounds"], s["healed"]) for s in splits({1: two, 3: one})] == [(1, False)]


def test_stuck_rounds_time_a_process_s_rounds_from_its_previous_round_and_excuse_its_pauses():
    processes = {(0, 100.0): [(1, 10.0), (2, 20.0), (3, 60.0), (4, 70.0)], (1, 100.0): [(1, 10.0), (2, 55.0)]}
    stuck, excused = stuck_rounds(processes, 30.0, {1: [(15.0, 45.0)]})
    assert stuck == [{"peer": 0, "round": 3, "seconds": 40.0, "t": 60.0}]
    assert excused == [{"peer": 1, "round": 2, "seconds": 45.0, "t": 55.0}]
    assert stuck_rounds({(2, 0.0): [(5, 300.0)]}, 30.0) == ([], [])  # a process's first round is not timed


def test_growth_compares_the_last_window_with_the_first_after_the_warm_up():
    values = [(float(t), 100.0 if t < 50 else 110.0) for t in range(0, 100)]
    w = windows(values, 10, 20)
    assert w is not None and w[0] == [100.0] * 20 and w[1] == [110.0] * 20
    g = growth(values, 10, 20)
    assert g is not None and g["change"] == 10.0 and g["pct"] == pytest.approx(10.0)
    assert growth(values[:45], 10, 20) is None  # too short for two windows after the warm-up
    assert growth([], 10, 20) is None


def test_the_sampler_reads_proc_and_starts_a_series_per_process():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        s = Sampler()
        with socket.socket() as held:  # a socket of ours: an fd, not one of the other fds
            s.sample({"peer0": child.pid, "me": os.getpid()}, 0.0)
            assert held.fileno() >= 0
        s.sample({"peer0": child.pid}, 1.0)
        one = s.series[child.pid]
        assert one.name == "peer0#0" and len(one.samples) == 2
        _, rss, fds, threads, group_rss, other_fds = one.samples[0]
        assert rss > 0 and fds >= 3 and threads >= 1 and group_rss >= rss and other_fds == fds  # it holds no socket
        mine = s.series[os.getpid()]
        assert mine.name == "me#0" and mine.samples[0][5] < mine.samples[0][2]
    finally:
        child.kill()
        child.wait(timeout=10)
    deadline = time.monotonic() + 10
    while proc_sample(child.pid) is not None and time.monotonic() < deadline:
        time.sleep(0.05)  # polling /proc for the reaped child, with a deadline
    assert proc_sample(child.pid) is None


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]


def _wait(what, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not what() and time.monotonic() < deadline:
        time.sleep(0.05)  # polling a process's state, with a deadline
    return bool(what())


class _Peers:
    """The little of a LocalSwarm that Churn's choices read: its peers (sleeping processes) and its model's blocks."""

    def __init__(self, tmp: Path, blocks_of: list[int]):
        self.model = type("M", (), {"blocks": max(blocks_of) + 1})()
        self.workdir, self.peers = tmp, []
        for i, b in enumerate(blocks_of):
            p = PeerProc(i, b, tmp / f"peer{i}", tmp / f"peer{i}.log")
            p.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
            p.ready.set()
            self.peers.append(p)

    def tail(self, p: PeerProc) -> str:
        return ""


def test_churn_never_takes_the_last_peer_of_a_block_nor_grows_past_its_bound_and_pauses_end(tmp_path):
    sw = _Peers(tmp_path, [0, 1, 0])  # block 1 has one peer; peer 0 takes only the bootstrap fault
    try:
        churn = Churn(sw, min_peers=1, max_peers=3, pause_s=30.0)  # type: ignore[arg-type]
        paused = churn.inject("pause", 0.0)
        assert paused["peer"] == 2 and _wait(lambda: _state(sw.peers[2].process.pid) == "T")
        # peer 2 paused: block 0 has peer 0 alone up, block 1 peer 1: nobody may go down now
        assert churn.inject("kill9_restart", 1.0)["kind"] == "none"
        assert churn.inject("bootstrap_kill", 2.0)["kind"] == "none"
        churn.tick(10.0)
        assert _state(sw.peers[2].process.pid) == "T"
        churn.tick(30.0)
        assert _wait(lambda: _state(sw.peers[2].process.pid) != "T") and churn.paused == {2: [(0.0, 30.0)]}
        left = churn.inject("join", 31.0)  # three peers up, the bound: a peer leaves instead
        assert (left["kind"], left["drawn"], left["peer"]) == ("leave", "join", 2)
        assert _wait(lambda: sw.peers[2].process.poll() is not None)
        churn.tick(32.0)
        assert left["exit_code"] == -15 and churn.pending == [] and churn.lost_checkpoints == []
    finally:
        for p in sw.peers:
            p.process.kill()
            p.process.wait(timeout=10)


@pytest.mark.slow
def test_a_five_minute_soak_under_churn(tmp_path):
    if not (DATA / "train.txt").is_file():
        pytest.skip(f"no training text in {DATA}")
    import json

    out = tmp_path / "soak.json"
    cmd = [sys.executable, "benchmarks/soak.py", "--minutes", "5", "--fault-every", "0.6", "1.2"]
    proc = subprocess.run(
        [*cmd, "--data-dir", str(DATA), "--out", str(out), "--workdir", str(tmp_path / "w")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    for key in ("duration_s", "peers", "faults", "rounds", "stuck_rounds", "splits", "unhealed_splits"):
        assert key in r
    for key in ("rss_growth_pct", "fd_growth", "thread_growth", "lost_checkpoints", "ce_by_10_min", "config"):
        assert key in r
    assert r["duration_s"] >= 300 and r["rounds"]["max_round"] > 0
    assert sum(f["kind"] != "none" for f in r["faults"]) >= 2
    assert r["lost_checkpoints"] == [] and r["stuck_rounds"] == []
    assert r["stopped"]["all_stopped"], r["stopped"]
