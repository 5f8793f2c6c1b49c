"""Fault matrix: a real swarm of daemon processes attacked and broken in every way issue 9 lists; did it survive?

Every row runs real daemons (`python -m swarmd`, spawned by swarmd.tools.launch.LocalSwarm, real hivemind
DHT on loopback; the partition row: three network namespaces, tests/netns_utils.py) on a tiny model
(one block, d=32) and short runs. The attacks speak the real protocol with the real codec:
  clean                 4 honest replicas of block 0: the reference from-noise CE
  byzantine MODE        3 honest replicas + 1 same-block peer (a real daemon whose Gossip is subclassed
                        here, ByzantineGossip: never in the shipped daemon) that signs and sends, every
                        round, its delta x1000 / sign-flipped / random noise / x1e36 / a replay of an old
                        round's payload; final CE within 0.02 nats of the clean run?
  public swarm          4 honest replicas; meanwhile a stranger (made-up peer id, no record) sends well-formed
                        deltas x1000 and x1e36 to every replica, stores a DHT record claiming round 1,000,000
                        (unsigned, and one signed by a fresh key of its own), stores 10 Sybil records of
                        made-up peer ids, opens 6 ExchangeDeltas streams declaring 500 MiB each and never
                        finishing, and runs one Forward session over 400 step_index values (daemon RSS before
                        and after); the final CE of that run against the clean one
  swarm key             4 honest replicas with --swarm-key; a stranger without it calls every RPC
  partition             3 namespaced hosts, one cut off for 30 s (its bridge port down), then healed
  checkpoint dir        a replica's checkpoint dir on a small tmpfs, remounted read-only for a while
  SIGTERM / kill -9     to a daemon's process group / its main process / its DHT process; kill -9 during
                        checkpoint writes, N times, each followed by a restart from the checkpoint dir
  insider ROW           issue 21: signed insiders running the real daemon with a changed delta, state or Forward
                        answer (drift 1 of 4, majority poison 3 of 5, poisoned state 3 of 5 + a joiner, lying
                        Forward, flood): benchmarks/insiders.py's rows and table (`--only insider --merge`;
                        `--insiders drift,poison,state,forward,flood` picks some)
Writes benchmarks/results/adversary.json (one row per fault: name, survived, evidence, ce, ce_clean,
ce_delta, data_lost) and the markdown fragment benchmarks/results/adversary.md:

    python benchmarks/adversary.py

`--only NAME[,NAME]` runs a subset (the rows whose name starts with one of them). Needs root for the
partition and tmpfs rows (reported as not run otherwise). This file owns the attacks (ByzantineGossip, the
stranger, the forger, the floods), the rows and their table; the swarms and what is read off them come
from benchmarks/harness/daemons.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import daemons, options, results
from benchmarks.harness.faults import CFG, Row, signed_delta
from benchmarks.harness.faults import fmt as _f
from swarmd.tools.launch import process_group, wait_group_gone

ROOT = Path(__file__).resolve().parent.parent
CE_TOLERANCE = 0.02  # nats: the bound on a Byzantine peer's effect on the final CE
BYZANTINE_MODES = ("x1000", "sign_flip", "noise", "x1e36", "replay")


# ----------------------------------------------------------------------------------------------
# The Byzantine daemon: a real `python -m swarmd` whose Gossip misbehaves (this file only)
# ----------------------------------------------------------------------------------------------
def run_byzantine(mode: str, config: str) -> int:
    """Run one daemon whose outgoing deltas are corrupted by `mode` (a child process of a benchmark)."""
    import torch

    from swarmd import __main__ as entry
    from swarmd.averaging.gossip import Gossip
    from swarmd.node import daemon as daemon_mod

    past: deque = deque(maxlen=4)  # this process's last outgoing payloads (the replay mode sends an old one)

    class ByzantineGossip(Gossip):
        async def publish(self) -> None:
            await super().publish()
            rs = self.current
            assert rs is not None
            sent = dict(rs.outgoing)
            for kind, own in rs.own.items():
                if mode == "replay":
                    if len(past) >= 3:
                        rs.outgoing[kind] = past[0][kind]  # a payload of 3 rounds ago, as it was signed
                    continue
                if mode == "x1000":
                    bad = {k: v * 1000 for k, v in own.items()}
                elif mode == "sign_flip":
                    bad = {k: -v for k, v in own.items()}
                elif mode == "noise":
                    bad = {
                        k: torch.randn_like(v) * max(float(v.norm()), 1e-3) * 10 / v.numel() ** 0.5
                        for k, v in own.items()
                    }
                elif mode == "x1e36":
                    bad = {k: v * 1e36 for k, v in own.items()}
                else:
                    raise SystemExit(f"unknown byzantine mode {mode}")
                rs.outgoing[kind] = signed_delta(self, kind, bad)
            past.append(sent)

    daemon_mod.Gossip = ByzantineGossip  # type: ignore[misc]  # this process only
    return entry.main(["--config", config, "--verbose"])


def byzantine_program(mode: str) -> list[str]:
    """The command that runs a ByzantineGossip daemon (this file's `byzantine MODE CONFIG`) without its config."""
    return [sys.executable, str(Path(__file__).resolve()), "byzantine", mode]


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------
def swarm(a, workdir: Path, peers: int = 4, seed: int = 0, **kw: Any) -> daemons.Swarm:
    """The rows' swarm: tiny daemons on CFG, no trajectory training, every round waiting for every delta."""
    swarm_kw = dict(model=CFG, trajectory_prob=0.0, seed=seed, wait_all=True, **kw)
    return daemons.tiny(peers, a.data_dir, workdir, a.rounds, a.steps, a.deadline_max, **swarm_kw)


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _pids(pgid: int) -> set[str]:
    return {x.split()[0] for x in process_group(pgid)}


def rpc_code(exc: BaseException) -> str:
    text = str(exc)
    return text.split(": ", 2)[1] if text.count(": ") >= 2 else text[:80]


# ----------------------------------------------------------------------------------------------
# rows
# ----------------------------------------------------------------------------------------------
@dataclass
class Run:
    """One swarm run's outcome: an honest replica's final CE, whether the honest peers ended well, what was seen."""

    ce: float | None
    ok: bool
    evidence: str
    rejected: int = 0
    dropped: int | None = None  # merges' deltas the outlier check dropped (honest peers' logs); None: not logged


def clean_run(a, peers: int = 4, seed: int = 0) -> Run:
    with tempfile.TemporaryDirectory(prefix="adv-clean-") as wd:
        sw = swarm(a, Path(wd), peers=peers, seed=seed)
        with sw:
            sw.start(300)
            done = daemons.finish(sw, list(range(peers)), a.timeout)
        ce = daemons.replica_ce(sw, 0, a.data_dir, a.eval_tokens)
        same = daemons.replicas_identical(sw, list(range(peers)))
        dropped = daemons.outlier_drops(sw, list(range(peers)))
    ok = done["exit"] == [0] * peers and ce is not None and same
    print(
        f"clean run, {peers} replicas, seed {seed}: CE {_f(ce)}, {done}, {dropped} outlier drops",
        file=sys.stderr,
        flush=True,
    )
    return Run(
        ce, ok, f"seed {seed}: exit codes {done['exit']}, rounds {done['rounds']}, bit-identical {same}", 0, dropped
    )


def byzantine_run(a, mode: str, seed: int = 0) -> Run:
    with tempfile.TemporaryDirectory(prefix=f"adv-byz-{mode}-") as wd:
        sw = swarm(a, Path(wd), seed=seed, programs={3: byzantine_program(mode)})
        with sw:
            sw.start(300)
            done = daemons.finish(sw, [0, 1, 2], a.timeout)
        ce = daemons.replica_ce(sw, 0, a.data_dir, a.eval_tokens)
        same = daemons.replicas_identical(sw, [0, 1, 2])
        rejected = daemons.log_count(sw, [0, 1, 2], "rejected a")
        dropped = daemons.outlier_drops(sw, [0, 1, 2])
    ok = done["exit"] == [0, 0, 0] and ce is not None and same and not done["tracebacks"]
    print(
        f"byzantine {mode}, seed {seed}: CE {_f(ce)}, {done}, {rejected} rejections, {dropped} outlier drops",
        file=sys.stderr,
        flush=True,
    )
    return Run(
        ce,
        ok,
        f"seed {seed}: honest exit codes {done['exit']}, rounds {done['rounds']}, bit-identical {same}, "
        f"tracebacks {done['tracebacks']}",
        rejected,
        dropped,
    )


def _mean(xs: list[float | None]) -> float | None:
    return None if not xs or any(x is None for x in xs) else sum(xs) / len(xs)  # type: ignore[arg-type]


def _diffs(runs: dict[int, Run], ref: dict[int, Run]) -> list[float | None]:
    """Paired differences run - reference, seed by seed (None where a CE is missing)."""
    return [
        None if runs[s].ce is None or ref[s].ce is None else runs[s].ce - ref[s].ce  # type: ignore[operator]
        for s in sorted(runs)
        if s in ref
    ]


def _drop_note(runs: dict[int, Run]) -> str:
    """The outlier check's drops per run, in the honest peers' merges (each peer merges block and table)."""
    return f"deltas dropped by the honest peers' outlier checks per run {[r.dropped for r in runs.values()]}"


def _spread(xs: list[float | None]) -> str:
    vals = [x for x in xs if x is not None]
    return "-" if not vals else f"[{', '.join(f'{x:+.4f}' for x in vals)}] (range {max(vals) - min(vals):.4f})"


_DROPS = r"(?:, (\d+) (?:direction|outlier) drops)?$"  # logged since the outlier check
_CLEAN_LINE = re.compile(r"clean run, (\d+) replicas, seed (\d+): CE (\S+), (\{.*\})" + _DROPS)
_BYZ_LINE = re.compile(r"byzantine (\S+), seed (\d+): CE (\S+), (.*), (\d+) rejections" + _DROPS)


def runs_from_log(path: Path) -> dict[tuple, list[Run]]:
    """The per-run lines a Byzantine command printed to stderr (clean_run, byzantine_run), by ("clean", peers,
    seed) or ("byzantine", mode, seed), in order: the rows of a command that was stopped before its end."""
    out: dict[tuple, list[Run]] = {}
    for line in path.read_text(errors="replace").splitlines():
        if m := _CLEAN_LINE.match(line):
            key, rejected, dropped = ("clean", int(m[1]), int(m[2])), 0, m[5]
        elif m := _BYZ_LINE.match(line):
            key, rejected, dropped = ("byzantine", m[1], int(m[2])), int(m[5]), m[6]
        else:
            continue
        ce = None if m[3] == "-" else float(m[3])
        done = m[4]
        ok = ce is not None and "'tracebacks': 0" in done and re.search(r"'exit': \[(0, )*0\]", done) is not None
        run = Run(ce, ok, f"seed {m[2]} (from the log): {done}", rejected, None if dropped is None else int(dropped))
        out.setdefault(key, []).append(run)
    return out


def byzantine_rows(a, seeds: list[int], log: dict[tuple, list[Run]] | None = None) -> tuple[list[Row], dict[int, Run]]:
    """Clean 4- and 3-replica runs and one run per attack, per seed; each attack against the honest clean run
    (its 3 honest replicas alone, the same seed), mean over the seeds. Returns the rows and the 4-replica runs.

    :param log: runs_from_log of a command that was stopped: its runs instead of new ones (missing ones: left out)
    """

    def run(key: tuple) -> Run | None:
        if log is None:
            return clean_run(a, key[1], key[2]) if key[0] == "clean" else byzantine_run(a, key[1], key[2])
        return log[key].pop(0) if log.get(key) else None

    clean4 = {s: r for s in seeds if (r := run(("clean", 4, s))) is not None}
    clean3 = {s: r for s in seeds if (r := run(("clean", 3, s))) is not None}
    repeat = run(("clean", 3, seeds[0]))  # the same seed again: the run-to-run noise floor
    noise = (
        None if repeat is None or repeat.ce is None or clean3[seeds[0]].ce is None else repeat.ce - clean3[seeds[0]].ce
    )
    c3 = _mean([r.ce for r in clean3.values()])
    rows = [
        Row(
            f"clean run (4 honest replicas), {len(clean4)} seeds",
            all(r.ok for r in clean4.values()),
            f"CE per seed {[_f(r.ce) for r in clean4.values()]}; {_drop_note(clean4)}; "
            + "; ".join(r.evidence for r in clean4.values()),
            _mean([r.ce for r in clean4.values()]),
            _mean([r.ce for r in clean4.values()]),
        ),
        Row(
            f"clean run (3 honest replicas: the Byzantine runs' honest set alone), {len(clean3)} seeds",
            all(r.ok for r in clean3.values()) and repeat is not None and repeat.ok,
            f"CE per seed {[_f(r.ce) for r in clean3.values()]}; minus the 4-replica run of the same seed "
            f"{_spread(_diffs(clean3, clean4))}; the same seed ({seeds[0]}) run again: {_f(noise, '{:+.4f}')} "
            f"(run-to-run noise); {_drop_note(clean3)}; " + "; ".join(r.evidence for r in clean3.values()),
            c3,
            c3,
        ),
    ]
    for mode in BYZANTINE_MODES:
        runs = {s: r for s in seeds if (r := run(("byzantine", mode, s))) is not None and s in clean3 and s in clean4}
        name = f"Byzantine same-block peer (1 of 4): {mode}, {len(runs)} of {len(seeds)} seeds"
        if not runs:
            rows.append(Row(name, False, "not run: the command was stopped before this attack's runs"))
            continue
        d3, d4 = _diffs(runs, clean3), _diffs(runs, clean4)
        m3 = _mean(d3)
        ok = all(r.ok for r in runs.values()) and m3 is not None and abs(m3) <= CE_TOLERANCE
        rows.append(
            Row(
                name,
                ok,
                f"CE - honest clean run (3 replicas, same seed) per seed {_spread(d3)}, mean "
                f"{_f(m3, '{:+.4f}')}; CE - 4-replica clean run per seed {_spread(d4)}, mean "
                f"{_f(_mean(d4), '{:+.4f}')}; rejections logged by the honest peers per run "
                f"{[r.rejected for r in runs.values()]}; {_drop_note(runs)}; "
                + "; ".join(r.evidence for r in runs.values()),
                _mean([r.ce for r in runs.values()]),
                _mean([clean3[s].ce for s in runs]),
            )
        )
    return rows, clean4


async def _stranger_deltas(sw: daemons.Swarm, honest: list[int], scale: float) -> list[str]:
    """Well-formed deltas scaled by `scale`, round and base hash read from GetStatus, a made-up peer id."""
    import torch

    from swarmd.averaging.delta import encode
    from swarmd.protocol import Codec, PayloadKind
    from swarmd.transport import PeerClient

    client, out = PeerClient(), []
    try:
        for i in honest:
            address = sw.peers[i].address
            try:
                st = await client.status(address, 5.0)
            except Exception as exc:
                out.append(f"GetStatus refused ({rpc_code(exc)})")
                continue
            torch.manual_seed(0)
            delta = {k: torch.randn(v) * 1e-3 * scale for k, v in _shapes().items()}
            enc = encode(
                delta,
                Codec.INT8,
                swarm_id=sw.config.net.swarm_id,
                config_hash=CFG.config_hash(),
                kind=PayloadKind.BLOCK_DELTA,
                block_index=0,
                round=st.round,
                base_hash=st.base_hash,
                peer_id="12D3KooWStrangerStrangerStrangerStrangerStranger",
                weight=1.0,
            )
            try:
                await client.exchange(address, enc, 10.0)
                out.append("accepted")
            except Exception as exc:
                out.append(rpc_code(exc))
    finally:
        await client.close()
    return out


def _shapes() -> dict:
    from swarmd.core.model import DenoisingBlock

    return {k: tuple(v.shape) for k, v in DenoisingBlock(CFG).state_dict().items()}


class Forger:
    """The attacker's own hivemind DHT node (forge_records) in a fresh process, started before the swarm (a DHT
    forked from this process, which holds gRPC state, cannot dial; a cold DHT takes tens of seconds to start on a
    loaded machine, long enough for a 12-round swarm to finish), told the swarm's multiaddrs once it runs."""

    def __init__(self) -> None:
        cmd = [sys.executable, str(Path(__file__).resolve()), "forge"]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)

    def attack(self, sw: daemons.Swarm, timeout_s: float = 180.0) -> str:
        """Send the spec; the child's last stdout line (what it stored), or why there is none."""
        maddrs = [m for p in sw.peers if p.alive() for m in p.info.get("multiaddrs", [])]
        spec = {"maddrs": maddrs, "swarm_id": sw.config.net.swarm_id, "victim": sw.peers[1].info["peer"]}
        try:
            out, _ = self.proc.communicate(json.dumps(spec) + "\n", timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.close()
            return f"attacker DHT did not answer within {timeout_s:.0f} s"
        lines = out.strip().splitlines()
        return lines[-1] if lines else f"attacker exited {self.proc.returncode} without a line"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def forge_records() -> str:
    """Start a raw hivemind DHT (no validators of ours), read the spec (JSON: the swarm's multiaddrs, swarm id,
    victim peer id) from stdin, reach the swarm, then store an unsigned record naming the victim with round
    1,000,000, one signed by a fresh key of the attacker's own, and 10 Sybil records of made-up peer ids."""
    import hivemind
    from hivemind.utils import get_dht_time

    from swarmd.membership.dht_process import _dht_rebootstrap
    from swarmd.membership.records import PeerRecord, block_key

    dht = None
    try:  # alone first: p2pd's own bootstrap gives up early on a loaded machine ("failed to connect to bootstrap
        # peers"); then dial and ping the swarm's nodes from inside the DHT process, as a re-bootstrap does
        dht = hivemind.DHT(  # patient RPCs: hivemind's 3 s ping timeout is too short on a loaded machine
            initial_peers=[], host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True, startup_timeout=60, wait_timeout=30
        )
    except Exception as exc:
        return f"attacker DHT did not start ({type(exc).__name__}: {str(exc)[-120:]})"
    try:
        spec = json.loads(sys.stdin.readline())
        maddrs, began = spec["maddrs"], time.monotonic()
        answered = 0
        for _ in range(10):
            answered = dht.run_coroutine(functools.partial(_dht_rebootstrap, maddrs))
            if answered:
                break
            time.sleep(2)  # the swarm's nodes did not answer the dial yet: try again, 10 times at most
        if not answered:
            return f"attacker DHT could not reach any of the {len(maddrs)} swarm nodes"
        key, exp = block_key(spec["swarm_id"], 0), get_dht_time() + 120
        forged = PeerRecord(
            spec["victim"],
            "127.0.0.1:1",
            0,
            1_000_000,
            1e6,
            CFG.config_hash(),
            "f" * 16,
            False,
            spec["swarm_id"],
            "e" * 16,
        )
        stored, attacker = [bool(dht.store(key, forged.to_value(), exp, subkey=forged.peer_id))], "?"
        from swarmd.membership.identity import Identity
        from swarmd.membership.trust import sign_record

        me = Identity.generate()
        attacker = me.peer_id
        own = sign_record(replace(forged, peer_id=me.peer_id), me, 120.0)
        stored.append(bool(dht.store(key, own.to_value(), exp, subkey=own.peer_id)))
        for n in range(10):
            sybil = replace(forged, peer_id=f"12D3KooWSybil{n:02d}{'x' * 30}", round=0, address=f"127.0.0.1:{2 + n}")
            stored.append(bool(dht.store(key, sybil.to_value(), exp, subkey=sybil.peer_id)))
    finally:
        dht.shutdown()
    return (
        f"DHT store accepted by some node: unsigned forged {stored[0]}, self-signed round 1e6 {stored[1]}, "
        f"Sybil {sum(stored[2:])}/10 ({answered} of {len(maddrs)} swarm nodes reached, stored "
        f"{time.monotonic() - began:.1f} s after the spec); self-signed attacker ...{attacker[-6:]}"
    )


async def _oversized_streams(address: str, pid: int) -> str:
    """6 ExchangeDeltas streams each declaring a 500 MiB payload, sending 1 MiB chunks, never finishing."""
    import grpc

    from swarmd.protocol import Codec, PayloadKind
    from swarmd.transport.client import channel_options
    from swarmd.v1 import swarm_pb2 as pb
    from swarmd.v1 import swarm_pb2_grpc as pb_grpc

    before = rss_mib(pid)
    channel = grpc.aio.insecure_channel(address, options=channel_options())
    stub = pb_grpc.SwarmStub(channel)
    chunk = os.urandom(1 << 20)

    async def requests():
        yield pb.Payload(
            header=pb.PayloadHeader(
                swarm_id="adv",
                config_hash=CFG.config_hash(),
                kind=PayloadKind.BLOCK_DELTA.to_pb(),
                block_index=0,
                round=0,
                codec=Codec.FP32.to_pb(),
                payload_bytes=500 << 20,
                raw_bytes=500 << 20,
                peer_id="12D3KooWBig",
            )
        )
        for _ in range(480):
            yield pb.Payload(chunk=chunk)
            await asyncio.sleep(0.01)

    async def one() -> str:
        try:
            async for reply in stub.ExchangeDeltas(requests(), timeout=15):
                if reply.WhichOneof("part") == "reject":
                    return f"refused in-band ({reply.reject[:70]})"
            return "answered"
        except grpc.RpcError as exc:
            return exc.code().name

    tasks = [asyncio.create_task(one()) for _ in range(6)]
    peak, started = before, time.monotonic()
    while not all(t.done() for t in tasks) and time.monotonic() - started < 20:
        peak = max(peak, rss_mib(pid))
        await asyncio.sleep(0.2)  # sampling the daemon's RSS while the streams run
    codes = [await t if t.done() else "still open" for t in tasks]
    for t in tasks:
        t.cancel()
    await channel.close()
    return f"codes {sorted(set(codes))}, daemon RSS {before:.0f} -> peak {peak:.0f} MiB"


async def _forward_flood(address: str, pid: int, steps: int = 400) -> str:
    """One Forward session over `steps` distinct step_index values, each caching (use_cache)."""
    import torch

    from swarmd.transport import PeerClient
    from swarmd.v1 import swarm_pb2 as pb
    from swarmd.wire import to_proto

    before, client = rss_mib(pid), PeerClient()
    session, codes, peak = client.forward_session(address, 10.0), {}, before
    try:
        for i in range(steps):
            req = pb.ForwardRequest(
                session_id="flood",
                block_index=0,
                config_hash=CFG.config_hash(),
                sigma=1.0,
                sigma_next=0.5,
                start_position=0,
                use_cache=True,
                step_index=i,
            )
            req.context.CopyFrom(to_proto(torch.randint(0, 256, (8, CFG.seq_len), dtype=torch.uint8)))
            req.z.CopyFrom(to_proto(torch.randn(8, CFG.seq_len, CFG.d_model)))
            try:
                await session.step(req)
                codes["OK"] = codes.get("OK", 0) + 1
            except Exception as exc:
                code = rpc_code(exc)
                codes[code] = codes.get(code, 0) + 1
            if i % 20 == 0:
                peak = max(peak, rss_mib(pid))
    finally:
        await session.close()
        await client.close()
    peak = max(peak, rss_mib(pid))
    return f"{steps} steps: {codes}, daemon RSS {before:.0f} -> peak {peak:.0f} MiB"


def public_rows(a, ce_clean: float | None) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="adv-public-") as wd:
        sw = swarm(a, Path(wd))
        ev: dict[str, str] = {}
        forger = Forger()  # its DHT starts while the swarm does
        with sw, contextlib.closing(forger):
            sw.start(300)
            daemons.wait_rounds(sw, [0, 1, 2, 3], 2)
            round_before = max(len(p.rounds_seen) for p in sw.peers)
            ev["forged"] = forger.attack(sw)  # first: the records must be there while the honest peers run on
            round_stored = min(len(p.rounds_seen) for p in sw.peers)
            print(f"forged records: {ev['forged']}", file=sys.stderr, flush=True)
            ev["x1000"] = ", ".join(asyncio.run(_stranger_deltas(sw, [0, 1, 2, 3], 1000.0)))
            print(f"stranger x1000: {ev['x1000']}", file=sys.stderr, flush=True)
            ev["x1e36"] = ", ".join(asyncio.run(_stranger_deltas(sw, [0, 1, 2, 3], 1e36)))
            print(f"stranger x1e36: {ev['x1e36']}, alive {[p.alive() for p in sw.peers]}", file=sys.stderr, flush=True)
            done = daemons.finish(sw, [0, 1, 2, 3], a.timeout)
        ce = daemons.replica_ce(sw, 0, a.data_dir, a.eval_tokens)
        same = daemons.replicas_identical(sw, [0, 1, 2, 3])
        adopted = daemons.log_count(sw, [0, 1, 2, 3], "adopted the")
        attacker = ev["forged"].rsplit("...", 1)[-1] if "self-signed attacker ..." in ev["forged"] else "?"
        from_attacker = sum(
            line.count("adopted") and line.count(attacker)
            for i in range(4)
            for line in sw.peers[i].log_path.read_text(errors="replace").splitlines()
        )
        sybil_lines = daemons.log_count(sw, [0, 1, 2, 3], "x" * 6)  # every Sybil id ends so: never dialled nor expected
        rejected = daemons.log_count(sw, [0, 1, 2, 3], "rejected a")
        part = [h["participation"] for s in sw.summaries() for h in s.get("history", []) if "participation" in h]
        big_round = any(r is not None and r >= 1_000_000 for r in done["rounds"])
        # the attacker's DHT came up and stored while the swarm had rounds left to read it (else not exercised)
        after = min(r or 0 for r in done["rounds"]) - round_stored
        reached = ev["forged"].startswith("DHT store") and after >= 3
        hist = [h.get("expected", 0) for s in sw.summaries() for h in s.get("history", [])]
        alive = done["exit"] == [0] * 4
    ok_ce = ce is not None and ce_clean is not None and abs(ce - ce_clean) <= CE_TOLERANCE
    common_ev = f"honest exit codes {done['exit']}, rounds {done['rounds']}, replicas bit-identical {same}"
    rows = [
        Row(
            "stranger sends a well-formed block delta x1000 to every replica",
            alive and ok_ce and "accepted" not in ev["x1000"],
            f"exchange answers: {ev['x1000']}; {common_ev}",
            ce,
            ce_clean,
        ),
        Row(
            "stranger sends a finite block delta x1e36 to every replica",
            alive and ok_ce and "accepted" not in ev["x1e36"],
            f"exchange answers: {ev['x1e36']}; {common_ev}",
            ce,
            ce_clean,
        ),
        Row(
            "forged DHT record claiming round 1,000,000 (unsigned, and self-signed by a fresh key)",
            alive and not big_round and ok_ce and reached and from_attacker == 0,
            f"{ev['forged']}; honest final rounds {done['rounds']} "
            f"(round lines before the attack: {round_before}; rounds every honest peer ran after the store: {after}), "
            f"state adoptions logged {adopted}, of them from the "
            f"attacker {from_attacker}; {common_ev}",
            ce,
            ce_clean,
        ),
        Row(
            "Sybil: 10 made-up peer ids without signed records",
            alive and ok_ce and reached and max(hist, default=0) <= 8 and sybil_lines == 0,
            f"{ev['forged']}; honest log lines naming a Sybil id {sybil_lines}; most (peer, kind) deltas any honest "
            f"peer expected in a round: {max(hist, default=0)} (3 other replicas x 2 kinds = 6, + 2 for the "
            f"attacker's own self-signed record, a peer like any other in a public swarm); honest participation "
            f"mean {_f(_mean(part))} over {len(part)} rounds; rejections logged {rejected}",
            ce,
            ce_clean,
        ),
    ]
    return rows


