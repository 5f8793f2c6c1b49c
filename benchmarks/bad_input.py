"""Bad input through the real CLI: exit code, message and seconds to the message, one fresh process per case.

Runs every case as `blocktrain ARGS` (the installed entry point next to this interpreter, else
`python -m cli.main`) in a fresh process, with stdin closed and a per-case timeout, and records the
exit code, the message (the first `error:` line on stderr, else its first line), the seconds from
the spawn to that line, the first stderr line as printed, and whether a traceback showed up. The
cases are the issue 10 list of late or unclear errors plus the usual bad inputs (missing, empty and
binary data, bad model flags, bad checkpoint dirs, an unknown swarm, a closed port, a taken port,
CUDA asked for without CUDA). One idle daemon (`blocktrain run`, waiting for a second peer, so it
never trains) gives the live swarm, multiaddr and taken port some cases need; it is stopped at the end.
A row passes when the exit code is the expected one, the message is one `error:` line with the
expected words, there is no traceback, and the message came within 3 s (network timeouts: within
their timeout, naming the cause). Writes benchmarks/results/bad_input.json and the markdown fragment
benchmarks/results/ISSUE10_bad_input.md (BENCHMARKS.md via benchmarks/compose.py):
    python benchmarks/bad_input.py
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
FAST_S = 3.0  # every message within this, except network timeouts
TINY = ["--blocks", "2", "--layers-per-block", "1", "--d-model", "32", "--n-heads", "2", "--seq-len", "16"]
TEXT = (b"the quick brown fox jumps over the lazy dog. " * 400) + bytes(range(32, 127)) * 40


@dataclass
class Case:
    name: str  # what the row is about
    args: list[str]  # blocktrain ARGS; {NAME} placeholders are filled from the fixtures
    expect_exit: int | tuple[int, ...]  # exit code(s) of a clear refusal (2 bad input, 1 unreachable, 0 no error)
    words: str  # a regex the message must match (it names the cause)
    network_timeout_s: float = 0.0  # > 0: a network timeout may take this long, but must say so
    issue: bool = False  # one of the issue's "late or unclear errors"


@dataclass
class Row:
    name: str
    command: str
    exit_code: int | None
    message: str
    seconds: float | None  # spawn -> the message line on stderr
    first_line: str
    traceback: bool
    ok: bool
    why: str = ""  # what fails the bar
    issue: bool = False
    wall_s: float = 0.0  # spawn -> exit
    extra: dict = field(default_factory=dict)


def cases() -> list[Case]:
    return [
        # the issue's list (found item 5)
        Case(
            "demo: fewer peers than blocks",
            ["demo", "--peers", "2", "--blocks", "3", "--data", "{TRAIN}", "--out", "{OUT}"],
            2,
            r"--peers 2 cannot train --blocks 3",
            issue=True,
        ),
        Case(
            "demo: --trajectory-prob 5",
            ["demo", "--trajectory-prob", "5", "--data", "{TRAIN}", "--out", "{OUT}"],
            2,
            r"trajectory_prob must be in \[0, 1\]",
            issue=True,
        ),
        Case(
            "status of a closed port",
            ["status", "127.0.0.1:{CLOSED}"],
            1,
            r"(?i)refused|not listening|unreachable|closed",
            issue=True,
        ),
        Case("join not-a-multiaddr", ["join", "not-a-multiaddr", "--data", "{TRAIN}"], 2, r"(?i)multiaddr", issue=True),
        Case(
            "run: --listen port already taken",
            ["run", "--data", "{TRAIN}", "--listen", "127.0.0.1:{TAKEN}", *TINY],
            (1, 2),
            r"(?i)in use|taken|cannot listen|bind",
            issue=True,
        ),
        Case(
            "train: binary file as training text",
            ["train", "--data", "{BINARY}", "--out", "{OUT}", *TINY],
            2,
            r"(?i)binary",
            issue=True,
        ),
        Case(
            "train: data without eval.txt beside it (not an error: announced)",
            ["train", "--data", "{LONE}", "--out", "{OUT}", "--rounds", "1", "--steps-per-round", "1", *TINY],
            0,
            r"(?i)held out",
            issue=True,
        ),
        # the usual bad inputs
        Case(
            "train: missing data file", ["train", "--data", "{MISSING}", "--out", "{OUT}", *TINY], 2, r"does not exist"
        ),
        Case(
            "train: empty data file", ["train", "--data", "{EMPTY}", "--out", "{OUT}", *TINY], 2, r"(?i)no bytes|empty"
        ),
        Case("demo: missing data file", ["demo", "--data", "{MISSING}", "--out", "{OUT}"], 2, r"does not exist"),
        Case(
            "train: --d-model 30 --n-heads 4",
            ["train", "--data", "{TRAIN}", "--out", "{OUT}", "--d-model", "30", "--n-heads", "4"],
            2,
            r"divisible by n_heads",
        ),
        Case("model-info --d-model 0", ["model-info", "--d-model", "0"], 2, r"d_model must be >= 1"),
        Case(
            "status --swarm of an unknown swarm id (not an error: an empty table and a note naming the swarm id)",
            ["status", "--swarm", "{MULTIADDR}", "--swarm-id", "no-such-swarm"],
            0,
            r"no peer of swarm 'no-such-swarm'",
        ),
        Case(
            "score --checkpoint a missing dir",
            ["score", "--checkpoint", "{MISSING}", "{TRAIN}"],
            2,
            r"(?i)does not exist",
        ),
        Case(
            "generate --checkpoint a dir without config.json",
            ["generate", "--checkpoint", "{NOT_CHECKPOINT}", "hello"],
            2,
            r"(?i)not a checkpoint",
        ),
        Case(
            "eval --checkpoint a corrupt config.json",
            ["eval", "--checkpoint", "{CORRUPT}", "--data", "{TRAIN}"],
            2,
            r"(?i)not valid JSON|unknown checkpoint",
        ),
        Case(
            "train --device cuda without CUDA",
            ["train", "--data", "{TRAIN}", "--out", "{OUT}", "--device", "cuda", *TINY],
            2,
            r"(?i)cuda",
        ),
        Case(
            "status of a port that accepts but never answers (a network timeout)",
            ["status", "127.0.0.1:{SILENT}", "--timeout-s", "3"],
            1,
            r"(?i)timed out|deadline|did not answer|no answer",
            network_timeout_s=10.0,
        ),
    ]


def blocktrain() -> list[str]:
    script = Path(sys.executable).parent / "blocktrain"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "cli.main"]


def run_case(case: Case, fill: dict[str, str], env: dict[str, str], timeout_s: float) -> Row:
    args = [re.sub(r"\{(\w+)\}", lambda m: fill[m.group(1)], a) for a in case.args]
    cmd = [*blocktrain(), *args]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT
    )
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append((time.monotonic() - t0, line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    wall = time.monotonic() - t0
    reader.join(timeout=10)
    stdout = proc.stdout.read() if proc.stdout is not None else ""
    errors = [(t, line) for t, line in lines if line.startswith("error:")]
    seconds, message = errors[0] if errors else (lines[0] if lines else (None, ""))
    row = Row(
        name=case.name,
        command="blocktrain " + " ".join(_shown(a, fill) for a in case.args),
        exit_code=proc.returncode,
        message=message,
        seconds=round(seconds, 2) if seconds is not None else None,
        first_line=lines[0][1] if lines else "",
        traceback=any("Traceback" in line for _, line in lines),
        ok=False,
        issue=case.issue,
        wall_s=round(wall, 2),
        extra={"stdout_head": stdout.strip().splitlines()[:3]},
    )
    row.ok, row.why = judge(case, row)
    return row


def _shown(arg: str, fill: dict[str, str]) -> str:
    """The argument as the table shows it: fixture paths by their placeholder name, not a temp path."""
    return re.sub(r"\{(\w+)\}", lambda m: m.group(1) if "/" in fill[m.group(1)] else fill[m.group(1)], arg)


def judge(case: Case, row: Row) -> tuple[bool, str]:
    why = []
    expected = case.expect_exit if isinstance(case.expect_exit, tuple) else (case.expect_exit,)
    if row.exit_code not in expected:
        why.append(f"exit {row.exit_code}, expected {' or '.join(map(str, expected))}")
    if row.traceback:
        why.append("traceback")
    if 0 not in expected and not row.message.startswith("error:"):
        why.append("no `error:` line")
    if not re.search(case.words, row.message):
        why.append("message does not name the cause")
    limit = case.network_timeout_s or FAST_S
    if row.seconds is None:
        why.append("no message at all")
    elif row.seconds >= limit:
        why.append(f"message after {row.seconds}s (bar {limit:.0f}s)")
    return not why, "; ".join(why)


class Fixtures:
    """Files, a closed port, and one idle daemon (its multiaddr, its taken port); stop() ends the daemon."""

    def __init__(self, root: Path, env: dict[str, str]):
        self.root, self.env = root, env
        self.daemon: subprocess.Popen | None = None
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
        }
        fill.update(self.start_daemon(train))
        return fill

    def start_daemon(self, train: Path) -> dict[str, str]:
        args = ["run", "--data", str(train), "--min-peers", "2", "--swarm-id", "badinput", *TINY]
        self.daemon = subprocess.Popen(
            [*blocktrain(), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=self.env,
            cwd=ROOT,
            start_new_session=True,
        )
        info: dict[str, str] = {}
        deadline = time.monotonic() + 180
        assert self.daemon.stdout is not None
        for line in self.daemon.stdout:
            key, _, value = line.rstrip("\n").partition(": ")
            info.setdefault(key, value)
            if line.strip() == "ready" or time.monotonic() > deadline:
                break
        if "address" not in info or "multiaddr" not in info:
            raise SystemExit(f"the helper daemon did not start: {info}")
        return {"TAKEN": info["address"].rpartition(":")[2], "MULTIADDR": info["multiaddr"]}

    def listen_silently(self) -> int:
        self.silent.bind(("127.0.0.1", 0))
        self.silent.listen(16)
        return self.silent.getsockname()[1]

    def stop(self) -> None:
        self.silent.close()
        if self.daemon is None or self.daemon.poll() is not None:
            return
        self.daemon.send_signal(signal.SIGTERM)
        try:
            self.daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.daemon.pid, signal.SIGKILL)  # its DHT process and p2pd
        except (ProcessLookupError, PermissionError):
            pass
        self.daemon.wait(timeout=10)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def markdown(out: dict) -> str:
    rows = out["rows"]
    failing = [r for r in rows if not r["ok"]]
    lines = [
        "## Bad input: exit code, message, seconds to the message (issue 10)",
        "",
        f"Produced by `{out['command']}` ({out['machine']}; {out['when']}). Every case runs the real CLI "
        "(`blocktrain ARGS`) in a fresh process; *seconds* is the time from the spawn to the message line "
        "on stderr (the first `error:` line, else the first line), so it includes the interpreter and CLI "
        "start-up. A row passes when the exit code is the expected one (2 bad input, 1 an unreachable peer, "
        f"0 not an error), the message is one `error:` line naming the cause, no traceback, and it came "
        f"within {FAST_S:.0f} s (network timeouts: within their timeout, naming the cause). Rows marked "
        "(issue) are the issue's list of late or unclear errors; TMP is the run's temp folder. Load average "
        "during the run: "
        f"{out['load_before']} before, {out['load_after']} after ({out['machine'].split(',')[0]}, shared).",
        "",
        "| input | exit | seconds | message | passes |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        label = f"{r['name']}{' (issue)' if r['issue'] else ''}<br>`{r['command']}`"
        message = re.sub(r"\S*blocktrain-bad-input-\w+", "TMP", r["message"]).replace("|", "\\|")
        if len(message) > 220:
            message = message[:217] + "..."
        secs = "-" if r["seconds"] is None else f"{r['seconds']:.2f}"
        verdict = "yes" if r["ok"] else f"**no**: {r['why']}"
        lines.append(f"| {label} | {r['exit_code']} | {secs} | {message} | {verdict} |")
    lines += [
        "",
        f"{len(rows) - len(failing)} of {len(rows)} rows pass"
        + (": every one." if not failing else f"; failing: {', '.join(r['name'] for r in failing)}."),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--out", type=Path, default=RESULTS / "bad_input.json")
    p.add_argument("--md", type=Path, default=RESULTS / "ISSUE10_bad_input.md")
    p.add_argument("--timeout-s", type=float, default=60.0, help="Give up on one case after this many seconds.")
    p.add_argument("--only", default="", help="Run only the cases whose name contains this.")
    p.add_argument("--render", type=Path, help="Only rewrite --md from this JSON result (no run).")
    args = p.parse_args(argv)
    if args.render is not None:
        args.md.write_text(markdown(json.loads(args.render.read_text())))
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="blocktrain-bad-input-"))
    env = {**os.environ, "BLOCKTRAIN_CACHE": str(tmp / "cache"), "COLUMNS": "200"}
    env.pop("BLOCKTRAIN_DATA", None)
    load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())
    fixtures = Fixtures(tmp, env)
    rows: list[Row] = []
    try:
        fill = fixtures.build()
        for case in cases():
            if args.only and args.only not in case.name:
                continue
            row = run_case(case, fill, env, args.timeout_s)
            rows.append(row)
            mark = "ok  " if row.ok else "FAIL"
            print(f"{mark} {row.seconds}s exit {row.exit_code} {row.name}: {row.message} {row.why}", flush=True)
    finally:
        fixtures.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    out = {
        "command": ("python benchmarks/bad_input.py " + " ".join(argv if argv is not None else sys.argv[1:])).strip(),
        "machine": f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}",
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_before": load_before,
        "load_after": " ".join(f"{x:.1f}" for x in os.getloadavg()),
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
