"""Flood rows: one signed insider on the honest peers' host floods them every round; what is an honest round then?

3 honest daemons + peer 3, the flooder (this file's `flooder MODE CONFIG`: the real daemon with FloodGossip), on the
fault matrix's one-block tiny model. Rows: clean (4 honest peers), flood/* (40 copies of its signed delta, 40
PullState, 200 GetStatus to every peer each round), ahead/* (the 40 deltas signed for the next round); */host: the
honest servers limit by host only (`honest-host-limits CONFIG`), */id: the shipped per-identity budgets. Writes
benchmarks/results/flood.json and prints a markdown table:

    python benchmarks/flood.py [--rounds 25 --steps 10] [--only clean,flood/id] [--pin]
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import daemons, faults, options, results
from benchmarks.harness.faults import fmt as _f

DELTAS, PULLS, STATUSES = 40, 40, 200  # what the flooder sends each other peer, each round (issue 21's figures)
FLOOD_TIMEOUT_S = 5.0  # each flood call's deadline
HONEST = [0, 1, 2]


def run_flooder(config: str, mode: str = "copies") -> int:
    """Run one daemon that floods every other known peer each round (a child process of a benchmark).

    :param mode: "copies": copies of its signed delta of the round (repeats, judged once); "ahead": its delta signed
        for the next round (each waits at the callee, holding a stream slot, until that round opens or
        deadline_max_s passes: the cheapest way to hold an honest peer's stream slots)
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
            self._flood = asyncio.create_task(self._flood_all(self._client, targets, delta))

        async def _flood_all(self, client: PeerClient, targets: list[str], delta: Any) -> None:
            me, kind = self.me, PayloadKind.BLOCK_STATE.to_pb()
            pull = pb.PullStateRequest(
                swarm_id=me.swarm_id, config_hash=me.config_hash, kind=kind, block_index=me.block_index
            )
            calls = []
            for address in targets:
                calls += [client.exchange(address, delta, FLOOD_TIMEOUT_S) for _ in range(DELTAS)]
                calls += [client.pull_state(address, pull, FLOOD_TIMEOUT_S) for _ in range(PULLS)]
                calls += [client.status(address, FLOOD_TIMEOUT_S) for _ in range(STATUSES)]
            for r in await asyncio.gather(*calls, return_exceptions=True):
                if isinstance(r, BaseException) and not isinstance(r, SwarmdError):
                    raise r
                busy = isinstance(r, BaseException) and "resource_exhausted" in str(r)
                counts["sent"] += 1
                counts["ok" if not isinstance(r, BaseException) else "busy" if busy else "other"] += 1
            counts["cpu_s"] = round(time.process_time(), 2)  # this process's CPU so far (training included)
            print(f"FLOOD {json.dumps(counts)}", file=sys.stderr, flush=True)

    return faults.run_daemon(config, Gossip=FloodGossip)


def run_host_limited(config: str) -> int:
    """Run one honest daemon whose server limits callers by host only (streams per host, no request budgets), as
    the shipped daemon did before issue 21 item 5 (a child process of this benchmark: the */host rows)."""
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


def _flood_counts(log: str) -> dict:
    """The flooder's last (cumulative) FLOOD line."""
    lines = [line[line.find("FLOOD {") + 6 :] for line in log.splitlines() if "FLOOD {" in line]
    return json.loads(lines[-1]) if lines else {"sent": 0, "ok": 0, "busy": 0, "other": 0}


def pinned(programs: dict[int, list[str]], cores: int) -> dict[int, list[str]]:
    """Every peer's command under `taskset`: peer 3 (the flooder, or the clean run's fourth peer) alone on the last
    core, the honest peers round-robin on the others (the flooder's client CPU is a machine of its own online)."""
    swarmd = [sys.executable, "-m", "swarmd", "--verbose", "--config"]  # the config file's path follows
    core = lambda i: cores - 1 if i == 3 else i % max(1, cores - 1)
    return {i: ["taskset", "-c", str(core(i)), *programs.get(i, swarmd)] for i in range(4)}


def plan(limits: str, mode: str) -> dict[int, list[str]]:
    """The peers' programs of a row (the rest run the shipped daemon): peer 3 the flooder (unless clean), the honest
    peers host-limited (limits "host": this file's `honest-host-limits`) or shipped ("id")."""
    honest = {i: faults.program(__file__, "honest-host-limits") for i in HONEST} if limits == "host" else {}
    return honest | ({3: flooder_program(mode)} if mode else {})


PLANS = {
    "clean": plan("id", ""),
    "flood/host": plan("host", "copies"),
    "flood/id": plan("id", "copies"),
    "ahead/host": plan("host", "ahead"),
    "ahead/id": plan("id", "ahead"),
}


def run(a, name: str, programs: dict[int, list[str]]) -> dict:
    """A row: the honest peers' median round seconds, rounds merged with part of the deltas (the flooder's missing
    ones count too) and surely missing an honest delta (fewer than expected minus the flooder's two: block and
    table), their own calls refused (RESOURCE_EXHAUSTED in their logs), peer 0's CE, the flooder's calls and CPU."""
    cores = os.cpu_count() or 1
    if a.pin and cores >= 2:
        programs = pinned(programs, cores)
    with tempfile.TemporaryDirectory(prefix=f"flood-{name.replace('/', '-')}-") as wd:
        sw = faults.swarm(a, Path(wd), seed=a.seed, programs=programs)
        with sw:
            sw.start(300)
            done = daemons.finish(sw, HONEST, a.timeout)
        ce = daemons.replica_ce(sw, HONEST[0], a.data_dir, a.eval_tokens)
        rounds = [h for i in HONEST for h in daemons.history(sw.peers[i])]
        refused = daemons.log_count(sw, HONEST, "resource_exhausted")
        flood = _flood_counts(sw.peers[3].log_path.read_text(errors="replace")) if 3 in programs else None
    seconds = [float(h["seconds"]) for h in rounds if "seconds" in h]
    row = {
        "name": name,
        "median_round_s": statistics.median(seconds) if seconds else None,
        "partial_rounds": sum(float(h.get("participation", 1.0)) < 1.0 for h in rounds),
        "short_rounds": sum(float(h.get("accepted", 0)) < float(h.get("expected", 0)) - 2 for h in rounds),
        "honest_rounds": len(rounds),
        "ce": ce,
        "ce_clean": None,  # main fills it in
        "flood": flood,
        "honest_refused": refused,
    }
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
    clean = next((r["ce"] for r in rows if r["name"] == "clean"), None)
    rows = [r | {"ce_clean": clean, "ce_delta": faults.ce_delta(r["ce"], clean)} for r in rows]
    out = {"command": results.command_line("flood.py", argv), "seconds": round(time.time() - started), "rows": rows}
    results.write_json(a.out, out)
    print(markdown(rows))


def markdown(rows: list[dict]) -> str:
    head = (
        "run | honest median round s | partial rounds | rounds missing an honest delta | honest calls refused "
        "| honest CE (vs clean) | flooder's calls: sent / ok / busy | flooder CPU s"
    )
    cells = []
    for r in rows:
        f = r["flood"] or {}
        calls = f"{f.get('sent', 0)} / {f.get('ok', 0)} / {f.get('busy', 0)}" if r["flood"] is not None else "-"
        delta = f" ({_f(r['ce_delta'], '{:+.4f}')})" if r["ce_delta"] is not None else ""
        cells.append(
            f"{r['name']} | {_f(r['median_round_s'], '{:.3f}')} | {r['partial_rounds']} of {r['honest_rounds']} | "
            f"{r['short_rounds']} | {r['honest_refused']} | {_f(r['ce'])}{delta} | {calls} | {f.get('cpu_s', '-')}"
        )
    return "\n".join(results.table(head, cells, align="l" * 8))


if __name__ == "__main__":
    main()
