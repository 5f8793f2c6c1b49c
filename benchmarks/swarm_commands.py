"""Fast swarm commands (issue 22): seconds of `status --swarm`, `score`/`generate --swarm` and the dashboard.

Starts a small local swarm (benchmarks.harness.daemons.tiny: 3 daemons, one per block of TINY_CFG, on the real
hivemind DHT on loopback, training until stopped), then times each command end to end as a fresh
`blocktrain` process (the console script beside this interpreter), --reps times each:
  status    `blocktrain status --swarm MULTIADDR --swarm-id demo --json` (checked: every peer listed);
  score     `blocktrain score TEXT --swarm MULTIADDR --swarm-id demo --max-bytes 64 --json`;
  generate  `blocktrain generate hello --swarm MULTIADDR --swarm-id demo --max-bytes 4 --seed 1`, with the
            seconds to its first stdout byte (the prompt, echoed once the swarm is reached) and to its end;
  dashboard `blocktrain dashboard --swarm MULTIADDR --swarm-id demo --port 0`: seconds to the URL line, to
            the page (GET / right after the URL; whether the page itself carries every peer, i.e. a first
            paint that shows the swarm) and to the first /api/swarm answer listing every peer.
Then where the time goes: each command once more per repetition, in a probe (this script with --probe:
the same CLI entry point in-process, with timestamps around the interpreter start, the first import of
torch / hivemind / grpc / scipy, the DHT client start, DHT lookups, GetStatus / GetConfig calls, sweeps,
the DHT shutdown and the process exit). A phase's seconds count each instant once (imports first, then
exit, DHT start, lookups, status calls, config calls, sweeps, shutdown); "other" is the rest (CLI
parsing, Python work, waits). Wall times on a shared machine are noisy: the load average is recorded
around every command, and medians are reported.

    python benchmarks/swarm_commands.py --label after --before-tree /tmp/before
    python benchmarks/swarm_commands.py --label before   # one tree alone (this checkout, labelled before)

--before-tree names a copy of the checkout before the change (e.g. `git archive` of the commit before, or
this tree with the change taken out): both trees then run each command back to back, under the same load.

Writes benchmarks/results/swarm_commands.json (one entry per --label, kept across runs, so a before and
an after run sit side by side) and the fragment benchmarks/results/swarm_commands.md.
"""

from __future__ import annotations

import time

T_PROBE = time.time()  # the probe's first instant after the interpreter started (only stdlib imported so far)

import argparse  # noqa: E402  (T_PROBE first: the probe measures the interpreter's start-up)
import functools  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shlex  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import urllib.request  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SWARM_ID = "demo"  # LocalSwarm's default
COMMANDS = ("status", "score", "generate", "dashboard")
HEAVY = ("torch", "hivemind", "grpc", "scipy")  # top-level packages whose first import the probe times
TEXT = (b"the quick brown fox jumps over the lazy dog. " * 8) + bytes(range(32, 127))
TARGET_S = 5.0  # issue 22: every command answers within this on a quiet machine


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
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            t0 = time.time()
            try:
                return await fn(*args, **kwargs)
            finally:
                marks.add(phase, t0, time.time(), name=name)

        return timed_async

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            marks.add(phase, t0, time.time(), name=name)

    return timed


def probe(marks_path: str, argv: list[str]) -> None:
    """Run `blocktrain ARGV` in this process (cli.main.entry) with timestamps in marks_path."""
    import builtins

    marks = Marks(marks_path)
    marks.add("probe_start", T_PROBE)
    patched: set[tuple[str, str, str]] = set()

    def patch_loaded() -> None:  # wrap a module's methods once it is imported, never importing it here
        for module, cls, method, phase in WRAPS:
            key = (module, cls, method)
            if key in patched or module not in sys.modules:
                continue
            owner = getattr(sys.modules[module], cls, None)
            if owner is None or not hasattr(owner, method):
                continue
            patched.add(key)
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
    for phase in PRIORITY:
        for t0, t1 in intervals[phase]:
            for i in range(max(0, int((t0 - start) * 1000)), min(ms, int((t1 - start) * 1000))):
                if owner[i] is None:
                    owner[i] = phase
    out: dict[str, Any] = {"interpreter_start": start - spawned, "probe_overhead": 0.0}
    if cli is not None:
        out["probe_overhead"] = cli["t0"] - start  # this script's own imports before the CLI's
        for i in range(min(ms, int((cli["t0"] - start) * 1000))):
            owner[i] = owner[i] or "probe_overhead"
        out["cli_import"] = cli["t1"] - cli["t0"]
        for i in range(int((cli["t0"] - start) * 1000), min(ms, int((cli["t1"] - start) * 1000))):
            if owner[i] in (None, "import"):
                owner[i] = "cli_import"  # cli's modules, and the heavy ones it imports itself (grpc)
    for phase in (*PRIORITY, "cli_import", "probe_overhead"):
        out[phase] = sum(o == phase for o in owner) / 1000
    out["other"] = sum(o is None for o in owner) / 1000
    out["total"] = ended - spawned
    out["imports"] = [
        {"name": e["name"], "s": round(e["t1"] - e["t0"], 3), "torch": e["torch"]}
        for e in events
        if e["kind"] == "import"
    ]
    out["calls"] = {p: sum(e["kind"] == p for e in events) for p in ("lookup", "status_call", "config_call", "sweep")}
    return out