def _growth(evidence: str) -> float:
    """MiB of RSS growth in an 'RSS A -> peak B MiB' evidence string."""
    try:
        part = evidence.rsplit("RSS ", 1)[1]
        before, peak = part.split(" -> peak ")
        return float(peak.split()[0]) - float(before)
    except (IndexError, ValueError):
        return float("inf")


def swarm_key_row(a, ce_clean: float | None) -> Row:
    try:
        from swarmd.transport.auth import write_swarm_key
    except ImportError:
        return Row("stranger without the swarm key calls every RPC", False, "no --swarm-key in this build")
    with tempfile.TemporaryDirectory(prefix="adv-key-") as wd:
        key = Path(wd) / "swarm.key"
        write_swarm_key(key)
        sw = swarm(a, Path(wd) / "swarm", swarm_key=str(key))
        with sw:
            sw.start(300)
            daemons.wait_rounds(sw, [0, 1, 2, 3], 2)
            answers = asyncio.run(_every_rpc(sw.peers[1].address))
            done = daemons.finish(sw, [0, 1, 2, 3], a.timeout)
        ce = daemons.replica_ce(sw, 0, a.data_dir, a.eval_tokens)
    refused = all(v not in ("answered", "OK") for k, v in answers.items() if k != "Health")
    ok = refused and answers.get("Health") == "SERVING" and done["exit"] == [0] * 4
    return Row(
        "stranger without the swarm key calls every RPC",
        ok,
        f"{answers}; honest exit codes {done['exit']}, rounds {done['rounds']}",
        ce,
        ce_clean,
    )


