"""Fast swarm commands: seconds of `status --swarm`, `score`/`generate --swarm` and the dashboard, and where they go.

Starts a local swarm (benchmarks.harness.daemons.tiny: 3 daemons, one per block; with --idle waiting for a 4th peer:
serving, not training) and times each command (command_args) as a fresh `blocktrain` process, --reps times; the first
--probe-reps also run it under a probe (this script with --probe: the CLI in-process, with timestamps around imports,
the DHT start, lookups, calls, sweeps and shutdown; see breakdown). --before-tree runs a checkout from before a change
side by side under the same load. Writes benchmarks/results/swarm_commands.json (one entry per label, kept across
runs) and swarm_commands.md (BENCHMARKS.md#swarm_commands):

    python benchmarks/swarm_commands.py --label after --before-tree /tmp/before --reps 5 --probe-reps 3
"""

from __future__ import annotations

import time

T_PROBE = time.time()  # the probe's first instant after the interpreter started (only stdlib imported so far)

import argparse  # noqa: E402  (T_PROBE first: the probe measures the interpreter's start-up)
import functools  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SWARM_ID = "demo"  # LocalSwarm's default
COMMANDS = ("status", "score", "generate", "dashboard")
HEAVY = ("torch", "hivemind", "grpc", "scipy")  # top-level packages whose first import the probe times
TEXT = (b"the quick brown fox jumps over the lazy dog. " * 8) + bytes(range(32, 127))
TARGET_S = 5.0  # every command answers within this on a quiet machine
LAUNCH = "from cli.main import entry; entry()"  # what the `blocktrain` console script runs


# -- the probe: the CLI in this process, with timestamps -------------------------------------------------------
class Marks:
    """Timestamped events appended to a JSON-lines file, flushed each (the probe may end with os._exit)."""

    def __init__(self, path: str):
        self.file = open(path, "a", buffering=1)  # noqa: SIM115  (open until the process ends)
        self.lock = threading.Lock()

    def add(self, kind: str, t0: float, t1: float | None = None, **info: Any) -> None:
        with self.lock:
            self.file.write(json.dumps({"kind": kind, "t0": t0, "t1": t0 if t1 is None else t1, **info}) + "\n")
            self.file.flush()


WRAPS = (  # module, class, method, phase
    ("swarmd.membership.dht", "HivemindDiscovery", "_start_dht", "dht_start"),
    ("swarmd.membership.dht", "HivemindDiscovery", "find_all", "lookup"),
    ("swarmd.membership.dht", "HivemindDiscovery", "find", "lookup"),
    ("swarmd.membership.dht", "HivemindDiscovery", "shutdown", "shutdown"),
    ("swarmd.transport.client", "PeerClient", "status", "status_call"),
    ("swarmd.transport.client", "PeerClient", "swarm_config", "config_call"),
    ("swarmd.serve.remote", "RemoteSweeper", "sweep", "sweep"),
)


def _wrapped(fn: Any, phase: str, name: str, marks: Marks) -> Any:
    """fn (a coroutine function or not), its calls marked as `phase` from their start to their end."""

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            marks.add(phase, t0, time.time(), name=name)

    @functools.wraps(fn)
    async def timed_async(*args: Any, **kwargs: Any) -> Any:
        t0 = time.time()
        try:
            return await fn(*args, **kwargs)
        finally:
            marks.add(phase, t0, time.time(), name=name)

    return timed_async if inspect.iscoroutinefunction(fn) else timed


