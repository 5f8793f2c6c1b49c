"""Insider rows of the fault matrix (issue 21): signed peers that run the project's own daemon with one line changed.

Each insider is a real `python -m swarmd` (this file's `insider MODE CONFIG` as a Swarm peer's program) with a valid
identity and signed record; only its Gossip (or BlockServing) is subclassed here: drift (1 of 4: its delta + a fixed
direction), poison (3 of 5: one poisoned step under the norm bound), state (3 of 5: a poisoned state announced ahead
of the swarm and served to PullState; an honest joiner), flood (1 of 4: benchmarks/flood.py's flooder), forward (a
holder of block 1 lies in Forward; the client is `blocktrain score --swarm`). Each row compares the honest peers' CE
with a clean run of the same honest peers and counts DEFENCE_PATTERNS in their logs. The rows run from the fault
matrix: `python benchmarks/adversary.py --only insider --merge` (rows into benchmarks/results/adversary.json);
insider_table is their own table in its markdown.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import flood
from benchmarks.harness import daemons, faults, results
from benchmarks.harness.faults import Row, signed_delta
from benchmarks.harness.faults import fmt as _f
from swarmd.errors import SwarmdError
from swarmd.tools.launch import PeerProc

# What the defences log, counted in the honest peers' logs (case-insensitive substrings)
DEFENCE_PATTERNS = (
    "refus",  # verified adoption: "refused the state of ..."; the transport's refusals too
    "fall back",  # loss-checked merges
    "fell back",
    "drift",  # slow-drift tracking
    "probation",  # Sybil probation
    "banned",  # verified inference, per-identity budgets
    "budget",
    "rejected a",  # the payload checks (issue 9)
    "as outliers",  # the robust merge's outlier check (issue 9)
    "not adopting",  # the quorum rule (issue 9)
)
INSIDER_CE_TOLERANCE = 0.02  # nats: 1-of-4 rows (the target)
MAJORITY_CE_TOLERANCE = 0.05  # nats: the 3-of-5 rows
FLOOD_ROUND_FACTOR = 1.5  # the flood row: honest median round time within this factor of the clean run's
ROWS = ("drift", "poison", "state", "forward", "flood")

DRIFT_FACTOR = 1.5  # the drift insider's fixed direction (against its first own delta), in units of its delta's norm
POISON_FRACTION = 0.9  # the poisoned step's norm, as a fraction of the receivers' norm bound
POISON_SEED = 2102
STATE_START, STATE_JUMP = 2, 2  # the poisoned-state insiders start at this round, announcing this many rounds ahead
STATE_DEADLINE_S = 1.0  # ... with short rounds of their own (they do not wait for the honest peers' deltas)
STATE_NOISE, STATE_SEED = 1.5, 2103  # the poisoned state: initial weights + this x max(std, 0.05) x fixed noise
FORWARD_MODE_FILE = "forward_mode"  # next to the liar's config: honest | garbage | bias
FORWARD_BIAS = 0.5  # the bias mode: a fixed per-byte offset of this scale on the final logits
FORWARD_CFG = replace(daemons.TINY_CFG, blocks=2, pred_input="none", pred_output="none")
ROOT = Path(__file__).resolve().parent.parent
_ADOPTED = re.compile(r"adopted the (block|embedding) of (\S+)")


# ---- The insiders: a real daemon with one changed line (child processes of the rows)
def run_insider(mode: str, config: str) -> int:
    """Run one daemon whose Gossip (or BlockServing, mode forward) is the insider `mode` of this file."""
    folder = Path(config).parent  # the swarm's folder: what insiders of one attacker share
    if mode == "state":  # rounds are what it lies about: it runs until stopped, whatever its counter says
        body = json.loads(Path(config).read_text())
        config = str(folder / f"{Path(config).stem}-insider.json")
        Path(config).write_text(json.dumps(body | {"stop_at_round": 0}))
    if mode == "forward":
        return faults.run_daemon(config, BlockServing=_lying_serving(folder / FORWARD_MODE_FILE))
    return faults.run_daemon(config, Gossip=_insider_gossip(mode, folder / "insiders"))


def _unit(like: dict, seed: int) -> dict:
    """A fixed direction of unit norm over tensors shaped like `like` (sorted names, seeded)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return _scaled({k: torch.randn(like[k].shape, generator=g) for k in sorted(like)}, 1.0)


