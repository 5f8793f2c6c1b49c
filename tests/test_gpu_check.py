"""benchmarks/gpu_check.py on the CPU with tiny flags: its stages run for real and write the JSON it promises.

The fast tests run the train stage (a real BlockTrainer in the script's child process) and serving.py
--quick (a real subprocess), one of them on the generated corpus; a serving.py that fails is recorded
as that stage's error while the train stage still reports. The slow one adds the two-daemon swarm
(LocalSwarm, hivemind DHT) and checks both peers reached their rounds.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
TINY_TRAIN = [
    "--device", "cpu", "--blocks", "3", "--layers-per-block", "1", "--d-model", "32", "--n-heads", "2",
    "--seq-len", "32", "--batch-size", "4", "--warmup-steps", "1", "--train-steps", "3", "--threads", "1",
]  # fmt: skip
TINY_SWARM = ["--swarm-d-model", "32", "--swarm-seq-len", "32", "--swarm-rounds", "2", "--swarm-steps", "4"]
TINY_SERVING = ["--serving-quick"]


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(args: list[str], out: Path, env_drop: tuple[str, ...] = (), timeout: float = 240) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in env_drop}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "wrote" in proc.stdout
    return json.loads(out.read_text())


def check_common(result: dict, stages: set[str]) -> None:
    assert set(result["stages"]) == stages
    assert result["device"]["requested"] == "cpu"
    assert result["device"]["torch"] and result["device"]["name"]
    assert result["seed_figures"]["active_adamw_gib"] == 0.198
    assert 0 < result["seconds"] < result["budget_s"]
    for stage in result["stages"].values():
        assert stage["seconds"] > 0 and stage["budget_s"] > 0


def check_train(t: dict) -> None:
    assert t["ok"], t.get("error")
    assert t["device"] == "cpu" and t["autocast"] == "fp32 (none)"
    assert t["steps_timed"] == 3 and t["tokens_per_s"] > 0 and t["median_step_s"] > 0
    assert t["peak_memory_bytes"] >= 0 and "RSS" in t["peak_memory_kind"]
    adamw = t["adamw_state_bytes"]
    # fp32 params, and grads and both moments of those the step reached (modules the block does not
    # run, e.g. block 0's predecessor projection, get no grad and no AdamW state): at most 16 bytes each
    assert adamw["params"] == 4 * adamw["trainable_params"] > 0
    assert 2 * adamw["grads"] == adamw["moments"] > 0
    assert adamw["total"] <= 16 * adamw["trainable_params"]
    assert 0 < t["adamw_state_gib"] <= t["model_info_active_adamw_gib"]
    assert math.isfinite(t["ce_first"]) and math.isfinite(t["ce_last"])


def check_serving(s: dict) -> None:
    assert s["ok"], s.get("error")
    assert s["complete"] and s["returncode"] == 0 and not s["timed_out"]
    h = s["headline"]
    assert h["requested_delay_ms"] == 50 and h["delay_ms"] == 5  # --quick measures 0 and 5 ms only
    assert h["one_sweep_tok_s"] > 0 and h["ar_tok_s"] > 0 and h["ratio"] > 1
    assert {r["delay_ms"] for r in s["traversal"]} == {0, 5}


def test_pick_ratio_and_printed_lines():
    gc = load_script()
    printed = (
        "traversal delay   0 ms   128 bytes: one sweep    379.9 tok/s  AR    22.8 tok/s  ratio   16.6x\n"
        "traversal delay  50 ms    64 bytes: one sweep    144.5 tok/s  AR     4.3 tok/s  ratio   33.9x\n"
        "traversal delay  50 ms   128 bytes: one sweep    311.0 tok/s  AR     4.4 tok/s  ratio   70.0x\n"
    )
    rows = gc.traversal_rows(None, printed)
    assert len(rows) == 3
    h = gc.pick_ratio(rows, 50.0)
    assert (h["delay_ms"], h["output_bytes"], h["ratio"], h["meets_goal"]) == (50, 128, 70.0, False)
    assert gc.pick_ratio(rows[:1], 50.0)["delay_ms"] == 0  # no 50 ms row: the largest delay measured
    failed = gc.run_stage("x", lambda budget: 1 / 0, 5.0)
    assert not failed["ok"] and failed["error"].startswith("ZeroDivisionError") and failed["budget_s"] == 5.0


def test_train_and_serving_on_generated_corpus(tmp_path):
    out = tmp_path / "gpu_check.json"
    result = run_script([*TINY_TRAIN, *TINY_SERVING, "--stages", "train,serving"], out, env_drop=("BLOCKTRAIN_DATA",))
    check_common(result, {"train", "serving"})
    assert result["data"].startswith("generated")
    assert result["ok"]
    check_train(result["stages"]["train"])
    check_serving(result["stages"]["serving"])


def test_failing_stage_is_recorded_and_the_rest_runs(tmp_path, text_data):
    out = tmp_path / "gpu_check.json"
    args = [*TINY_TRAIN, "--data-dir", str(text_data), "--stages", "train,serving", "--serving-args=--no-such"]
    result = run_script(args, out)
    assert not result["ok"]
    check_train(result["stages"]["train"])
    serving = result["stages"]["serving"]
    assert not serving["ok"] and "exited with 2" in serving["error"]


@pytest.mark.slow
@pytest.mark.swarm
def test_all_three_stages(tmp_path, text_data):
    out = tmp_path / "gpu_check.json"
    result = run_script([*TINY_TRAIN, *TINY_SWARM, *TINY_SERVING, "--data-dir", str(text_data)], out)
    check_common(result, {"train", "swarm", "serving"})
    check_train(result["stages"]["train"])
    check_serving(result["stages"]["serving"])
    s = result["stages"]["swarm"]
    assert s["ok"], s.get("error")
    assert s["devices"] == ["cpu", "cpu"] and s["layout"] == "1 block(s) x 2 replica(s)"
    assert s["reached_rounds"] and all(p["round"] >= 2 and p["round_lines"] >= 2 for p in s["peers"])
    assert 0 < s["participation"] <= 1
    assert s["ce_went_down"] and s["from_noise_ce_after"] < s["from_noise_ce_before"]
    assert result["ok"]
