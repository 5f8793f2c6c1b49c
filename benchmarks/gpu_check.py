"""GPU check: train one block on --device in bf16, a two-peer swarm with one peer there, serving.py at 50 ms.

Three stages, each timed and bounded (all together by --budget-s; a failed stage records its error and the next
runs): train (a real BlockTrainer in a child process, the GPU config by default: tokens/s, peak memory, the AdamW
state), swarm (two LocalSwarm daemons, peer 0 on --device and peer 1 on the CPU: rounds, participation, from-noise CE
before and after) and serving (benchmarks/serving.py: the one-sweep / AR tok/s ratio at --serving-delay-ms). Data:
--data-dir, else a stdlib corpus. Writes --out (benchmarks/results/gpu_check.json); BENCHMARKS.md#gpu_check.

    python benchmarks/gpu_check.py                     # the GPU config, on cuda
    python benchmarks/gpu_check.py --device cpu --d-model 64 --layers-per-block 1 --train-steps 3 \\
        --swarm-rounds 2 --swarm-steps 5 --serving-quick # a CPU smoke run

On the device machine (no internet, python3 3.12) carry in as .whl (carry=[".whl"]) what its image lacks: hivemind,
base58, configargparse, netaddr, prefetch_generator, py-cid, py-multihash, varint, pydantic, pydantic-core,
annotated-types, typing-inspection, cryptography, cffi, pycparser, zstandard, grpcio-health-checking,
grpcio-reflection; then `python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl`, and with
PYTHONPATH=/tmp/site: `python3 benchmarks/gpu_check.py --device cuda --out $OUT/gpu_check.json`. Without the wheels
the train stage still runs; the swarm and serving stages record their import errors.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from benchmarks.harness import options, results
from benchmarks.harness.procs import maxrss_bytes
from swarmd.core.config import ModelConfig, TrainConfig

GIB = 1024**3
ROOT = Path(__file__).resolve().parent.parent
SERVING = ROOT / "benchmarks" / "serving.py"
SEED_FIGURES = {
    "config": "B=3, L_b=4, d=512",
    "observed_peak": "a few GiB",
    "active_adamw_gib": 0.198,
    "serving_ratio_2_cpu_cores": 70.0,
    "serving_ratio_goal": 100.0,
}
STAGES = ("train", "swarm", "serving")
RESERVE_S = 10.0  # kept back from the budget for the stages' own teardown and writing the result
SPEC = ("batch_size", "block", "device", "dtype", "threads", "seed", "warmup_steps", "train_steps")  # the child's


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    options.add_data_dir(p, help="folder with train.txt [and eval.txt] (default $BLOCKTRAIN_DATA, else generated)")
    p.add_argument("--device", default="cuda", help="torch device of the trained block and of swarm peer 0")
    p.add_argument("--dtype", choices=("auto", "bf16", "fp32"), default="auto", help="autocast of the train stage")
    p.add_argument("--stages", default=",".join(STAGES), help="comma-separated subset of train,swarm,serving")
    p.add_argument("--budget-s", type=float, default=540.0, help="all stages together end within this")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu_check.json"))
    p.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("train stage (defaults: the GPU config)")
    options.add_shape(g, blocks=3, d_model=512, seq_len=128, layers_per_block=4)
    g.add_argument("--n-heads", type=int, default=0, help="0 = d_model // 64 (at least 1)")
    g.add_argument("--hidden", type=int, default=0, help="0 = 4 * d_model")
    g.add_argument("--batch-size", type=int, default=TrainConfig.batch_size)
    g.add_argument("--block", type=int, default=0, help="block trained (> 0: frozen predecessors feed it)")
    g.add_argument("--warmup-steps", type=int, default=3)
    g.add_argument("--train-steps", type=int, default=30, help="timed steps")
    g.add_argument("--threads", type=int, default=0, help="torch threads of the train stage (0 = torch's default)")
    g.add_argument("--train-budget-s", type=float, default=150.0)
    g = p.add_argument_group("swarm stage")
    g.add_argument("--swarm-blocks", type=int, default=1, choices=(1, 2), help="1: 1 block x 2 replicas")
    g.add_argument("--swarm-d-model", type=int, default=64)
    g.add_argument("--swarm-layers", type=int, default=1)
    g.add_argument("--swarm-seq-len", type=int, default=64)
    g.add_argument("--swarm-rounds", type=int, default=4)
    g.add_argument("--swarm-steps", type=int, default=20, help="local steps per round")
    g.add_argument("--swarm-batch-size", type=int, default=8)
    g.add_argument("--eval-tokens", type=int, default=4096, help="held-out bytes of the from-noise CE")
    g.add_argument("--swarm-budget-s", type=float, default=180.0)
    g = p.add_argument_group("serving stage")
    g.add_argument("--serving-delay-ms", type=float, default=50.0)
    g.add_argument("--serving-quick", action="store_true", help="pass --quick (tiny shapes, 0 and 5 ms only)")
    g.add_argument("--serving-args", default="--max-weight-gib 0", help="more serving.py flags")
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)  # train-stage child: its spec file
    a = p.parse_args(argv)
    a.stage_list = [s for s in a.stages.split(",") if s]
    unknown = set(a.stage_list) - set(STAGES)
    if unknown:
        p.error(f"unknown stages {sorted(unknown)}; choose from {','.join(STAGES)}")
    return a


def model(blocks: int, layers: int, d: int, seq_len: int, head_width: int, heads: int = 0, hidden: int = 0):
    """A ModelConfig of this shape: heads 0 = d // head_width (at least 1), hidden 0 = FFN 4 d."""
    heads, hidden = heads or max(1, d // head_width), hidden or 4 * d
    return ModelConfig(blocks=blocks, layers_per_block=layers, d_model=d, n_heads=heads, hidden=hidden, seq_len=seq_len)


def find_data(a: argparse.Namespace, workdir: Path) -> dict:
    """{"train", "eval", "source"}: --data-dir / $BLOCKTRAIN_DATA, else the stdlib corpus built under workdir."""
    if a.data_dir:
        folder = Path(a.data_dir)
        if not (folder / "train.txt").is_file():
            raise SystemExit(f"--data-dir must hold train.txt (got {folder})")
        ev = folder / "eval.txt" if (folder / "eval.txt").is_file() else folder / "train.txt"
        return {"train": folder / "train.txt", "eval": ev, "source": str(folder)}
    from swarmd.core.corpus import stdlib_corpus

    corpus = stdlib_corpus(cache=workdir / "corpus", train_cap=2 << 20, eval_cap=128 << 10)
    return {"train": corpus.train, "eval": corpus.eval, "source": f"generated: {corpus.name}"}


# -- stage 1: one block -------------------------------------------------------------------------------
def adamw_state_bytes(trainer) -> dict:
    """Bytes held for the trainable parameters: fp32 params, their grads and AdamW's two moments."""
    nbytes = lambda t: 0 if t is None else t.numel() * t.element_size()
    params = [p for g in trainer.opt.param_groups for p in g["params"] if p.requires_grad]
    state = [trainer.opt.state.get(p, {}) for p in params]
    out = {
        "params": sum(map(nbytes, params)),
        "grads": sum(nbytes(p.grad) for p in params),
        "moments": sum(nbytes(s.get(k)) for s in state for k in ("exp_avg", "exp_avg_sq")),
    }
    return out | {"total": sum(out.values()), "trainable_params": sum(p.numel() for p in params)}


def autocast_for(dtype: str, device: str) -> torch.dtype | None:
    """bf16 or None (fp32); auto: bf16 on a CUDA device that has it (as BlockTrainer picks), else fp32."""
    if dtype == "auto":
        cuda = torch.device(device).type == "cuda"
        return torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else None
    return torch.bfloat16 if dtype == "bf16" else None


def train_block(spec: dict) -> dict:
    """The train stage's body (in the child): real BlockTrainer steps, timed, with the memory they took."""
    from swarmd.core.data import ByteData
    from swarmd.core.memory import model_info
    from swarmd.core.train import BlockTrainer, init_block

    device, budget_s, t_start = spec["device"], spec["budget_s"], time.perf_counter()
    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    torch.manual_seed(spec["seed"])
    cfg = ModelConfig(**spec["model"])
    tcfg = TrainConfig(batch_size=spec["batch_size"], seed=spec["seed"])
    cuda = torch.device(device).type == "cuda"
    stream = ByteData.from_path(spec["train"], cfg.seq_len).stream(spec["seed"], tcfg.batch_size)
    batches = [next(stream) for _ in range(spec["warmup_steps"] + spec["train_steps"])]
    if cuda:
        torch.cuda.init()
        torch.cuda.reset_peak_memory_stats(device)
    rss_before, cuda_before = maxrss_bytes(), torch.cuda.memory_allocated(device) if cuda else 0
    trainer = BlockTrainer(cfg, tcfg, spec["block"], device)
    trainer.autocast = autocast_for(spec["dtype"], device)
    if spec["block"] > 0:  # real trajectory inputs: the earlier blocks run frozen, forward only
        trainer.set_others(
            {b: init_block(cfg, b, spec["seed"]).to(device).requires_grad_(False) for b in range(spec["block"])}
        )
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    times, ces = [], []
    for i, (x, y) in enumerate(batches):
        sync()
        t0 = time.perf_counter()
        ces.append(trainer.step(x, y)["ce"])
        sync()
        if i >= spec["warmup_steps"]:
            times.append(time.perf_counter() - t0)
        if time.perf_counter() - t_start > budget_s and times:
            break  # out of time: what was measured stands
    tokens, median, adamw = tcfg.batch_size * cfg.seq_len, statistics.median(times), adamw_state_bytes(trainer)
    out: dict[str, Any] = {
        "model": cfg.to_dict(),
        "block": spec["block"],
        "batch_size": tcfg.batch_size,
        "device": device,
        "autocast": str(trainer.autocast).replace("torch.", "") if trainer.autocast else "fp32 (none)",
        "torch_threads": torch.get_num_threads(),
        "steps_timed": len(times),
        "steps_asked": spec["train_steps"],
        "median_step_s": median,
        "tokens_per_s": tokens / median,
        "tokens_per_s_mean": tokens * len(times) / sum(times),
        "ce_first": ces[0],
        "ce_last": ces[-1],
        "adamw_state_bytes": adamw,
        "adamw_state_gib": adamw["total"] / GIB,
        "model_info_active_adamw_gib": model_info(cfg)["active_adamw_gib"],
        "adamw_vs_seed": adamw["total"] / GIB / SEED_FIGURES["active_adamw_gib"],
    }
    if cuda:
        peak = torch.cuda.max_memory_allocated(device)
        return out | {
            "peak_memory_kind": "torch.cuda.max_memory_allocated",
            "peak_memory_bytes": peak,
            "peak_memory_gib": peak / GIB,
            "peak_memory_reserved_gib": torch.cuda.max_memory_reserved(device) / GIB,
            "memory_before_model_bytes": cuda_before,
            "device_name": torch.cuda.get_device_name(device),
        }
    after = maxrss_bytes()
    return out | {
        "peak_memory_kind": "peak RSS added by training (ru_maxrss after - before building the model)",
        "peak_memory_bytes": after - rss_before,
        "peak_memory_gib": (after - rss_before) / GIB,
        "peak_rss_gib": after / GIB,
    }


def stage_train(a: argparse.Namespace, data: dict, budget_s: float, workdir: Path) -> dict:
    """Run train_block in a child process (this script with --child), killed at budget_s."""
    spec_path, out_path, log = workdir / "train_spec.json", workdir / "train_out.json", workdir / "train_child.log"
    cfg = model(a.blocks, a.layers_per_block, a.d_model, a.seq_len, 64, a.n_heads, a.hidden)
    spec = options.picked(a, SPEC) | {"model": cfg.to_dict(), "train": str(data["train"]), "out": str(out_path)}
    spec["budget_s"] = max(0.5 * budget_s, budget_s - 30.0)  # stepping stops here: start and report fit after
    spec_path.write_text(json.dumps(spec))
    with open(log, "wb") as f:
        cmd = [sys.executable, __file__, "--child", str(spec_path)]
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=budget_s)
    if proc.returncode != 0 or not out_path.is_file():
        raise RuntimeError(f"train child exited with {proc.returncode}: {tail(log.read_text(errors='replace'))}")
    return json.loads(out_path.read_text())


