"""The demo: a whole swarm on this machine (LocalSwarm), its progress as events, and the model it keeps.

Owns what `blocktrain demo` does, minus the rendering. `plan_demo` validates every option and
builds the config each peer will get, with no torch and no process started (bad input fails at
once, exit 2). `run_demo` then starts --peers daemons on loopback (block i mod B, joined through
peer 0's DHT multiaddr) from a starter thread, scores the freshly initialised stack on held-out
text in a second thread, and watches the peers from the calling thread, reporting each thing that
happens as a DemoEvent (a peer starting, ready, finishing a round, exiting; the CE before and
after). When every peer has run its rounds it assembles the trained model from their checkpoints,
writes it to --out as a normal checkpoint (swarmd.core.checkpoint.save_model, the format of
`blocktrain train --out`) and scores it again. Every wait has a deadline; every daemon is stopped
whatever happens; the work dir (peer checkpoints, configs, logs) is removed after a success when
it was a temp dir, and kept, and named, after a failure. Torch is imported only inside run_demo.
DEMO_MODEL / DEMO_TRAIN are its defaults.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarmd.averaging.config import GossipConfig
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.textcheck import check_data_path, data_files
from swarmd.errors import ConfigError, DataError, SwarmdError
from swarmd.node.config import DaemonConfig, NetConfig, peer_train_config
from swarmd.protocol import Codec

DEMO_MODEL = ModelConfig(layers_per_block=1, d_model=64, hidden=256, seq_len=64)  # small enough for a laptop
# pipelined: every block of the demo's swarm lowers the CE; measured best on both configs
DEMO_TRAIN = TrainConfig(batch_size=16, lr=3e-3, pipeline=True)
DEMO_SWARM_ID = "demo"
CHECKPOINT_FORMAT = "blocktrain-checkpoint/1"  # swarmd.core.checkpoint.FORMAT (that module imports torch)


def default_out(now: float | None = None) -> Path:
    """Where the model goes without --out: runs/demo-YYYYMMDD-HHMMSS under the current directory."""
    return Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S", time.localtime(now))


@dataclass(frozen=True)
class DemoPlan:
    """A validated demo run: built by plan_demo before any process starts."""

    train: TrainConfig  # batch_size, lr, seed and trajectory_prob of every peer
    peer_config: DaemonConfig  # what every peer gets (LocalSwarm fills in block, seed, checkpoint dir, bootstrap)
    train_path: Path
    eval_path: Path
    out: Path  # the assembled model is written here as a normal checkpoint
    replaces_model: bool  # out already holds a BlockTrain checkpoint, which the new model replaces
    eval_tokens: int  # held-out bytes scored before and after
    timeout_s: float  # give up and stop every peer after this many seconds
    workdir: Path | None  # peer checkpoints and logs (None = a temp dir, removed after a success)

    # the rest is what peer_config says
    @property
    def peers(self) -> int:  # daemons to start (each waits for all of them); block of peer i = i mod model.blocks
        return self.peer_config.min_peers

    @property
    def model(self) -> ModelConfig:
        return self.peer_config.model

    @property
    def rounds(self) -> int:  # rounds each block trains
        return self.peer_config.max_rounds

    @property
    def swarm_rounds(self) -> int:  # rounds the swarm runs: pipelined, (B - 1) x stagger more
        return self.rounds + self.peer_config.train.extra_rounds(self.model.blocks)

    @property
    def steps_per_round(self) -> int:
        return self.peer_config.gossip.steps_per_round

    @property
    def codec(self) -> Codec:
        return self.peer_config.gossip.codec

    @property
    def device(self) -> str:  # torch device of every peer (cpu, cuda)
        return self.peer_config.device


def plan_demo(
    peers: int,
    model: ModelConfig,
    train_path: Path,
    eval_path: Path,
    *,
    rounds: int,
    steps_per_round: int,
    codec: Codec | str,
    balance_steps: float = GossipConfig.balance_steps,
    pull_codec: str = GossipConfig.pull_codec,
    device: str = "cpu",
    train: TrainConfig = DEMO_TRAIN,
    eval_tokens: int = 4096,
    out: Path | None = None,
    workdir: Path | None = None,
    timeout_s: float = 900.0,
) -> DemoPlan:
    """Validate every option and the peers' config (ConfigError / DataError, exit 2); imports no torch."""
    if peers < 1 or rounds < 1 or steps_per_round < 1:
        raise ConfigError("--peers, --rounds and --steps-per-round must be >= 1")
    if peers < model.blocks:
        raise ConfigError(
            f"--peers {peers} cannot train --blocks {model.blocks}: every block needs a peer (give --peers >= "
            f"{model.blocks} or --blocks <= {peers})"
        )
    if eval_tokens < 1 or timeout_s <= 0:
        raise ConfigError("--eval-tokens must be >= 1 and --timeout-s > 0")
    try:
        codec = Codec(codec)
        peer_config = DaemonConfig(
            model=model,
            train=peer_train_config(
                steps_per_round,
                batch_size=train.batch_size,
                lr=train.lr,
                seed=train.seed,
                trajectory_prob=train.trajectory_prob,
                replica_adam=train.replica_adam,
                predecessor_pulls=train.predecessor_pulls,
                prefetch_pulls=train.prefetch_pulls,
                pipeline=train.pipeline,
                pipeline_stagger=train.pipeline_stagger,
            ),
            gossip=GossipConfig(
                steps_per_round=steps_per_round, codec=codec, balance_steps=balance_steps, pull_codec=pull_codec
            ),
            net=NetConfig(swarm_id=DEMO_SWARM_ID),
            data_path=str(Path(train_path).resolve()),
            device=device,
            max_rounds=rounds,
            min_peers=peers,
        )
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    _check_text(Path(train_path), model.seq_len + 1, "training data")
    _check_text(Path(eval_path), model.seq_len + 1, "held-out data")
    out = Path(out) if out is not None else default_out()
    return DemoPlan(
        train=train,
        peer_config=peer_config,
        train_path=Path(train_path),
        eval_path=Path(eval_path),
        out=out,
        replaces_model=_check_out(out),
        eval_tokens=eval_tokens,
        timeout_s=timeout_s,
        workdir=Path(workdir) if workdir is not None else None,
    )