def _scaled(delta: dict, by: float) -> dict:
    """`delta` at norm `by` (a negative `by`: the opposite direction); a zero delta stays zero."""
    import torch

    norm = float(torch.sqrt(sum((t.double() ** 2).sum() for t in delta.values()))) or 1.0
    return {k: by * t / norm for k, t in delta.items()}


def _insider_gossip(mode: str, crew: Path) -> type:
    """The Gossip subclass of an insider mode (drift, poison, state); crew: a folder where the insiders of one
    attacker list their peer ids (to tell each other's records apart)."""
    import logging

    import torch

    from swarmd.averaging.context import BLOCK, EMB
    from swarmd.averaging.gossip import Gossip
    from swarmd.averaging.robust import delta_norm

    class Insider(Gossip):
        async def publish(self) -> None:
            await super().publish()
            rs = self.current
            assert rs is not None
            for kind, own in list(rs.own.items()):  # sign and send instead, and merge it as our own (a replica)
                rs.outgoing[kind] = enc = signed_delta(self, kind, self.bad(kind, own))
                rs.own[kind] = self.decode(enc, kind, self.me.block_index if kind.is_block else -1)

    class Drift(Insider):
        v: dict | None = None  # kind -> the fixed direction: against its first round's own delta (unit norm)

        def bad(self, kind, own: dict) -> dict:
            rs = self.current
            assert rs is not None
            if self.v is None:
                self.v = {k: _scaled(o, -1.0) for k, o in rs.own.items()}
            v, n = self.v[kind], delta_norm(own)
            return {k: t + DRIFT_FACTOR * n * v[k] for k, t in own.items()}

    class Poison(Insider):
        def bad(self, kind, own: dict) -> dict:
            u, bound = _unit(own, POISON_SEED + (kind == EMB)), self.norm_bound(kind)
            return {k: POISON_FRACTION * bound * t for k, t in u.items()}

    class PoisonedState(Gossip):
        poisoned: tuple[dict, dict] | None = None

        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, **kw)
            # short rounds: its record names the poisoned state at a round ahead of the swarm's at every re-sync
            self.cfg = replace(self.cfg, deadline_min_s=0.2, deadline_max_s=STATE_DEADLINE_S)

        def poison(self) -> tuple[dict, dict]:
            if self.poisoned is None:  # from the initial weights every replica of the block starts from
                _, block, emb = self.state.snapshot()
                g = torch.Generator().manual_seed(STATE_SEED)

                def noisy(ts: dict) -> dict:
                    out = {}
                    for k in sorted(ts):
                        t = ts[k].float()
                        scale = max(float(t.std()) if t.numel() > 1 else 0.0, 0.05)
                        out[k] = t + STATE_NOISE * scale * torch.randn(t.shape, generator=g)
                    return out

                self.poisoned = (noisy(block), noisy(emb))
            return self.poisoned

        async def sync(self, records: list) -> list[str]:
            poison = self.poison()  # taken at round 0, before any training
            if self.state.round < STATE_START:
                return await super().sync(records)
            crew.mkdir(parents=True, exist_ok=True)
            (crew / self.me.peer_id).touch()
            mates = {f.name for f in crew.iterdir()}
            others = [r for r in self.remember(records) if r.peer_id != self.me.peer_id]
            # the other insiders' round (a quorum must announce one (round, weights)), STATE_JUMP rounds ahead of
            # the most advanced honest record
            ours = [r.round for r in others if r.peer_id in mates]
            honest = [r.round + STATE_JUMP for r in others if r.peer_id not in mates]
            new_round = max([self.state.round, *ours, *honest])
            await asyncio.to_thread(self.state.adopt, poison[0], poison[1], new_round)
            for kind in (BLOCK, EMB):
                self.ef[kind].reset()
                self.anchors[kind].clear()
            logging.getLogger("insider").info("insider: serving the poisoned state at round %d", new_round)
            return ["block", "embedding"]

    return {"drift": Drift, "poison": Poison, "state": PoisonedState}[mode]