# -- the swarm and the commands --------------------------------------------------------------------------------
LAUNCH = "from cli.main import entry; entry()"  # what the `blocktrain` console script runs


def blocktrain() -> list[str]:
    """`blocktrain` as its console script runs it, from the tree on PYTHONPATH (tree_env)."""
    return [sys.executable, "-c", LAUNCH]


def tree_env(env: dict, tree: Path) -> dict:
    """env with the checkout `tree` first on the path: its cli and swarmd are the ones that run."""
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (str(tree), env.get("PYTHONPATH", "")) if p)}


def loadavg() -> float:
    return round(os.getloadavg()[0], 2)


def command_args(name: str, maddr: str, text: Path) -> list[str]:
    swarm = ["--swarm", maddr, "--swarm-id", SWARM_ID]
    return {
        "status": ["status", *swarm, "--json"],
        "score": ["score", str(text), *swarm, "--max-bytes", "64", "--json"],
        "generate": ["generate", "hello", *swarm, "--max-bytes", "4", "--seed", "1"],
        "dashboard": ["dashboard", *swarm, "--port", "0"],
    }[name]


def wait_cpu(proc: subprocess.Popen, timeout_s: float) -> float | None:
    """Wait for proc (killed after timeout_s); the CPU seconds (user + system) it and the children it reaped used."""
    deadline = time.time() + timeout_s
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if not pid and time.time() > deadline:
            proc.kill()
            pid, status, usage = os.wait4(proc.pid, 0)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return usage.ru_utime + usage.ru_stime
        time.sleep(0.005)  # polling the child (os.wait4 gives its CPU time), with a deadline


def run_plain(cmd: list[str], env: dict, timeout_s: float, cwd: Path = ROOT) -> dict[str, Any]:
    """Run cmd; seconds to its first stdout byte and to its end, its CPU seconds, exit code and stdout."""
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd)
    assert proc.stdout is not None
    first: list[float] = []
    chunks: list[bytes] = []

    def read() -> None:
        assert proc.stdout is not None
        while chunk := proc.stdout.read1(65536):
            if not first:
                first.append(time.time())
            chunks.append(chunk)

    errors: list[bytes] = []
    readers = [
        threading.Thread(target=read, daemon=True),
        threading.Thread(target=lambda: errors.append(proc.stderr.read() if proc.stderr else b""), daemon=True),
    ]
    for reader in readers:
        reader.start()
    cpu_s = wait_cpu(proc, timeout_s)
    ended = time.time()
    for reader in readers:
        reader.join(5)
    err = b"".join(errors)
    return {
        "s": ended - t0,
        "first_byte_s": (first[0] - t0) if first else None,
        "cpu_s": cpu_s,
        "exit": proc.returncode,
        "stdout": b"".join(chunks).decode(errors="replace"),
        "stderr_tail": err.decode(errors="replace")[-600:],
    }