def _check_text(path: Path, min_bytes: int, what: str) -> None:
    """DataError unless path is text (swarmd.core.textcheck's instant checks) of at least min_bytes bytes."""
    check_data_path(path)
    try:
        size = sum(f.stat().st_size for f in data_files(path))
    except OSError as exc:
        raise DataError(f"cannot read {what} at {path}: {exc.strerror or exc}") from None
    if size < min_bytes:
        raise DataError(f"{what} has {size} bytes; need at least seq_len + 1 = {min_bytes}")


def _check_out(out: Path) -> bool:
    """Whether out holds a BlockTrain checkpoint (to be replaced); ConfigError if it cannot take the model."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a directory")
    if out.is_dir() and any(out.iterdir()):
        config = out / "config.json"
        if not (config.is_file() and CHECKPOINT_FORMAT in config.read_text(errors="replace")):
            raise ConfigError(f"--out {out} is a non-empty directory that holds no BlockTrain checkpoint")
        return True
    parent = next((p for p in (out, *out.parents) if p.exists()), Path("."))
    if not os.access(parent, os.W_OK):
        raise ConfigError(f"--out {out}: cannot write under {parent}")
    return False


@dataclass(frozen=True)
class DemoEvent:
    """One thing that happened, with its plain one-line text (the CLI prints it or draws a live view)."""

    kind: str  # work | initial | start | ready | round | exit | final | saved
    elapsed_s: float  # since run_demo started
    text: str
    peer: int = -1
    block: int = -1
    round: int = 0
    train_ce: float | None = None  # the peer's training CE over its last round
    participation: float | None = None  # share of the block's peers whose delta this peer merged
    bytes_sent: int | None = None  # total wire bytes the peer has sent
    ce: float | None = None  # held-out from-noise CE of the whole stack (initial, final)


OnEvent = Callable[[DemoEvent], None]
_ROUND_FIELDS = {
    "round": r"round (\d+)",
    "train_ce": r"train ce (\S+)",
    "participation": r"participation (\S+)",
    "bytes_sent": r"sent ([\d.]+ MB|\d+ B)\b",  # X.XX MB (swarmd.node.runner), or N B (daemons before it)
}


def parse_round_line(line: str) -> dict[str, Any]:
    """The fields of a daemon's `round R: block B train ce X participation P sent M MB in S s` line (those found);
    bytes_sent in bytes (M MB, 2 decimals, is read as round(M * 10^6); an `N B` line gives N)."""
    found: dict[str, Any] = {}
    for key, pattern in _ROUND_FIELDS.items():
        m = re.search(pattern, line)
        if m is None:
            continue
        try:
            if key == "bytes_sent":
                number, unit = m.group(1).split()
                found[key] = round(float(number) * 1e6) if unit == "MB" else int(number)
            else:
                found[key] = int(m.group(1)) if key == "round" else float(m.group(1))
        except ValueError:
            continue
    return found


class _Background(threading.Thread):
    """A daemon thread that keeps its function's result or exception for the watcher."""

    def __init__(self, fn: Callable[[], Any], name: str):
        super().__init__(name=name, daemon=True)
        self.fn = fn
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as exc:  # handed to the watcher thread, which re-raises it
            self.error = exc