def _lying_serving(mode_file: Path) -> type:
    """A BlockServing whose Forward answers are changed as the mode file says (honest, garbage, bias)."""
    import torch

    from swarmd.serve.serving import BlockServing
    from swarmd.wire import from_proto, to_proto

    class Lying(BlockServing):
        async def forward(self, request):
            reply = await super().forward(request)
            mode = mode_file.read_text().strip() if mode_file.is_file() else "honest"
            if mode == "honest" or request.end_session:
                return reply
            part = reply.logits if request.final else reply.z
            t = from_proto(part)
            g = torch.Generator().manual_seed(int(request.step_index) + 7)
            if mode == "garbage":
                t = torch.randn(t.shape, generator=g) * (10.0 if request.final else 3.0)
            elif request.final:  # bias: a fixed per-byte offset of the logits
                t = t + FORWARD_BIAS * torch.randn(t.shape[-1], generator=torch.Generator().manual_seed(5))
            else:
                t = t + FORWARD_BIAS * float(t.std())
            part.CopyFrom(to_proto(t.contiguous().float()))
            return reply

    return Lying


# ---- runs and what is read off them
@dataclass
class Outcome:
    """One swarm run: the honest peers' CEs (peer index -> CE), how they ended, what their logs said."""

    ces: dict[int, float | None]
    done: dict
    same: bool
    logs: dict[str, int]  # DEFENCE_PATTERNS -> count in the honest logs
    said: list[str]  # the first of those lines per pattern
    adoptions: dict[str, int]  # "from an insider" / "from an honest peer" / "rejoin (source not logged)"
    insider_ce: float | None
    round_s: float | None  # honest median seconds from own delta ready to merge
    interval_s: float | None  # honest median wall seconds between merges
    partial: int  # honest rounds that merged fewer deltas than expected
    rounds: int  # honest rounds in the histories
    final_rounds: dict[int, Any]
    insider_log: str = ""  # the flooder's last two reports
    seconds: float = 0.0

    @property
    def ce(self) -> float | None:
        return self.ces.get(0)


def swarm_of(a, workdir: Path, honest: int, insiders: dict[int, str], **kw: Any) -> daemons.Swarm:
    """faults.swarm with peers 0..honest-1 honest, then the insiders (`insider MODE`, flood.py's flooder)."""
    program = lambda m: flood.flooder_program() if m == "flood" else faults.program(__file__, "insider", m)
    programs = {i: program(m) for i, m in insiders.items()}
    return faults.swarm(a, workdir, honest + len(insiders), programs=programs, **kw)


def run_swarm(a, honest: int, insiders: dict[int, str], joiner: tuple[int, int] | None = None) -> Outcome:
    """Run honest + insider peers to the end of their rounds; joiner: (its peer index, the round it arrives at)."""
    began = time.monotonic()
    what = ",".join(sorted(set(insiders.values()))) or "clean"
    with tempfile.TemporaryDirectory(prefix="insider-run-") as wd:
        sw = swarm_of(a, Path(wd), honest, insiders)
        watched = list(range(honest))
        with sw:
            sw.start(300)
            if joiner is not None:
                index, at = joiner
                p = PeerProc(index, 0, sw.workdir / f"peer{index}", sw.workdir / f"peer{index}.log")
                sw.peers.append(p)
                daemons.wait_rounds(sw, [0], at)
                sw.bootstrap = [m for q in sw.peers if q.alive() for m in q.info.get("multiaddrs", [])[:1]]
                sw._spawn(p)
                try:
                    sw._wait_ready(p, 300)
                    watched.append(len(sw.peers) - 1)
                except SwarmdError as exc:  # reported by the row (the joiner's CE is missing)
                    print(f"insider run {what}: the joiner did not start: {exc}", file=sys.stderr, flush=True)
            done = daemons.finish(sw, watched, a.timeout)
        out = _read(a, sw, watched, sorted(insiders), done)
    out.seconds = time.monotonic() - began
    line = f"insider run {what}: {honest} honest, CE {out.ces}, {done}, {out.logs}, {out.seconds:.0f} s"
    print(line, file=sys.stderr)
    return out