async def _every_rpc(address: str) -> dict[str, str]:
    import torch

    from swarmd.averaging.delta import encode
    from swarmd.protocol import Codec, PayloadKind
    from swarmd.transport import PeerClient
    from swarmd.v1 import swarm_pb2 as pb
    from swarmd.wire import to_proto

    os.environ.pop("BLOCKTRAIN_SWARM_KEY", None)
    client, out = PeerClient(), {}

    async def call(name: str, coro) -> None:
        try:
            await coro
            out[name] = "answered"
        except Exception as exc:
            out[name] = rpc_code(exc)

    try:
        await call("GetStatus", client.status(address, 5.0))
        await call("GetConfig", client.swarm_config(address, 5.0))
        req = pb.PullStateRequest(
            swarm_id="demo", config_hash=CFG.config_hash(), kind=PayloadKind.BLOCK_STATE.to_pb(), block_index=0
        )
        await call("PullState", client.pull_state(address, req, 5.0))
        enc = encode(
            {k: torch.zeros(v) for k, v in _shapes().items()},
            Codec.INT8,
            swarm_id="demo",
            config_hash=CFG.config_hash(),
            kind=PayloadKind.BLOCK_DELTA,
            block_index=0,
            round=0,
            base_hash="",
            peer_id="12D3KooWStranger",
            weight=1.0,
        )
        await call("ExchangeDeltas", client.exchange(address, enc, 5.0))
        session = client.forward_session(address, 5.0)
        fwd = pb.ForwardRequest(session_id="s", block_index=0, config_hash=CFG.config_hash(), sigma=1.0, final=True)
        fwd.context.CopyFrom(to_proto(torch.zeros(1, CFG.seq_len, dtype=torch.uint8)))
        fwd.z.CopyFrom(to_proto(torch.zeros(1, CFG.seq_len, CFG.d_model)))
        await call("Forward", session.step(fwd))
        await session.close()
        out["Health"] = await client.health(address, 5.0)
    finally:
        await client.close()
    return out