def run_demo(plan: DemoPlan, on_event: OnEvent | None = None, poll_s: float = 0.1) -> dict:
    """Train the planned swarm, keep its model in plan.out; returns the summary (ce_start, ce_end, out, ...).

    :param on_event: called from this thread with every DemoEvent, as it happens
    :param poll_s: how often the peers' output is looked at
    :note: blocks until every peer has run its rounds or plan.timeout_s has passed (SwarmdError).
    """
    from swarmd.tools.launch import LocalSwarm

    t0 = time.monotonic()

    def emit(kind: str, text: str, **fields: Any) -> None:
        if on_event is not None:
            on_event(DemoEvent(kind, time.monotonic() - t0, text, **fields))

    temp = plan.workdir is None
    root = plan.workdir or Path(tempfile.mkdtemp(prefix="blocktrain-demo-"))
    emit("work", f"peers keep checkpoints and logs in {root}")
    swarm = LocalSwarm(
        plan.peers,
        plan.model,
        plan.train_path,
        root,
        rounds=plan.rounds,
        steps_per_round=plan.steps_per_round,
        codec=plan.codec,
        balance_steps=plan.peer_config.gossip.balance_steps,
        pull_codec=plan.peer_config.gossip.pull_codec,
        batch_size=plan.train.batch_size,
        lr=plan.train.lr,
        seed=plan.train.seed,
        swarm_id=DEMO_SWARM_ID,
        trajectory_prob=plan.train.trajectory_prob,
        replica_adam=plan.train.replica_adam,
        predecessor_pulls=plan.train.predecessor_pulls,
        prefetch_pulls=plan.train.prefetch_pulls,
        pipeline=plan.train.pipeline,
        pipeline_stagger=plan.train.pipeline_stagger,
        device=plan.device,
    )
    kept = True  # the work dir stays (and is named) unless the run succeeds or is interrupted
    try:
        with _sigterm_interrupts():
            initial = _Background(lambda: _initial_ce(plan), "demo-initial-ce")
            initial.start()
            _watch(plan, swarm, initial, emit, poll_s)
            result = _finish(plan, swarm, emit, initial.result)
        result["wall_s"] = time.monotonic() - t0
        kept = False
        return result
    except KeyboardInterrupt:
        kept = False
        raise
    except SwarmdError as exc:
        if str(root) in str(exc):
            raise
        err = type(exc)(f"{exc} (peer logs kept in {root})")
        err.exit_code = exc.exit_code
        raise err from None
    finally:
        if temp and not kept:
            shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def _sigterm_interrupts():
    """SIGTERM raises KeyboardInterrupt in the main thread, so a terminated demo still stops its peers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _initial_ce(plan: DemoPlan) -> tuple[float, tuple[Any, Any]]:
    from swarmd.core.data import ByteData
    from swarmd.core.evaluate import from_noise_ce
    from swarmd.core.train import init_block, init_embedding

    model, seed = plan.model, plan.train.seed
    eval_xy = ByteData.from_path(plan.eval_path, model.seq_len).eval_windows(plan.eval_tokens)
    init = [init_block(model, b, seed) for b in range(model.blocks)]
    return from_noise_ce(init, init_embedding(model, seed), *eval_xy, model)["ce"], eval_xy


def _watch(plan: DemoPlan, swarm, initial: _Background, emit: Callable[..., None], poll_s: float) -> None:
    """Start the peers (starter thread) and report what they do until all have exited; stop them all after."""
    starter = _Background(lambda: swarm.start(timeout_s=min(plan.timeout_s, 300.0)), "demo-starter")
    started: set[int] = set()
    ready: set[int] = set()
    exited: set[int] = set()
    rounds_read = [0] * plan.peers
    initial_told = False
    deadline = time.monotonic() + plan.timeout_s
    stopped = threading.Event()
    starter.start()
    try:
        while True:
            for p in swarm.peers:
                if p.proc is not None and p.index not in started:
                    started.add(p.index)
                    emit("start", f"peer {p.index} starting (block {p.block})", peer=p.index, block=p.block)
                if p.ready.is_set() and p.index not in ready:
                    ready.add(p.index)
                    emit("ready", f"peer {p.index} ready: block {p.block} at {p.address}", peer=p.index, block=p.block)
                for line in p.rounds_seen[rounds_read[p.index] :]:
                    rounds_read[p.index] += 1
                    f = parse_round_line(line)
                    emit(
                        "round",
                        _round_text(p.index, p.block, plan.swarm_rounds, f, line),
                        peer=p.index,
                        block=p.block,
                        **f,
                    )
                if p.index in started and not p.alive() and p.index not in exited:
                    exited.add(p.index)
                    code = p.process.returncode
                    emit(
                        "exit",
                        f"peer {p.index} finished" if code == 0 else f"peer {p.index} exited with code {code}",
                        peer=p.index,
                        block=p.block,
                    )
                    if code != 0:
                        raise _peer_failed(swarm, p, code)
            if initial.error is not None:
                raise initial.error
            if not initial_told and initial.result is not None:
                initial_told = True
                emit("initial", f"initial from-noise CE {initial.result[0]:.4f} nats/byte", ce=initial.result[0])
            if starter.error is not None:
                raise starter.error
            if len(exited) == plan.peers:
                break
            if time.monotonic() > deadline:
                raise SwarmdError(f"the swarm did not finish {plan.swarm_rounds} rounds within {plan.timeout_s:.0f}s")
            stopped.wait(poll_s)  # a poll with a deadline: peers report through their stdout lines
        initial.join(timeout=plan.timeout_s)
        if initial.error is not None:
            raise initial.error
        if initial.result is None:
            raise SwarmdError("scoring the initial model did not finish")
        if not initial_told:
            emit("initial", f"initial from-noise CE {initial.result[0]:.4f} nats/byte", ce=initial.result[0])
    finally:
        swarm.stop()
        starter.join(timeout=10.0)  # it returns at once once its peers are gone
        swarm.stop()  # a peer the starter spawned while the first stop ran


def _round_text(index: int, block: int, rounds: int, f: dict[str, Any], line: str) -> str:
    if "round" not in f:
        return f"peer {index}: {line}"
    parts = [f"peer {index} round {f['round']}/{rounds}: block {block}"]
    if "train_ce" in f:
        parts.append(f"train ce {f['train_ce']:.4f}")
    if "participation" in f:
        parts.append(f"participation {f['participation']:.2f}")
    if "bytes_sent" in f:
        parts.append(f"sent {f['bytes_sent'] / 1e6:.2f} MB")
    return " ".join(parts)


def _peer_failed(swarm, p, code: int) -> SwarmdError:
    """The error of a peer that exited non-zero: its last `error:` line (or log tail); exit 2 if it was bad input."""
    tail = swarm.tail(p, lines=20).split(" | ")
    errors = [line for line in tail if line.startswith("error:")]
    reason = errors[-1].removeprefix("error: ") if errors else " | ".join(tail[-3:])
    err = SwarmdError(f"peer {p.index} (block {p.block}) exited with code {code}: {reason}; its log: {p.log_path}")
    if code == 2:  # the peer refused its input (data, config): so does the demo
        err.exit_code = 2
    return err


def _finish(plan: DemoPlan, swarm, emit: Callable[..., None], initial: tuple[float, tuple[Any, Any]]) -> dict:
    """Assemble the trained model, write it to plan.out, score it; the summary."""
    from swarmd.core import checkpoint as ck
    from swarmd.core.evaluate import from_noise_ce

    ce_start, (x, y) = initial
    blocks, emb = swarm.assemble()
    sums = swarm.summaries()
    rounds = min(int(s.get("round", 0)) for s in sums)
    ce_end = from_noise_ce(blocks, emb, x, y, plan.model)["ce"]
    emit("final", f"assembled model: from-noise CE {ce_end:.4f} nats/byte (was {ce_start:.4f})", ce=ce_end)
    steps: dict[int, int] = {}
    for s in sums:
        if "block_index" in s:
            steps.setdefault(int(s["block_index"]), int(s.get("local_steps", 0)))
    if plan.replaces_model:  # block files of a deeper earlier model would linger
        for stale in plan.out.glob("block_*.safetensors"):
            stale.unlink()
    ck.save_model(
        plan.out,
        plan.model,
        dict(enumerate(blocks)),
        emb,
        plan.peer_config.train,
        steps,
        rounds=rounds,
        trained_by="blocktrain demo",
        peers=plan.peers,
        ce=ce_end,
    )
    emit("saved", f"model saved in {plan.out}", ce=ce_end)
    return {
        "peers": plan.peers,
        "blocks": plan.model.blocks,
        "rounds": rounds,
        "steps_per_round": plan.steps_per_round,
        "codec": plan.codec.value,
        "ce_start": ce_start,
        "ce_end": ce_end,
        "participation": sum(float(s.get("participation", 0)) for s in sums) / len(sums),
        "bytes_sent": sum(int(s.get("bytes_sent", 0)) for s in sums),
        "raw_bytes_sent": sum(int(s.get("raw_bytes_sent", 0)) for s in sums),
        "out": str(plan.out),
        "config": plan.model.to_dict(),
    }
