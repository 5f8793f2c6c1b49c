"""Bad input through the real CLI: exit code, message and seconds to the message, one fresh process per case.

Each case of CASES runs as `blocktrain ARGS` in a fresh process (its own process group, stdin closed, a timeout);
judge() says when its row passes. Fixtures: an idle daemon (`blocktrain run --min-peers 2`, one block) gives the live
swarm, its multiaddr and a taken port; an idle daemon of a private swarm (--swarm-key) is joined without its key and
with another; the last case joins the first daemon with a swarm key of its own (every exchange refused: exit 3; after
it that daemon trains). Writes benchmarks/results/bad_input.json and bad_input.md (BENCHMARKS.md#bad_input):

    python benchmarks/bad_input.py
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.harness import options, results  # noqa: E402
from benchmarks.harness.cli_runs import Spawned, killpg, poll_json  # noqa: E402
from swarmd.tools.launch import process_group  # noqa: E402

FAST_S = 3.0  # every message within this (quiet estimate), except network timeouts
DHT_S = 10.0  # a command that starts a DHT client (hivemind's DHT process and p2pd) and does one lookup
PROBE_S = 60.0  # the dashboard's /api/swarm lists the idle daemon within this
TINY = ["--blocks", "2", "--layers-per-block", "1", "--d-model", "32", "--n-heads", "2", "--seq-len", "16"]
DAEMON_MODEL = ["--blocks", "1", *TINY[2:]]  # the idle daemons serve every block: score / generate can run
TEXT = (b"the quick brown fox jumps over the lazy dog. " * 400) + bytes(range(32, 127)) * 40
NOISE = re.compile(r"Traceback|\[ERROR\]|\[WARN|^error:|No multiaddrs found|\b(ERROR|WARN|WARNING)\b")  # a success
LOG_NOISE = re.compile(r"Traceback|\[ERROR\]|No multiaddrs found|\bERROR\b")  # among a running peer's log lines
GROUPS = {  # `*NAME` in a case's args
    "TINY": TINY,
    "D": ["--data", "{TRAIN}"],
    "O": ["--out", "{OUT}"],
    "LIVE": ["--swarm", "{MULTIADDR}", "--swarm-id", "badinput"],  # a DHT client's way into the idle daemon's swarm
    "KEYED_JOIN": ["join", "{MULTIADDR}", "--swarm-id", "badinput", "--data", "{TRAIN}", "--swarm-key", "{OTHER_KEY}"],
    "QUICK_JOIN": ["--steps-per-round", "2", "--batch-size", "4", "--deadline-max", "2", "--codec", "fp32"],
}
SUCCESS = " (a success: no [ERROR] line, no traceback)"  # the name's tail of a quiet case


@dataclass
class Case:
    name: str  # what the row is about
    args: list[str]  # blocktrain ARGS; {NAME} placeholders are filled from the fixtures
    expect_exit: int | tuple[int, ...]  # 2 bad input, 1 unreachable, 3 nothing merges, 0 no error
    words: str  # a regex the message must match (it names the cause); {NAME} placeholders are filled too
    network_timeout_s: float = 0.0  # > 0: a network timeout (or a bounded network case) may take this long
    dht: bool = False  # it starts a DHT client: the message within DHT_S
    logs_ok: bool = False  # a peer's log lines may come before the `error:` line, which must be stderr's last
    issue: int = 0  # the issue whose list the case is from (10, 22), 0 for the usual bad inputs
    quiet: bool = False  # a success: a quiet stderr, and `words` must match a stdout line (the message)
    probe: str = ""  # "dashboard": once its URL is out, poll URL/api/swarm until it lists a peer, then Ctrl-C
    timeout_s: float = 0.0  # give up on the case after this long (0: the --timeout-s of the run)


def argv(args: str) -> list[str]:
    """blocktrain ARGS from a line: split on spaces, `*NAME` expanded to one of GROUPS."""
    return [x for w in args.split() for x in (GROUPS[w[1:]] if w.startswith("*") else [w])]


def C(issue: int, name: str, args: str, expect_exit: int | tuple[int, ...], words: str, **more: object) -> Case:
    """One row of CASES: the issue whose list it is from (0: the usual bad inputs), the case's name, args, exit
    code(s), the message's words and more Case fields."""
    return Case(name + (SUCCESS if more.get("quiet") else ""), argv(args), expect_exit, words, issue=issue, **more)