def process_rows(a) -> list[Row]:
    """SIGTERM to a process group, kill -9 of a daemon / of its DHT process, kill -9 during checkpoint writes."""
    from swarmd.core import checkpoint as ck

    rows = []
    with tempfile.TemporaryDirectory(prefix="adv-proc-") as wd:
        sw = swarm(a, Path(wd), peers=2)
        sw.config = replace(sw.config, stop_at_round=0)  # until stopped
        with sw:
            sw.start(300)
            daemons.wait_rounds(sw, [0, 1], 2)
            target = sw.peers[0]
            streams = asyncio.run(_oversized_streams(target.address, target.process.pid))
            rows.append(
                Row(
                    "6 ExchangeDeltas streams each declaring 500 MiB, never finishing",
                    target.alive() and "still open" not in streams and _growth(streams) < 200,
                    streams,
                )
            )
            forward = asyncio.run(_forward_flood(target.address, target.process.pid))
            rows.append(
                Row(
                    "one Forward session with 400 distinct step_index values",
                    target.alive() and _growth(forward) < 300,
                    forward,
                )
            )
            print(f"resources: {streams}; {forward}", file=sys.stderr, flush=True)
            p = sw.peers[1]
            for name, sig in (("SIGTERM", signal.SIGTERM), ("SIGINT", signal.SIGINT)):
                pgid, started = p.process.pid, time.monotonic()
                os.killpg(pgid, sig)
                try:
                    p.process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    pass
                took = time.monotonic() - started
                left = wait_group_gone(pgid, 10)
                sw.kill(1, signal.SIGKILL)  # whatever is left (nothing, when it survived)
                rows.append(
                    Row(
                        f"{name} to the daemon's whole process group",
                        p.process.poll() == 0 and took < 10 and not left,
                        f"exited with code {p.process.poll()} after {took:.1f} s; processes "
                        f"of its group left 10 s later: {left or 'none'}",
                    )
                )
                sw.restart(1, 300)
                daemons.wait_rounds(sw, [1], 2)
            # kill -9 of the daemon's main process (a user, the OOM killer)
            pgid = p.process.pid
            os.kill(pgid, signal.SIGKILL)
            p.process.wait(timeout=30)
            left = wait_group_gone(pgid, 10)
            rows.append(
                Row(
                    "kill -9 of a daemon's main process: no orphan DHT process or p2pd",
                    not left,
                    f"processes of its group (DHT process, p2pd) left 10 s later: {left or 'none'}",
                )
            )
            sw.restart(1, 300)
            daemons.wait_rounds(sw, [1], 2)
            dht = [
                int(x.split()[0])
                for x in process_group(p.process.pid)
                if x.split()[0] != str(p.process.pid) and x.split()[1] == "python"
            ]
            if dht:
                old_p2pd = {x.split()[0] for x in process_group(p.process.pid) if x.endswith("p2pd")}
                os.kill(dht[0], signal.SIGKILL)
                killed, deadline = time.time(), time.monotonic() + 10
                while old_p2pd & _pids(p.process.pid) and time.monotonic() < deadline:
                    time.sleep(0.1)  # polling for its p2pd to end, with a deadline
                p2pd_left = sorted(old_p2pd & _pids(p.process.pid))
                rows.append(
                    Row(
                        "kill -9 of a daemon's DHT process alone: its p2pd ends",
                        not p2pd_left,
                        f"the killed DHT process's p2pd left 10 s later: {p2pd_left or 'none'}",
                    )
                )
                deadline = time.monotonic() + 90
                back = None
                while back is None and time.monotonic() < deadline:
                    time.sleep(0.5)  # polling the peer's log and checkpointed round history, with a deadline
                    log = p.log_path.read_text(errors="replace")
                    full = [
                        h
                        for h in daemons.history(p)
                        if h["wall"] > killed and h["expected"] == 2 and h["accepted"] == 2 and "restarted" in log
                    ]
                    back = full[0]["wall"] - killed if full else None
                comms = [x.split()[1] for x in process_group(p.process.pid)]
                rows.append(
                    Row(
                        "kill -9 of a daemon's DHT process alone: the daemon starts its DHT again and rejoins",
                        back is not None and p.alive() and comms.count("python") == 2 and "p2pd" in comms,
                        f"DHT restart lines {log.count('restarted (')}; seconds from the kill until the peer merged "
                        f"a round with both expected (peer, kind) deltas again: "
                        f"{_f(back, '{:.1f}') if back is not None else 'not within 90 s'}; its process group "
                        f"now {sorted(comms)}",
                    )
                )
            sw.kill(1, signal.SIGKILL)
            # kill -9 during checkpoint writes, N times
            rng, kills = random.Random(0), []
            for _ in range(a.kills):
                sw.restart(1, 300)
                resumed_at = int(p.info.get("round", -1))
                daemons.wait_rounds(sw, [1], 1)
                time.sleep(rng.uniform(0.0, 1.0))  # a random moment of a round (each round ends with a checkpoint)
                sw.kill(1, signal.SIGKILL)
                d = p.checkpoint_dir
                tmp = len(list(d.glob(".*.tmp"))) + len(list(d.glob("gen-*/.*.tmp")))
                gens = len(list(d.glob("gen-*")))
                try:
                    body = ck.read_config(d)
                    ck.verify_generation(d, body)
                    block_meta = ck.load_tensors(ck.block_file(d, 0))[1]
                    optim_meta = ck.load_tensors(ck.optim_file(d, 0))[1]
                    consistent = block_meta.get("step") == optim_meta.get("step")
                    kills.append(
                        {
                            "resumed_at": resumed_at,
                            "round": body.get("round"),
                            "tmp_left": tmp,
                            "generations": gens,
                            "consistent": consistent,
                            "verified": True,
                        }
                    )
                except Exception as exc:
                    kills.append({"resumed_at": resumed_at, "error": str(exc), "tmp_left": tmp, "verified": False})
            sw.restart(1, 300)
            final_resume = int(p.info.get("round", -1))
            stale_after_start = (
                len(list(p.checkpoint_dir.glob(".*.tmp"))) + len(list(p.checkpoint_dir.glob("gen-*"))) - 1
            )
    ok = all(r["verified"] and r.get("consistent") for r in kills) and final_resume >= 0
    resumes = sum(r["resumed_at"] >= 0 for r in kills)
    rows.append(
        Row(
            f"kill -9 during checkpoint writes ({a.kills} times, each followed by a restart)",
            ok,
            f"{resumes}/{a.kills} restarts resumed from the checkpoint; after each kill: generation verified "
            f"{sum(r['verified'] for r in kills)}/{a.kills}, optimizer step == weights step "
            f"{sum(bool(r.get('consistent')) for r in kills)}/{a.kills}, temp files left by the kill "
            f"{sum(r['tmp_left'] for r in kills)} in all, generation folders at most "
            f"{max((r.get('generations', 0) for r in kills), default=0)}; after the final restart: "
            f"{max(stale_after_start, 0)} stale temp files / extra generations",
            data_lost="none" if ok else f"{[r for r in kills if not r['verified']]}",
        )
    )
    return rows