def _read(a, sw: daemons.Swarm, watched: list[int], insiders: list[int], done: dict) -> Outcome:
    """What a finished run's checkpoints and logs say (watched: positions in sw.peers of the honest peers)."""
    ces = {sw.peers[i].index: daemons.replica_ce(sw, i, a.data_dir, a.eval_tokens) for i in watched}
    # the run's folder names a row (e.g. "drift"): out of the lines before they are matched
    texts = [sw.peers[i].log_path.read_text(errors="replace").replace(str(sw.workdir), "<run>") for i in watched]
    lines = [line for t in texts for line in t.splitlines()]
    logs = {pat: sum(pat in line.lower() for line in lines) for pat in DEFENCE_PATTERNS}
    said = [next(_short(line) for line in lines if p in line.lower()) for p in DEFENCE_PATTERNS if logs[p]]
    tails = {sw.peers[i].info.get("peer", "?")[-6:] for i in insiders}
    adoptions = {"from an insider": 0, "from an honest peer": 0, "rejoin (source not logged)": 0}
    for line in lines:
        if "rejoined: adopted" in line:
            adoptions["rejoin (source not logged)"] += 1
        elif m := _ADOPTED.search(line):
            adoptions["from an insider" if m[2][-6:] in tails else "from an honest peer"] += 1
    sums = sw.summaries()
    hist = [sums[i].get("history", []) for i in watched]
    seconds = [h["seconds"] for hs in hist for h in hs if "seconds" in h]
    gaps = [y["at_s"] - x["at_s"] for hs in hist for x, y in itertools.pairwise(hs) if "at_s" in x and "at_s" in y]
    round_s, interval_s = (statistics.median(xs) if xs else None for xs in (seconds, gaps))
    partial = sum(h.get("accepted", 0) < h.get("expected", 0) for hs in hist for h in hs)
    logs_of = [sw.peers[i].log_path.read_text(errors="replace") for i in insiders]
    flooded = [line for t in logs_of for line in t.splitlines() if line.startswith("FLOOD ")]  # flood.py's reports
    same = daemons.replicas_identical(sw, watched[:2]) if len(watched) > 1 else True
    insider_ce = daemons.replica_ce(sw, insiders[0], a.data_dir, a.eval_tokens) if insiders else None
    final_rounds = {sw.peers[i].index: sums[i].get("round") for i in watched}
    ran = (round_s, interval_s, partial, sum(len(hs) for hs in hist), final_rounds, "; ".join(flooded[-2:]))
    return Outcome(ces, done, same, logs, said, adoptions, insider_ce, *ran)


def _short(line: str, n: int = 160) -> str:
    """A log line from its peer tag (else its logger name) on, at most n characters."""
    at = line.find("[block")
    return line[at if at >= 0 else max(line.find(" swarmd."), 0) :].strip()[:n]


# ---- rows
@dataclass
class InsiderRow(Row):
    """A fault-matrix row with what the insider rows measure besides the CE."""

    tolerance: float = INSIDER_CE_TOLERANCE
    worse_adoptions: int | None = None  # adoptions of a state that scores worse (an insider's)
    logs: dict = field(default_factory=dict)  # DEFENCE_PATTERNS -> count in the honest logs
    timing: dict = field(default_factory=dict)  # round times, clean and attacked (flood row)
    seconds: float = 0.0  # wall time of the row's runs