def bounded(issue: int, command: str, flag: str, value: str, bound: str, more_args: str = "", note: str = "") -> Case:
    """A range check's row: `command flag value more_args` exits 2 with "<flag> must be <bound>, got <value>"."""
    name = f"{command} {flag} {value}"
    words = f"{flag} must be {bound}, got {value}".replace("[", r"\[").replace("]", r"\]")
    return C(issue, name + note, f"{name} {more_args}", 2, words)


LIVE_22 = {"quiet": True, "dht": True}  # a DHT client command's success against the live swarm
PRIVATE = "join {KEYED_MULTIADDR} --swarm-id badkey *D"  # a private swarm's GetConfig refused, naming the key
# fmt: off
CASES = (  # one case a row, a long row on two lines (a table, left as written)
    # issue 10's list: late or unclear errors
    C(10, "demo: fewer peers than blocks", "demo --peers 2 --blocks 3 *D *O", 2, r"--peers 2 cannot train --blocks 3"),
    C(10, "demo: --trajectory-prob 5", "demo --trajectory-prob 5 *D *O", 2,
      r"--trajectory-prob must be in \[0, 1\], got 5"),
    C(10, "status of a closed port", "status 127.0.0.1:{CLOSED}", 1, r"(?i)refused|not listening|unreachable|closed"),
    C(10, "join not-a-multiaddr", "join not-a-multiaddr *D", 2, r"(?i)multiaddr"),
    C(10, "run: --listen port already taken", "run *D --listen 127.0.0.1:{TAKEN} *TINY", (1, 2),
      r"(?i)in use|taken|cannot listen|bind"),
    C(10, "train: binary file as training text", "train --data {BINARY} *O *TINY", 2, r"(?i)binary"),
    C(10, "train: data without eval.txt beside it (not an error: announced)",
      "train --data {LONE} *O --rounds 1 --steps-per-round 1 *TINY", 0, r"(?i)held out"),
    # issue 22's list: every numeric flag range-checked at parse time (a representative few, every command)
    C(22, "run --steps-per-round -5 (was a 49-line traceback after 18 s)", "run --steps-per-round -5", 2,
      r"^error: bad value: --steps-per-round must be >= 1, got -5$"),
    bounded(22, "demo", "--rounds", "-1", ">= 1"),
    bounded(22, "train", "--lr", "nan", "> 0"),
    bounded(22, "join", "--steps-per-round", "0", ">= 1", "{MULTIADDR}"),
    bounded(22, "score", "--max-bytes", "-1", ">= 1", "{TRAIN}", " (score's budget flag)"),
    bounded(22, "eval", "--eval-tokens", "-1", ">= 1"),
    bounded(22, "generate", "--temperature", "-1", ">= 0", "hello"),
    bounded(22, "status", "--timeout-s", "0", "> 0", "127.0.0.1:{CLOSED}"),
    bounded(22, "dashboard", "--port", "70000", "in [0, 65535]", "--swarm {MULTIADDR}"),
    # issue 22's list: DHT client commands against the live swarm, no hivemind noise on stderr
    C(22, "status --swarm of the live swarm", "status *LIVE", 0, r"{PEER_SHORT}", **LIVE_22),
    C(22, "score --swarm, a tiny budget", "score *LIVE --max-bytes 32 {TRAIN}", 0, r"^ce \d+\.\d+ nats/byte",
      **LIVE_22),
    C(22, "generate --swarm, a tiny budget", "generate *LIVE --max-bytes 4 hello", 0, r"^hello", **LIVE_22),
    C(22, "dashboard --swarm started and stopped with Ctrl-C", "dashboard *LIVE --port 0", 0, r"^dashboard: http://",
      quiet=True, probe="dashboard"),
    # issue 22's list: join's config check; a private swarm's GetConfig refused (exit 1 or 2) naming the key
    C(22, "join with a model flag that differs from the swarm's config",
      "join {MULTIADDR} --swarm-id badinput *D --d-model 64", 2,
      r"do not match the swarm's config: --d-model 64 \(swarm: 32\)", dht=True),
    C(22, "join a private swarm without its key", PRIVATE, (1, 2), r"(?i)no proof of the swarm key.*--swarm-key",
      dht=True),
    C(22, "join a private swarm with another swarm key", PRIVATE + " --swarm-key {OTHER_KEY}", (1, 2),
      r"(?i)another swarm key.*--swarm-key", dht=True),
    # the usual bad inputs
    C(0, "train: missing data file", "train --data {MISSING} *O *TINY", 2, r"does not exist"),
    C(0, "train: empty data file", "train --data {EMPTY} *O *TINY", 2, r"(?i)no bytes|empty"),
    C(0, "demo: missing data file", "demo --data {MISSING} *O", 2, r"does not exist"),
    C(0, "train: --d-model 30 --n-heads 4", "train *D *O --d-model 30 --n-heads 4", 2, r"divisible by n_heads"),
    bounded(0, "model-info", "--d-model", "0", ">= 1"),
    C(0, "status --swarm of an unknown swarm id (not an error: an empty table and a note naming the swarm id)",
      "status --swarm {MULTIADDR} --swarm-id no-such-swarm", 0, r"no peer of swarm 'no-such-swarm'", dht=True),
    C(0, "score --checkpoint a missing dir", "score --checkpoint {MISSING} {TRAIN}", 2, r"(?i)does not exist"),
    C(0, "generate --checkpoint a dir without config.json", "generate --checkpoint {NOT_CHECKPOINT} hello", 2,
      r"(?i)not a checkpoint"),
    C(0, "eval --checkpoint a corrupt config.json", "eval --checkpoint {CORRUPT} *D", 2,
      r"(?i)not valid JSON|unknown checkpoint"),
    C(0, "train --device cuda without CUDA", "train *D *O --device cuda *TINY", 2, r"(?i)cuda"),
    C(0, "status of a port that accepts but never answers (a network timeout)",
      "status 127.0.0.1:{SILENT} --timeout-s 3", 1, r"(?i)timed out|deadline|did not answer|no answer",
      network_timeout_s=10.0),
    # last: after it the idle daemon has a second peer and trains; its bound: 3 of the daemon's rounds (20 steps,
    # its deadline), its DHT start and stop
    C(22, "join the public swarm with a swarm key (every exchange refused: stops after 3 rounds)",
      "*KEYED_JOIN --identity {HIGH_ID} *QUICK_JOIN", 3,
      r"^error: every exchange (was refused|failed) for 3 rounds: .*swarm key",
      network_timeout_s=120.0, logs_ok=True, timeout_s=240.0),
)
# fmt: on


