"""benchmarks/replica_sim.py --sync-dp: the swarm against one replica at K x the batch.

The row's arithmetic (best of the sweep, excess in percent, both efficiencies, the sweep-edge flag) on
made-up figures; then one tiny real run (d=16, seq 16, one round of two steps) that writes the JSON rows
with the promised keys beside the rows already there, and its markdown section with the command; a rerun
replaces its own rows instead of adding copies.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "--blocks", "2", "--d-model", "16", "--seq-len", "16", "--rounds", "1", "--steps", "2",
    "--batch-size", "2", "--eval-tokens", "64", "--eval-every", "1",
]  # fmt: skip
KEYS = {"K", "steps_per_replica", "ce", "sync_dp_ce", "excess_pct", "efficiency"}


@pytest.fixture(scope="module")
def rs():
    spec = importlib.util.spec_from_file_location("replica_sim", ROOT / "benchmarks" / "replica_sim.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def data(tmp_path) -> Path:
    """A tiny train.txt / eval.txt folder."""
    folder = tmp_path / "data"
    folder.mkdir()
    text = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(200))
    (folder / "train.txt").write_text(text)
    (folder / "eval.txt").write_text(text[::-1])
    return folder


def sweep(*ces: float) -> list[dict]:
    return [{"lr_mult": m, "lr_abs": 3e-3 * m, "ce": c} for m, c in zip((1.0, 1.41, 2.0), ces, strict=False)]


def test_summary_picks_the_best_lr_and_counts_excess_and_efficiency(rs):
    single = [(200, 2.4), (400, 2.2), (800, 2.0)]
    row = rs.sync_dp_summary(4, {"steps_per_replica": 200, "ce": 2.2}, sweep(2.15, 2.0, 2.1), single)
    assert set(row) >= KEYS
    assert row["sync_dp_ce"] == 2.0 and row["sync_dp_lr_mult"] == 1.41 and not row["sync_dp_lr_at_edge"]
    assert row["excess_pct"] == pytest.approx(10.0)
    assert row["efficiency"] == pytest.approx(400 / 800)  # the single replica reaches 2.2 at 400 steps
    assert row["sync_dp_efficiency"] == pytest.approx(800 / 800)
    assert not row["extrapolated"] and not row["sync_dp_extrapolated"]


def test_summary_flags_the_sweep_edge_and_goes_without_a_reference(rs):
    row = rs.sync_dp_summary(2, {"steps_per_replica": 200, "ce": 2.0}, sweep(2.3, 2.2, 2.1), [])
    assert row["sync_dp_lr_mult"] == 2.0 and row["sync_dp_lr_at_edge"]
    assert row["efficiency"] is None and row["sync_dp_efficiency"] is None
    assert row["excess_pct"] == pytest.approx(100 * (2.0 - 2.1) / 2.1)  # negative: the swarm is below sync DP


def test_parse_lrs(rs):
    assert rs.parse_lrs("1,1.41,2") == [1.0, 1.41, 2.0]
    for bad in ("", "1,x", "1,-2"):
        with pytest.raises(SystemExit):
            rs.parse_lrs(bad)


def test_defaults_keep_the_variant_outputs(rs, tmp_path):
    a = rs.parse_args(["--data-dir", str(tmp_path)])
    assert a.md.name == "BENCHMARKS.md" and not a.sync_dp
    a = rs.parse_args(["--data-dir", str(tmp_path), "--sync-dp"])
    assert a.md.name == "BENCHMARKS.md" and a.ks == [2, 4, 8] and a.sync_lrs == [1.0, 1.41, 2.0]


def test_tiny_sync_dp_run_writes_rows_and_section(rs, tmp_path, data):
    out, md = tmp_path / "rs.json", tmp_path / "rs.md"
    out.write_text(json.dumps({"rows": [{"label": "earlier"}], "single": {}}))
    argv = ["--data-dir", str(data), *TINY, "--sync-dp", "--ks", "2", "--sync-lrs", "1,2", "--out", str(out)]
    argv += ["--md", str(md)]
    rs.main(argv)
    rs.main(argv)  # a rerun replaces its rows
    result = json.loads(out.read_text())
    assert result["rows"] == [{"label": "earlier"}]
    assert result["single"] == {}  # the variants' reference is left alone; --sync-dp has its own
    assert list(result["sync_dp_single"]) == ["seed0_r1_H2_b2_lr0.003_B2_d16_seq16"]
    (row,) = result["sync_dp"]
    assert set(row) >= KEYS
    assert row["K"] == 2 and row["steps_per_replica"] == 2 and row["sync_dp_batch_size"] == 4
    assert [s["lr_mult"] for s in row["sync_dp_sweep"]] == [1.0, 2.0]
    assert row["sync_dp_ce"] == min(s["ce"] for s in row["sync_dp_sweep"])
    assert math.isfinite(row["efficiency"]) and math.isfinite(row["excess_pct"])
    section = md.read_text()
    assert "<!-- replica_sim.py sync-dp -->" in section and "python benchmarks/replica_sim.py" in section
    assert "--sync-dp --ks 2 --sync-lrs 1,2" in section


def test_swarm_variants_keep_the_steps_beside_sync_dp_at_their_h(rs, tmp_path, data):
    out, md = tmp_path / "rs.json", tmp_path / "rs.md"
    argv = ["--data-dir", str(data), *TINY, "--sync-dp", "--ks", "2", "--sync-lrs", "1", "--no-single"]
    rs.main([*argv, "--swarm-variants", "", "H=1,ra=1", "--out", str(out), "--md", str(md)])
    rows = json.loads(out.read_text())["sync_dp"]
    assert [r["swarm_variant"] for r in rows] == ["H=2, AdamW", "H=1, ReplicaAdamW"]
    assert {r["steps_per_replica"] for r in rows} == {2}  # H=1 runs twice the rounds
    assert [r["sync_dp_h"] for r in rows] == [2, 1]  # each swarm beside sync DP at its own H
    assert rows[0]["sync_dp_sweep"] != rows[1]["sync_dp_sweep"]
    assert rows[0]["ce"] != rows[1]["ce"]
    assert "H=1, ReplicaAdamW" in md.read_text()


def test_variant_h_and_replica_adam(rs):
    v = rs.parse_variant("K=4,H=5,ra=1")
    assert v["H"] == 5 and v["ra"] == 1 and rs.label(v).endswith("H=5 ReplicaAdamW")
    assert rs.swarm_label(rs.parse_variant("K=4"), 25) == "H=25, AdamW"


def test_variant_trajectory_keys_reach_the_train_config(rs, tmp_path, data, monkeypatch):
    v = rs.parse_variant("K=2,tp=0,pp=1")
    assert v["tp"] == 0.0 and v["pp"] == 1
    assert rs.swarm_label(v, 25) == "H=25, AdamW, trajectory prob 0, pulls 1"
    seen = []
    real = rs.SimConfig

    def spy(model, train, **kw):
        seen.append(train)
        return real(model, train, **kw)

    monkeypatch.setattr(rs, "SimConfig", spy)
    out, md = str(tmp_path / "o.json"), str(tmp_path / "o.md")
    rs.main(
        ["--data-dir", str(data), *TINY, "--variants", "K=2,tp=0,pp=1", "K=2", "--no-single", "--out", out, "--md", md]
    )
    assert (seen[0].trajectory_prob, seen[0].predecessor_pulls) == (0.0, 1)
    assert (seen[1].trajectory_prob, seen[1].predecessor_pulls) == (1.0, 1)  # the defaults when not named


def test_report_merges_the_rows_of_other_runs(rs, tmp_path, data):
    argv = ["--data-dir", str(data), *TINY, "--sync-dp", "--sync-lrs", "1", "--no-single"]
    a, b, md = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "rs.md"
    rs.main([*argv, "--ks", "2", "--out", str(a), "--md", str(md)])
    rs.main([*argv, "--ks", "3", "--out", str(b), "--md", str(tmp_path / "b.md")])
    rs.main([*argv, "--report", "--merge", str(b), "--out", str(a), "--md", str(md)])
    rows = json.loads(a.read_text())["sync_dp"]
    assert sorted(r["K"] for r in rows) == [2, 3]
    assert {r["command"] for r in rows} <= set(md.read_text().split("`"))  # each row's own command is listed
    with pytest.raises(SystemExit):
        rs.parse_args(["--data-dir", str(data), "--merge", str(b)])


def test_real_daemon_replica_rows_carry_sync_dp_at_k_times_the_batch(tmp_path, data, monkeypatch):
    """benchmarks/swarm.py --sync-lrs: for each K > 1 the reference is B daemons (one replica per block) at K x the
    batch and each lr multiple, run once per (K, multiple) whatever the outers, and the row carries the sync-DP
    keys. The daemons are swapped for a recorder here (the LocalSwarm runs themselves are the benchmark's)."""
    spec = importlib.util.spec_from_file_location("swarm_bench", ROOT / "benchmarks" / "swarm.py")
    sb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sb)
    calls = []

    def fake_run_swarm(a, cfg, codec, train_path, eval_xy, peers=None, rounds=None, **kw):
        calls.append({"peers": peers, "batch_size": kw.get("batch_size", a.batch_size), "lr": kw.get("lr", a.lr)})
        ce = 2.0 + 0.1 * (peers or 0) - kw.get("batch_size", a.batch_size) / 1000 - kw.get("lr", a.lr)
        keys = ("participation", "wall_s", "round_seconds_median", "wire_bytes_per_round_per_peer", "rejected")
        return {"swarm_ce": ce, **dict.fromkeys(keys, 1.0)}

    monkeypatch.setattr(sb, "run_swarm", fake_run_swarm)
    argv = ["--data-dir", str(data), "--only", "replicas", "--replicas", "2", "--outers", "none", "nesterov"]
    a = sb.parse_args([*argv, "--single-mults", "--sync-lrs", "1", "2", "--batch-size", "8", "--lr", "0.001"])
    cfg = sb.options.model_of(a)
    *_, section = sb.run_replicas(a, cfg, data / "train.txt", None, [], {})
    sync = [c for c in calls if c["batch_size"] == 16]
    assert [(c["peers"], c["lr"]) for c in sync] == [(cfg.blocks, 0.001), (cfg.blocks, 0.002)]  # once for both
    assert [c["peers"] for c in calls if c["batch_size"] == 8] == [2 * cfg.blocks] * 2  # the two swarms
    for row in section["rows"]:
        assert set(row) >= KEYS and row["K"] == 2
        assert row["sync_dp_lr_mult"] == 2 and row["sync_dp_ce"] == pytest.approx(2.0 + 0.3 - 0.016 - 0.002)
        assert row["excess_pct"] == pytest.approx(100 * (row["ce"] / row["sync_dp_ce"] - 1))
    a.replica_md = tmp_path / "replicas.md"
    sb.write_replica_md(a, section)
    assert "sync DP at K x the batch" in a.replica_md.read_text() and "+" in a.replica_md.read_text()