def get(url: str, timeout_s: float = 30.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as reply:
        return reply.read()


def run_dashboard(cmd: list[str], env: dict, peer_ids: list[str], timeout_s: float, cwd: Path = ROOT) -> dict[str, Any]:
    """Start the dashboard; seconds to its URL line, to its page (and whether the page carries every peer),
    to the first /api/swarm listing every peer; then SIGINT it."""
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd, text=True)
    assert proc.stdout is not None
    out: dict[str, Any] = {"url_s": None, "page_s": None, "page_has_swarm": False, "api_s": None}
    try:
        line = proc.stdout.readline()
        if not line.startswith("dashboard: "):
            raise RuntimeError(f"dashboard printed {line!r}: {proc.stderr.read() if proc.stderr else ''}")
        out["url_s"] = time.time() - t0
        url = line.split()[1]
        page = get(url, timeout_s).decode(errors="replace")
        out["page_s"] = time.time() - t0
        out["page_has_swarm"] = all(p in page for p in peer_ids)
        deadline = t0 + timeout_s
        while time.time() < deadline:
            view = json.loads(get(url + "api/swarm"))
            ids = {p["peer_id"] for b in view.get("blocks", []) for p in b["peers"]}
            if view.get("status") == "ok" and set(peer_ids) <= ids:
                out["api_s"] = time.time() - t0
                break
            time.sleep(0.05)  # polling the dashboard's JSON, with a deadline
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        out["s"] = time.time() - t0
        out["exit"] = proc.returncode
    return out


def run_probe(
    name: str, args: list[str], env: dict, peer_ids: list[str], timeout_s: float, tmp: Path, tree: Path
) -> dict:
    marks = tmp / f"marks-{name}-{time.time_ns()}.jsonl"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--probe", str(marks), "--", *args]
    spawned = time.time()
    if name == "dashboard":
        result = run_dashboard(cmd, env, peer_ids, timeout_s, tree)
        ended = spawned + result["api_s"] if result["api_s"] else time.time()
    else:
        result = run_plain(cmd, env, timeout_s, tree)
        ended = time.time()
    events = [json.loads(line) for line in marks.read_text().splitlines() if line.strip()]
    if name == "dashboard":  # up to the first full answer; the probe's DHT calls after it are the next polls
        events = [e for e in events if e["t0"] < ended]
        events = [{**e, "t1": min(e["t1"], ended)} for e in events]
    out = breakdown(events, spawned, ended)
    out["exit_code"] = result["exit"]
    return out


def checked(name: str, result: dict, peer_ids: list[str]) -> dict:
    """The timing row of one plain run, with what it proves (every peer listed, a CE, generated bytes)."""
    row = {k: result[k] for k in ("s", "first_byte_s", "cpu_s", "exit")}
    row["load"] = loadavg()
    if result["exit"] != 0:
        row["error"] = result["stderr_tail"]
    elif name == "status":
        listed = [p["peer_id"] for p in json.loads(result["stdout"])["peers"]]
        row["peers_listed"] = len(listed)
        row["every_peer"] = sorted(listed) == sorted(peer_ids)
    elif name == "score":
        row["ce"] = json.loads(result["stdout"])["ce"]
    elif name == "generate":
        row["bytes_out"] = len(result["stdout"].strip()) - len("hello")
    return row


def median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def summarize(rows: list[dict], keys: tuple[str, ...]) -> dict:
    return {k: median([r.get(k) for r in rows]) for k in keys}


