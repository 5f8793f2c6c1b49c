"""Flood row: one signed insider on the honest peers' host floods them every round; what is an honest round then?

Issue 21 item 5. Real daemons (`python -m swarmd`, swarmd.tools.launch.LocalSwarm, hivemind DHT on loopback) on a
tiny one-block model (adversary.py's CFG: d=32, B=1), every round waiting for every expected delta. Peer 3 runs
FloodGossip (this file's `flooder CONFIG`: the real daemon with one changed class, never in the shipped daemon):
a valid signed identity that trains and gossips like the others and, each round, sends every other peer 40 copies
of its signed delta, 40 PullState and 200 GetStatus, all at once, from 127.0.0.1 like the honest peers. Runs:
  clean         4 honest peers (the reference round time and CE)
  flood/host    3 honest + the flooder; the honest peers' servers limit by caller host only, as before item 5
                (this file's `honest-host-limits CONFIG`: server_limits patched back to per-host streams and no
                request budgets)
  flood/id      3 honest + the flooder; the shipped limits: budgets per verified peer id under a host ceiling
  ahead/host    as flood/host, but the 40 deltas are its delta signed for the next round: each waits at the
  ahead/id      callee for that round (up to deadline_max_s), holding a stream slot: the cheap way to hold slots
Each row: the honest peers' median round seconds (their round history), rounds merged with part of the deltas
only (the flooder's own missing ones count too) and rounds surely missing an honest peer's delta (fewer than the
expected minus the flooder's two), the honest peers' own calls refused with RESOURCE_EXHAUSTED (their logs), an
honest replica's from-noise CE against the clean run, what the flooder's calls got (sent, ok, refused with
RESOURCE_EXHAUSTED) and the flooder process's CPU seconds (on one machine its client competes for the cores).
Writes benchmarks/results/flood.json and prints a markdown table:

    python benchmarks/flood.py [--rounds 25 --steps 10]

Other scripts (benchmarks/adversary.py) may run the flooder through flooder_program().
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import daemons, faults, options, results
from benchmarks.harness.faults import fmt as _f

DELTAS, PULLS, STATUSES = 40, 40, 200  # what the flooder sends each other peer, each round (issue 21's figures)
FLOOD_TIMEOUT_S = 5.0  # each flood call's deadline


def run_flooder(
    config: str, mode: str = "copies", deltas: int = DELTAS, pulls: int = PULLS, statuses: int = STATUSES
) -> int:
    """Run one daemon that floods every other known peer each round (a child process of a benchmark).

    :param mode: "copies": its deltas are copies of its signed delta of the round (repeats, judged once);
        "ahead": its delta signed for the next round (each waits at the callee, holding a stream slot, until that
        round opens or deadline_max_s passes: the cheapest way to hold an honest peer's stream slots)
    """
    from swarmd.averaging.context import BLOCK
    from swarmd.averaging.gossip import Gossip
    from swarmd.errors import SwarmdError
    from swarmd.protocol import PayloadKind
    from swarmd.transport import PeerClient
    from swarmd.v1 import swarm_pb2 as pb

    counts: dict[str, float] = {"sent": 0, "ok": 0, "busy": 0, "other": 0}

    class FloodGossip(Gossip):
        _client: PeerClient | None = None
        _flood: asyncio.Task | None = None

        async def publish(self) -> None:
            await super().publish()
            rs = self.current
            if rs is None or BLOCK not in rs.outgoing or (self._flood is not None and not self._flood.done()):
                return
            if self._client is None:
                self._client = PeerClient(signer=self.identity, max_payload_bytes=self.cfg.max_payload_bytes)
            targets = [r.address for r in self.known.values() if r.address and r.peer_id != self.me.peer_id]
            ahead = mode == "ahead"
            delta = faults.signed_delta(self, BLOCK, rs.own[BLOCK], 1, 1.0) if ahead else rs.outgoing[BLOCK]
            self._flood = asyncio.create_task(self._flood_all(targets, delta))

        async def _flood_all(self, targets: list[str], delta: Any) -> None:
            client = self._client
            assert client is not None
            pull = pb.PullStateRequest(
                swarm_id=self.me.swarm_id,
                config_hash=self.me.config_hash,
                kind=PayloadKind.BLOCK_STATE.to_pb(),
                block_index=self.me.block_index,
            )
            calls = []
            for address in targets:
                calls += [client.exchange(address, delta, FLOOD_TIMEOUT_S) for _ in range(deltas)]
                calls += [client.pull_state(address, pull, FLOOD_TIMEOUT_S) for _ in range(pulls)]
                calls += [client.status(address, FLOOD_TIMEOUT_S) for _ in range(statuses)]
            replies = await asyncio.gather(*calls, return_exceptions=True)
            for r in replies:
                counts["sent"] += 1
                key = (
                    "ok" if not isinstance(r, BaseException) else "busy" if "resource_exhausted" in str(r) else "other"
                )
                counts[key] += 1
                if isinstance(r, BaseException) and not isinstance(r, SwarmdError):
                    raise r
            counts["cpu_s"] = round(time.process_time(), 2)  # this process's CPU so far (training included)
            print(f"FLOOD {json.dumps(counts)}", file=sys.stderr, flush=True)

    return faults.run_daemon(config, Gossip=FloodGossip)


def run_host_limited(config: str) -> int:
    """Run one honest daemon whose server limits callers by host only (streams per host, no request budgets), as
    the shipped daemon did before issue 21 item 5 (a child process of this benchmark: the 'without' rows)."""
    from swarmd.node.service import SwarmService
    from swarmd.transport.limits import RateLimiter, StreamLimiter

    def host_limits(self: SwarmService) -> dict[str, Any]:
        net = self.peer.config.net
        return dict(
            payload_limit=self.payload_limit,
            streams=StreamLimiter(net.max_streams, net.max_streams_per_peer, max_per_identity=0),
            forward_rate=RateLimiter(net.forward_rate, net.forward_burst),
            callers=None,  # every caller keyed by its host
            requests=RateLimiter(rate=0),  # unlimited
            pulls=RateLimiter(rate=0),
        )

    SwarmService.server_limits = host_limits  # type: ignore[method-assign]  # this process only
    return faults.run_daemon(config)


def flooder_program(mode: str = "copies") -> list[str]:
    """The command that runs a flooding daemon (this file's `flooder MODE CONFIG`) without its config."""
    return faults.program(__file__, "flooder", mode)


@dataclass
class Row:
    name: str
    median_round_s: float | None
    partial_rounds: int  # honest rounds that merged fewer deltas than expected (participation < 1)
    # ... fewer than expected minus the flooder's two (block and table): surely missing an honest peer's delta
    short_rounds: int
    honest_rounds: int
    ce: float | None
    ce_clean: float | None = None
    flood: dict | None = None  # the flooder's calls: sent, ok, busy (RESOURCE_EXHAUSTED), other
    honest_refused: int = 0  # the honest peers' own calls refused with RESOURCE_EXHAUSTED (their logs)

    @property
    def ce_delta(self) -> float | None:
        return None if self.ce is None or self.ce_clean is None else self.ce - self.ce_clean


def _flood_counts(log: str) -> dict:
    """The flooder's last (cumulative) FLOOD line."""
    lines = [line[line.find("FLOOD {") + 6 :] for line in log.splitlines() if "FLOOD {" in line]
    return json.loads(lines[-1]) if lines else {"sent": 0, "ok": 0, "busy": 0, "other": 0}


def pinned(programs: dict[int, list[str]], cores: int) -> dict[int, list[str]]:
    """Every peer's command under `taskset`: peer 3 (the flooder, or the clean run's fourth peer) alone on the last
    core, the honest peers round-robin on the others, so the flooder's own client CPU (a machine of its own on the
    internet) does not run on the honest peers' cores."""
    swarmd = [sys.executable, "-m", "swarmd", "--verbose", "--config"]  # the config file's path follows
    core = lambda i: cores - 1 if i == 3 else i % max(1, cores - 1)
    return {i: ["taskset", "-c", str(core(i)), *programs.get(i, swarmd)] for i in range(4)}


def plan(limits: str, mode: str) -> dict[int, list[str]]:
    """The peers' programs of a row: peer 3 the flooder (unless clean), the honest peers host-limited (limits "host":
    this file's `honest-host-limits`) or shipped ("id")."""
    honest = {i: faults.program(__file__, "honest-host-limits") for i in HONEST} if limits == "host" else {}
    return honest | ({3: flooder_program(mode)} if mode else {})


HONEST = [0, 1, 2]
PLANS = {  # row -> the peers' programs (the rest run the shipped daemon)
    "clean": plan("id", ""),
    "flood/host": plan("host", "copies"),
    "flood/id": plan("id", "copies"),
    "ahead/host": plan("host", "ahead"),
    "ahead/id": plan("id", "ahead"),
}


def run(a, name: str, programs: dict[int, list[str]], honest: list[int] = HONEST) -> Row:
    cores = os.cpu_count() or 1
    if a.pin and cores >= 2:
        programs = pinned(programs, cores)
    with tempfile.TemporaryDirectory(prefix=f"flood-{name.replace('/', '-')}-") as wd:
        sw = faults.swarm(a, Path(wd), seed=a.seed, programs=programs)
        with sw:
            sw.start(300)
            done = daemons.finish(sw, honest, a.timeout)
        ce = daemons.replica_ce(sw, honest[0], a.data_dir, a.eval_tokens)
        rounds = [h for i in honest for h in daemons.history(sw.peers[i])]
        refused = daemons.log_count(sw, honest, "resource_exhausted")
        flood = _flood_counts(sw.peers[3].log_path.read_text(errors="replace")) if 3 in programs else None
    seconds = [float(h["seconds"]) for h in rounds if "seconds" in h]
    partial = sum(float(h.get("participation", 1.0)) < 1.0 for h in rounds)
    short = sum(float(h.get("accepted", 0)) < float(h.get("expected", 0)) - 2 for h in rounds)
    median = statistics.median(seconds) if seconds else None
    row = Row(name, median, partial, short, len(rounds), ce, flood=flood, honest_refused=refused)
    print(f"{name}: {row}, exit {done['exit']}, tracebacks {done['tracebacks']}", file=sys.stderr, flush=True)
    return row


def parse_args(argv=None):
    p = options.parser(__doc__)
    options.add_schedule(p, rounds=25, steps=10)
    daemons.add_run_options(p, timeout_s=600.0)
    p.add_argument("--seed", type=int, default=0)
    pin = "the flooder (peer 3) on a core of its own, the honest peers on the others (taskset; needs 2 cores)"
    p.add_argument("--pin", action="store_true", help=pin)
    p.add_argument("--only", default=",".join(PLANS), help="comma-separated rows")
    options.add_outputs(p, "flood.json")
    return options.parse_checked(p, argv, "train.txt and eval.txt")


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["flooder"]:
        raise SystemExit(run_flooder(argv[2], argv[1]))
    if argv[:1] == ["honest-host-limits"]:
        raise SystemExit(run_host_limited(argv[1]))
    a = parse_args(argv)
    started = time.time()
    rows = [run(a, name, PLANS[name]) for name in PLANS if name in a.only.split(",")]
    clean = next((r for r in rows if r.name == "clean"), None)
    for r in rows:
        r.ce_clean = clean.ce if clean else None
    out = {
        "command": results.command_line("flood.py", argv),
        "seconds": round(time.time() - started),
        "rows": [_as_dict(r) for r in rows],
    }
    results.write_json(a.out, out)
    print(markdown(rows))


def _as_dict(r: Row) -> dict:
    return {**r.__dict__, "ce_delta": r.ce_delta}


def markdown(rows: list[Row]) -> str:
    lines = [
        "| run | honest median round s | partial rounds | rounds missing an honest delta | honest calls refused "
        "| honest CE (vs clean) | flooder's calls: sent / ok / busy | flooder CPU s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        f = r.flood or {}
        calls = f"{f.get('sent', 0)} / {f.get('ok', 0)} / {f.get('busy', 0)}" if r.flood is not None else "-"
        delta = f" ({_f(r.ce_delta, '{:+.4f}')})" if r.ce_delta is not None else ""
        lines.append(
            f"| {r.name} | {_f(r.median_round_s, '{:.3f}')} | {r.partial_rounds} of {r.honest_rounds} | "
            f"{r.short_rounds} | {r.honest_refused} | "
            f"{_f(r.ce)}{delta} | {calls} | {(r.flood or {}).get('cpu_s', '-')} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