def readonly_row(a) -> Row:
    """A replica's checkpoint dir on a tmpfs, remounted read-only for a while, then writable again."""
    if os.geteuid() != 0:
        return Row("checkpoint dir read-only", False, "not run: needs root to mount a tmpfs")
    from swarmd.transport import PeerClient

    with tempfile.TemporaryDirectory(prefix="adv-ro-") as wd:
        mnt = Path(wd) / "mnt"
        mnt.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], check=True)
        try:
            sw = swarm(a, Path(wd) / "swarm", peers=2)
            sw.config = replace(sw.config, stop_at_round=0)
            sw.peers[1].checkpoint_dir = mnt / "peer1"
            with sw:
                sw.start(300)
                daemons.wait_rounds(sw, [0, 1], 2)
                p = sw.peers[1]
                subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
                n0 = len(p.rounds_seen)
                health = []

                async def poll(seconds: float) -> None:
                    client = PeerClient()
                    try:
                        end = time.monotonic() + seconds
                        while time.monotonic() < end:
                            with contextlib.suppress(Exception):
                                h = await client.health(p.address, 2.0)
                                if not health or health[-1] != h:
                                    health.append(h)
                            await asyncio.sleep(0.3)
                    finally:
                        await client.close()

                asyncio.run(poll(a.readonly_s))
                rounds_ro = len(p.rounds_seen) - n0
                subprocess.run(["mount", "-o", "remount,rw", str(mnt)], check=True)
                asyncio.run(poll(8.0))
                alive = p.alive()
                log = p.log_path.read_text(errors="replace")
                warned = log.count("not written")
                sw.stop()
                code = p.process.poll()
        finally:
            subprocess.run(["umount", "-l", str(mnt)], check=False)
    ok = alive and rounds_ro > 0 and health[:1] == ["SERVING"] and "NOT_SERVING" in health and health[-1] == "SERVING"
    return Row(
        "checkpoint dir read-only (tmpfs remounted ro, then rw)",
        ok,
        f"{rounds_ro} rounds merged while read-only ({a.readonly_s:.0f} s), {warned} one-line warnings, "
        f"tracebacks {log.count('Traceback')}, health sequence {health}, process alive {alive}, "
        f"exit code on SIGTERM {code}",
    )


