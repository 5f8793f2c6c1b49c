"""Averaging benchmark: one fp32 tensor averaged among N loopback peers by hivemind's DecentralizedAverager and by ours.

Per N in --peers and system in --systems (hivemind's butterfly all-reduce; ours: ButterflyRound in fp32 or fp16, and
all-to-all), N peer processes each hold a Gaussian tensor of --numel values; once all are ready the parent says go and
the time runs to the last peer holding the average; error: the worst peer's relative distance to the exact mean.
Writes --out (JSON) and --md (a markdown fragment).

    python benchmarks/averaging_vs_hivemind.py
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import options, results

META = dict(swarm_id="bench", config_hash="bench", kind="block_delta", block_index=0)
SYSTEMS = ("hivemind", "butterfly", "butterfly-fp16", "all-to-all")
KEYS = dict(zip(SYSTEMS, ("hivemind", "blocktrain", "blocktrain_fp16", "all_to_all")))  # row key prefixes
SUFFIXES = (("_s", ".2f"), ("_rel_error", ".1e"), ("_over_hivemind", ".2f"))  # a system's columns
PIPE_TIMEOUT_S = 900.0  # a peer process starting under heavy load (torch import) can take minutes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--peers", type=int, nargs="+", default=[2, 6, 12], help="group sizes (default 2 6 12)")
    p.add_argument("--numel", type=int, default=2_000_000, help="fp32 values per tensor (default 2,000,000: 8 MB)")
    p.add_argument("--repeats", type=int, default=2, help="timed rounds per system and size (default 2)")
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    options.add_outputs(p, "averaging_vs_hivemind.json", "averaging_vs_hivemind.md")
    return p.parse_args(argv)


def tensors(n: int, numel: int):
    """Every peer's tensor (peer k: seed k) and their exact mean (float64)."""
    import torch

    vectors = [torch.randn(numel, generator=torch.Generator().manual_seed(k)) for k in range(n)]
    return vectors, torch.stack([v.double() for v in vectors]).mean(0)


def _rel_error(got, want) -> float:
    from swarmd.averaging.allreduce import relative_error

    return relative_error(got, want)