def test_cosine_rows_and_stored_runs_are_reused(rs, tmp_path, data, monkeypatch):
    """--cosine decays every run's inner lr (a row of its own beside the constant-lr one); the sync-DP and swarm
    runs land in "sync_dp_runs", so a second invocation (here through --sweeps-from) reruns none of them."""
    first, second, md = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "rs.md"
    argv = ["--data-dir", str(data), *TINY, "--sync-dp", "--ks", "2", "--sync-lrs", "1", "--no-single", "--md", str(md)]
    rs.main([*argv, "--cosine", "0.05", "--out", str(first)])
    rs.main([*argv, "--out", str(first)])  # the constant-lr row is another measurement, kept beside it
    rows = json.loads(first.read_text())["sync_dp"]
    assert sorted(r.get("cosine", 0) for r in rows) == [0, 0.05]
    runs = json.loads(first.read_text())["sync_dp_runs"]
    assert len(runs) == 4 and sum(key.startswith("swarm ") for key in runs) == 2

    def no_rerun(*args, **kw):
        raise AssertionError("a stored run was rerun")

    monkeypatch.setattr(rs, "run_one", no_rerun)
    rs.main([*argv, "--cosine", "0.05", "--out", str(second), "--sweeps-from", str(first)])
    (row,) = json.loads(second.read_text())["sync_dp"]
    cosine = next(r for r in rows if r.get("cosine"))
    assert row["ce"] == cosine["ce"] and row["sync_dp_ce"] == cosine["sync_dp_ce"]
    with pytest.raises(SystemExit):
        rs.parse_args(["--data-dir", str(data), "--cosine", "1.5"])


def test_section_commands_leave_out_the_run_caches(rs):
    cmd = "python benchmarks/replica_sim.py --sync-dp --sweeps-from /tmp/a.json /tmp/b.json --ks 2 --out r.json"
    assert rs.without_caches(cmd) == "python benchmarks/replica_sim.py --sync-dp --ks 2 --out r.json"
    assert rs.without_caches("python x.py --ks 2") == "python x.py --ks 2"
