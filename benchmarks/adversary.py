"""Fault matrix: a real swarm of daemon processes attacked and broken in every way issue 9 lists; did it survive?

Real daemons on the real DHT (the partition row: three network namespaces), the tiny one-block model; the attacks
speak the real protocol with the real codec. Row groups (`--only NAME[,NAME]`): clean, byzantine, public, key,
partition, readonly (these two need root), process and insider (benchmarks/insiders.py; `--insiders drift,...`).
Writes benchmarks/results/adversary.json (one row per fault: name, survived, evidence, CEs, data_lost) and
benchmarks/results/adversary.md; `--merge` keeps the rows of earlier commands:

    python benchmarks/adversary.py --data-dir /work/shared/data/wikitext-2 [--only insider] --merge
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
from collections import Counter, deque
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import daemons, options, procs, results
from benchmarks.harness.faults import CFG, Row, ce_delta, program, run_daemon, signed_delta, swarm
from benchmarks.harness.faults import fmt as _f
from swarmd.tools.launch import process_group, wait_group_gone

ROOT = Path(__file__).resolve().parent.parent
CE_TOLERANCE = 0.02  # nats: the bound on a Byzantine peer's effect on the final CE
BYZANTINE_MODES = ("x1000", "sign_flip", "noise", "x1e36", "replay")
GROUPS = ("clean", "byzantine", "public", "key", "process", "readonly", "partition", "insider")
HONEST = [0, 1, 2, 3]
STRANGER = "12D3KooWStrangerStrangerStrangerStrangerStranger"


def run_byzantine(mode: str, config: str) -> int:
    """Run one daemon whose outgoing deltas are corrupted by `mode` (a child process of a benchmark)."""
    import torch

    from swarmd.averaging.gossip import Gossip

    bad = {
        "x1000": lambda v: v * 1000,
        "sign_flip": lambda v: -v,
        "noise": lambda v: torch.randn_like(v) * max(float(v.norm()), 1e-3) * 10 / v.numel() ** 0.5,
        "x1e36": lambda v: v * 1e36,
        "replay": None,
    }[mode]
    past: deque = deque(maxlen=4)  # this process's last outgoing payloads (the replay mode sends an old one)

    class ByzantineGossip(Gossip):
        async def publish(self) -> None:
            await super().publish()
            rs = self.current
            assert rs is not None
            sent = dict(rs.outgoing)
            for kind, own in rs.own.items():
                if bad is not None:
                    rs.outgoing[kind] = signed_delta(self, kind, {k: bad(v) for k, v in own.items()})
                elif len(past) >= 3:
                    rs.outgoing[kind] = past[0][kind]  # a payload of 3 rounds ago, as it was signed
            past.append(sent)

    return run_daemon(config, Gossip=ByzantineGossip)


def rss_mib(pid: int) -> float:
    return (procs.proc_sample(pid) or {}).get("rss_kb", float("nan")) / 1024


def rpc_code(exc: BaseException) -> str:
    text = str(exc)
    return text.split(": ", 2)[1] if text.count(": ") >= 2 else text[:80]


def _mean(xs: list[float | None]) -> float | None:
    return None if not xs or any(x is None for x in xs) else sum(xs) / len(xs)  # type: ignore[arg-type]


# ---- the Byzantine rows
@dataclass
class Run:
    """One swarm run's outcome: an honest replica's final CE, whether the honest peers ended well, what was seen."""

    ce: float | None
    ok: bool
    evidence: str
    rejected: int = 0
    dropped: int = 0  # merges' deltas the outlier check dropped (honest peers' logs)


def swarm_run(a, mode: str, seed: int, honest: int = 3) -> Run:
    """A run of `honest` replicas alone (mode "clean") or 3 honest replicas + a ByzantineGossip daemon of `mode`
    (this file's `byzantine MODE CONFIG`)."""
    clean = mode == "clean"
    programs = {} if clean else {honest: program(__file__, "byzantine", mode)}
    with tempfile.TemporaryDirectory(prefix=f"adv-{'clean' if clean else 'byzantine'}-") as wd:
        sw = swarm(a, Path(wd), peers=honest + (not clean), seed=seed, programs=programs)
        with sw:
            sw.start(300)
            done = daemons.finish(sw, list(range(honest)), a.timeout)
        ce = daemons.replica_ce(sw, 0, a.data_dir, a.eval_tokens)
        same = daemons.replicas_identical(sw, list(range(honest)))
        rejected = 0 if clean else daemons.log_count(sw, list(range(honest)), "rejected a")
        dropped = daemons.outlier_drops(sw, list(range(honest)))
    ok = done["exit"] == [0] * honest and ce is not None and same
    evidence = f"exit codes {done['exit']}, rounds {done['rounds']}, bit-identical {same}"
    if not clean:
        ok, evidence = ok and not done["tracebacks"], f"honest {evidence}, tracebacks {done['tracebacks']}"
    what = f"clean run, {honest} replicas" if clean else f"byzantine {mode}"
    print(f"{what}, seed {seed}: CE {_f(ce)}, {done}, {rejected} rejections, {dropped} outlier drops", file=sys.stderr)
    return Run(ce, ok, f"seed {seed}: {evidence}", rejected, dropped)


def byzantine_rows(a, seeds: list[int]) -> tuple[list[Row], dict[int, Run]]:
    """Clean 4- and 3-replica runs and one run per attack, per seed; each attack against the honest clean run
    (its 3 honest replicas alone, the same seed), mean over the seeds. Returns the rows and the 4-replica runs."""

    def diffs(runs: dict[int, Run], ref: dict[int, Run]) -> list[float | None]:
        return [ce_delta(runs[s].ce, ref[s].ce) for s in sorted(runs)]

    def spread(xs: list[float | None]) -> str:
        vals = [x for x in xs if x is not None]
        return "-" if not vals else f"[{', '.join(f'{x:+.4f}' for x in vals)}] (range {max(vals) - min(vals):.4f})"

    def seen(runs: dict[int, Run]) -> str:
        drops = [r.dropped for r in runs.values()]
        evidence = "; ".join(r.evidence for r in runs.values())
        return f"deltas dropped by the honest peers' outlier checks per run {drops}; {evidence}"

    clean4 = {s: swarm_run(a, "clean", s, honest=4) for s in seeds}
    clean3 = {s: swarm_run(a, "clean", s) for s in seeds}
    repeat = swarm_run(a, "clean", seeds[0])  # the same seed again: the run-to-run noise floor
    noise = ce_delta(repeat.ce, clean3[seeds[0]].ce)
    c3, c4 = _mean([r.ce for r in clean3.values()]), _mean([r.ce for r in clean4.values()])
    ev4 = f"CE per seed {[_f(r.ce) for r in clean4.values()]}; {seen(clean4)}"
    ev3 = (
        f"CE per seed {[_f(r.ce) for r in clean3.values()]}; minus the 4-replica run of the same seed "
        f"{spread(diffs(clean3, clean4))}; the same seed ({seeds[0]}) run again: {_f(noise, '{:+.4f}')} "
        f"(run-to-run noise); {seen(clean3)}"
    )
    ok3 = all(r.ok for r in clean3.values()) and repeat.ok
    name3 = f"clean run (3 honest replicas: the Byzantine runs' honest set alone), {len(clean3)} seeds"
    rows = [
        Row(f"clean run (4 honest replicas), {len(clean4)} seeds", all(r.ok for r in clean4.values()), ev4, c4, c4),
        Row(name3, ok3, ev3, c3, c3),
    ]
    for mode in BYZANTINE_MODES:
        runs = {s: swarm_run(a, mode, s) for s in seeds}
        d3, d4 = diffs(runs, clean3), diffs(runs, clean4)
        m3 = _mean(d3)
        ok = all(r.ok for r in runs.values()) and m3 is not None and abs(m3) <= CE_TOLERANCE
        ev = (
            f"CE - honest clean run (3 replicas, same seed) per seed {spread(d3)}, mean {_f(m3, '{:+.4f}')}; "
            f"CE - 4-replica clean run per seed {spread(d4)}, mean {_f(_mean(d4), '{:+.4f}')}; rejections logged "
            f"by the honest peers per run {[r.rejected for r in runs.values()]}; {seen(runs)}"
        )
        name = f"Byzantine same-block peer (1 of 4): {mode}, {len(runs)} of {len(seeds)} seeds"
        rows.append(Row(name, ok, ev, _mean([r.ce for r in runs.values()]), c3))
    return rows, clean4


# ---- the stranger: made-up deltas, records, streams and Forward sessions
def _delta(scale: float, swarm_id: str, peer_id: str, round: int = 0, base_hash: str = "") -> Any:
    """A well-formed int8 delta of block 0 from a made-up peer: seeded noise x 1e-3 x scale."""
    import torch

    from swarmd.averaging.delta import encode
    from swarmd.core.model import DenoisingBlock
    from swarmd.protocol import Codec, PayloadKind

    torch.manual_seed(0)
    delta = {k: torch.randn(v.shape) * 1e-3 * scale for k, v in DenoisingBlock(CFG).state_dict().items()}
    hdr = dict(swarm_id=swarm_id, config_hash=CFG.config_hash(), kind=PayloadKind.BLOCK_DELTA, block_index=0)
    return encode(delta, Codec.INT8, round=round, base_hash=base_hash, peer_id=peer_id, weight=1.0, **hdr)


def _forward(session_id: str, batch: int, **kw: Any) -> Any:
    """A Forward request for block 0 on random bytes and noise."""
    import torch

    from swarmd.v1 import swarm_pb2 as pb
    from swarmd.wire import to_proto

    req = pb.ForwardRequest(session_id=session_id, block_index=0, config_hash=CFG.config_hash(), sigma=1.0, **kw)
    req.context.CopyFrom(to_proto(torch.randint(0, 256, (batch, CFG.seq_len), dtype=torch.uint8)))
    req.z.CopyFrom(to_proto(torch.randn(batch, CFG.seq_len, CFG.d_model)))
    return req


async def _stranger_deltas(sw: daemons.Swarm, scale: float) -> str:
    """Well-formed deltas scaled by `scale` to every replica, round and base hash read from GetStatus, a made-up
    peer id: what each exchange got."""
    from swarmd.transport import PeerClient

    client, out = PeerClient(), []
    try:
        for i in HONEST:
            try:
                st = await client.status(sw.peers[i].address, 5.0)
            except Exception as exc:
                out.append(f"GetStatus refused ({rpc_code(exc)})")
                continue
            enc = _delta(scale, sw.config.net.swarm_id, STRANGER, st.round, st.base_hash)
            try:
                await client.exchange(sw.peers[i].address, enc, 10.0)
                out.append("accepted")
            except Exception as exc:
                out.append(rpc_code(exc))
    finally:
        await client.close()
    return ", ".join(out)


class Forger:
    """The attacker's own hivemind DHT node (forge_records) in a fresh process, started before the swarm (a DHT
    forked from this process, which holds gRPC state, cannot dial; a cold DHT takes tens of seconds to start on a
    loaded machine, long enough for a 12-round swarm to finish), told the swarm's multiaddrs once it runs."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            program(__file__, "forge"), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
        )

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
    from swarmd.membership.identity import Identity
    from swarmd.membership.records import PeerRecord, block_key
    from swarmd.membership.trust import sign_record

    try:  # alone first (p2pd's own bootstrap gives up early on a loaded machine), with patient RPCs (hivemind's 3 s
        # ping timeout is too short there); then dial and ping the swarm's nodes from inside it, as a re-bootstrap
        dht = hivemind.DHT(
            initial_peers=[], host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True, startup_timeout=60, wait_timeout=30
        )
    except Exception as exc:
        return f"attacker DHT did not start ({type(exc).__name__}: {str(exc)[-120:]})"
    try:
        spec = json.loads(sys.stdin.readline())
        maddrs, began = spec["maddrs"], time.monotonic()
        for _ in range(10):
            if answered := dht.run_coroutine(functools.partial(_dht_rebootstrap, maddrs)):
                break
            time.sleep(2)  # the swarm's nodes did not answer the dial yet: try again, 10 times at most
        if not answered:
            return f"attacker DHT could not reach any of the {len(maddrs)} swarm nodes"
        key, exp, sid = block_key(spec["swarm_id"], 0), get_dht_time() + 120, spec["swarm_id"]
        forged = PeerRecord(
            spec["victim"], "127.0.0.1:1", 0, 1_000_000, 1e6, CFG.config_hash(), "f" * 16, False, sid, "e" * 16
        )
        me = Identity.generate()
        records = [forged, sign_record(replace(forged, peer_id=me.peer_id), me, 120.0)]
        for n in range(10):
            sybil_id = f"12D3KooWSybil{n:02d}{'x' * 30}"
            records.append(replace(forged, peer_id=sybil_id, round=0, address=f"127.0.0.1:{2 + n}"))
        stored = [bool(dht.store(key, r.to_value(), exp, subkey=r.peer_id)) for r in records]
    finally:
        dht.shutdown()
    return (
        f"DHT store accepted by some node: unsigned forged {stored[0]}, self-signed round 1e6 {stored[1]}, "
        f"Sybil {sum(stored[2:])}/10 ({answered} of {len(maddrs)} swarm nodes reached, stored "
        f"{time.monotonic() - began:.1f} s after the spec); self-signed attacker ...{me.peer_id[-6:]}"
    )


def public_rows(a, ce_clean: float | None) -> list[Row]:
    """Strangers' deltas (x1000, x1e36), forged DHT records and Sybil records against one 4-replica run."""
    with tempfile.TemporaryDirectory(prefix="adv-public-") as wd:
        sw = swarm(a, Path(wd))
        ev: dict[str, str] = {}
        forger = Forger()  # its DHT starts while the swarm does
        with sw, contextlib.closing(forger):
            sw.start(300)
            daemons.wait_rounds(sw, HONEST, 2)
            round_before = max(len(p.rounds_seen) for p in sw.peers)
            ev["forged"] = forger.attack(sw)  # first: the records must be there while the honest peers run on
            round_stored = min(len(p.rounds_seen) for p in sw.peers)
            for x, scale in (("x1000", 1000.0), ("x1e36", 1e36)):
                ev[x] = asyncio.run(_stranger_deltas(sw, scale))
            print(f"public: {ev}, alive {[p.alive() for p in sw.peers]}", file=sys.stderr, flush=True)
            done = daemons.finish(sw, HONEST, a.timeout)
        ce = daemons.replica_ce(sw, 0, a.data_dir, a.eval_tokens)
        same = daemons.replicas_identical(sw, HONEST)
        adopted = daemons.log_count(sw, HONEST, "adopted the")
        attacker = ev["forged"].rsplit("...", 1)[-1] if "self-signed attacker ..." in ev["forged"] else "?"
        lines = [line for i in HONEST for line in sw.peers[i].log_path.read_text(errors="replace").splitlines()]
        from_attacker = sum(line.count("adopted") and line.count(attacker) for line in lines)
        sybil_lines = daemons.log_count(sw, HONEST, "x" * 6)  # every Sybil id ends so: never dialled nor expected
        rejected = daemons.log_count(sw, HONEST, "rejected a")
        history = [h for s in sw.summaries() for h in s.get("history", [])]
    part = [h["participation"] for h in history if "participation" in h]
    most = max((h.get("expected", 0) for h in history), default=0)
    # the attacker's DHT came up and stored while the swarm had rounds left to read it (else not exercised)
    after = min(r or 0 for r in done["rounds"]) - round_stored
    reached = ev["forged"].startswith("DHT store") and after >= 3
    big_round = any(r is not None and r >= 1_000_000 for r in done["rounds"])
    ok = done["exit"] == [0] * 4 and ce is not None and ce_clean is not None and abs(ce - ce_clean) <= CE_TOLERANCE
    common = f"honest exit codes {done['exit']}, rounds {done['rounds']}, replicas bit-identical {same}"
    forged = (
        f"{ev['forged']}; honest final rounds {done['rounds']} (round lines before the attack: {round_before}; "
        f"rounds every honest peer ran after the store: {after}), state adoptions logged {adopted}, of them from "
        f"the attacker {from_attacker}; {common}"
    )
    sybil = (
        f"{ev['forged']}; honest log lines naming a Sybil id {sybil_lines}; most (peer, kind) deltas any honest "
        f"peer expected in a round: {most} (3 other replicas x 2 kinds = 6, + 2 for the attacker's own "
        f"self-signed record, a peer like any other in a public swarm); honest participation mean "
        f"{_f(_mean(part))} over {len(part)} rounds; rejections logged {rejected}"
    )
    rows = [
        (f"stranger sends a {w} block delta {x} to every replica", ok and "accepted" not in ev[x], ev[x])
        for w, x in (("well-formed", "x1000"), ("finite", "x1e36"))
    ]
    rows = [(name, survived, f"exchange answers: {e}; {common}") for name, survived, e in rows]
    forged_name = "forged DHT record claiming round 1,000,000 (unsigned, and self-signed by a fresh key)"
    rows.append((forged_name, ok and not big_round and reached and from_attacker == 0, forged))
    sybil_name = "Sybil: 10 made-up peer ids without signed records"
    rows.append((sybil_name, ok and reached and most <= 8 and not sybil_lines, sybil))
    return [Row(name, survived, evidence, ce, ce_clean) for name, survived, evidence in rows]


def swarm_key_row(a, ce_clean: float | None) -> Row:
    """A stranger without the swarm key calls every RPC of a keyed swarm: refused, Health answered."""
    from swarmd.transport.auth import write_swarm_key

    with tempfile.TemporaryDirectory(prefix="adv-key-") as wd:
        key = Path(wd) / "swarm.key"
        write_swarm_key(key)
        sw = swarm(a, Path(wd) / "swarm", swarm_key=str(key))
        with sw:
            sw.start(300)
            daemons.wait_rounds(sw, HONEST, 2)
            answers = asyncio.run(_every_rpc(sw.peers[1].address))
            done = daemons.finish(sw, HONEST, a.timeout)
        ce = daemons.replica_ce(sw, 0, a.data_dir, a.eval_tokens)
    refused = all(v not in ("answered", "OK") for k, v in answers.items() if k != "Health")
    ok = refused and answers.get("Health") == "SERVING" and done["exit"] == [0] * 4
    evidence = f"{answers}; honest exit codes {done['exit']}, rounds {done['rounds']}"
    return Row("stranger without the swarm key calls every RPC", ok, evidence, ce, ce_clean)


async def _every_rpc(address: str) -> dict[str, str]:
    from swarmd.protocol import PayloadKind
    from swarmd.transport import PeerClient
    from swarmd.v1 import swarm_pb2 as pb

    os.environ.pop("BLOCKTRAIN_SWARM_KEY", None)
    client, out = PeerClient(), {}
    kind = PayloadKind.BLOCK_STATE.to_pb()
    pull = pb.PullStateRequest(swarm_id="demo", config_hash=CFG.config_hash(), kind=kind, block_index=0)
    session = client.forward_session(address, 5.0)
    calls = {
        "GetStatus": client.status(address, 5.0),
        "GetConfig": client.swarm_config(address, 5.0),
        "PullState": client.pull_state(address, pull, 5.0),
        "ExchangeDeltas": client.exchange(address, _delta(0.0, "demo", "12D3KooWStranger"), 5.0),
        "Forward": session.step(_forward("s", 1, final=True)),
    }
    try:
        for name, call in calls.items():
            try:
                await call
                out[name] = "answered"
            except Exception as exc:
                out[name] = rpc_code(exc)
        await session.close()
        out["Health"] = await client.health(address, 5.0)
    finally:
        await client.close()
    return out


# ---- processes, disks and networks
async def _peak_rss(pid: int, attack: Any, every_s: float = 0.2) -> tuple[Any, float, float]:
    """Run the coroutine `attack` while sampling the daemon's RSS: its result, RSS before and peak (MiB)."""
    before = rss_mib(pid)
    task, peak = asyncio.create_task(attack), before
    while not task.done():
        peak = max(peak, rss_mib(pid))
        await asyncio.wait([task], timeout=every_s)
    return task.result(), before, max(peak, rss_mib(pid))


async def _oversized_streams(address: str, pid: int) -> tuple[str, float]:
    """6 ExchangeDeltas streams each declaring a 500 MiB payload, sending 1 MiB chunks, never finishing: what they
    got, and the daemon's RSS growth (MiB)."""
    import grpc

    from swarmd.protocol import Codec, PayloadKind
    from swarmd.transport.client import channel_options
    from swarmd.v1 import swarm_pb2 as pb
    from swarmd.v1 import swarm_pb2_grpc as pb_grpc

    channel = grpc.aio.insecure_channel(address, options=channel_options())
    stub, chunk, size = pb_grpc.SwarmStub(channel), os.urandom(1 << 20), 500 << 20
    kind, codec = PayloadKind.BLOCK_DELTA.to_pb(), Codec.FP32.to_pb()
    header = pb.PayloadHeader(swarm_id="adv", config_hash=CFG.config_hash(), kind=kind, block_index=0, round=0)
    header.codec, header.payload_bytes, header.raw_bytes, header.peer_id = codec, size, size, "12D3KooWBig"

    async def requests():
        yield pb.Payload(header=header)
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

    async def six() -> list[str]:
        tasks = [asyncio.create_task(one()) for _ in range(6)]
        await asyncio.wait(tasks, timeout=20)
        codes = [t.result() if t.done() else "still open" for t in tasks]
        for t in tasks:
            t.cancel()
        return codes

    codes, before, peak = await _peak_rss(pid, six())
    await channel.close()
    return f"codes {sorted(set(codes))}, daemon RSS {before:.0f} -> peak {peak:.0f} MiB", peak - before


async def _forward_flood(address: str, pid: int, steps: int = 400) -> tuple[str, float]:
    """One Forward session over `steps` distinct step_index values, each caching (use_cache): what the steps got,
    and the daemon's RSS growth (MiB)."""
    from swarmd.transport import PeerClient

    client = PeerClient()
    session, codes = client.forward_session(address, 10.0), Counter()

    async def session_steps() -> None:
        for i in range(steps):
            try:
                await session.step(_forward("flood", 8, sigma_next=0.5, start_position=0, use_cache=True, step_index=i))
                codes["OK"] += 1
            except Exception as exc:
                codes[rpc_code(exc)] += 1

    try:
        _, before, peak = await _peak_rss(pid, session_steps())
    finally:
        await session.close()
        await client.close()
    return f"{steps} steps: {dict(codes)}, daemon RSS {before:.0f} -> peak {peak:.0f} MiB", peak - before


def _signal_rows(sw: daemons.Swarm) -> list[Row]:
    """SIGTERM and SIGINT to peer 1's whole process group, then kill -9 of its main process (a user, the OOM
    killer): does it exit 0 within 10 s, is its group (DHT process, p2pd) gone 10 s later? Each then restarts."""
    p, rows = sw.peers[1], []
    for name, sig in (("SIGTERM", signal.SIGTERM), ("SIGINT", signal.SIGINT)):
        pgid, started = p.process.pid, time.monotonic()
        os.killpg(pgid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.process.wait(timeout=60)
        took, left = time.monotonic() - started, wait_group_gone(pgid, 10)
        sw.kill(1, signal.SIGKILL)  # whatever is left (nothing, when it survived)
        ev = f"exited with code {p.process.poll()} after {took:.1f} s; processes of its group left 10 s later"
        ok = p.process.poll() == 0 and took < 10 and not left
        rows.append(Row(f"{name} to the daemon's whole process group", ok, f"{ev}: {left or 'none'}"))
        sw.restart(1, 300)
        daemons.wait_rounds(sw, [1], 2)
    pgid = p.process.pid
    os.kill(pgid, signal.SIGKILL)
    p.process.wait(timeout=30)
    left = wait_group_gone(pgid, 10)
    ev = f"processes of its group (DHT process, p2pd) left 10 s later: {left or 'none'}"
    rows.append(Row("kill -9 of a daemon's main process: no orphan DHT process or p2pd", not left, ev))
    sw.restart(1, 300)
    daemons.wait_rounds(sw, [1], 2)
    return rows


def _dht_rows(sw: daemons.Swarm) -> list[Row]:
    """kill -9 of peer 1's DHT process alone: its p2pd ends; the daemon starts its DHT again and rejoins."""
    p = sw.peers[1]
    group = [x.split(None, 1) for x in process_group(p.process.pid)]
    dht = [int(pid) for pid, comm in group if pid != str(p.process.pid) and comm == "python"]
    if not dht:
        return []
    old_p2pd = {pid for pid, comm in group if comm.endswith("p2pd")}
    p2pd_left = lambda: sorted(old_p2pd & {x.split()[0] for x in process_group(p.process.pid)})
    os.kill(dht[0], signal.SIGKILL)
    killed, deadline = time.time(), time.monotonic() + 10
    while p2pd_left() and time.monotonic() < deadline:
        time.sleep(0.1)  # polling for its p2pd to end, with a deadline
    left = p2pd_left()
    deadline, back = time.monotonic() + 90, None
    while back is None and time.monotonic() < deadline:
        time.sleep(0.5)  # polling the peer's log and checkpointed round history, with a deadline
        log = p.log_path.read_text(errors="replace")
        history = [h for h in daemons.history(p) if h["wall"] > killed and h["expected"] == h["accepted"] == 2]
        back = history[0]["wall"] - killed if history and "restarted" in log else None
    comms = [x.split()[1] for x in process_group(p.process.pid)]
    ok = back is not None and p.alive() and comms.count("python") == 2 and "p2pd" in comms
    rejoin = (
        f"DHT restart lines {log.count('restarted (')}; seconds from the kill until the peer merged a round with "
        f"both expected (peer, kind) deltas again: {_f(back, '{:.1f}') if back is not None else 'not within 90 s'}"
        f"; its process group now {sorted(comms)}"
    )
    name = "kill -9 of a daemon's DHT process alone:"
    return [
        Row(f"{name} its p2pd ends", not left, f"the killed DHT process's p2pd left 10 s later: {left or 'none'}"),
        Row(f"{name} the daemon starts its DHT again and rejoins", ok, rejoin),
    ]


def _checkpoint_kills(sw: daemons.Swarm, kills: int) -> Row:
    """kill -9 of peer 1 at a random moment of a round (each ends with a checkpoint), `kills` times, each
    followed by a restart: is the checkpoint whole, optimizer and weights of one step, no temp files left?"""
    from swarmd.core import checkpoint as ck

    p, rng, out = sw.peers[1], random.Random(0), []
    d = p.checkpoint_dir
    for _ in range(kills):
        sw.restart(1, 300)
        resumed_at = int(p.info.get("round", -1))
        daemons.wait_rounds(sw, [1], 1)
        time.sleep(rng.uniform(0.0, 1.0))  # a random moment of a round
        sw.kill(1, signal.SIGKILL)
        tmp = len(list(d.glob(".*.tmp"))) + len(list(d.glob("gen-*/.*.tmp")))
        try:
            body = ck.read_config(d)
            ck.verify_generation(d, body)
            steps = [ck.load_tensors(f(d, 0))[1].get("step") for f in (ck.block_file, ck.optim_file)]
            state = dict(
                round=body.get("round"), generations=len(list(d.glob("gen-*"))), consistent=steps[0] == steps[1]
            )
            out.append(dict(resumed_at=resumed_at, tmp_left=tmp, verified=True, **state))
        except Exception as exc:
            out.append({"resumed_at": resumed_at, "error": str(exc), "tmp_left": tmp, "verified": False})
    sw.restart(1, 300)
    final_resume = int(p.info.get("round", -1))
    stale = len(list(d.glob(".*.tmp"))) + len(list(d.glob("gen-*"))) - 1
    ok = all(r["verified"] and r.get("consistent") for r in out) and final_resume >= 0
    return Row(
        f"kill -9 during checkpoint writes ({kills} times, each followed by a restart)",
        ok,
        f"{sum(r['resumed_at'] >= 0 for r in out)}/{kills} restarts resumed from the checkpoint; after each kill: "
        f"generation verified {sum(r['verified'] for r in out)}/{kills}, optimizer step == weights step "
        f"{sum(bool(r.get('consistent')) for r in out)}/{kills}, temp files left by the kill "
        f"{sum(r['tmp_left'] for r in out)} in all, generation folders at most "
        f"{max((r.get('generations', 0) for r in out), default=0)}; after the final restart: "
        f"{max(stale, 0)} stale temp files / extra generations",
        data_lost="none" if ok else f"{[r for r in out if not r['verified']]}",
    )


def process_rows(a) -> list[Row]:
    """Oversized streams and a long Forward session, SIGTERM / SIGINT to a process group, kill -9 of a daemon / of
    its DHT process, kill -9 during checkpoint writes."""
    with tempfile.TemporaryDirectory(prefix="adv-proc-") as wd:
        sw = swarm(a, Path(wd), peers=2)
        sw.config = replace(sw.config, stop_at_round=0)  # until stopped
        with sw:
            sw.start(300)
            daemons.wait_rounds(sw, [0, 1], 2)
            target = sw.peers[0]
            streams, streams_mib = asyncio.run(_oversized_streams(target.address, target.process.pid))
            forward, forward_mib = asyncio.run(_forward_flood(target.address, target.process.pid))
            print(f"resources: {streams}; {forward}", file=sys.stderr, flush=True)
            ok_streams = target.alive() and "still open" not in streams and streams_mib < 200
            ok_forward = target.alive() and forward_mib < 300
            rows = [
                Row("6 ExchangeDeltas streams each declaring 500 MiB, never finishing", ok_streams, streams),
                Row("one Forward session with 400 distinct step_index values", ok_forward, forward),
                *_signal_rows(sw),
                *_dht_rows(sw),
            ]
            sw.kill(1, signal.SIGKILL)
            rows.append(_checkpoint_kills(sw, a.kills))
    return rows


def readonly_row(a) -> Row:
    """A replica's checkpoint dir on a tmpfs, remounted read-only for a while, then writable again."""
    if os.geteuid() != 0:
        return Row("checkpoint dir read-only", False, "not run: needs root to mount a tmpfs")
    from swarmd.transport import PeerClient

    health: list[str] = []

    async def poll(address: str, seconds: float) -> None:
        """Health every 0.3 s for `seconds`, each change appended to `health`."""
        client, end = PeerClient(), time.monotonic() + seconds
        try:
            while time.monotonic() < end:
                with contextlib.suppress(Exception):
                    h = await client.health(address, 2.0)
                    if not health or health[-1] != h:
                        health.append(h)
                await asyncio.sleep(0.3)
        finally:
            await client.close()

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
                asyncio.run(poll(p.address, a.readonly_s))
                rounds_ro = len(p.rounds_seen) - n0
                subprocess.run(["mount", "-o", "remount,rw", str(mnt)], check=True)
                asyncio.run(poll(p.address, 8.0))
                alive = p.alive()
                log = p.log_path.read_text(errors="replace")
                sw.stop()
                code = p.process.poll()
        finally:
            subprocess.run(["umount", "-l", str(mnt)], check=False)
    ok = alive and rounds_ro > 0 and health[:1] == ["SERVING"] and "NOT_SERVING" in health and health[-1] == "SERVING"
    return Row(
        "checkpoint dir read-only (tmpfs remounted ro, then rw)",
        ok,
        f"{rounds_ro} rounds merged while read-only ({a.readonly_s:.0f} s), {log.count('not written')} one-line "
        f"warnings, tracebacks {log.count('Traceback')}, health sequence {health}, process alive {alive}, "
        f"exit code on SIGTERM {code}",
    )


def partition_row(a) -> Row:
    """One of 3 namespaced hosts cut off (link down) for --partition-s, then healed: how soon does every peer merge
    a round with all 4 expected deltas again?"""
    from tests.netns_utils import NetnsLab, _ip, unavailable

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
                    full = [h for h in daemons.history(p) if h["wall"] > healed and h["expected"] == h["accepted"] == 4]
                    first[i] = full[0]["wall"] - healed if full else None
                if all(x is not None for x in first):
                    rejoined = max(first)  # type: ignore[type-var]
            logs = "".join(p.log_path.read_text(errors="replace") for p in sw.peers)
    return Row(
        f"partition: one of 3 hosts cut off {a.partition_s:.0f} s (link down), then healed",
        rejoined is not None and rejoined <= 60,
        f"round lines at cut {cut}, at heal {rounds_at_heal}; seconds after the heal until every peer "
        f"merged a round with all 4 expected (peer, kind) deltas: {first} -> "
        f"{f'rejoined in {rejoined:.1f} s' if rejoined is not None else 'not within 120 s'}; "
        f"re-bootstrap lines {logs.count('re-bootstrapp')}, rejoin lines {logs.count('rejoining it')}, rejoins "
        f"from fresh signed states {logs.count('rejoined: adopted')}, state adoptions {logs.count('adopted the')}",
    )


def parse_args(argv=None):
    p = options.parser(__doc__)
    options.add_schedule(p, rounds=12, steps=4)
    daemons.add_run_options(p, timeout_s=300.0)
    p.add_argument("--kills", type=int, default=5, help="kill -9 during checkpoint writes: how many times")
    p.add_argument("--partition-s", type=float, default=30.0, help="seconds the partition row cuts one host off")
    p.add_argument("--readonly-s", type=float, default=15.0, help="seconds the readonly row's dir is read-only")
    p.add_argument("--only", default="", help=f"comma-separated row groups: {','.join(GROUPS)}")
    p.add_argument("--insiders", default="", help="insider rows (benchmarks/insiders.py ROWS), comma-separated")
    p.add_argument("--insider-rounds", type=int, default=25, help="rounds of the insider rows' runs")
    p.add_argument("--insider-steps", type=int, default=10, help="H of the insider rows' runs")
    p.add_argument("--score-bytes", type=int, default=16384, help="bytes the lying-Forward rows score")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated swarm seeds of the Byzantine rows")
    p.add_argument("--byz-rounds", type=int, default=30, help="rounds of the Byzantine rows' runs (0: --rounds)")
    p.add_argument("--byz-steps", type=int, default=8, help="H of the Byzantine rows' runs (0: --steps)")
    p.add_argument("--merge", action="store_true", help="keep the rows of --out that this run does not produce")
    options.add_outputs(p, "adversary.json", "adversary.md")
    return p.parse_args(argv)


def with_schedule(a: argparse.Namespace, rounds: int, steps: int) -> argparse.Namespace:
    """a with --rounds and --steps replaced (0: kept)."""
    return argparse.Namespace(**{**vars(a), "rounds": rounds or a.rounds, "steps": steps or a.steps})


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["byzantine"]:
        sys.exit(run_byzantine(argv[1], argv[2]))
    if argv[:1] == ["forge"]:
        print(forge_records(), flush=True)
        return
    a = parse_args(argv)
    groups = set(a.only.split(",")) if a.only else set(GROUPS)
    seeds = [int(x) for x in a.seeds.split(",")]
    started = time.monotonic()
    rows: list[Row] = []
    ce_clean = None

    def add(new: list[Row]) -> None:
        for r in new:
            rows.append(r)
            print(json.dumps(asdict(r) | {"ce_delta": r.ce_delta}), flush=True)

    byz = {"rounds": a.byz_rounds or a.rounds, "steps_per_round": a.byz_steps or a.steps, "seeds": seeds}
    ins = {"rounds": a.insider_rounds, "steps_per_round": a.insider_steps, "score_bytes": a.score_bytes}
    if "byzantine" in groups:  # a longer run than the other rows: the CE must resolve the 0.02-nat tolerance
        byz_rows, clean4 = byzantine_rows(with_schedule(a, a.byz_rounds, a.byz_steps), seeds)
        add(byz_rows)
        if (byz["rounds"], byz["steps_per_round"]) == (a.rounds, a.steps):
            ce_clean = clean4[seeds[0]].ce
    if groups & {"clean", "public", "key"} and (ce_clean is None or "clean" in groups):
        run = swarm_run(a, "clean", seeds[0], honest=4)
        ce_clean = run.ce
        add([Row(f"clean run (4 honest replicas), seed {seeds[0]}", run.ok, run.evidence, run.ce, run.ce)])
    for group, make in (
        ("public", lambda: public_rows(a, ce_clean)),
        ("key", lambda: [swarm_key_row(a, ce_clean)]),
        ("partition", lambda: [partition_row(a)]),
        ("readonly", lambda: [readonly_row(a)]),
        ("process", lambda: process_rows(a)),
    ):
        if group in groups:
            add(make())
    if "insider" in groups:  # signed insiders running the real daemon (benchmarks/insiders.py)
        from benchmarks import insiders

        which = tuple(a.insiders.split(",")) if a.insiders else insiders.ROWS
        add(insiders.insider_rows(with_schedule(a, a.insider_rounds, a.insider_steps), which))
    command = results.command_line("adversary.py", argv)
    for r in rows:
        r.command = command
    kept = []
    if a.merge and a.out.exists():  # rows of earlier commands that this one did not produce
        names, before = {r.name for r in rows}, json.loads(a.out.read_text())
        # a Byzantine command replaces every Byzantine row (their names carry the seed count)
        kept = [r for r in before["rows"] if r["name"] not in names and not ("byzantine" in groups and _byz_row(r))]
        byz = byz if "byzantine" in groups else before.get("byzantine", byz)
        ins = ins if "insider" in groups else before.get("insider", ins)
    out = {
        "command": command,
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
    *("clean run (4", "clean run (3", "Byzantine", "stranger sends", "forged", "Sybil", "stranger without"),
    *("partition", "checkpoint dir", "6 ExchangeDeltas", "one Forward", "SIGTERM", "SIGINT", "kill -9"),
    *("insider drift", "insider majority", "insider poisoned", "insider lying", "insider flood"),  # insiders.ROWS
)


def _byz_row(row: dict) -> bool:
    """A row byzantine_rows writes (the attacks and their two clean references)."""
    name = row["name"]
    four = re.fullmatch(r"clean run \(4 honest replicas\), \d+ seeds", name)
    return name.startswith(("Byzantine same-block", "clean run (3 honest")) or four is not None


def _order(name: str) -> int:
    return next((i for i, start in enumerate(ROW_ORDER) if name.startswith(start)), len(ROW_ORDER))


def write_md(path: Path, out: dict) -> None:
    from benchmarks.insiders import insider_table

    rows, byz = out["rows"], out.get("byzantine", {})
    commands = list(dict.fromkeys(r.get("command") or out["command"] for r in rows))
    c = lambda r: commands.index(r.get("command") or out["command"]) + 1
    cells = [
        f"{r['name']} | {'yes' if r['survived'] else '**no**'} | {_f(r['ce'])} | {_f(r['ce_clean'])} "
        f"| {_f(r['ce_delta'], '{:+.4f}')} | {r['data_lost']} | {c(r)} | {r['evidence'].replace('|', '/')}"
        for r in rows
    ]
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
        "Byzantine rows: 3 honest replicas + 1 attacker; clean CE: the same 3 replicas alone, same seed; CE - clean: "
        f"the mean over the seeds of the paired differences, within {out['ce_tolerance']} nats. The evidence gives "
        "each seed's difference and the one to the 4-replica run; the 3-replica clean rows give the run-to-run "
        "noise (one seed run twice). Rows whose defence is missing or attack could not run say so (not survived).",
        "",
        *results.table("fault | survived | CE | clean CE | CE - clean | data lost | c | evidence", cells, "llrrrlll"),
        *insider_table(rows, out.get("insider")),
        "",
        f"{sum(r['survived'] for r in rows)} of {len(rows)} rows survived. Machine: {out['machine']}.",
        "",
        "Commands:",
        "",
        *(f"{i}. `{c}`" for i, c in enumerate(commands, 1)),
        "",
    ]
    results.write_text(path, "\n".join(lines))


if __name__ == "__main__":
    main()