def blocktrain() -> list[str]:
    script = Path(sys.executable).parent / "blocktrain"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "cli.main"]


def fill_in(text: str, fill: dict[str, str], regex: bool = False) -> str:
    return re.sub(r"\{([A-Z_]+)\}", lambda m: re.escape(fill[m.group(1)]) if regex else fill[m.group(1)], text)


def shown(arg: str, fill: dict[str, str]) -> str:
    """The argument as the table shows it: fixture paths by their placeholder name, not a temp path."""
    return re.sub(r"\{(\w+)\}", lambda m: m.group(1) if "/" in fill[m.group(1)] else fill[m.group(1)], arg)


def run_case(case: Case, fill: dict[str, str], env: dict[str, str], timeout_s: float) -> dict:
    """The case's row: what `blocktrain ARGS` answered, how fast, and judge()'s verdict."""
    load = os.getloadavg()[0]
    run = Spawned([*blocktrain(), *(fill_in(a, fill) for a in case.args)], env, ROOT, session=True)
    waits: list[tuple[float, float]] = []  # (seconds since spawn, its main thread's run-queue wait so far)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            with contextlib.suppress(OSError, IndexError, ValueError):  # /proc/PID/schedstat: on-CPU, waiting (ns)
                waited = int(Path(f"/proc/{run.proc.pid}/schedstat").read_text().split()[1]) / 1e9
                waits.append((run.since(), waited))
            done.wait(0.02)

    threading.Thread(target=sample, daemon=True).start()
    extra: dict = {}
    if case.probe == "dashboard":
        extra.update(probe_dashboard(run))
        killpg(run.proc.pid, signal.SIGINT)  # Ctrl-C as a terminal sends it: to the whole process group
    if not run.wait(max(1.0, (case.timeout_s or timeout_s) - run.since())):
        extra["timed_out_after_s"] = round(run.since(), 1)
        run.stop(signal.SIGINT, 30, group=True)
    done.set()
    if left := process_group(run.proc.pid):  # an exited command left a process of its group behind (DHT, p2pd)
        extra["left_processes"] = left
        killpg(run.proc.pid, signal.SIGKILL)
    if case.quiet:
        words = fill_in(case.words, fill, regex=True)
        seconds, message = ([x for x in run.out if re.search(words, x[1])] or run.out or [(None, "")])[0]
    else:
        seconds, message = ([x for x in run.err if x[1].startswith("error:")] or run.err or [(None, "")])[0]
    waited = max((w for t, w in waits if seconds is not None and t <= seconds), default=0.0)
    stderr = [line for _, line in run.err]
    if case.logs_ok and (logs := [line for line in stderr if not line.startswith("error:")]):
        extra["log_lines"] = len(logs)
    if case.probe and "api_peers_after_s" in extra:
        message += f" (its /api/swarm listed {extra['api_peers']} peer(s) after {extra['api_peers_after_s']} s)"
    row = {
        "name": case.name,
        "command": "blocktrain " + " ".join(shown(a, fill) for a in case.args),
        "exit_code": run.proc.returncode,
        "message": message,
        "seconds": round(seconds, 2) if seconds is not None else None,  # spawn -> the message line
        "quiet_s": round(seconds - waited, 2) if seconds is not None else None,  # less the run-queue wait until then
        "first_line": stderr[0] if stderr else "",
        "traceback": any("Traceback" in line for line in stderr),
        "ok": False,
        "why": "",  # what fails the bar
        "issue": case.issue,
        "wall_s": round(run.wall_s or run.since(), 2),  # spawn -> exit
        "cpu_s": round(run.cpu_s or 0.0, 2),  # user + system CPU seconds (with the children it waited for)
        "load_1m": round(load, 1),  # at the spawn
        "bar_s": DHT_S if case.dht else case.network_timeout_s or FAST_S,
        "bar": "dht" if case.dht else "network" if case.network_timeout_s else "fast",
        "stderr": stderr[:20],
        "extra": {**extra, "stdout_head": [line for _, line in run.out][:3], "run_queue_wait_s": round(waited, 2)},
    }
    why = judge(case, row, fill)
    return row | {"ok": not why, "why": "; ".join(why)}