def partition_row(a) -> Row:
    try:
        from tests.netns_utils import NetnsLab, _ip, unavailable
    except ImportError as exc:
        return Row("partition 30 s then heal", False, f"not run: {exc}")
    if unavailable():
        return Row("partition 30 s then heal", False, f"not run: {unavailable()}")

    with NetnsLab(3) as lab, tempfile.TemporaryDirectory(prefix="adv-part-") as wd:
        swarm_kw = dict(model=CFG, swarm_id="part", trajectory_prob=0.0)
        sw = daemons.netns_swarm(lab, a.data_dir, Path(wd), 0, a.steps, a.deadline_max, **swarm_kw)
        with sw:
            sw.start(300)
            sw.wait_rounds(3, 300)
            _ip("-n", lab.bridge, "link", "set", "h2", "down")
            cut = [len(p.rounds_seen) for p in sw.peers]
            time.sleep(a.partition_s)
            _ip("-n", lab.bridge, "link", "set", "h2", "up")
            healed, rounds_at_heal = time.time(), [len(p.rounds_seen) for p in sw.peers]
            rejoined, first = None, [None, None, None]
            while time.time() - healed < 120 and rejoined is None:
                time.sleep(1)  # polling the peers' checkpointed round history
                for i, p in enumerate(sw.peers):
                    full = [
                        h
                        for h in daemons.history(p)
                        if h["wall"] > healed and h["expected"] == 4 and h["accepted"] == 4
                    ]
                    first[i] = full[0]["wall"] - healed if full else None
                if all(x is not None for x in first):
                    rejoined = max(first)  # type: ignore[type-var]
            logs = [p.log_path.read_text(errors="replace") for p in sw.peers]
    ok = rejoined is not None and rejoined <= 60
    return Row(
        f"partition: one of 3 hosts cut off {a.partition_s:.0f} s (link down), then healed",
        ok,
        f"round lines at cut {cut}, at heal {rounds_at_heal}; seconds after the heal until every peer "
        f"merged a round with all 4 expected (peer, kind) deltas: {first} -> "
        f"{f'rejoined in {rejoined:.1f} s' if rejoined is not None else 'not within 120 s'}; "
        f"re-bootstrap lines {sum(x.count('re-bootstrapp') for x in logs)}, rejoin lines "
        f"{sum(x.count('rejoining it') for x in logs)}, rejoins from fresh signed states "
        f"{sum(x.count('rejoined: adopted') for x in logs)}, state adoptions "
        f"{sum(x.count('adopted the') for x in logs)}",
    )