def _row(
    name: str, run: Outcome, clean: Outcome, tol: float, ok: bool = True, note: str = "", poisoned: bool = False
) -> InsiderRow:
    """An insider row from its run and its clean run (ok: the row's own condition besides the CE's; poisoned: the
    insiders serve poisoned states, so an adoption of theirs is of a worse one; else adoptions are only counted)."""
    delta = faults.ce_delta(run.ce, clean.ce)
    worse = run.adoptions["from an insider"] if poisoned else 0
    ended = run.done["exit"] == [0] * len(run.done["exit"]) and not run.done["tracebacks"]
    ok = ok and ended and delta is not None and delta <= tol and worse == 0
    per_peer, per_clean = ({i: _f(c) for i, c in r.ces.items()} for r in (run, clean))
    nonzero = lambda counts: {k: v for k, v in counts.items() if v}
    evidence = (
        f"honest CE per peer {per_peer} (clean {per_clean}); adoptions in the honest logs {run.adoptions}; "
        f"insider's own final CE {_f(run.insider_ce)}; defence log lines {nonzero(run.logs)} "
        f"(clean run {nonzero(clean.logs)}); first line of each: {run.said or 'none'}; honest exit codes "
        f"{run.done['exit']}, final rounds {run.final_rounds}, tracebacks {run.done['tracebacks']}, honest "
        f"replicas bit-identical {run.same}; partial merges {run.partial}/{run.rounds}" + (f"; {note}" if note else "")
    )
    timing = {"round_s": run.round_s, "interval_s": run.interval_s, "clean_round_s": clean.round_s}
    more = dict(tolerance=tol, worse_adoptions=worse, logs=run.logs, timing=timing)
    return InsiderRow(name, ok, evidence, run.ce, clean.ce, **more, seconds=round(run.seconds + clean.seconds, 1))


def insider_rows(a, which: tuple[str, ...] = ROWS) -> list[InsiderRow]:
    """The insider rows named in `which` (ROWS), each against its clean run (the same honest peers alone)."""
    rows: list[InsiderRow] = []
    cleans: dict[tuple[int, int], Outcome] = {}

    def clean(honest: int, repeat: int = 0) -> Outcome:
        """The honest peers alone (the repeat-th time: a second run measures the run-to-run noise)."""
        if (honest, repeat) not in cleans:
            cleans[honest, repeat] = run_swarm(a, honest, {})
        return cleans[honest, repeat]

    noise = ""
    if {"drift", "flood"} & set(which):  # the same clean run twice: what the CE differences can resolve
        again = faults.ce_delta(clean(3, repeat=1).ce, clean(3).ce)
        noise = f"run-to-run noise (the 3-peer clean run again, same seed): {_f(again, '{:+.4f}')}"
    if "drift" in which:
        name = "insider drift (1 of 4): honest delta + a fixed direction v each round"
        note = f"v: against the insider's first own delta, at {DRIFT_FACTOR}x its delta's norm; {noise}"
        rows.append(_row(name, run_swarm(a, 3, {3: "drift"}), clean(3), INSIDER_CE_TOLERANCE, note=note))
    if "poison" in which:
        name = "insider majority poison (3 of 5): the same poisoned step from all three, under the norm bound"
        note = f"the step: a fixed direction at {POISON_FRACTION} of the receivers' norm bound, every round"
        run = run_swarm(a, 2, dict.fromkeys((2, 3, 4), "poison"))
        rows.append(_row(name, run, clean(2), MAJORITY_CE_TOLERANCE, note=note))
    if "state" in which:
        # an honest joiner (peer seed 5) spawned at round 3 (a daemon takes seconds to start: it is ready mid-run);
        # it ends on the swarm's state, so its reference is the clean run's honest CE
        joiner = (5, 3)
        run, c = run_swarm(a, 2, dict.fromkeys((2, 3, 4), "state"), joiner), clean(2)
        joined = run.ces.get(5)
        note = (
            f"the insiders re-adopt the poisoned state every round from round {STATE_START}, {STATE_JUMP} rounds "
            f"ahead of the honest records; joiner (peer 5, spawned at round {joiner[1]}) CE {_f(joined)} (not "
            f"started: '-') vs the clean honest {_f(c.ce)}, its final round {run.final_rounds.get(5)}"
        )
        ok = joined is not None and c.ce is not None and joined - c.ce <= MAJORITY_CE_TOLERANCE
        name = "insider poisoned state (3 of 5): announced ahead of the swarm, served to PullState; a joiner"
        rows.append(_row(name, run, c, MAJORITY_CE_TOLERANCE, ok, note, poisoned=True))
    if "forward" in which:
        rows.extend(forward_rows(a))
    if "flood" in which:
        run, c = run_swarm(a, 3, {3: "flood"}), clean(3)
        ratio = None if not (run.round_s and c.round_s) else run.round_s / c.round_s
        name = (
            f"insider flood (1 of 4): {flood.DELTAS} copies of its delta, {flood.PULLS} PullState, "
            f"{flood.STATUSES} GetStatus per round"
        )
        note = (
            f"honest median round (own delta ready -> merge) {_f(run.round_s, '{:.3f}')} s vs clean "
            f"{_f(c.round_s, '{:.3f}')} s (x{_f(ratio, '{:.2f}')}), median wall between merges "
            f"{_f(run.interval_s, '{:.3f}')} s vs {_f(c.interval_s, '{:.3f}')} s; the flooder's last report: "
            f"{run.insider_log or 'none'}; flooder: benchmarks/flood.py; {noise}"
        )
        ok = ratio is not None and ratio <= FLOOD_ROUND_FACTOR
        rows.append(_row(name, run, c, INSIDER_CE_TOLERANCE, ok, note))
    return rows