def probe_dashboard(run: Spawned) -> dict:
    """Wait for the dashboard's URL, then poll its /api/swarm until it lists a peer (or PROBE_S since the spawn)."""
    if (found := run.url(PROBE_S)) is None:
        return {"api": "no URL printed"}
    listed = lambda v: bool(v.get("peers"))
    found_peers, last = poll_json(f"{found[1]}/api/swarm", listed, run.t0 + PROBE_S, 0.5, run.running)
    if found_peers:
        return {"api_peers": last["peers"], "api_peers_after_s": round(run.since(), 1)}
    return {"api": f"no peer listed within {PROBE_S:.0f} s", "api_last": last}


def judge(case: Case, row: dict, fill: dict[str, str]) -> list[str]:
    """What fails the row's bar (nothing: it passes)."""
    why = []
    expected = case.expect_exit if isinstance(case.expect_exit, tuple) else (case.expect_exit,)
    if row["exit_code"] not in expected:
        why.append(f"exit {row['exit_code']}, expected {' or '.join(map(str, expected))}")
    if row["traceback"]:
        why.append("traceback")
    if case.quiet:
        if noise := [line for line in row["stderr"] if NOISE.search(line)]:
            why.append(f"stderr noise ({len(noise)} lines): {noise[0][:120]}")
    elif 0 not in expected:
        errors = [line for line in row["stderr"] if line.startswith("error:")]
        others = [line for line in row["stderr"] if not line.startswith("error:")]
        if not row["message"].startswith("error:"):
            why.append("no `error:` line")
        elif len(errors) > 1:
            why.append(f"{len(errors)} `error:` lines")
        if case.logs_ok:  # a peer's own log lines first; the error line last
            if noise := [line for line in others if LOG_NOISE.search(line)]:
                why.append(f"stderr noise ({len(noise)} lines): {noise[0][:120]}")
            if row["stderr"] and not row["stderr"][-1].startswith("error:"):
                why.append("the `error:` line is not the last line")
        elif others:
            why.append(f"{len(others)} more stderr lines: {others[0][:120]}")
    if not re.search(fill_in(case.words, fill, regex=True), row["message"]):
        why.append("message does not name the cause" if not case.quiet else "stdout does not show the result")
    if case.probe and "api_peers" not in row["extra"]:
        why.append(f"dashboard: {row['extra'].get('api', 'probe failed')}")
    if row["quiet_s"] is None:
        why.append("no message at all")
    elif row["quiet_s"] >= row["bar_s"]:
        why.append(
            f"message after {row['seconds']}s, {row['quiet_s']}s less the run-queue wait (bar {row['bar_s']:.0f}s)"
        )
    return why