# ----------------------------------------------------------------------------------------------
def parse_args(argv=None):
    p = options.parser(__doc__)
    options.add_schedule(p, rounds=12, steps=4)
    daemons.add_run_options(p, timeout_s=300.0)
    p.add_argument("--kills", type=int, default=5, help="kill -9 during checkpoint writes: how many times")
    p.add_argument("--partition-s", type=float, default=30.0, help="seconds the partition row cuts one host off")
    p.add_argument(
        "--readonly-s", type=float, default=15.0, help="seconds the readonly row's checkpoint dir is read-only"
    )
    p.add_argument(
        "--only",
        default="",
        help="comma-separated row groups: clean,byzantine,public,key,process,readonly,partition,insider",
    )
    p.add_argument("--insiders", default="", help="insider rows (benchmarks/insiders.py ROWS), comma-separated")
    p.add_argument("--insider-rounds", type=int, default=25, help="rounds of the insider rows' runs")
    p.add_argument("--insider-steps", type=int, default=10, help="H of the insider rows' runs")
    p.add_argument("--score-bytes", type=int, default=16384, help="bytes the lying-Forward rows score")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated swarm seeds of the Byzantine rows")
    p.add_argument("--byz-rounds", type=int, default=30, help="rounds of the Byzantine rows' runs (0: --rounds)")
    p.add_argument("--byz-steps", type=int, default=8, help="H of the Byzantine rows' runs (0: --steps)")
    options.add_from_log(
        p, "Byzantine rows from the per-run lines (stderr) of a Byzantine command that was stopped early"
    )
    p.add_argument(
        "--merge",
        action="store_true",
        help="keep the rows of --out that this run does not produce (each row names the command that made it)",
    )
    options.add_outputs(p, "adversary.json", "adversary.md")
    return p.parse_args(argv)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["byzantine"]:
        sys.exit(run_byzantine(argv[1], argv[2]))
    if argv[:1] == ["forge"]:
        print(forge_records(), flush=True)
        return
    a = parse_args(argv)
    groups = (
        set(a.only.split(","))
        if a.only
        else {"clean", "byzantine", "public", "key", "process", "readonly", "partition", "insider"}
    )
    started = time.monotonic()
    rows: list[Row] = []
    ce_clean = None

    def add(new: list[Row]) -> None:
        for r in new:
            rows.append(r)
            print(json.dumps(asdict(r) | {"ce_delta": r.ce_delta}), flush=True)

    seeds = [int(x) for x in a.seeds.split(",")]
    if "byzantine" in groups:  # a longer run than the other rows: the CE must resolve the 0.02-nat tolerance
        ab = argparse.Namespace(**{**vars(a), "rounds": a.byz_rounds or a.rounds, "steps": a.byz_steps or a.steps})
        byz, clean4 = byzantine_rows(ab, seeds, runs_from_log(a.from_log) if a.from_log else None)
        add(byz)
        if (ab.rounds, ab.steps) == (a.rounds, a.steps):
            ce_clean = clean4[seeds[0]].ce
    if groups & {"clean", "public", "key"} and (ce_clean is None or "clean" in groups):
        run = clean_run(a, 4, seeds[0])
        ce_clean = run.ce
        add([Row(f"clean run (4 honest replicas), seed {seeds[0]}", run.ok, run.evidence, run.ce, run.ce)])
    if "public" in groups:
        add(public_rows(a, ce_clean))
    if "key" in groups:
        add([swarm_key_row(a, ce_clean)])
    if "partition" in groups:
        add([partition_row(a)])
    if "readonly" in groups:
        add([readonly_row(a)])
    if "process" in groups:
        add(process_rows(a))
    if "insider" in groups:  # issue 21: signed insiders running the real daemon (benchmarks/insiders.py)
        from benchmarks import insiders

        ai = argparse.Namespace(**{**vars(a), "rounds": a.insider_rounds, "steps": a.insider_steps})
        add(insiders.insider_rows(ai, tuple(a.insiders.split(",")) if a.insiders else insiders.ROWS))
    command = results.command_line("adversary.py", argv)
    for r in rows:
        r.command = command
    kept, byz = [], {"rounds": a.byz_rounds or a.rounds, "steps_per_round": a.byz_steps or a.steps, "seeds": seeds}
    ins = {"rounds": a.insider_rounds, "steps_per_round": a.insider_steps, "score_bytes": a.score_bytes}
    if a.merge and a.out.exists():  # rows of earlier commands that this one did not produce
        names, before = {r.name for r in rows}, json.loads(a.out.read_text())
        # a Byzantine command replaces every Byzantine row (their names carry the seed count)
        kept = [r for r in before["rows"] if r["name"] not in names and not ("byzantine" in groups and _byz_row(r))]
        if "byzantine" not in groups:
            byz = before.get("byzantine", byz)
        if "insider" not in groups:
            ins = before.get("insider", ins)
    out = {
        "command": results.command_line("adversary.py", argv),
        "config": CFG.to_dict(),
        "rounds": a.rounds,
        "steps_per_round": a.steps,
        "byzantine": byz,
        "insider": ins,
        "ce_tolerance": CE_TOLERANCE,
        "seconds": round(time.monotonic() - started, 1),
        "rows": sorted(kept + [asdict(r) | {"ce_delta": r.ce_delta} for r in rows], key=lambda r: _order(r["name"])),
        "machine": results.machine(),
    }
    results.write_json(a.out, out)
    write_md(a.md, out)