def probe(marks_path: str, argv: list[str]) -> None:
    """Run `blocktrain ARGV` in this process (cli.main.entry) with timestamps in marks_path."""
    import builtins

    marks = Marks(marks_path)
    marks.add("probe_start", T_PROBE)
    patched: set[tuple[str, str, str]] = set()

    def patch_loaded() -> None:  # wrap a module's methods once it is imported, never importing it here
        for module, cls, method, phase in WRAPS:
            owner = getattr(sys.modules.get(module), cls, None)
            if (module, cls, method) not in patched and hasattr(owner, method):
                patched.add((module, cls, method))
                setattr(owner, method, _wrapped(getattr(owner, method), phase, f"{cls}.{method}", marks))

    real_import = builtins.__import__
    depth = [0]

    def timed_import(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        top = name.partition(".")[0]
        heavy = level == 0 and top in HEAVY and name not in sys.modules
        if not heavy:
            module = real_import(name, globals, locals, fromlist, level)
            if depth[0] == 0:
                patch_loaded()
            return module
        outer, t0 = depth[0] == 0, time.time()
        torch_before = "torch" in sys.modules
        depth[0] += 1
        try:
            return real_import(name, globals, locals, fromlist, level)
        finally:
            depth[0] -= 1
            t1 = time.time()
            if outer:
                marks.add("import", t0, t1, name=name, torch="torch" in sys.modules and not torch_before)
                patch_loaded()

    builtins.__import__ = timed_import
    t0 = time.time()
    import cli.main

    marks.add("cli_import", t0, time.time())
    real_exit = os._exit

    def exit_now(code: int) -> None:
        marks.add("returned", time.time(), how="os._exit")
        real_exit(code)

    os._exit = exit_now
    sys.argv = ["blocktrain", *argv]
    try:
        cli.main.entry()
    finally:
        marks.add("returned", time.time(), how="interpreter exit")


PRIORITY = ("import", "exit", "dht_start", "lookup", "status_call", "config_call", "sweep", "shutdown")


def breakdown(events: list[dict], spawned: float, ended: float) -> dict[str, Any]:
    """Seconds per phase of one probe run (each instant counted once, in PRIORITY order), plus counts."""
    start = next(e["t0"] for e in events if e["kind"] == "probe_start")
    cli = next((e for e in events if e["kind"] == "cli_import"), None)
    returned = max((e["t0"] for e in events if e["kind"] == "returned"), default=ended)
    intervals: dict[str, list[tuple[float, float]]] = {p: [] for p in PRIORITY}
    intervals["exit"].append((returned, ended))
    for e in events:
        if e["kind"] in intervals and e["kind"] != "exit":
            intervals[e["kind"]].append((e["t0"], e["t1"]))
    ms = max(0, int((ended - start) * 1000) + 1)
    owner: list[str | None] = [None] * ms

    def claim(t0: float, t1: float, phase: str, over: tuple = (None,)) -> None:  # the milliseconds owned by `over`
        for i in range(max(0, int((t0 - start) * 1000)), min(ms, int((t1 - start) * 1000))):
            owner[i] = phase if owner[i] in over else owner[i]

    for phase in PRIORITY:
        for t0, t1 in intervals[phase]:
            claim(t0, t1, phase)
    out: dict[str, Any] = {"interpreter_start": start - spawned, "probe_overhead": 0.0}
    if cli is not None:
        out["probe_overhead"] = cli["t0"] - start  # this script's own imports before the CLI's
        claim(start, cli["t0"], "probe_overhead")
        out["cli_import"] = cli["t1"] - cli["t0"]
        claim(cli["t0"], cli["t1"], "cli_import", (None, "import"))  # cli's modules, and heavy ones it imports (grpc)
    for phase in (*PRIORITY, "cli_import", "probe_overhead"):
        out[phase] = sum(o == phase for o in owner) / 1000
    out["other"] = sum(o is None for o in owner) / 1000
    out["total"] = ended - spawned
    imports = [e for e in events if e["kind"] == "import"]
    out["imports"] = [{"name": e["name"], "s": round(e["t1"] - e["t0"], 3), "torch": e["torch"]} for e in imports]
    out["calls"] = {p: sum(e["kind"] == p for e in events) for p in ("lookup", "status_call", "config_call", "sweep")}
    return out


# -- the swarm and the commands --------------------------------------------------------------------------------
def blocktrain(tree: Path, env: dict) -> tuple[list[str], dict]:
    """`blocktrain` as its console script runs it, and env with the checkout `tree` first on the path (its cli and
    swarmd are the ones that run)."""
    path = os.pathsep.join(p for p in (str(tree), env.get("PYTHONPATH", "")) if p)
    return [sys.executable, "-c", LAUNCH], {**env, "PYTHONPATH": path}


def command_args(name: str, maddr: str, text: Path) -> list[str]:
    swarm = ["--swarm", maddr, "--swarm-id", SWARM_ID]
    return {
        "status": ["status", *swarm, "--json"],
        "score": ["score", str(text), *swarm, "--max-bytes", "64", "--json"],
        "generate": ["generate", "hello", *swarm, "--max-bytes", "4", "--seed", "1"],
        "dashboard": ["dashboard", *swarm, "--port", "0"],
    }[name]


def run_plain(cmd: list[str], env: dict, timeout_s: float, cwd: Path) -> Any:
    """cmd run to its end (killed after timeout_s): a cli_runs.Spawned."""
    from benchmarks.harness.cli_runs import Spawned

    run = Spawned(cmd, env, cwd)
    if not run.wait(timeout_s):
        run.stop(signal.SIGKILL, 30)
    return run


def run_dashboard(cmd: list[str], env: dict, peer_ids: list[str], timeout_s: float, cwd: Path) -> dict[str, Any]:
    """Start the dashboard; seconds to its URL line, to its page (and whether the page carries every peer),
    to the first /api/swarm listing every peer; then SIGINT it."""
    from benchmarks.harness.cli_runs import Spawned, get, poll_json

    def every_peer(view: dict) -> bool:
        ids = {p["peer_id"] for b in view.get("blocks", []) for p in b["peers"]}
        return view.get("status") == "ok" and set(peer_ids) <= ids

    run = Spawned(cmd, env, cwd)
    out: dict[str, Any] = {"url_s": None, "page_s": None, "page_has_swarm": False, "api_s": None}
    try:
        if (found := run.url(timeout_s)) is None:
            raise RuntimeError(f"dashboard printed no URL: {run.stdout()!r} {[line for _, line in run.err]}")
        out["url_s"], url = found
        page = get(url + "/", timeout_s).decode(errors="replace")
        out["page_s"], out["page_has_swarm"] = run.since(), all(p in page for p in peer_ids)
        if poll_json(url + "/api/swarm", every_peer, run.t0 + timeout_s, 0.05, lambda: True)[0]:
            out["api_s"] = run.since()
    finally:
        run.stop(signal.SIGINT, 30)
        out["s"], out["exit"] = run.since(), run.proc.returncode
    return out


def run_probe(
    name: str, args: list[str], env: dict, peer_ids: list[str], timeout_s: float, tmp: Path, tree: Path
) -> dict:
    marks = tmp / f"marks-{name}-{time.time_ns()}.jsonl"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--probe", str(marks), "--", *args]
    spawned = time.time()
    if name == "dashboard":
        result = run_dashboard(cmd, env, peer_ids, timeout_s, tree)
        ended, code = (spawned + result["api_s"] if result["api_s"] else time.time()), result["exit"]
    else:
        code, ended = run_plain(cmd, env, timeout_s, tree).proc.returncode, time.time()
    events = [json.loads(line) for line in marks.read_text().splitlines() if line.strip()]
    if name == "dashboard":  # up to the first full answer; the probe's DHT calls after it are the next polls
        events = [{**e, "t1": min(e["t1"], ended)} for e in events if e["t0"] < ended]
    return {**breakdown(events, spawned, ended), "exit_code": code}


def checked(name: str, run: Any, peer_ids: list[str]) -> dict:
    """The timing row of one plain run, with what it proves (every peer listed, a CE, generated bytes)."""
    from benchmarks.harness.cli_runs import loadavg

    row = {"s": run.wall_s, "first_byte_s": run.first_byte_s, "cpu_s": run.cpu_s, "exit": run.proc.returncode}
    row["load"] = loadavg()
    if row["exit"] != 0:
        row["error"] = "\n".join(line for _, line in run.err)[-600:]
    elif name == "status":
        listed = [p["peer_id"] for p in json.loads(run.stdout())["peers"]]
        row["peers_listed"] = len(listed)
        row["every_peer"] = sorted(listed) == sorted(peer_ids)
    elif name == "score":
        row["ce"] = json.loads(run.stdout())["ce"]
    elif name == "generate":
        row["bytes_out"] = len(run.stdout().strip()) - len("hello")
    return row


def summarize(rows: list[dict], keys: tuple[str, ...]) -> dict:
    """The median of each key over the rows that have it (None where none has)."""
    known = {k: [r[k] for r in rows if r.get(k) is not None] for k in keys}
    return {k: statistics.median(v) if v else None for k, v in known.items()}


def measure(args: argparse.Namespace) -> dict[str, dict]:
    """{label: run} for each tree: this checkout (--label), and with --before-tree also that one (--before-label), the
    two run command by command, side by side (which goes first alternates by repetition) under the same load."""
    import asyncio
    from dataclasses import replace

    from benchmarks.harness import daemons
    from benchmarks.harness.cli_runs import loadavg

    trees = [(args.label, ROOT)] + ([(args.before_label, args.before_tree.resolve())] if args.before_tree else [])
    base = {**os.environ, "COLUMNS": "200", "OMP_NUM_THREADS": "1"}
    rows = {label: {c: [] for c in args.commands} for label, _ in trees}
    probes = {label: {c: [] for c in args.commands} for label, _ in trees}
    load_before = loadavg()
    with tempfile.TemporaryDirectory(prefix="blocktrain-swarm-commands-") as tmp_name:
        tmp = Path(tmp_name)
        text = tmp / "text.txt"
        text.write_bytes(TEXT)
        swarm = daemons.tiny(3, args.data_dir, tmp / "swarm", 0, 10, 10.0)  # rounds 0: train until stopped
        if args.idle:  # waiting for a 4th peer that never comes: announced, serving, answering, not training
            swarm.config = replace(swarm.config, min_peers=len(swarm.peers) + 1, min_peers_timeout_s=86400.0)
        try:
            swarm.start(args.start_timeout_s)
            peer_ids = [st.peer_id for st in asyncio.run(swarm.statuses(5.0)) if st is not None]
            if len(peer_ids) != len(swarm.peers):
                raise SystemExit(f"only {len(peer_ids)} of {len(swarm.peers)} daemons answer GetStatus")
            maddr = swarm.peers[0].info["multiaddrs"][0]
            time.sleep(args.settle_s)  # the joiners' DHT records reach the swarm key
            for rep in range(args.reps):
                for name in args.commands:
                    for label, tree in trees if rep % 2 == 0 else trees[::-1]:
                        launch, env = blocktrain(tree, base)
                        cmd_args = command_args(name, maddr, text)
                        cmd = [*launch, *cmd_args]
                        if name == "dashboard":
                            row = run_dashboard(cmd, env, peer_ids, args.timeout_s, tree) | {"load": loadavg()}
                        else:
                            row = checked(name, run_plain(cmd, env, args.timeout_s, tree), peer_ids)
                        rows[label][name].append(row)
                        print(f"rep {rep} {label} {name}: {json.dumps(row)}", flush=True)
                        if rep < args.probe_reps:
                            pr = run_probe(name, cmd_args, env, peer_ids, args.timeout_s, tmp, tree)
                            probes[label][name].append(pr)
                            phases = {k: round(v, 2) for k, v in pr.items() if isinstance(v, float)}
                            print(f"rep {rep} {label} {name} probe: {json.dumps(phases)} {pr['calls']}", flush=True)
        finally:
            swarm.stop()
    same = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "reps": args.reps, "idle_swarm": args.idle}
    same |= {"command": args.command, "load_before": load_before, "load_after": loadavg()}
    medians = ("s", "first_byte_s", "cpu_s", "url_s", "page_s", "api_s", "load")
    phases = ("total", "interpreter_start", "probe_overhead", "cli_import", *PRIORITY, "other")
    return {
        label: {
            "label": label,
            "tree": str(tree),
            "paired_with": [other for other, _ in trees if other != label],
            "machine": f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}",
            **same,
            "rows": rows[label],
            "probes": probes[label],
            "median": {name: summarize(rows[label][name], medians) for name in args.commands},
            "median_breakdown": {
                name: summarize(probes[label][name], phases) for name in args.commands if probes[label][name]
            },
        }
        for label, tree in trees
    }