def tail(text: str, n: int = 5) -> str:
    return " | ".join(text.strip().splitlines()[-n:])


class StageError(RuntimeError):
    """A stage's failure with details for its record (run_stage adds them)."""

    def __init__(self, message: str, **details: Any):
        super().__init__(message)
        self.details = details


# -- stage 2: two daemons ---------------------------------------------------------------------------
def mixed_swarm(*args: Any, devices: list[str], **kw: Any):
    """A LocalSwarm(*args, **kw) whose peer i runs on devices[i] (imported here: the train stage must run where
    the swarm's packages, grpc and hivemind, are missing)."""
    from swarmd.tools.launch import LocalSwarm

    class MixedSwarm(LocalSwarm):
        def peer_config(self, p):
            return replace(super().peer_config(p), device=devices[p.index])

    return MixedSwarm(*args, **kw)


ROUND_LINE = re.compile(r"round (\d+): block (\d+) train ce (\S+) participation ([0-9.]+)")


def stage_swarm(a: argparse.Namespace, data: dict, budget_s: float, workdir: Path) -> dict:
    from swarmd.core.data import ByteData
    from swarmd.core.evaluate import from_noise_ce
    from swarmd.core.train import init_block, init_embedding

    deadline = time.monotonic() + budget_s
    cfg = model(a.swarm_blocks, a.swarm_layers, a.swarm_d_model, a.swarm_seq_len, 32)
    devices = [a.device, "cpu"]
    eval_xy = ByteData.from_path(data["eval"], cfg.seq_len).eval_windows(a.eval_tokens)
    eval_steps = max(4, cfg.blocks)  # B=1's default plan is a single step: score a few
    ce = lambda blocks, emb: float(from_noise_ce(blocks, emb, *eval_xy, cfg, steps=eval_steps)["ce"])
    ce_before = ce([init_block(cfg, b, a.seed) for b in range(cfg.blocks)], init_embedding(cfg, a.seed))
    schedule = dict(rounds=a.swarm_rounds, steps_per_round=a.swarm_steps, batch_size=a.swarm_batch_size)
    kw = dict(codec="int8", lr=3e-3, seed=a.seed, deadline_max_s=30.0, swarm_id="gpucheck", devices=devices)
    swarm = mixed_swarm(2, cfg, data["train"], workdir / "swarm", **schedule, **kw)
    t0 = time.monotonic()
    try:
        try:
            swarm.start(timeout_s=max(5.0, deadline - time.monotonic() - 15))
            started_s = time.monotonic() - t0
            finished = swarm.wait(timeout_s=max(1.0, deadline - time.monotonic() - 15))
        finally:
            swarm.stop(grace_s=10.0)
        if not finished:
            rounds = [len(p.rounds_seen) for p in swarm.peers]
            raise RuntimeError(f"peers did not finish {a.swarm_rounds} rounds in time (rounds seen {rounds})")
        bad = [(p.index, p.process.returncode) for p in swarm.peers if p.process.returncode != 0]
        if bad:
            raise RuntimeError(f"peers exited with (peer, code) {bad}")
    except Exception as exc:  # the peers' logs go with the temporary folder: keep their ends in the record
        raise StageError(str(exc), peer_logs={p.index: swarm.tail(p, 25) for p in swarm.peers}) from exc
    ce_after = ce(*swarm.assemble())
    peers = []
    for p, s in zip(swarm.peers, swarm.summaries()):
        ces = [float(m.group(3)) for m in map(ROUND_LINE.match, p.rounds_seen) if m]
        peer = dict(peer=p.index, device=devices[p.index], block=p.block, round_lines=len(ces))
        peer |= {k: s.get(k) for k in ("round", "rounds_merged", "participation", "bytes_sent")}
        peers.append(peer | dict(train_ce_first_round=(ces or [None])[0], train_ce_last_round=(ces or [None])[-1]))
    return {
        "model": cfg.to_dict(),
        "layout": f"{cfg.blocks} block(s) x {2 // cfg.blocks} replica(s)",
        "devices": devices,
        "rounds_asked": a.swarm_rounds,
        "steps_per_round": a.swarm_steps,
        "start_s": started_s,
        "peers": peers,
        "reached_rounds": all((q["round"] or 0) >= a.swarm_rounds for q in peers),
        "participation": statistics.mean(float(q["participation"] or 0.0) for q in peers),
        "from_noise_ce_before": ce_before,
        "from_noise_ce_after": ce_after,
        "eval_steps": eval_steps,
        "eval_tokens": int(eval_xy[1].numel()),
        "ce_went_down": ce_after < ce_before,
    }