# ---- the lying Forward: `blocktrain score --swarm` against a frozen 2-block swarm
def score_cli(a, maddr: str, swarm_id: str) -> dict:
    """`blocktrain score EVAL --swarm MADDR --json` of this checkout: its CE, exit code, warnings and hops."""
    cmd = [sys.executable, "-c", "from cli.main import entry; entry()", "score", str(Path(a.data_dir) / "eval.txt")]
    cmd += ["--swarm", maddr, "--swarm-id", swarm_id, "--max-bytes", str(a.score_bytes), "--json"]
    began = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    try:
        body = json.loads(proc.stdout[proc.stdout.find("{") :]) if "{" in proc.stdout else {}
    except ValueError:
        body = {}
    warn = [_short(x, 160) for x in proc.stderr.splitlines() if re.search(r"warn|unverified|banned|drop", x, re.I)]
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    return {
        "ce": body.get("ce"),
        "exit": proc.returncode,
        "warnings": warn[:4],
        "hops": body.get("hops"),
        "checked": {k: v for k, v in body.items() if re.search(r"check|verif|ban|drop", k)},
        "seconds": round(time.monotonic() - began, 1),
        "error": "" if proc.returncode == 0 else _short(last, 200),
    }


def forward_rows(a) -> list[InsiderRow]:
    """Train a 2-block swarm (peer 1, block 1, is the liar, honest while training), freeze it (restart with lr
    1e-12, until stopped), then score through it: honest, garbage, bias with an honest replica of block 1 (peer 3,
    merging with the liar: the same base); then the same with the replica gone, the liar the only holder."""
    began = time.monotonic()
    scores: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="ins-forward-") as wd:
        sw = swarm_of(a, Path(wd), 3, {1: "forward"}, model=FORWARD_CFG)
        mode = sw.workdir / FORWARD_MODE_FILE

        def score(phase: str, *modes: str) -> None:
            maddr, swarm_id = sw.peers[0].info["multiaddrs"][0], sw.config.net.swarm_id
            for what in modes:
                mode.write_text(what.split()[0])
                scores[f"{phase}, {what}"] = got = score_cli(a, maddr, swarm_id)
                print(f"forward {phase} {what}: {got}", file=sys.stderr, flush=True)

        with sw:
            sw.workdir.mkdir(parents=True, exist_ok=True)
            mode.write_text("honest")
            sw.start(300)
            trained = daemons.finish(sw, [0, 1, 2, 3], a.timeout)
            sw.config = replace(sw.config, train=replace(sw.config.train, lr=1e-12), stop_at_round=0, min_peers=3)
            for i in (0, 1, 3):
                sw.restart(i, 300)
            daemons.wait_rounds(sw, [0, 1, 3], 2)
            score("with replica", "honest", "garbage", "bias")
            sw.kill(3, signal.SIGTERM)  # the replica leaves: the liar is the only holder of block 1
            daemons.wait_rounds(sw, [0, 1], len(sw.peers[0].rounds_seen) + 2)
            score("only holder", "honest", "garbage", "bias", "honest again")
    seconds = round(time.monotonic() - began, 1)
    honest = {k: _f(s["ce"]) for k, s in scores.items() if "honest" in k}
    rows = []
    for key in ("with replica, garbage", "with replica, bias", "only holder, garbage", "only holder, bias"):
        s, ref = scores[key], scores[key.split(",")[0] + ", honest"]["ce"]
        delta = faults.ce_delta(s["ce"], ref)
        if "replica" in key:  # a second replica: the client must route around the liar and keep the honest CE
            ok = s["exit"] == 0 and delta is not None and abs(delta) <= INSIDER_CE_TOLERANCE
        else:  # the only holder: nothing to compare with; the client must say the answer is unverified
            ok = s["exit"] != 0 or any("unverified" in w for w in s["warnings"])
        error = f"; error {s['error']}" if s["error"] else ""
        evidence = (
            f"score CE {_f(s['ce'])} vs the same swarm answering honestly {_f(ref)} (with the replica: honest "
            f"{honest['with replica, honest']}; the only holder: honest {honest['only holder, honest']}, again "
            f"after the lies {honest['only holder, honest again']}); exit code {s['exit']}; warnings "
            f"{s['warnings'] or 'none'}; hops {s['hops']}, checked/dropped fields of --json "
            f"{s['checked'] or 'none (not reported)'}{error}; swarm trained "
            f"{a.rounds} rounds x H={a.steps} ({trained}), then frozen (lr 1e-12)"
        )
        name = f"insider lying Forward ({key.replace(',', ':')}): `blocktrain score --swarm`"
        logs, timing = {"exit": s["exit"], "warnings": len(s["warnings"])}, {"score_s": s["seconds"]}
        rows.append(InsiderRow(name, ok, evidence, s["ce"], ref, logs=logs, timing=timing, seconds=seconds))
    return rows


