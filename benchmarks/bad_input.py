"""Bad input through the real CLI: exit code, message and seconds to the message, one fresh process per case.

Runs every case as `blocktrain ARGS` (the installed entry point next to this interpreter, else
`python -m cli.main`) in a fresh process (its own process group), with stdin closed and a per-case
timeout, and records the exit code, the message (the first `error:` line on stderr, else its first
line; for a success that must stay quiet, the first stdout line showing the result), the seconds from
the spawn to that line, the same less the time the process's main thread waited for a CPU (the run
queue wait of /proc/PID/schedstat: an estimate, from above, of the seconds on a quiet machine), every
stderr line, and whether a traceback showed up. The cases are the issue 10 list of late or unclear
errors, the issue 22 list (numeric flags refused at parse time, DHT client commands against a live
swarm without hivemind's `[ERROR]` noise, join's config mismatch, a wrong or missing swarm key) and the
usual bad inputs (missing, empty and binary data, bad model flags, bad checkpoint dirs, an unknown
swarm, a closed port, a taken port, CUDA asked for without CUDA).

Fixtures: one idle daemon (`blocktrain run --min-peers 2`, one block, so it serves the whole model to
score / generate and never trains while alone) gives the live swarm, multiaddr and taken port; a second
idle daemon of a private swarm (--swarm-key) is joined without its key and with another one. The last
case joins the idle daemon with a swarm key of its own: the daemon (the lower peer id, fixed by
--identity, dials) is refused every exchange, so the joiner's rounds merge nothing and it stops with
exit code 3 (after it the idle daemon trains; it is the last case for that). Both are stopped at the end.

A row passes when the exit code is the expected one, the message is one `error:` line with the expected
words and stderr holds nothing else (a success row: no `error:`, `[ERROR]`, `WARN`/`WARNING` or traceback
line on stderr, and stdout shows the result; the exit-3 joiner may log before its `error:` line, which must
be its last), there is no traceback, and the message came
within 3 s on the quiet estimate (10 s for a command that starts a DHT client; network timeouts and the
exit-3 case: within their stated bound).
Writes benchmarks/results/bad_input.json and the markdown fragment benchmarks/results/bad_input.md
(BENCHMARKS.md#bad_input):
    python benchmarks/bad_input.py
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
FAST_S = 3.0  # every message within this (quiet estimate), except network timeouts
DHT_S = 10.0  # a command that starts a DHT client (hivemind's DHT process and p2pd) and does one lookup
PROBE_S = 60.0  # the dashboard's /api/swarm lists the idle daemon within this
TINY = ["--blocks", "2", "--layers-per-block", "1", "--d-model", "32", "--n-heads", "2", "--seq-len", "16"]
DAEMON_MODEL = ["--blocks", "1", *TINY[2:]]  # the idle daemons serve every block: score / generate can run
TEXT = (b"the quick brown fox jumps over the lazy dog. " * 400) + bytes(range(32, 127)) * 40
NOISE = re.compile(r"Traceback|\[ERROR\]|\[WARN|^error:|No multiaddrs found|\b(ERROR|WARN|WARNING)\b")  # a success
LOG_NOISE = re.compile(r"Traceback|\[ERROR\]|No multiaddrs found|\bERROR\b")  # among a running peer's log lines
KEYED_JOIN = ["join", "{MULTIADDR}", "--swarm-id", "badinput", "--data", "{TRAIN}", "--swarm-key", "{OTHER_KEY}"]
LIVE = ["--swarm", "{MULTIADDR}", "--swarm-id", "badinput"]  # a DHT client command's way into the idle daemon's swarm
QUICK_JOIN = ["--steps-per-round", "2", "--batch-size", "4", "--deadline-max", "2", "--codec", "fp32"]


@dataclass
class Case:
    name: str  # what the row is about
    args: list[str]  # blocktrain ARGS; {NAME} placeholders are filled from the fixtures
    expect_exit: int | tuple[int, ...]  # exit code(s) of a clear refusal (2 bad input, 1 unreachable, 3 nothing
    # merges, 0 no error)
    words: str  # a regex the message must match (it names the cause); {NAME} placeholders are filled too
    network_timeout_s: float = 0.0  # > 0: a network timeout (or a bounded network case) may take this long
    dht: bool = False  # it starts a DHT client: the message within DHT_S
    logs_ok: bool = False  # a command that runs a peer: its log lines may come before the `error:` line, which
    # must be the last line of stderr (no `[ERROR]` line, no traceback)
    issue: int = 0  # the issue whose list the case is from (10, 22), 0 for the usual bad inputs
    quiet: bool = False  # a success: stderr must hold no `error:`, `[ERROR]`/`[WARN]` or traceback line, and
    # `words` must match a stdout line (the message)
    probe: str = ""  # "dashboard": once its URL is out, poll URL/api/swarm until it lists a peer, then Ctrl-C
    timeout_s: float = 0.0  # give up on the case after this long (0: the --timeout-s of the run)


@dataclass
class Row:
    name: str
    command: str
    exit_code: int | None
    message: str
    seconds: float | None  # spawn -> the message line
    quiet_s: float | None  # ... less the main thread's run-queue wait until then (a quiet machine, from above)
    first_line: str  # stderr's first line
    traceback: bool
    ok: bool
    why: str = ""  # what fails the bar
    issue: int = 0
    wall_s: float = 0.0  # spawn -> exit
    cpu_s: float = 0.0  # user + system CPU seconds of the process (and the children it waited for)
    load_1m: float = 0.0  # the 1-minute load average at the spawn
    bar_s: float = FAST_S
    bar: str = "fast"  # fast, dht (starts a DHT client) or network (a network timeout, a bounded network case)
    stderr: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)


GROUPS = {"TINY": TINY, "LIVE": LIVE, "KEYED_JOIN": KEYED_JOIN, "QUICK_JOIN": QUICK_JOIN}


def argv(args: str) -> list[str]:
    """blocktrain ARGS from a line: split on spaces, `*NAME` expanded to one of GROUPS."""
    return [x for w in args.split() for x in (GROUPS[w[1:]] if w.startswith("*") else [w])]


def case(name: str, args: str, expect_exit: int | tuple[int, ...], words: str, **more: Any) -> Case:
    return Case(name, argv(args), expect_exit, words, **more)


def refused(name: str, args: str, words: str) -> Case:
    """An issue 22 numeric flag refused while parsing: exit code 2, one `--flag must be ..., got ...` line."""
    return case(name, args, 2, words, issue=22)


def live(name: str, args: str, words: str, **more: Any) -> Case:
    """An issue 22 success against the live swarm (args with LIVE): exit code 0 and a quiet stderr."""
    return case(f"{name} (a success: no [ERROR] line, no traceback)", args, 0, words, issue=22, quiet=True, **more)


def cases() -> list[Case]:
    d, o = "--data {TRAIN}", "--out {OUT}"
    return [
        # issue 10's list (found item 5)
        case(
            "demo: fewer peers than blocks",
            f"demo --peers 2 --blocks 3 {d} {o}",
            2,
            r"--peers 2 cannot train --blocks 3",
            issue=10,
        ),
        case(
            "demo: --trajectory-prob 5",
            f"demo --trajectory-prob 5 {d} {o}",
            2,
            r"--trajectory-prob must be in \[0, 1\], got 5",
            issue=10,
        ),
        case(
            "status of a closed port",
            "status 127.0.0.1:{CLOSED}",
            1,
            r"(?i)refused|not listening|unreachable|closed",
            issue=10,
        ),
        case("join not-a-multiaddr", f"join not-a-multiaddr {d}", 2, r"(?i)multiaddr", issue=10),
        case(
            "run: --listen port already taken",
            f"run {d} --listen 127.0.0.1:{{TAKEN}} *TINY",
            (1, 2),
            r"(?i)in use|taken|cannot listen|bind",
            issue=10,
        ),
        case("train: binary file as training text", f"train --data {{BINARY}} {o} *TINY", 2, r"(?i)binary", issue=10),
        case(
            "train: data without eval.txt beside it (not an error: announced)",
            f"train --data {{LONE}} {o} --rounds 1 --steps-per-round 1 *TINY",
            0,
            r"(?i)held out",
            issue=10,
        ),
        # issue 22's list: every numeric flag range-checked at parse time (a representative few, every command)
        refused(
            "run --steps-per-round -5 (was a 49-line traceback after 18 s)",
            "run --steps-per-round -5",
            r"^error: bad value: --steps-per-round must be >= 1, got -5$",
        ),
        refused("demo --rounds -1", "demo --rounds -1", r"--rounds must be >= 1, got -1"),
        refused("train --lr nan", "train --lr nan", r"--lr must be > 0, got nan"),
        refused(
            "join --steps-per-round 0", "join {MULTIADDR} --steps-per-round 0", r"--steps-per-round must be >= 1, got 0"
        ),
        refused(
            "score --max-bytes -1 (score's budget flag)",
            "score --max-bytes -1 {TRAIN}",
            r"--max-bytes must be >= 1, got -1",
        ),
        refused("eval --eval-tokens -1", "eval --eval-tokens -1", r"--eval-tokens must be >= 1, got -1"),
        refused("generate --temperature -1", "generate --temperature -1 hello", r"--temperature must be >= 0, got -1"),
        refused("status --timeout-s 0", "status --timeout-s 0 127.0.0.1:{CLOSED}", r"--timeout-s must be > 0, got 0"),
        refused(
            "dashboard --port 70000",
            "dashboard --swarm {MULTIADDR} --port 70000",
            r"--port must be in \[0, 65535\], got 70000",
        ),
        # issue 22's list: DHT client commands against the live swarm, no hivemind noise on stderr
        live("status --swarm of the live swarm", "status *LIVE", r"{PEER_SHORT}", dht=True),
        live("score --swarm, a tiny budget", "score *LIVE --max-bytes 32 {TRAIN}", r"^ce \d+\.\d+ nats/byte", dht=True),
        live("generate --swarm, a tiny budget", "generate *LIVE --max-bytes 4 hello", r"^hello", dht=True),
        live(
            "dashboard --swarm started and stopped with Ctrl-C",
            "dashboard *LIVE --port 0",
            r"^dashboard: http://",
            probe="dashboard",
        ),
        case(
            "join with a model flag that differs from the swarm's config",
            f"join {{MULTIADDR}} --swarm-id badinput {d} --d-model 64",
            2,
            r"do not match the swarm's config: --d-model 64 \(swarm: 32\)",
            issue=22,
            dht=True,
        ),
        # GetConfig refused: `no peer answered` (PeerUnavailable, 1) naming the key
        case(
            "join a private swarm without its key",
            f"join {{KEYED_MULTIADDR}} --swarm-id badkey {d}",
            (1, 2),
            r"(?i)no proof of the swarm key.*--swarm-key",
            issue=22,
            dht=True,
        ),
        case(
            "join a private swarm with another swarm key",
            f"join {{KEYED_MULTIADDR}} --swarm-id badkey {d} --swarm-key {{OTHER_KEY}}",
            (1, 2),
            r"(?i)another swarm key.*--swarm-key",
            issue=22,
            dht=True,
        ),
        # the usual bad inputs
        case("train: missing data file", f"train --data {{MISSING}} {o} *TINY", 2, r"does not exist"),
        case("train: empty data file", f"train --data {{EMPTY}} {o} *TINY", 2, r"(?i)no bytes|empty"),
        case("demo: missing data file", f"demo --data {{MISSING}} {o}", 2, r"does not exist"),
        case("train: --d-model 30 --n-heads 4", f"train {d} {o} --d-model 30 --n-heads 4", 2, r"divisible by n_heads"),
        case("model-info --d-model 0", "model-info --d-model 0", 2, r"--d-model must be >= 1, got 0"),
        case(
            "status --swarm of an unknown swarm id (not an error: an empty table and a note naming the swarm id)",
            "status --swarm {MULTIADDR} --swarm-id no-such-swarm",
            0,
            r"no peer of swarm 'no-such-swarm'",
            dht=True,
        ),
        case("score --checkpoint a missing dir", "score --checkpoint {MISSING} {TRAIN}", 2, r"(?i)does not exist"),
        case(
            "generate --checkpoint a dir without config.json",
            "generate --checkpoint {NOT_CHECKPOINT} hello",
            2,
            r"(?i)not a checkpoint",
        ),
        case(
            "eval --checkpoint a corrupt config.json",
            f"eval --checkpoint {{CORRUPT}} {d}",
            2,
            r"(?i)not valid JSON|unknown checkpoint",
        ),
        case("train --device cuda without CUDA", f"train {d} {o} --device cuda *TINY", 2, r"(?i)cuda"),
        case(
            "status of a port that accepts but never answers (a network timeout)",
            "status 127.0.0.1:{SILENT} --timeout-s 3",
            1,
            r"(?i)timed out|deadline|did not answer|no answer",
            network_timeout_s=10.0,
        ),
        # last: after it the idle daemon has a second peer and trains; its bound: 3 rounds of the daemon's
        # (20 steps, its deadline), its DHT start and stop
        case(
            "join the public swarm with a swarm key (every exchange refused: stops after 3 rounds)",
            "*KEYED_JOIN --identity {HIGH_ID} *QUICK_JOIN",
            3,
            r"^error: every exchange (was refused|failed) for 3 rounds: .*swarm key",
            network_timeout_s=120.0,
            logs_ok=True,
            issue=22,
            timeout_s=240.0,
        ),
    ]


def blocktrain() -> list[str]:
    script = Path(sys.executable).parent / "blocktrain"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "cli.main"]


def fill_in(text: str, fill: dict[str, str], regex: bool = False) -> str:
    return re.sub(r"\{([A-Z_]+)\}", lambda m: re.escape(fill[m.group(1)]) if regex else fill[m.group(1)], text)


def run_wait_s(pid: int) -> float | None:
    """Seconds the process's main thread has waited on a run queue (runnable, no CPU free), None if unreadable."""
    try:
        fields = Path(f"/proc/{pid}/schedstat").read_text().split()
        return int(fields[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def run_case(case: Case, fill: dict[str, str], env: dict[str, str], timeout_s: float) -> Row:
    args = [fill_in(a, fill) for a in case.args]
    cmd = [*blocktrain(), *args]
    load = os.getloadavg()[0]
    usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        encoding="utf-8",
        errors="replace",
        env=env,
        cwd=ROOT,
        start_new_session=True,  # its own process group: Ctrl-C goes to the group, leftovers are found
    )
    err_lines: list[tuple[float, str]] = []
    out_lines: list[tuple[float, str]] = []
    waits: list[tuple[float, float]] = []  # (seconds since spawn, run-queue wait so far)
    done = threading.Event()

    def read(stream, into: list[tuple[float, str]]) -> None:
        for line in stream:
            into.append((time.monotonic() - t0, line.rstrip("\n")))

    def sample() -> None:
        while not done.is_set():
            w = run_wait_s(proc.pid)
            if w is not None:
                waits.append((time.monotonic() - t0, w))
            done.wait(0.02)

    readers = [
        threading.Thread(target=read, args=(proc.stderr, err_lines), daemon=True),
        threading.Thread(target=read, args=(proc.stdout, out_lines), daemon=True),
        threading.Thread(target=sample, daemon=True),
    ]
    for t in readers:
        t.start()
    limit = case.timeout_s or timeout_s
    extra: dict = {}
    if case.probe == "dashboard":
        extra.update(probe_dashboard(proc, out_lines, t0, PROBE_S))
        interrupt(proc)
    try:
        proc.wait(timeout=max(1.0, limit - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        extra["timed_out_after_s"] = round(time.monotonic() - t0, 1)
        interrupt(proc)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            _killpg(proc.pid)
            proc.wait()
    wall = time.monotonic() - t0
    done.set()
    for t in readers:
        t.join(timeout=10)
    usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if left := group_members(proc.pid):  # an exited command left a process of its group behind (DHT child, p2pd)
        extra["left_processes"] = left
        _killpg(proc.pid)
    cpu = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
    errors = [(t, line) for t, line in err_lines if line.startswith("error:")]
    if case.quiet:
        words = fill_in(case.words, fill, regex=True)
        shown = [(t, line) for t, line in out_lines if re.search(words, line)]
        seconds, message = shown[0] if shown else (out_lines[0] if out_lines else (None, ""))
    else:
        seconds, message = errors[0] if errors else (err_lines[0] if err_lines else (None, ""))
    waited = max((w for t, w in waits if seconds is not None and t <= seconds), default=0.0)
    logs = [line for _, line in err_lines if not line.startswith("error:")]
    if case.logs_ok and logs:
        extra["log_lines"] = len(logs)
    if case.probe and "api_peers_after_s" in extra:
        message += f" (its /api/swarm listed {extra['api_peers']} peer(s) after {extra['api_peers_after_s']} s)"
    row = Row(
        name=case.name,
        command="blocktrain " + " ".join(_shown(a, fill) for a in case.args),
        exit_code=proc.returncode,
        message=message,
        seconds=round(seconds, 2) if seconds is not None else None,
        quiet_s=round(seconds - waited, 2) if seconds is not None else None,
        first_line=err_lines[0][1] if err_lines else "",
        traceback=any("Traceback" in line for _, line in err_lines),
        ok=False,
        issue=case.issue,
        wall_s=round(wall, 2),
        cpu_s=round(cpu, 2),
        load_1m=round(load, 1),
        bar_s=bar_s(case),
        bar="dht" if case.dht else "network" if case.network_timeout_s else "fast",
        stderr=[line for _, line in err_lines][:20],
        extra={**extra, "stdout_head": [line for _, line in out_lines][:3], "run_queue_wait_s": round(waited, 2)},
    )
    row.ok, row.why = judge(case, row, fill)
    return row


def probe_dashboard(proc: subprocess.Popen, out_lines: list[tuple[float, str]], t0: float, bound_s: float) -> dict:
    """Wait for the dashboard's URL, then poll its /api/swarm until it lists a peer (or bound_s since the spawn)."""
    url = None
    while url is None and proc.poll() is None and time.monotonic() - t0 < bound_s:
        for _, line in out_lines:
            if m := re.search(r"http://\S+", line):
                url = m.group(0).rstrip("/") + "/api/swarm"
        time.sleep(0.1)
    if url is None:
        return {"api": "no URL printed"}
    last: dict = {}
    while proc.poll() is None and time.monotonic() - t0 < bound_s:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                last = json.loads(r.read())
        except (OSError, ValueError) as exc:
            last = {"fetch_error": str(exc)}
        if last.get("peers"):
            return {"api_peers": last["peers"], "api_peers_after_s": round(time.monotonic() - t0, 1)}
        time.sleep(0.5)
    return {"api": f"no peer listed within {bound_s:.0f} s", "api_last": last}


def interrupt(proc: subprocess.Popen) -> None:
    """Ctrl-C as a terminal sends it: SIGINT to the command's whole process group."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
    except (ProcessLookupError, PermissionError):
        pass


def group_members(pgid: int) -> list[str]:
    """'PID COMM STATE' of each process still alive in process group `pgid` (from /proc; zombies left out: they
    exited, only their reaping is due)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        comm = text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(f"{stat.parent.name} {comm} {fields[0]}")
    return out


def _killpg(pgid: int) -> bool:
    """SIGKILL whatever is left of the process group `pgid`; whether anything was."""
    try:
        os.killpg(pgid, signal.SIGKILL)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _shown(arg: str, fill: dict[str, str]) -> str:
    """The argument as the table shows it: fixture paths by their placeholder name, not a temp path."""
    return re.sub(r"\{(\w+)\}", lambda m: m.group(1) if "/" in fill[m.group(1)] else fill[m.group(1)], arg)


def bar_s(case: Case) -> float:
    return DHT_S if case.dht else case.network_timeout_s or FAST_S


def judge(case: Case, row: Row, fill: dict[str, str]) -> tuple[bool, str]:
    why = []
    expected = case.expect_exit if isinstance(case.expect_exit, tuple) else (case.expect_exit,)
    if row.exit_code not in expected:
        why.append(f"exit {row.exit_code}, expected {' or '.join(map(str, expected))}")
    if row.traceback:
        why.append("traceback")
    errors = [line for line in row.stderr if line.startswith("error:")]
    if case.quiet:
        noise = [line for line in row.stderr if NOISE.search(line)]
        if noise:
            why.append(f"stderr noise ({len(noise)} lines): {noise[0][:120]}")
    elif 0 not in expected:
        if not row.message.startswith("error:"):
            why.append("no `error:` line")
        elif len(errors) > 1:
            why.append(f"{len(errors)} `error:` lines")
        others = [line for line in row.stderr if not line.startswith("error:")]
        if case.logs_ok:  # a peer's own log lines first; the error line last
            noise = [line for line in others if LOG_NOISE.search(line)]
            if noise:
                why.append(f"stderr noise ({len(noise)} lines): {noise[0][:120]}")
            if row.stderr and not row.stderr[-1].startswith("error:"):
                why.append("the `error:` line is not the last line")
        elif others:
            why.append(f"{len(others)} more stderr lines: {others[0][:120]}")
    if not re.search(fill_in(case.words, fill, regex=True), row.message):
        why.append("message does not name the cause" if not case.quiet else "stdout does not show the result")
    if case.probe and "api_peers" not in row.extra:
        why.append(f"dashboard: {row.extra.get('api', 'probe failed')}")
    limit = bar_s(case)
    if row.quiet_s is None:
        why.append("no message at all")
    elif row.quiet_s >= limit:
        why.append(f"message after {row.seconds}s, {row.quiet_s}s less the run-queue wait (bar {limit:.0f}s)")
    return not why, "; ".join(why)


class Fixtures:
    """Files, keys, identities, a closed and a silent port, and two idle daemons (one of a private swarm);
    stop() ends the daemons."""

    def __init__(self, root: Path, env: dict[str, str]):
        self.root, self.env = root, env
        self.daemons: list[subprocess.Popen] = []
        self.silent = socket.socket()  # listens (the kernel completes every handshake) but never accepts

    def build(self) -> dict[str, str]:
        r = self.root
        (r / "data").mkdir()
        train = r / "data" / "train.txt"
        train.write_bytes(TEXT)
        (r / "data" / "eval.txt").write_bytes(TEXT[::-1])
        (r / "empty.txt").write_bytes(b"")
        (r / "binary.bin").write_bytes(bytes(range(256)) * 64)
        (r / "lone").mkdir()
        (r / "lone" / "text.txt").write_bytes(TEXT)
        (r / "not-a-checkpoint").mkdir()
        (r / "not-a-checkpoint" / "notes.txt").write_text("hello")
        (r / "corrupt").mkdir()
        (r / "corrupt" / "config.json").write_text("{not json")
        keys = self.keys_and_identities()
        fill = {
            "TRAIN": str(train),
            "EMPTY": str(r / "empty.txt"),
            "BINARY": str(r / "binary.bin"),
            "MISSING": str(r / "missing.txt"),
            "NOT_CHECKPOINT": str(r / "not-a-checkpoint"),
            "CORRUPT": str(r / "corrupt"),
            "OUT": str(r / "out"),
            "LONE": str(r / "lone" / "text.txt"),
            "CLOSED": str(closed_port()),
            "SILENT": str(self.listen_silently()),
            **keys,
        }
        base = ["run", "--data", str(train), "--min-peers", "2", *DAEMON_MODEL]
        public = self.start_daemon([*base, "--swarm-id", "badinput", "--identity", keys["LOW_ID"]])
        private = self.start_daemon([*base, "--swarm-id", "badkey", "--swarm-key", keys["KEY"]])
        info = self.wait_ready(public)
        keyed = self.wait_ready(private)
        return {
            **fill,
            "TAKEN": info["address"].rpartition(":")[2],
            "MULTIADDR": info["multiaddr"],
            "PEER_SHORT": info["peer"][-8:],  # how `status` shows a peer id
            "KEYED_MULTIADDR": keyed["multiaddr"],
        }

    def keys_and_identities(self) -> dict[str, str]:
        """Two swarm keys, and two peer identities in peer-id order (the idle daemon's is the lower: it dials)."""
        sys.path.insert(0, str(ROOT))
        from swarmd.membership.identity import Identity
        from swarmd.transport.auth import write_swarm_key

        out = {"KEY": str(self.root / "swarm.key"), "OTHER_KEY": str(self.root / "other.key")}
        write_swarm_key(out["KEY"])
        write_swarm_key(out["OTHER_KEY"])
        low, high = sorted((Identity.generate(bytes([i + 1]) * 32) for i in range(2)), key=lambda x: x.peer_id)
        for name, identity in (("LOW_ID", low), ("HIGH_ID", high)):
            path = self.root / f"{name.lower()}.pem"
            path.write_bytes(identity.to_pem())
            os.chmod(path, 0o600)
            out[name] = str(path)
        return out

    def start_daemon(self, args: list[str]) -> subprocess.Popen:
        daemon = subprocess.Popen(
            [*blocktrain(), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=self.env,
            cwd=ROOT,
            start_new_session=True,
        )
        self.daemons.append(daemon)
        return daemon

    @staticmethod
    def wait_ready(daemon: subprocess.Popen) -> dict[str, str]:
        info: dict[str, str] = {}
        deadline = time.monotonic() + 180
        assert daemon.stdout is not None
        for line in daemon.stdout:
            key, _, value = line.rstrip("\n").partition(": ")
            info.setdefault(key, value)
            if line.strip() == "ready" or time.monotonic() > deadline:
                break
        if not {"address", "multiaddr", "peer"} <= info.keys():
            raise SystemExit(f"a helper daemon did not start: {info}")
        threading.Thread(target=daemon.stdout.read, daemon=True).start()  # drain: it never blocks on a full pipe
        return info

    def listen_silently(self) -> int:
        self.silent.bind(("127.0.0.1", 0))
        self.silent.listen(16)
        return self.silent.getsockname()[1]

    def stop(self) -> None:
        self.silent.close()
        for daemon in self.daemons:
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
        for daemon in self.daemons:
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            _killpg(daemon.pid)  # its DHT process and p2pd
            daemon.wait(timeout=10)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def markdown(out: dict) -> str:
    rows = out["rows"]
    failing = [r for r in rows if not r["ok"]]
    lines = [
        "## Bad input: exit code, message, seconds to the message (issues 10 and 22)",
        "",
        f"Produced by `{out['command']}` ({out['machine']}; {out['when']}; wall time {out.get('wall_s', 0):.0f} s). "
        "Every case runs the real CLI (`blocktrain ARGS`) in a fresh process; *seconds* is the time from the spawn "
        "to the message line (the first `error:` line on stderr, else its first line; for a success row, the "
        "stdout line showing the result), so it includes the interpreter and CLI start-up. *quiet est.* is the same "
        "less the time the process's main thread waited for a CPU (its run-queue wait in /proc/PID/schedstat): "
        "an estimate, from above, of the seconds on a quiet machine (the waits of its child processes, hivemind's "
        "DHT process and p2pd, are not subtracted); the bar is judged on it. *load* is the 1-minute load average "
        "at the spawn. A row passes when the exit code is the expected one (2 bad input, 1 an unreachable or "
        "refusing peer, 3 a peer whose every exchange is refused, 0 not an error), stderr is one `error:` line "
        "naming the cause and nothing else (a success row: no `error:`, `[ERROR]`, `WARN`/`WARNING` or traceback "
        "line on stderr, and stdout shows the result; the joiner that runs rounds may log before its `error:` line, "
        "which must be its last, with no `[ERROR]` line), no traceback, and the message came within the *bar*: "
        f"{FAST_S:.0f} s; {DHT_S:.0f} s for a command that starts a DHT client (hivemind's DHT process and p2pd "
        "start, then one lookup; stated here, not by the CLI); a network timeout within its own bound; the joiner "
        "refused for 3 rounds within 120 s. Rows marked (issue N) are that issue's list; TMP is the run's temp "
        "folder; MULTIADDR is the idle daemon's (`blocktrain run --min-peers 2`, one block, so score / generate "
        "find every block; `--identity` fixed so that it dials a joiner), KEYED_MULTIADDR that of a second idle "
        "daemon of a private swarm (`--swarm-key KEY`); OTHER_KEY is another swarm key. The last row runs last: "
        "after it the idle daemon has a second peer and trains. Load average during the run: "
        f"{out['load_before']} before, {out['load_after']} after ({out['machine'].split(',')[0]}, shared).",
        "",
        "| input | exit | seconds | quiet est. | bar | load | message | passes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        issue = r["issue"] if not isinstance(r["issue"], bool) else 10 * r["issue"]
        label = f"{r['name']}{f' (issue {issue})' if issue else ''}<br>`{r['command']}`"
        message = re.sub(r"\S*blocktrain-bad-input-\w+", "TMP", r["message"]).replace("|", "\\|")
        if len(message) > 260:
            message = message[:257] + "..."
        if n := r.get("extra", {}).get("log_lines"):
            message += f" (after {n} log lines of the peer, e.g. `{r['stderr'][0][:140]}`)".replace("|", "\\|")
        secs = "-" if r["seconds"] is None else f"{r['seconds']:.2f}"
        quiet = "-" if r.get("quiet_s") is None else f"{r['quiet_s']:.2f}"
        verdict = "yes" if r["ok"] else f"**no**: {r['why']}".replace("|", "\\|")
        bar = f"{r.get('bar_s', FAST_S):.0f} s{' (DHT)' if r.get('bar') == 'dht' else ''}"
        load = r.get("load_1m", "-")
        lines.append(f"| {label} | {r['exit_code']} | {secs} | {quiet} | {bar} | {load} | {message} | {verdict} |")
    lines += [
        "",
        f"{len(rows) - len(failing)} of {len(rows)} rows pass"
        + (": every one." if not failing else f"; failing: {', '.join(r['name'] for r in failing)}."),
    ]
    over = [r for r in rows if r.get("bar") == "dht" and (r.get("quiet_s") or 0) >= FAST_S]
    if over:
        lines += [
            "",
            f"Over {FAST_S:.0f} s on the quiet estimate, within the {DHT_S:.0f} s bar of a command that starts a DHT "
            "client: " + "; ".join(f"{r['name']} ({r['quiet_s']:.2f} s)" for r in over) + ".",
        ]
    left = [
        f"{r['name']}: {', '.join(r['extra']['left_processes'])}"
        for r in rows
        if isinstance(r.get("extra", {}).get("left_processes"), list)
    ]
    if left:
        lines += [
            "",
            "Processes of a command's group still there after it exited (PID COMM STATE; killed by the "
            "harness): " + "; ".join(left) + ".",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--out", type=Path, default=RESULTS / "bad_input.json")
    p.add_argument("--md", type=Path, default=RESULTS / "bad_input.md")
    p.add_argument("--timeout-s", type=float, default=60.0, help="Give up on one case after this many seconds.")
    p.add_argument("--only", default="", help="Run only the cases whose name contains this.")
    p.add_argument("--render", type=Path, help="Only rewrite --md from this JSON result (no run).")
    args = p.parse_args(argv)
    if args.render is not None:
        args.md.write_text(markdown(json.loads(args.render.read_text())))
        return 0
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="blocktrain-bad-input-"))
    env = {**os.environ, "BLOCKTRAIN_CACHE": str(tmp / "cache"), "COLUMNS": "200"}
    for name in ("BLOCKTRAIN_DATA", "BLOCKTRAIN_SWARM_KEY", "BLOCKTRAIN_SWARM", "BLOCKTRAIN_SWARM_ID"):
        env.pop(name, None)
    load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())
    fixtures = Fixtures(tmp, env)
    rows: list[Row] = []
    try:
        fill = fixtures.build()
        print(f"fixtures up after {time.monotonic() - started:.0f} s", flush=True)
        for case in cases():
            if args.only and args.only not in case.name:
                continue
            row = run_case(case, fill, env, args.timeout_s)
            rows.append(row)
            mark = "ok  " if row.ok else "FAIL"
            print(
                f"{mark} {row.seconds}s (quiet est. {row.quiet_s}s, load {row.load_1m}) exit {row.exit_code} "
                f"{row.name}: {row.message} {row.why}",
                flush=True,
            )
    finally:
        fixtures.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    out = {
        "command": ("python benchmarks/bad_input.py " + " ".join(argv if argv is not None else sys.argv[1:])).strip(),
        "machine": f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}",
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_before": load_before,
        "load_after": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "wall_s": round(time.monotonic() - started, 1),
        "fast_s": FAST_S,
        "rows": [asdict(r) for r in rows],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    args.md.write_text(markdown(out))
    print(f"wrote {args.out} and {args.md}: {sum(r.ok for r in rows)} of {len(rows)} rows pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