# -- the record ------------------------------------------------------------------------------------------------
def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


PHASE_NAMES = {
    "interpreter_start": "interpreter start",
    "probe_overhead": "probe's own imports",
    "cli_import": "import cli",
    "import": "import torch / hivemind / grpc / scipy",
    "dht_start": "DHT client start",
    "lookup": "DHT lookups",
    "status_call": "GetStatus calls",
    "config_call": "GetConfig calls",
    "sweep": "sweeps",
    "shutdown": "DHT shutdown",
    "exit": "process exit",
    "other": "other",
    "total": "total (probe)",
}
ORDER = ("before, idle swarm", "after, idle swarm", "before, training swarm", "after, training swarm")  # columns first
TIMED = (  # the main table's timed rows: command, key, row name
    ("status", "s", "`status --swarm` (s)"),
    ("status", "cpu_s", "`status --swarm`: CPU, user + system (s)"),
    ("score", "s", "`score --swarm` (s)"),
    ("score", "cpu_s", "`score --swarm`: CPU (s)"),
    ("generate", "first_byte_s", "`generate --swarm`: first byte (s)"),
    ("generate", "s", "`generate --swarm`: end, 4 bytes (s)"),
    ("generate", "cpu_s", "`generate --swarm`: CPU (s)"),
    ("dashboard", "url_s", "`dashboard`: URL printed (s)"),
    ("dashboard", "page_s", "`dashboard`: page served (s)"),
    ("dashboard", "api_s", "`dashboard`: first /api/swarm with every peer (s)"),
)