def insider_table(rows: list[dict], schedule: dict | None = None) -> list[str]:
    """The markdown lines of the insider rows' own table (adversary.write_md appends them); [] without any.

    :param schedule: the result's "insider" entry (rounds, steps_per_round, score_bytes)
    """
    mine = [r for r in rows if r["name"].startswith("insider")]
    if not mine:
        return []
    s = schedule or {}
    head = (
        "insider row | survived | honest CE | clean CE | CE - clean | tolerance | worse adoptions | defence log lines "
        "| round s (clean) | s"
    )
    cells = []
    for r in mine:
        t, logs = r.get("timing", {}), {k: v for k, v in r.get("logs", {}).items() if v}
        cells.append(
            f"{r['name']} | {'yes' if r['survived'] else '**no**'} | {_f(r['ce'])} | {_f(r['ce_clean'])} "
            f"| {_f(r['ce_delta'], '{:+.4f}')} | {r.get('tolerance', '-')} | {r.get('worse_adoptions', '-')} "
            f"| {json.dumps(logs).replace('|', '/') if logs else '-'} "
            f"| {_f(t.get('round_s'), '{:.3f}')} ({_f(t.get('clean_round_s'), '{:.3f}')}) | {r.get('seconds', 0):.0f}"
        )
    return [
        "",
        "#### Insider rows (issue 21): signed peers running the real daemon with a changed line",
        "",
        f"{s.get('rounds', '?')} rounds x H={s.get('steps_per_round', '?')}, one seed; the lying-Forward rows: a "
        f"2-block swarm trained so, then frozen, scored with `blocktrain score --swarm` on {s.get('score_bytes', '?')} "
        "bytes. Honest CE: peer 0's from-noise CE; clean: the same honest peers alone (same seeds). Worse "
        "adoptions: the honest peers' adoptions of an insider's state. Defence lines: counts of DEFENCE_PATTERNS "
        "(benchmarks/insiders.py) in the honest peers' logs.",
        "",
        *results.table(head, cells, align="llrrrrrllr"),
    ]


if __name__ == "__main__":
    if sys.argv[1:2] == ["insider"]:
        sys.exit(run_insider(sys.argv[2], sys.argv[3]))
    sys.exit("usage: python benchmarks/adversary.py --only insider [--insiders drift,poison,...] --merge")
