"""Serving benchmark: traversal economics, swarm vs local generation, served size, failover.

Every peer is a real gRPC server on 127.0.0.1 hosting one block, all in this process; the client is a RemoteSweeper
that sleeps the per-hop delay before every hop. Measures one-sweep scoring against an autoregressive pipeline, bytes/s
of `generate` through the swarm and locally, the largest random-weight model three peers serve, and a failover
mid-generation. Writes --out (JSON); --render FILE prints its tables.

    python benchmarks/serving.py [--quick] [--out benchmarks/results/serving.json] [--render FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import results
from swarmd.core.checkpoint import save_model
from swarmd.core.config import ModelConfig
from swarmd.core.model import DenoisingBlock, count_params, start_noise
from swarmd.core.train import init_block, init_embedding
from swarmd.membership.discovery import StaticDiscovery
from swarmd.serve.inference import GenerationStats, LocalSweeper, generate, generate_bytes
from swarmd.serve.remote import BlockRouter, RemoteSweeper
from swarmd.serve.serving import BlockServing, ServingOnlyHandler
from swarmd.transport import PeerClient, start_server

SWARM = "bench"
HOP_KEYS = {"step": "step_index", "block": "block_index", "peer": "address", "positions": "positions"}


class Swarm:
    """Block servers on loopback plus a client (also verify_cost.py's); `sweeper(delay_s)` gives a RemoteSweeper.

    :param layout: the block of each server
    :param make_handler: (server i, its block) -> its handler; default: a ServingOnlyHandler serving `blocks`
        (a list, or a callable that builds block b on demand) and `emb`
    :param status_s: the discovery's GetStatus timeout
    """

    def __init__(self, cfg: ModelConfig, blocks, emb, layout: list[int], make_handler=None, status_s: float = 5.0):
        self.cfg, self.blocks, self.emb, self.layout, self.status_s = cfg, blocks, emb, layout, status_s
        self.make_handler = make_handler or self.serving_handler
        self.servers, self.client = [], None

    def serving_handler(self, i: int, b: int) -> ServingOnlyHandler:
        serving = BlockServing(self.cfg, b, peer_id=f"peer{i}")
        block = self.blocks(b) if callable(self.blocks) else self.blocks[b]  # a callable builds on demand
        serving.update_weights(block.state_dict(), self.emb.table)
        return ServingOnlyHandler(serving, SWARM)

    async def __aenter__(self):
        self.client = PeerClient()
        for i, b in enumerate(self.layout):
            handler = self.make_handler(i, b)
            self.servers.append(await start_server(handler))
            handler.address = self.servers[-1].address
        self.blocks = self.emb = None  # the servers hold their own snapshots
        return self

    def discovery(self) -> StaticDiscovery:
        addresses = [s.address for s in self.servers]
        return StaticDiscovery(addresses, lambda a: self.client.status(a, timeout_s=self.status_s), SWARM)

    def sweeper(self, delay_s: float = 0.0, timeout_s: float = 120.0) -> RemoteSweeper:
        router = BlockRouter(self.discovery(), self.client, self.cfg.config_hash(), SWARM)
        return RemoteSweeper(self.cfg, router, self.client, timeout_s=timeout_s, hop_delay_s=delay_s)

    async def covered(self) -> tuple[ModelConfig, BlockRouter]:
        """The model config the servers announce, and a router whose coverage of every block is checked."""
        from swarmd.serve.remote import check_coverage, swarm_model_config

        discovery = self.discovery()
        cfg, records = await swarm_model_config(discovery, self.client, swarm_id=SWARM)
        router = BlockRouter(discovery, self.client, cfg.config_hash(), SWARM)
        await check_coverage(router, cfg, records)
        return cfg, router

    async def __aexit__(self, *exc):
        await self.client.close()
        for server in self.servers:
            await server.stop(0)


def inputs(cfg: ModelConfig, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randint(0, 256, (1, n))
    return x, start_noise(cfg, (1, n, cfg.d_model), torch.Generator().manual_seed(n))


async def one_sweep_s(sweeper, cfg: ModelConfig, n: int) -> float:
    x, z = inputs(cfg, n)
    t0 = time.perf_counter()
    await sweeper.sweep(f"sweep-{n}-{time.perf_counter_ns()}", x, z, 0, False)
    return time.perf_counter() - t0


async def ar_pipeline_s(sweeper, cfg: ModelConfig, n: int) -> float:
    """A plain autoregressive pipeline over the same hops: one traversal per token, one new position each."""
    x, z = inputs(cfg, n)
    session = f"ar-{n}-{time.perf_counter_ns()}"
    t0 = time.perf_counter()
    for p in range(n):
        await sweeper.sweep(session, x[:, p : p + 1], z[:, p : p + 1], p, True)
    seconds = time.perf_counter() - t0
    await sweeper.end_session(session)
    return seconds


async def traversal(cfg, blocks, emb, delays_ms, lengths, reps) -> tuple[list[dict], dict]:
    rows, hops = [], {}
    async with Swarm(cfg, blocks, emb, [0, 1, 2]) as swarm:
        warm = swarm.sweeper()
        for n in lengths:  # first calls of each shape allocate; keep them out of the timings
            await one_sweep_s(warm, cfg, n)
        await ar_pipeline_s(warm, cfg, 8)
        for delay_ms in delays_ms:
            sweeper = swarm.sweeper(delay_ms / 1000)
            for n in lengths:
                start = len(sweeper.trace)
                one = statistics.median([await one_sweep_s(sweeper, cfg, n) for _ in range(reps)])
                mid = len(sweeper.trace)
                ar_reps = reps if delay_ms == 0 else 1
                ar = statistics.median([await ar_pipeline_s(sweeper, cfg, n) for _ in range(ar_reps)])
                hops[f"{delay_ms}ms/{n}"] = {
                    "one_sweep_hops": (mid - start) // reps,
                    "ar_hops": (len(sweeper.trace) - mid) // ar_reps,
                }
                row = dict(delay_ms=delay_ms, output_bytes=n, one_sweep_tok_s=n / one, ar_tok_s=n / ar)
                rows.append(row | {"ratio": ar / one, "one_sweep_s": one, "ar_s": ar})
                print(
                    f"traversal delay {delay_ms:>3} ms  {n:>4} bytes: one sweep {n / one:8.1f} tok/s  "
                    f"AR {n / ar:7.1f} tok/s  ratio {ar / one:6.1f}x"
                )
    return rows, hops


async def generation(cfg, blocks, emb, delays_ms, n_bytes) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:  # the swarm and the local run read the same checkpoint
        save_model(Path(tmp), cfg, dict(enumerate(blocks)), emb)
        from swarmd.serve.inference import load_local

        st = GenerationStats()
        ref = await generate_bytes(load_local(tmp), b"The ", n_bytes, 1.0, seed=1, stats=st)
        local_rate = n_bytes / st.seconds
        async with Swarm(cfg, blocks, emb, [0, 1, 2]) as swarm:
            for delay_ms in delays_ms:
                sweeper = swarm.sweeper(delay_ms / 1000)
                st = GenerationStats()
                out = await generate_bytes(sweeper, b"The ", n_bytes, 1.0, seed=1, stats=st)
                rate, same = n_bytes / st.seconds, out == ref
                row = dict(delay_ms=delay_ms, bytes=n_bytes, swarm_bytes_s=rate, local_bytes_s=local_rate)
                rows.append(row | dict(same_text=same, sweeps=st.sweeps, hops=len(sweeper.trace)))
                print(f"generation delay {delay_ms:>3} ms: swarm {rate:7.1f} B/s, local {local_rate:7.1f}, same {same}")
    return rows


async def size(ladder, seq_len, budget_s, max_param_bytes) -> dict:
    rungs, best = [], None
    for d, layers in ladder:
        cfg = ModelConfig(
            blocks=3, layers_per_block=layers, d_model=d, n_heads=max(1, d // 64), hidden=4 * d, seq_len=seq_len
        )
        rung: dict = {"d_model": d, "layers_per_block": layers}
        if 4 * (3 * layers * 12 * d * d) * 4 // 3 > max_param_bytes:  # fp32 snapshots of 3 blocks + one being built
            rungs.append(rung | {"skipped": f"over the {max_param_bytes >> 30} GiB weight budget"})
            continue
        t0 = time.perf_counter()
        emb = init_embedding(cfg)
        with torch.device("meta"):  # count without allocating
            params = 3 * count_params(DenoisingBlock(cfg)) + count_params(emb)
        try:
            async with Swarm(cfg, lambda b, cfg=cfg: init_block(cfg, b), emb, [0, 1, 2]) as swarm:
                sweeper = swarm.sweeper(timeout_s=budget_s)
                seconds = await one_sweep_s(sweeper, cfg, seq_len)
                trace = [
                    {k: getattr(h, a) for k, a in HOP_KEYS.items()}
                    | {"seconds": round(h.seconds, 4), "compute_s": round(h.compute_s, 4)}
                    for h in sweeper.trace
                ]
        except Exception as exc:
            rungs.append(rung | {"params": params, "failed": f"{type(exc).__name__}: {exc}"})
            break
        rung |= dict(hidden=4 * d, params=params, params_fp16_gb=params * 2 / 1e9, sweep_s=seconds)
        rungs.append(rung | {"build_s": time.perf_counter() - t0 - seconds, "hop_trace": trace})
        print(f"size d={d} L_b={layers}: {params / 1e6:.1f}M params, a sweep of {seq_len} bytes in {seconds:.2f} s")
        best = rungs[-1]
        if seconds > budget_s:
            break
    return dict(ladder=rungs, largest=best, seq_len=seq_len, budget_s=budget_s, max_weight_bytes=max_param_bytes)


async def failover(cfg, blocks, emb, n_bytes, kill_at, delay_ms) -> dict:
    ref = await generate_bytes(LocalSweeper(cfg, blocks, emb), b"The ", n_bytes, 1.0, seed=2)
    async with Swarm(cfg, blocks, emb, [0, 1, 1, 2]) as swarm:
        sweeper = swarm.sweeper(delay_ms / 1000, timeout_s=10.0)
        st, out, victim = GenerationStats(), [], None
        async for byte in generate(sweeper, b"The ", n_bytes, 1.0, seed=2, stats=st):
            out.append(byte)
            if len(out) == kill_at:
                address = next(iter(sweeper._sessions.values())).streams[1][0].address
                victim = next(s for s in swarm.servers if s.address == address)
                await victim.stop(0)
        times = st.per_byte_s
        normal = statistics.median(times[:kill_at] + times[kill_at + 1 :])
        resent = [h for h in sweeper.trace if h.resent]
        row = dict(delay_ms=delay_ms, bytes=n_bytes, killed_after_byte=kill_at, completed=len(out) == n_bytes)
        row |= dict(same_text=bytes(out) == ref, failovers=sweeper.failovers, median_byte_s=normal)
        row |= dict(failover_byte_s=times[kill_at], added_latency_s=times[kill_at] - normal)
        row |= dict(resent_positions=[h.positions for h in resent], new_peer=resent[0].address if resent else None)
        row["killed_peer"] = victim.address if victim else None
    print(f"failover: completed {row['completed']}, same text {row['same_text']}, added {row['added_latency_s']:.3f} s")
    return row


# (blocks, layers, d, heads, hidden, seq), lengths, delays (ms), reps, generated bytes, size ladder (d, L_b)
QUICK = ((3, 1, 64, 2, 256, 128), [16, 32], [0, 5], 1, 8, [(64, 1), (128, 1)])
LADDER = [(512, 4), (1024, 4), (2048, 4), (2048, 8), (4096, 4)]
FULL = ((3, 4, 512, 8, 2048, 128), [64, 128], [0, 20, 50], 5, 32, LADDER)


async def main(args) -> dict:
    torch.manual_seed(0)
    shape, lengths, delays, reps, gen_bytes, ladder = QUICK if args.quick else FULL
    cfg = ModelConfig(**dict(zip(("blocks", "layers_per_block", "d_model", "n_heads", "hidden", "seq_len"), shape)))
    blocks, emb = [init_block(cfg, b, 0) for b in range(cfg.blocks)], init_embedding(cfg, 0)
    t0 = time.perf_counter()
    rows, hop_counts = await traversal(cfg, blocks, emb, delays, lengths, reps)
    gen = await generation(cfg, blocks, emb, delays, gen_bytes)
    fail = await failover(cfg, blocks, emb, gen_bytes, gen_bytes // 2, delays[1])
    sz = await size(ladder, cfg.seq_len, args.size_budget_s, args.max_weight_gib << 30)
    return {
        "traversal": rows,
        "traversal_hops": hop_counts,
        "generation": gen,
        "failover": fail,
        "size": sz,
        "setup": {
            "model": cfg.to_dict(),
            "params": sum(count_params(b) for b in blocks) + count_params(emb),
            "delay": "client-side asyncio.sleep(delay) before every Forward call (user space; no tc netem, no proxy)",
            "peers": "one gRPC server per block on 127.0.0.1, all in one process with the client",
            "torch_threads": torch.get_num_threads(),
            "cpus": os.cpu_count(),
            "machine": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "seconds": time.perf_counter() - t0,
            "command": "python benchmarks/serving.py" + (" --quick" if args.quick else ""),
        },
    }


def render(result: dict) -> str:
    """Markdown tables of a result file (python benchmarks/serving.py --render FILE)."""
    ms = lambda s: f"{1000 * s:.1f} ms"
    traversal = [
        f"{r['delay_ms']} ms | {r['output_bytes']} | {r['one_sweep_tok_s']:.1f} | {r['ar_tok_s']:.1f} "
        f"| {r['ratio']:.1f}x"
        for r in result["traversal"]
    ]
    generation = [
        f"{r['delay_ms']} ms | {r['swarm_bytes_s']:.1f} | {r['local_bytes_s']:.1f} "
        f"| {'yes' if r['same_text'] else 'NO'}"
        for r in result["generation"]
    ]
    size = []
    for r in result["size"]["ladder"]:
        shape = f"{r['d_model']} | {r['layers_per_block']}"
        if "skipped" in r or "failed" in r:
            params = f"{r['params'] / 1e6:.1f}M" if "params" in r else "-"
            size.append(f"{shape} | {params} | {r.get('skipped') or r.get('failed')} |")
        else:
            hops = ", ".join(f"{h['block']}: {h['positions']}, {h['seconds']:.2f}" for h in r["hop_trace"])
            params = f"{r['params'] / 1e6:.1f}M ({r['params_fp16_gb']:.2f})"
            size.append(f"{shape} | {params} | {r['sweep_s']:.2f} s | {hops}")
    f = result["failover"]
    failover = (
        f"{f['delay_ms']} ms | {f['bytes']} | {f['killed_after_byte']} | {f['completed']} | {f['same_text']} "
        f"| {ms(f['median_byte_s'])} | {ms(f['failover_byte_s'])} | {ms(f['added_latency_s'])} "
        f"| {f['resent_positions']} positions"
    )
    tables = [
        ("per-hop delay | output bytes | one-sweep tok/s | AR pipeline tok/s | ratio", traversal),
        ("per-hop delay | swarm generation B/s | local generation B/s | same text", generation),
        ("d_model | L_b | params (fp16 GB) | one sweep of 128 bytes | hops (block: positions, s)", size),
        (
            "per-hop delay | bytes | killed after byte | completed | same text | median byte | failover byte "
            "| added latency | prefix re-sent",
            [failover],
        ),
    ]
    return "\n\n".join("\n".join(results.table(head, rows, "l" * (head.count("|") + 1))) for head, rows in tables)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes, two delays: a smoke run")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "serving.json")
    parser.add_argument("--size-budget-s", type=float, default=60.0, help="the size ladder stops after a slower sweep")
    parser.add_argument("--max-weight-gib", type=int, default=8, help="skip rungs whose fp32 weights (x2) exceed this")
    parser.add_argument("--render", type=Path, help="print the markdown tables of an existing result file and exit")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # progress lines show as they come
    if args.render:
        print(render(json.loads(args.render.read_text())))
        sys.exit(0)
    result = asyncio.run(main(args))
    results.write_json(args.out, result, sort_keys=False)
    print(f"wrote {args.out}")