# -- stage 3: serving.py ------------------------------------------------------------------------------
TRAVERSAL_LINE = re.compile(
    r"traversal delay\s+(\d+) ms\s+(\d+) bytes: one sweep\s+([0-9.]+) tok/s\s+AR\s+([0-9.]+) tok/s\s+ratio\s+([0-9.]+)x"
)
TRAVERSAL_KEYS = (("delay_ms", int), ("output_bytes", int), ("one_sweep_tok_s", float), ("ar_tok_s", float))


def traversal_rows(result: dict | None, stdout: str) -> list[dict]:
    """serving.py's traversal rows: from its JSON, else parsed from the lines it printed."""
    if result and result.get("traversal"):
        return result["traversal"]
    keys = (*TRAVERSAL_KEYS, ("ratio", float))
    return [{k: kind(v) for (k, kind), v in zip(keys, m.groups())} for m in TRAVERSAL_LINE.finditer(stdout)]


def pick_ratio(rows: list[dict], delay_ms: float) -> dict:
    """The row at delay_ms (else at the largest delay measured) with the longest output."""
    if not rows:
        raise RuntimeError("serving.py measured no traversal")
    delays = {r["delay_ms"] for r in rows}
    used = delay_ms if delay_ms in delays else max(delays)
    row = max((r for r in rows if r["delay_ms"] == used), key=lambda r: r["output_bytes"])
    out = {k: row[k] for k in ("output_bytes", "one_sweep_tok_s", "ar_tok_s", "ratio")}
    goal = row["ratio"] >= SEED_FIGURES["serving_ratio_goal"]
    return out | {"delay_ms": used, "requested_delay_ms": delay_ms, "meets_goal": goal}