def _quiet() -> None:
    """One torch thread, warnings only (the parent and every peer process)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import logging

    import torch

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)
    for name in ("hivemind", "swarmd"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _recv(conn):
    if not conn.poll(PIPE_TIMEOUT_S):
        raise TimeoutError("no word from the benchmark parent")
    return conn.recv()


def timed(system: str, n: int, repeats: int, one_round) -> dict:
    """repeats rounds of one_round() -> (seconds to get ready, seconds from go to done, worst error), summed up."""
    matched, times, errors = [], [], []
    for _ in range(repeats):
        for got, x in zip((matched, times, errors), one_round()):
            got.append(x)
        print(f"  {system:10s} N={n:2d}: {times[-1]:.3f} s, rel error {errors[-1]:.2e}", flush=True)
    return {"seconds": times, "median_s": statistics.median(times), "rel_error": max(errors), "ready_s": matched}


def run_hivemind(n: int, numel: int, repeats: int) -> dict:
    """N DHT nodes and N DecentralizedAveragers, each its own process (hivemind starts them so), driven from here."""
    import hivemind
    from hivemind.averaging.control import AveragingStage

    vectors, mean = tensors(n, numel)
    dhts, averagers = [], []

    def one_round() -> tuple[float, float, float]:
        for k, averager in enumerate(averagers):
            with averager.get_tensors() as held:
                held[0].copy_(vectors[k])
        started = time.monotonic()
        steps = [a.step(wait=False, require_trigger=True, timeout=240.0) for a in averagers]
        while any(s.stage != AveragingStage.AWAITING_TRIGGER and not s.done() for s in steps):
            time.sleep(0.01)
        go = time.monotonic()
        for s in steps:
            s.allow_allreduce()
        for s in steps:
            s.result()
        seconds, worst = time.monotonic() - go, 0.0
        for averager in averagers:
            with averager.get_tensors() as held:
                worst = max(worst, _rel_error(held[0], mean))
        return go - started, seconds, worst

    try:
        for _ in range(n):
            initial = [str(a) for a in dhts[0].get_visible_maddrs()] if dhts else []
            dhts.append(hivemind.DHT(start=True, initial_peers=initial, host_maddrs=["/ip4/127.0.0.1/tcp/0"]))
        group = dict(prefix="bench", target_group_size=n, min_group_size=n, min_matchmaking_time=2.0)
        group |= dict(request_timeout=1.0, allreduce_timeout=240.0)
        for vector, dht in zip(vectors, dhts):
            averagers.append(hivemind.averaging.DecentralizedAverager([vector.clone()], dht, start=True, **group))
        return timed("hivemind", n, repeats, one_round)
    finally:
        for averager in averagers:
            averager.shutdown()
        for dht in dhts:
            dht.shutdown()


class _Handler:
    """Routes ExchangeDeltas to the open round (butterfly) or answers with our whole tensor (all-to-all)."""

    def __init__(self):
        self.round = None
        self.opened = asyncio.Event()

    async def exchange(self, incoming):
        await asyncio.wait_for(self.opened.wait(), 60)
        return await self.round.handle(incoming)


class _AllToAll:
    """Today's pattern: our whole tensor, encoded and signed once, swapped with each peer on one stream."""

    def __init__(self, vector, identity, peers, round):
        self.vector, self.identity, self.peers, self.round = vector, identity, sorted(peers), round
        self.received: dict = {}
        self.enc = None
        self.all_in = asyncio.Event()

    def payload(self):
        from swarmd.averaging.delta import encode
        from swarmd.membership.trust import sign_payload

        if self.enc is None:
            me = self.identity.peer_id
            enc = encode({"delta": self.vector}, "fp32", **META, round=self.round, peer_id=me, zstd=False)
            self.enc = sign_payload(enc, self.identity)
        return self.enc

    def take(self, enc) -> None:
        from swarmd.averaging.delta import decode
        from swarmd.membership.trust import verify_payload

        verify_payload(enc)
        if enc.header.peer_id not in self.peers or enc.header.peer_id in self.received:
            raise ValueError("unexpected sender")
        self.received[enc.header.peer_id] = decode(enc, {"delta": tuple(self.vector.shape)}, **META)["delta"]
        if len(self.received) == len(self.peers) - 1:
            self.all_in.set()

    async def handle(self, incoming):
        self.take(incoming)
        return self.payload()

    async def run(self, client, addresses):
        from swarmd.averaging.allreduce import dials, weighted_mean

        me = self.identity.peer_id
        i, n = self.peers.index(me), len(self.peers)
        targets = [p for k, p in enumerate(self.peers) if k != i and dials(i, k, n)]

        async def one(peer):
            self.take(await client.exchange(addresses[peer], self.payload(), 120.0))

        await asyncio.gather(*(one(p) for p in targets))
        await asyncio.wait_for(self.all_in.wait(), 120.0)
        parts = {**self.received, me: self.vector}
        return weighted_mean(parts, {p: 1.0 for p in parts})


def blocktrain_peer(rank: int, n: int, numel: int, repeats: int, system: str, conn) -> None:
    _quiet()
    from swarmd.averaging.allreduce import ButterflyRound
    from swarmd.membership.identity import Identity
    from swarmd.transport import PeerClient, start_server

    vectors, mean = tensors(n, numel)
    mine = vectors[rank]
    identity = Identity.generate()

    async def main():
        handler = _Handler()
        limit = 4 * numel + (1 << 20)
        server = await start_server(handler, max_payload_bytes=limit)
        client = PeerClient(max_payload_bytes=limit)
        conn.send(("hello", (identity.peer_id, server.address)))
        addresses = await asyncio.to_thread(_recv, conn)
        peers = sorted(addresses)
        for peer, address in addresses.items():  # dial every channel first, as hivemind's matchmaking has
            if peer != identity.peer_id:
                await client.health(address, timeout_s=60)
        codec = "fp16" if system.endswith("fp16") else "fp32"
        try:
            for r in range(repeats):
                handler.opened.clear()
                if system.startswith("butterfly"):
                    handler.round = ButterflyRound(
                        mine, identity=identity, peers=peers, round=r, meta=META, codec=codec, timeout_s=120.0
                    )
                else:
                    handler.round = _AllToAll(mine, identity, peers, r)
                handler.opened.set()
                conn.send(("ready", 0.0))
                await asyncio.to_thread(_recv, conn)  # go
                out = await handler.round.run(client, addresses)
                conn.send(("done", time.monotonic(), _rel_error(out, mean)))
                if getattr(handler.round, "missing", None):
                    raise RuntimeError(f"parts missing from {handler.round.missing}")
            await asyncio.to_thread(_recv, conn)  # stop
        finally:
            await client.close()
            await server.stop(0.5)

    asyncio.run(main())