def measure(args: argparse.Namespace) -> dict[str, dict]:
    """{label: run} for each tree: this checkout (--label), and with --before-tree also that one (--before-label), the
    two run command by command, side by side (which goes first alternates by repetition) under the same load."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.harness import daemons

    trees = [(args.label, ROOT)] + ([(args.before_label, args.before_tree.resolve())] if args.before_tree else [])
    base = {**os.environ, "COLUMNS": "200", "OMP_NUM_THREADS": "1"}
    rows: dict[str, dict[str, list[dict]]] = {label: {c: [] for c in args.commands} for label, _ in trees}
    probes: dict[str, dict[str, list[dict]]] = {label: {c: [] for c in args.commands} for label, _ in trees}
    load_before = loadavg()
    with tempfile.TemporaryDirectory(prefix="blocktrain-swarm-commands-") as tmp_name:
        tmp = Path(tmp_name)
        text = tmp / "text.txt"
        text.write_bytes(TEXT)
        swarm = daemons.tiny(3, args.data_dir, tmp / "swarm", 0, 10, 10.0)  # rounds 0: train until stopped
        if args.idle:  # waiting for a 4th peer that never comes: announced, serving, answering, not training
            from dataclasses import replace

            swarm.config = replace(swarm.config, min_peers=len(swarm.peers) + 1, min_peers_timeout_s=86400.0)
        try:
            swarm.start(args.start_timeout_s)
            import asyncio

            statuses = asyncio.run(swarm.statuses(5.0))
            peer_ids = [st.peer_id for st in statuses if st is not None]
            if len(peer_ids) != len(swarm.peers):
                raise SystemExit(f"only {len(peer_ids)} of {len(swarm.peers)} daemons answer GetStatus")
            maddr = swarm.peers[0].info["multiaddrs"][0]
            time.sleep(args.settle_s)  # the joiners' DHT records reach the swarm key
            for rep in range(args.reps):
                for name in args.commands:
                    for label, tree in trees if rep % 2 == 0 else trees[::-1]:
                        env, cmd = tree_env(base, tree), [*blocktrain(), *command_args(name, maddr, text)]
                        if name == "dashboard":
                            row = run_dashboard(cmd, env, peer_ids, args.timeout_s, tree)
                            row["load"] = loadavg()
                        else:
                            row = checked(name, run_plain(cmd, env, args.timeout_s, tree), peer_ids)
                        rows[label][name].append(row)
                        print(f"rep {rep} {label} {name}: {json.dumps(row)}", flush=True)
                        if rep < args.probe_reps:
                            pr = run_probe(
                                name, command_args(name, maddr, text), env, peer_ids, args.timeout_s, tmp, tree
                            )
                            probes[label][name].append(pr)
                            phases = {k: round(v, 2) for k, v in pr.items() if isinstance(v, float)}
                            print(f"rep {rep} {label} {name} probe: {json.dumps(phases)} {pr['calls']}", flush=True)
        finally:
            swarm.stop()
    load_after = loadavg()
    return {
        label: {
            "label": label,
            "tree": str(tree),
            "paired_with": [other for other, _ in trees if other != label],
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}",
            "reps": args.reps,
            "idle_swarm": args.idle,
            "command": args.command,
            "load_before": load_before,
            "load_after": load_after,
            "rows": rows[label],
            "probes": probes[label],
            "median": {
                name: summarize(rows[label][name], ("s", "first_byte_s", "cpu_s", "url_s", "page_s", "api_s", "load"))
                for name in args.commands
            },
            "median_breakdown": {
                name: summarize(
                    probes[label][name],
                    ("total", "interpreter_start", "probe_overhead", "cli_import", *PRIORITY, "other"),
                )
                for name in args.commands
                if probes[label][name]
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


ORDER = (
    "before, idle swarm",
    "after, idle swarm",
    "before, training swarm",
    "after, training swarm",
)  # the record's columns, others after


def markdown(record: dict) -> str:
    runs = record["runs"]
    labels = [label for label in ORDER if label in runs] + [label for label in runs if label not in ORDER]
    first = runs[labels[0]]
    lines = [
        "## Fast swarm commands (issue 22)",
        "",
        f"A swarm of 3 daemons (benchmarks.harness.daemons.tiny, one per block of a tiny model; {first['machine']}, "
        "shared with other work: wall times scale with the load average) on the real hivemind DHT on "
        "loopback. *idle swarm*: the daemons wait for a 4th peer that never comes (announced, serving, "
        "answering, not training: the machine as quiet as others leave it); otherwise they train all along "
        "(3 trainers on 2 cores: a loaded machine). Every command runs as a fresh `blocktrain` process "
        f"(`python -c '{LAUNCH}'`, the console script's code, from the label's tree on PYTHONPATH); *before* "
        "is this checkout with the change taken out (--before-tree: a copy of it whose changed files are as "
        "committed before the change), run command by command side by side "
        "with *after*, under the same load (which goes first alternates). Medians of each run's repetitions, "
        "seconds from the spawn; *CPU* is the process's user + system time with the children it reaped (its "
        "DHT process). status lists every peer in every run; generate's *first byte* is its prompt, echoed "
        "once the swarm is reached; the dashboard's *page* is GET / right after its URL line, *page shows the "
        "swarm* whether that page itself carries every peer (its first paint), *api* the first /api/swarm "
        "that lists every peer.",
        "",
        "| command | " + " | ".join(labels) + " |",
        "|---|" + "---|" * len(labels),
    ]

    def cell(label: str, name: str, key: str) -> str:
        m = runs[label]["median"].get(name)
        return fmt(m.get(key)) if m else "-"

    def count(name: str, key: str) -> list[str]:
        out = []
        for label in labels:
            rows = runs[label]["rows"].get(name, [])
            out.append(f"{sum(bool(r.get(key)) for r in rows)} of {len(rows)}" if rows else "-")
        return out

    for name, key, what in (
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
    ):
        lines.append(f"| {what} | " + " | ".join(cell(label, name, key) for label in labels) + " |")
    lines.append("| `dashboard`: page shows the swarm | " + " | ".join(count("dashboard", "page_has_swarm")) + " |")
    lines.append("| `status --swarm` listed every peer | " + " | ".join(count("status", "every_peer")) + " |")
    lines.append("| repetitions | " + " | ".join(str(runs[label]["reps"]) for label in labels) + " |")
    loads = [f"{runs[label]['load_before']:.1f} / {runs[label]['load_after']:.1f}" for label in labels]
    lines.append("| load average (1 min) at the start / end | " + " | ".join(loads) + " |")
    lines += [
        "",
        "Where the time goes: the same commands in a probe (this script's --probe: the same entry point, with "
        "timestamps), medians of the probe runs, seconds. Each instant counts once, imports first; *import "
        "torch / hivemind ...* is their first import wherever it happens (hivemind's own imports torch), "
        "*other* the CLI's own work and waits. The dashboard's phases run to its first full /api/swarm answer.",
    ]
    for name in COMMANDS:
        have = [label for label in labels if runs[label].get("median_breakdown", {}).get(name)]
        if not have:
            continue
        lines += ["", f"| `{name}` | " + " | ".join(have) + " |", "|---|" + "---|" * len(have)]
        for phase in ("interpreter_start", "probe_overhead", "cli_import", *PRIORITY, "other", "total"):
            cells = [fmt(runs[label]["median_breakdown"][name].get(phase)) for label in have]
            lines.append(f"| {PHASE_NAMES[phase]} | " + " | ".join(cells) + " |")
    lines.append("")
    for label in labels:
        run = runs[label]
        command = run.get("command", record.get("command", ""))
        command, _, note = command.partition("` ")  # a note after the command (a renamed label)
        lines.append(f"*{label}*: `{command}`{' ' + note if note else ''}, {run['when']}.  ")
    lines += ["", f"Target: every command within {TARGET_S:.0f} s on a quiet machine.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--probe"]:
        probe(argv[1], argv[3:] if argv[2:3] == ["--"] else argv[2:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--data-dir", type=Path, default=os.environ.get("BLOCKTRAIN_DATA", "/work/shared/data/wikitext-2"))
    p.add_argument("--label", default="after", help="name of this checkout's run in the record (before, after, ...)")
    p.add_argument(
        "--before-tree",
        type=Path,
        default=None,
        help="a copy of the checkout before the change: its commands run too, side by side (--before-label)",
    )
    p.add_argument("--before-label", default="before", help="name of --before-tree's run in the record")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--probe-reps", type=int, default=None, help="repetitions with a probe run too (default: --reps)")
    p.add_argument("--commands", nargs="+", choices=COMMANDS, default=list(COMMANDS))
    p.add_argument("--timeout-s", type=float, default=120.0, help="give up on one command after this many seconds")
    p.add_argument("--start-timeout-s", type=float, default=240.0)
    p.add_argument("--settle-s", type=float, default=3.0)
    p.add_argument(
        "--idle",
        action="store_true",
        help="daemons that never train (waiting for a 4th peer): the commands then run on a machine this swarm "
        "leaves quiet",
    )
    p.add_argument("--out", type=Path, default=RESULTS / "swarm_commands.json")
    p.add_argument("--md", type=Path, default=RESULTS / "swarm_commands.md")
    p.add_argument("--render", action="store_true", help="only rewrite --md from --out (nothing runs)")
    args = p.parse_args(argv)
    args.command = shlex.join(["python", "benchmarks/swarm_commands.py", *argv])
    if args.probe_reps is None:
        args.probe_reps = args.reps
    record = json.loads(args.out.read_text()) if args.out.exists() else {"runs": {}}
    if not args.render:
        if not (Path(args.data_dir) / "train.txt").is_file():
            p.error(f"--data-dir must hold train.txt (got {args.data_dir}); set BLOCKTRAIN_DATA")
        record["runs"].update(measure(args))
        record["commands"] = {
            name: "blocktrain " + " ".join(command_args(name, "MULTIADDR", Path("TEXT"))) for name in COMMANDS
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    args.md.parent.mkdir(parents=True, exist_ok=True)
    args.md.write_text(markdown(record))
    print(f"wrote {args.out} and {args.md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