def stage_serving(a: argparse.Namespace, budget_s: float, workdir: Path) -> dict:
    out_json, log = workdir / "serving.json", workdir / "serving.log"
    cmd = [sys.executable, str(SERVING), "--out", str(out_json), *shlex.split(a.serving_args)]
    cmd += ["--quick"] if a.serving_quick else []
    has_device = '"--device"' in SERVING.read_text()
    cmd += ["--device", a.device] if has_device else []
    timed_out = False
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            rc = proc.wait(timeout=budget_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc, timed_out = proc.wait(), True
    stdout = log.read_text(errors="replace")
    result = json.loads(out_json.read_text()) if out_json.is_file() and rc == 0 else None
    rows = traversal_rows(result, stdout)
    if not rows:
        raise RuntimeError(f"serving.py {'timed out' if timed_out else f'exited with {rc}'}: {tail(stdout)}")
    out = {
        "command": " ".join(cmd[1:]).replace(str(ROOT) + "/", "").replace(str(workdir), "<tmp>"),
        "device": a.device if has_device else "cpu (serving.py has no --device flag)",
        "returncode": rc,
        "timed_out": timed_out,
        "complete": result is not None,
        "headline": pick_ratio(rows, a.serving_delay_ms),
        "traversal": rows,
    }
    if result:
        setup = result.get("setup", {})
        out["generation"] = result.get("generation")
        out["failover"] = {k: result["failover"].get(k) for k in ("completed", "same_text", "added_latency_s")}
        out |= {"serving_seconds": setup.get("seconds"), "torch_threads": setup.get("torch_threads")}
    return out


# -- the run -------------------------------------------------------------------------------------------
def run_stage(name: str, fn: Callable[[float], dict], budget_s: float) -> dict:
    """fn(budget_s), timed; an exception (a timeout included) is recorded as the stage's error."""
    t0 = time.perf_counter()
    try:
        out = {"ok": True, **fn(budget_s)}
    except BaseException as exc:  # a stage that fails must not stop the others (KeyboardInterrupt aside)
        if isinstance(exc, KeyboardInterrupt):
            raise
        out = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
        out |= getattr(exc, "details", {})
    out |= {"seconds": time.perf_counter() - t0, "budget_s": budget_s}
    print(f"{name}: {'ok' if out['ok'] else 'FAILED ' + out['error']} in {out['seconds']:.1f}s", flush=True)
    return out


def device_info(device: str) -> dict:
    cpu = platform.processor() or platform.machine()
    info = dict(requested=device, torch=torch.__version__, cuda_build=torch.version.cuda, cpu=cpu)
    info |= {"cuda_available": torch.cuda.is_available(), "machine": results.machine(), "name": f"cpu: {cpu}"}
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        info["name"] = torch.cuda.get_device_name(device)
        info["bf16_supported"] = torch.cuda.is_bf16_supported()
        info["memory_gib"] = torch.cuda.get_device_properties(device).total_memory / GIB
    return info


def summary_line(name: str, s: dict) -> str:
    head = f"{name:8s} {'ok' if s['ok'] else 'FAILED':6s} {s['seconds']:7.1f}s  "
    if not s["ok"]:
        return head + s["error"][:200]
    if name == "train":
        return head + (
            f"{s['tokens_per_s']:,.0f} tok/s ({s['autocast']}, {s['steps_timed']} steps), peak "
            f"{s['peak_memory_gib']:.3f} GiB (seed: a few GiB), AdamW state {s['adamw_state_gib']:.3f} GiB "
            f"(seed 0.198 GiB for B=3, L_b=4, d=512)"
        )
    if name == "swarm":
        rounds = "/".join(str(q["round"]) for q in s["peers"])
        return head + (
            f"rounds {rounds} of {s['rounds_asked']} ({'/'.join(s['devices'])}), participation "
            f"{s['participation']:.2f}, from-noise CE {s['from_noise_ce_before']:.3f} -> {s['from_noise_ce_after']:.3f}"
        )
    h = s["headline"]
    return head + (
        f"{h['delay_ms']:g} ms, {h['output_bytes']} bytes: one sweep {h['one_sweep_tok_s']:.1f} / AR "
        f"{h['ar_tok_s']:.1f} tok/s = {h['ratio']:.1f}x (goal >= 100x; 70x on 2 CPU cores)"
    )


def main(argv: list[str] | None = None) -> dict:
    a = parse_args(argv)
    if a.child:
        spec = json.loads(a.child.read_text())
        Path(spec["out"]).write_text(json.dumps(train_block(spec)))
        return {}
    t_start = time.monotonic()
    end = t_start + a.budget_s - RESERVE_S
    left = lambda: max(1.0, end - time.monotonic())
    stages: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        workdir = Path(tmp)
        data = find_data(a, workdir)
        print(f"data: {data['source']}", flush=True)
        runs = {  # stage -> (its body, its bound)
            "train": (lambda b: stage_train(a, data, b, workdir), a.train_budget_s),
            "swarm": (lambda b: stage_swarm(a, data, b, workdir), a.swarm_budget_s),
            "serving": (lambda b: stage_serving(a, b, workdir), float("inf")),
        }
        for name in (s for s in STAGES if s in a.stage_list):
            stages[name] = run_stage(name, runs[name][0], min(runs[name][1], left()))
    result = {
        "device": device_info(a.device),
        "seed_figures": SEED_FIGURES,
        "data": data["source"],
        "stages": stages,
        "ok": all(s["ok"] for s in stages.values()),
        "budget_s": a.budget_s,
        "seconds": time.monotonic() - t_start,
        "command": results.command_line("gpu_check.py", argv),
        "threads_env": os.environ.get("OMP_NUM_THREADS"),
    }
    results.write_json(a.out, result)
    info = result["device"]
    print("\n".join([f"device: {info['name']} (torch {info['torch']})", *map(summary_line, stages, stages.values())]))
    print(f"wrote {a.out} in {result['seconds']:.1f}s", flush=True)
    return result


if __name__ == "__main__":
    main()