def run_group(system: str, n: int, numel: int, repeats: int) -> dict:
    ctx = mp.get_context("spawn")
    procs, pipes = [], []

    def one_round() -> tuple[float, float, float]:
        ready = max(_recv(pipe)[1] for pipe in pipes)
        go = time.monotonic()
        for pipe in pipes:
            pipe.send("go")
        done = [_recv(pipe) for pipe in pipes]
        return ready, max(d[1] for d in done) - go, max(d[2] for d in done)

    try:
        for k in range(n):
            parent, child = ctx.Pipe()
            procs.append(ctx.Process(target=blocktrain_peer, args=(k, n, numel, repeats, system, child), daemon=True))
            procs[-1].start()
            pipes.append(parent)
        addresses = dict(_recv(pipe)[1] for pipe in pipes)
        for pipe in pipes:
            pipe.send(addresses)
        result = timed(system, n, repeats, one_round)
        for pipe in pipes:
            pipe.send("stop")
        return result
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)


def markdown(result: dict) -> str:
    cells = [("hivemind_s", ".2f"), ("hivemind_rel_error", ".1e")]
    cells += [(f"{key}{suffix}", f) for key in KEYS.values() if key != "hivemind" for suffix, f in SUFFIXES]
    head = (
        "peers | hivemind s | hivemind error | butterfly s | butterfly error | butterfly / hivemind | butterfly fp16 s "
        "| fp16 error | fp16 / hivemind | all-to-all s | all-to-all error | all-to-all / hivemind"
    )
    values = lambda r: [str(r["peers"]), *(format(r[k], f) if r.get(k) is not None else "-" for k, f in cells)]
    lines = results.paragraphs(
        "### Averaging one 8 MB fp32 tensor: hivemind's DecentralizedAverager vs ours (loopback)",
        f"Command: `{result['command']}`",
        f"{result['numel']:,} fp32 values ({4 * result['numel'] / 1e6:.0f} MB) per peer, each peer a process; seconds "
        f"from go to the last peer holding the average (median of {result['repeats']} rounds; matchmaking excluded), "
        "relative error of the worst peer. Ratio = ours / hivemind's time (target at 6 peers: <= 0.5 with error < "
        f"1e-3). Load average during the run: {result['load_average']}.",
        results.table(head, (" | ".join(values(r)) for r in result["rows"]), "r" * 12),
        "blocktrain_s is the butterfly (each peer sends ~2 (N-1)/N of the tensor in signed parts); all-to-all sends "
        "N-1 whole tensors per peer. On 2 shared cores every system is CPU-bound at 6 and 12 peers: quote the ratios.",
    )
    return "\n".join([*lines[:-1], *results.machine_footer(result["machine"])])


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    _quiet()
    rows = []
    for n in args.peers:
        row: dict = {"peers": n}
        for system in args.systems:
            run = run_hivemind if system == "hivemind" else functools.partial(run_group, system)
            r = run(n, args.numel, args.repeats)
            key = KEYS[system]
            row |= {f"{key}_s": r["median_s"], f"{key}_rel_error": r["rel_error"], f"{key}_runs": r}
        for key in list(KEYS.values())[1:]:
            if row.get("hivemind_s") and row.get(f"{key}_s") is not None:
                row[f"{key}_over_hivemind"] = row[f"{key}_s"] / row["hivemind_s"]
        rows.append(row)
        result = {  # written after every group size: a later failure leaves the sizes measured so far
            "command": results.command_line("averaging_vs_hivemind.py", argv),
            "numel": args.numel,
            "repeats": args.repeats,
            "rows": rows,
            "load_average": " / ".join(f"{x:.1f}" for x in os.getloadavg()),
            "machine": results.machine(),
        }
        results.write_json(args.out, result)
        args.md.write_text(markdown(result))
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