def markdown(record: dict) -> str:
    runs = record["runs"]
    labels = [label for label in ORDER if label in runs] + [label for label in runs if label not in ORDER]
    lines = [
        "## Fast swarm commands",
        "",
        f"A swarm of 3 daemons (benchmarks.harness.daemons.tiny; {runs[labels[0]]['machine']}, shared: wall times "
        "scale with the load average) on the real hivemind DHT on loopback; *idle swarm*: waiting for a 4th peer "
        "(serving, not training), else training. Every command is a fresh `blocktrain` process "
        f"(`python -c '{LAUNCH}'` from the label's tree); *before* runs side by side with *after* under the same "
        "load. Medians, seconds from the spawn; *CPU*: user + system with the children it reaped.",
        "",
        "| command | " + " | ".join(labels) + " |",
        "|---|" + "---|" * len(labels),
    ]

    def row(what: str, cells: list[str]) -> None:
        lines.append(f"| {what} | " + " | ".join(cells) + " |")

    def count(name: str, key: str) -> list[str]:
        runs_rows = [runs[label]["rows"].get(name, []) for label in labels]
        return [f"{sum(bool(r.get(key)) for r in rs)} of {len(rs)}" if rs else "-" for rs in runs_rows]

    for name, key, what in TIMED:
        row(what, [fmt((runs[label]["median"].get(name) or {}).get(key)) for label in labels])
    row("`dashboard`: page shows the swarm", count("dashboard", "page_has_swarm"))
    row("`status --swarm` listed every peer", count("status", "every_peer"))
    row("repetitions", [str(runs[label]["reps"]) for label in labels])
    loads = [f"{runs[label]['load_before']:.1f} / {runs[label]['load_after']:.1f}" for label in labels]
    row("load average (1 min) at the start / end", loads)
    lines += ["", "Where the time goes (--probe runs, medians, s; each instant counted once, imports first):"]
    for name in COMMANDS:
        have = [label for label in labels if runs[label].get("median_breakdown", {}).get(name)]
        if have:
            lines += ["", f"| `{name}` | " + " | ".join(have) + " |", "|---|" + "---|" * len(have)]
            for phase in ("interpreter_start", "probe_overhead", "cli_import", *PRIORITY, "other", "total"):
                row(PHASE_NAMES[phase], [fmt(runs[label]["median_breakdown"][name].get(phase)) for label in have])
    lines.append("")
    for label in labels:
        command, _, note = runs[label].get("command", record.get("command", "")).partition("` ")  # a renamed label
        lines.append(f"*{label}*: `{command}`{' ' + note if note else ''}, {runs[label]['when']}.  ")
    lines += ["", f"Target: every command within {TARGET_S:.0f} s on a quiet machine.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--probe"]:
        probe(argv[1], argv[3:] if argv[2:3] == ["--"] else argv[2:])
        return 0
    sys.path.insert(0, str(ROOT))  # not in the probe: there the tree on PYTHONPATH comes first
    from benchmarks.harness import options, results

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    options.add_data_dir(p, fallback=options.SHARED_DATA)
    p.add_argument("--label", default="after", help="name of this checkout's run in the record (before, after, ...)")
    p.add_argument("--before-tree", type=Path, default=None, help="a copy of the checkout before the change")
    p.add_argument("--before-label", default="before", help="name of --before-tree's run in the record")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--probe-reps", type=int, default=None, help="repetitions with a probe run too (default: --reps)")
    p.add_argument("--commands", nargs="+", choices=COMMANDS, default=list(COMMANDS))
    p.add_argument("--timeout-s", type=float, default=120.0, help="give up on one command after this many seconds")
    p.add_argument("--start-timeout-s", type=float, default=240.0)
    p.add_argument("--settle-s", type=float, default=3.0)
    p.add_argument("--idle", action="store_true", help="daemons that never train (waiting for a 4th peer)")
    options.add_outputs(p, "swarm_commands.json", "swarm_commands.md", results=RESULTS)
    p.add_argument("--render", action="store_true", help="only rewrite --md from --out (nothing runs)")
    args = p.parse_args(argv)
    args.command = results.command_line("swarm_commands.py", argv)
    args.probe_reps = args.reps if args.probe_reps is None else args.probe_reps
    record = json.loads(args.out.read_text()) if args.out.exists() else {"runs": {}}
    if not args.render:
        options.check_data(p, args, "train.txt")
        record["runs"].update(measure(args))
        record["commands"] = {c: "blocktrain " + " ".join(command_args(c, "MULTIADDR", Path("TEXT"))) for c in COMMANDS}
        results.write_json(args.out, record)
    results.write_text(args.md, markdown(record))
    print(f"wrote {args.out} and {args.md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