ROW_ORDER = (  # the table's order, by how a row's name starts (rows of several commands merged)
    "clean run (4",
    "clean run (3",
    "Byzantine",
    "stranger sends",
    "forged",
    "Sybil",
    "stranger without",
    "partition",
    "checkpoint dir",
    "6 ExchangeDeltas",
    "one Forward",
    "SIGTERM",
    "SIGINT",
    "kill -9",
    "insider drift",  # benchmarks/insiders.py's rows, in its ROWS order
    "insider majority",
    "insider poisoned",
    "insider lying",
    "insider flood",
)


def _byz_row(row: dict) -> bool:
    """A row byzantine_rows writes (the attacks and their two clean references)."""
    name = row["name"]
    return (
        name.startswith(("Byzantine same-block", "clean run (3 honest"))
        or re.fullmatch(r"clean run \(4 honest replicas\), \d+ seeds", name) is not None
    )


def _order(name: str) -> int:
    return next((i for i, start in enumerate(ROW_ORDER) if name.startswith(start)), len(ROW_ORDER))


def write_md(path: Path, out: dict) -> None:
    rows = out["rows"]
    byz = out.get("byzantine", {})
    commands = list(dict.fromkeys(r.get("command") or out["command"] for r in rows))
    lines = [
        "### Fault matrix: a real swarm under attack and breakage (`benchmarks/adversary.py`)",
        "",
        f"Last command: `{out['command']}` ({out['seconds']:.0f} s on this machine); every row names the command "
        "that produced it (column c, commands listed below the table).",
        "",
        f"Real daemon processes (`python -m swarmd` via LocalSwarm; the partition row: three network namespaces), "
        f"real hivemind DHT, tiny model (one block, d={out['config']['d_model']}, seq {out['config']['seq_len']}), "
        f"{out['rounds']} rounds x H={out['steps_per_round']} (Byzantine rows: {byz.get('rounds', '?')} rounds x "
        f"H={byz.get('steps_per_round', '?')}, seeds {byz.get('seeds', '?')}), int8 deltas. CE: from-noise CE "
        "(nats/byte) of an honest replica's final checkpoint. The public-swarm rows share one run (attacks in "
        "sequence), so they share its CE.",
        f"Byzantine rows: 3 honest replicas + 1 attacker; the clean CE is the honest clean run (the same 3 replicas "
        f"alone, same seed), CE - clean the mean over the seeds of the paired differences, which must stay within "
        f"{out['ce_tolerance']} nats; the evidence gives each seed's difference, the difference to the 4-replica "
        "clean run, and the 3-replica clean rows give the run-to-run noise (the same seed run twice). Rows whose "
        "defence is not in place, or whose attack could not be carried out, say so and count as not survived.",
        "",
        "| fault | survived | CE | clean CE | CE - clean | data lost | c | evidence |",
        "|---|---|---:|---:|---:|---|---|---|",
    ]
    for r in rows:
        evidence = r["evidence"].replace("|", "/")
        c = commands.index(r.get("command") or out["command"]) + 1
        lines.append(
            f"| {r['name']} | {'yes' if r['survived'] else '**no**'} | {_f(r['ce'])} | {_f(r['ce_clean'])} "
            f"| {_f(r['ce_delta'], '{:+.4f}')} | {r['data_lost']} | {c} | {evidence} |"
        )
    survived = sum(r["survived"] for r in rows)
    from benchmarks.insiders import insider_table

    lines += insider_table(rows, out.get("insider"))
    lines += ["", f"{survived} of {len(rows)} rows survived. Machine: {out['machine']}.", "", "Commands:", ""]
    lines += [f"{i}. `{c}`" for i, c in enumerate(commands, 1)]
    lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