class Fixtures:
    """Files, keys, identities, a closed and a silent port, and two idle daemons (one of a private swarm);
    stop() ends the daemons."""

    def __init__(self, root: Path, env: dict[str, str]):
        self.root, self.env = root, env
        self.daemons: list[Spawned] = []
        self.silent = socket.socket()  # listens (the kernel completes every handshake) but never accepts

    def build(self) -> dict[str, str]:
        r = self.root
        files = {  # placeholder: (path, content; None: a folder, "": nothing there)
            "TRAIN": ("data/train.txt", TEXT),
            "EVAL": ("data/eval.txt", TEXT[::-1]),
            "EMPTY": ("empty.txt", b""),
            "BINARY": ("binary.bin", bytes(range(256)) * 64),
            "MISSING": ("missing.txt", ""),
            "NOT_CHECKPOINT": ("not-a-checkpoint", None),
            "NOTES": ("not-a-checkpoint/notes.txt", b"hello"),
            "CORRUPT": ("corrupt", None),
            "CORRUPT_CONFIG": ("corrupt/config.json", b"{not json"),
            "OUT": ("out", ""),
            "LONE": ("lone/text.txt", TEXT),
        }
        fill = {name: str(r / path) for name, (path, _) in files.items()}
        for path, content in files.values():
            if content is None:
                (r / path).mkdir(parents=True)
            elif content != "":
                (r / path).parent.mkdir(parents=True, exist_ok=True)
                (r / path).write_bytes(content)
        self.silent.bind(("127.0.0.1", 0))
        self.silent.listen(16)
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))  # nothing listens once the socket is closed
            fill.update(CLOSED=str(closed.getsockname()[1]), SILENT=str(self.silent.getsockname()[1]))
        fill.update(self.keys_and_identities())
        base = ["run", "--data", fill["TRAIN"], "--min-peers", "2", *DAEMON_MODEL]
        for more in (
            ["--swarm-id", "badinput", "--identity", fill["LOW_ID"]],
            ["--swarm-id", "badkey", "--swarm-key", fill["KEY"]],
        ):
            self.daemons.append(Spawned([*blocktrain(), *base, *more], self.env, ROOT, session=True))
        info, keyed = map(self.wait_ready, self.daemons)  # the public swarm's, the private one's
        return {
            **fill,
            "TAKEN": info["address"].rpartition(":")[2],
            "MULTIADDR": info["multiaddr"],
            "PEER_SHORT": info["peer"][-8:],  # how `status` shows a peer id
            "KEYED_MULTIADDR": keyed["multiaddr"],
        }

    def keys_and_identities(self) -> dict[str, str]:
        """Two swarm keys, and two peer identities in peer-id order (the idle daemon's is the lower: it dials)."""
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

    @staticmethod
    def wait_ready(daemon: Spawned) -> dict[str, str]:
        """The `key: value` lines it printed before `ready` (waiting up to 180 s)."""
        while daemon.running() and daemon.since() < 180 and all(line != "ready" for _, line in daemon.out):
            time.sleep(0.1)
        info: dict[str, str] = {}
        for key, _, value in (line.partition(": ") for _, line in daemon.out):
            info.setdefault(key, value)
        if not {"address", "multiaddr", "peer"} <= info.keys():
            raise SystemExit(f"a helper daemon did not start: {info}")
        return info

    def stop(self) -> None:
        self.silent.close()
        for daemon in self.daemons:
            daemon.proc.send_signal(signal.SIGTERM)
        for daemon in self.daemons:
            daemon.wait(30)
            killpg(daemon.proc.pid, signal.SIGKILL)  # its DHT process and p2pd
            daemon.wait(10)


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(out: dict) -> str:
    rows = out["rows"]
    failing = [r for r in rows if not r["ok"]]
    lines = [
        "## Bad input: exit code, message, seconds to the message (issues 10 and 22)",
        "",
        f"Produced by `{out['command']}` ({out['machine']}; {out['when']}; wall time {out.get('wall_s', 0):.0f} s). "
        "Each case runs `blocktrain ARGS` in a fresh process. *seconds*: spawn to message; *quiet est.*: less the "
        f"main thread's run-queue wait, judged against the *bar* ({FAST_S:.0f} s; {DHT_S:.0f} s with a DHT client; a "
        "network case: its own); *load*: 1-minute load average at the spawn. A row passes with the expected exit "
        "code (2 bad input, 1 unreachable or refusing peer, 3 every exchange refused, 0 no error), one `error:` line "
        "naming the cause and nothing else on stderr (a success: quiet stderr, the result on stdout), no traceback, "
        "within the bar. TMP: the run's temp folder; MULTIADDR: the idle daemon's, KEYED_MULTIADDR: a private "
        f"swarm's. Load average: {out['load_before']} before, {out['load_after']} after.",
        "",
    ]
    cells = []
    for r in rows:
        issue = f" (issue {r['issue']})" if r["issue"] else ""
        label = f"{r['name']}{issue}<br>`{r['command']}`"
        message = cell(re.sub(r"\S*blocktrain-bad-input-\w+", "TMP", r["message"]))
        if len(message) > 260:
            message = message[:257] + "..."
        if n := r.get("extra", {}).get("log_lines"):
            message += cell(f" (after {n} log lines of the peer, e.g. `{r['stderr'][0][:140]}`)")
        secs = "-" if r["seconds"] is None else f"{r['seconds']:.2f}"
        quiet = "-" if r.get("quiet_s") is None else f"{r['quiet_s']:.2f}"
        verdict = "yes" if r["ok"] else cell(f"**no**: {r['why']}")
        bar = f"{r.get('bar_s', FAST_S):.0f} s{' (DHT)' if r.get('bar') == 'dht' else ''}"
        load = r.get("load_1m", "-")
        cells.append(f"{label} | {r['exit_code']} | {secs} | {quiet} | {bar} | {load} | {message} | {verdict}")
    lines += results.table("input | exit | seconds | quiet est. | bar | load | message | passes", cells, "l" * 8)
    failed = ": every one." if not failing else f"; failing: {', '.join(r['name'] for r in failing)}."
    lines += ["", f"{len(rows) - len(failing)} of {len(rows)} rows pass{failed}"]
    if over := [r for r in rows if r.get("bar") == "dht" and (r.get("quiet_s") or 0) >= FAST_S]:
        names = "; ".join(f"{r['name']} ({r['quiet_s']:.2f} s)" for r in over)
        lines += ["", f"Over {FAST_S:.0f} s, within the {DHT_S:.0f} s bar of a DHT client: {names}."]
    if left := [r for r in rows if r.get("extra", {}).get("left_processes")]:
        names = "; ".join(f"{r['name']}: {', '.join(r['extra']['left_processes'])}" for r in left)
        lines += ["", f"Processes of a command's group left after it exited (killed): {names}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    options.add_outputs(p, "bad_input.json", "bad_input.md", results=ROOT / results.RESULTS)
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
    loads = lambda: " ".join(f"{x:.1f}" for x in os.getloadavg())
    load_before = loads()
    fixtures, rows = Fixtures(tmp, env), []
    try:
        fill = fixtures.build()
        print(f"fixtures up after {time.monotonic() - started:.0f} s", flush=True)
        for case in (c for c in CASES if args.only in c.name):
            rows.append(row := run_case(case, fill, env, args.timeout_s))
            took = f"{row['seconds']}s (quiet est. {row['quiet_s']}s, load {row['load_1m']}) exit {row['exit_code']}"
            print(f"{'ok  ' if row['ok'] else 'FAIL'} {took} {row['name']}: {row['message']} {row['why']}", flush=True)
    finally:
        fixtures.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    out = {
        "command": results.command_line("bad_input.py", argv),
        "machine": f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}",
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_before": load_before,
        "load_after": loads(),
        "wall_s": round(time.monotonic() - started, 1),
        "fast_s": FAST_S,
        "rows": rows,
    }
    results.write_json(args.out, out, sort_keys=False)
    args.md.write_text(markdown(out))
    print(f"wrote {args.out} and {args.md}: {sum(r['ok'] for r in rows)} of {len(rows)} rows pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
