"""Cost of verified inference per sweep, and the divergence honest replicas show (issue 21 item 3).

Starts a local swarm of real gRPC servers on 127.0.0.1 (BlockServing behind ServingOnlyHandler), every block
held by two replicas, and scores the same windows with --verify-share 0 (range checks only), the default 0.5
and 1.0: extra Forward calls and seconds per sweep. Then measures how far honest answers to one hop lie apart
(swarmd.serve.verify.divergence, D units): batched vs alone and cached vs uncached on one device, CPU vs
--device (cuda: fp32, TF32 and bf16 autocast), and one base vs a base one short training round later. Last, the
cost of one tie-break by recomputation (swarmd.serve.tiebreak): two signed replicas of block 1, one of them a liar
that turns after its first hop, and no third.

    python benchmarks/verify_cost.py [--device cuda] [--d-model 64] [--blocks 4] [--windows 256]

Prints and writes the report to benchmarks/results/verify_cost.json (--out).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

import torch

from swarmd.core.config import ModelConfig
from swarmd.core.model import euler_step, sampler_plan
from swarmd.core.train import init_block, init_embedding
from swarmd.serve.inference import score_windows
from swarmd.serve.verify import Answer, Hop, VerifyPolicy, divergence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.test_verified_inference: the signed replicas


async def sweep_cost(cfg, blocks, emb, x, y, share: float, batch_size: int) -> dict:
    from swarmd.membership.discovery import StaticDiscovery
    from swarmd.serve.remote import BlockRouter, RemoteSweeper, check_coverage, swarm_model_config
    from swarmd.serve.serving import BlockServing, ServingOnlyHandler
    from swarmd.transport.client import PeerClient
    from swarmd.transport.server import start_server

    hosts = []
    for i, b in enumerate(b for b in range(cfg.blocks) for _ in range(2)):
        serving = BlockServing(cfg, b, peer_id=f"host{i}")
        serving.update_weights(blocks[b].state_dict(), emb.table)
        handler = ServingOnlyHandler(serving, swarm_id="bench")
        server = await start_server(handler)
        handler.address = server.address
        hosts.append(server)
    client = PeerClient()
    try:
        discovery = StaticDiscovery([s.address for s in hosts], lambda a: client.status(a, timeout_s=2.0), "bench")
        cfg2, records = await swarm_model_config(discovery, client, swarm_id="bench")
        router = BlockRouter(discovery, client, cfg2.config_hash(), "bench")
        await check_coverage(router, cfg2, records)
        sweeper = RemoteSweeper(cfg2, router, client, verify=VerifyPolicy(share, rng=random.Random(0)))
        await score_windows(sweeper, x[:batch_size], y[:batch_size], seed=1, batch_size=batch_size)  # warm up
        sweeper.stats.__init__()
        t0 = time.perf_counter()
        got = await score_windows(sweeper, x, y, seed=1, batch_size=batch_size)
        seconds = time.perf_counter() - t0
        s = sweeper.stats
        await sweeper.close()
        return {
            "share": share,
            "sweeps": got["sweeps"],
            "hops_per_sweep": s.hops / got["sweeps"],
            "extra_calls_per_sweep": s.extra_calls / got["sweeps"],
            "s_per_sweep": seconds / got["sweeps"],
            "ce": got["ce"],
        }
    finally:
        await client.close()
        for server in hosts:
            await server.stop(0)


async def tiebreak_cost(cfg, blocks, emb, x, y, batch_size: int) -> dict:
    """Two replicas of every block, signed (records announce base/emb hashes; PullState answered, signed); the second
    replica of block 1 answers its first hop honestly, then with a 0.02 bias, and is the fastest (routed to first).
    share 1.0 checks every hop, so the lie is disputed on its second hop and, with no third replica, broken by
    recomputation: one pull of block 1 and of the byte table, a local build, one recomputed hop. Run twice, the
    second without the liar: the extra seconds of the tie-break (its own timer and the whole run's difference)."""
    from swarmd.membership.discovery import StaticDiscovery
    from swarmd.serve.remote import BlockRouter, RemoteSweeper, check_coverage, swarm_model_config
    from swarmd.serve.serving import BlockServing
    from swarmd.transport.client import PeerClient
    from swarmd.transport.server import start_server
    from tests.test_verified_inference import LyingServing, SignedHandler, state_checks

    out = {}
    for case in ("liar", "honest"):
        hosts, handlers = [], []
        layout = [b for b in range(cfg.blocks) for _ in range(2)]
        liar = 3  # the second replica of block 1
        for i, b in enumerate(layout):
            if case == "liar" and i == liar:
                serving = LyingServing(cfg, b, peer_id=f"host{i}", lie="bias", bias=0.02, honest_first=1)
            else:
                serving = BlockServing(cfg, b, peer_id=f"host{i}")
            state = blocks[b].state_dict()
            serving.update_weights(state, emb.table)
            handler = SignedHandler(serving, state, emb.table, seed=i, swarm_id="bench")
            server = await start_server(handler)
            handler.address = server.address
            hosts.append(server)
            handlers.append(handler)
        client = PeerClient()
        try:
            discovery = StaticDiscovery([s.address for s in hosts], client.status, "bench")
            cfg2, records = await swarm_model_config(discovery, client, swarm_id="bench")
            router = BlockRouter(discovery, client, cfg2.config_hash(), "bench")
            await check_coverage(router, cfg2, records)
            for r in router.known(1):
                if r.address == hosts[liar].address:
                    r.latency_s = 0.0
            sweeper = RemoteSweeper(
                cfg2, router, client, verify=VerifyPolicy(1.0, rng=random.Random(0)), state_checks=state_checks()
            )
            t0 = time.perf_counter()
            got = await score_windows(sweeper, x, y, seed=1, batch_size=batch_size)
            seconds = time.perf_counter() - t0
            s = sweeper.stats
            await sweeper.close()
            out[case] = {
                "s": seconds,
                "sweeps": got["sweeps"],
                "ce": got["ce"],
                "dropped": len(s.dropped),
                "tiebreaks": s.tiebreaks,
                "tiebreak_s": s.tiebreak_s,
                "state_downloads": s.state_downloads,
                "state_download_bytes": s.state_download_bytes,
                "redone_sweeps": s.redone_sweeps,
                "pulls_served": sum(h.pulls for h in handlers),
            }
        finally:
            await client.close()
            for server in hosts:
                await server.stop(0)
    out["extra_s_whole_run"] = out["liar"]["s"] - out["honest"]["s"]
    out["ce_liar_minus_honest"] = out["liar"]["ce"] - out["honest"]["ce"]
    return out


def hop_answers(cfg, block, table_hat, x, z, sigma, nxt, device, autocast=None):
    with torch.no_grad():
        _, z_next, message = euler_step(
            block.to(device), table_hat.to(device), x.to(device), z.to(device), sigma, nxt, autocast_dtype=autocast
        )
    return Answer(z_next.float().cpu(), None if message is None else message.float().cpu())


def honest_divergence(cfg, blocks, emb, x, device: str) -> dict:
    b, sigma, nxt = sampler_plan(cfg)[1]
    z = (1 + cfg.sigma_hi**2) ** 0.5 * torch.randn((*x.shape, cfg.d_model), generator=torch.Generator().manual_seed(0))
    th = emb.normalized().detach()
    hop = Hop(z[:1], sigma, nxt)
    alone = hop_answers(cfg, blocks[b], th, x[:1], z[:1], sigma, nxt, "cpu")
    batched = hop_answers(cfg, blocks[b], th, x, z, sigma, nxt, "cpu")
    batched = Answer(batched.out[:1], None if batched.message is None else batched.message[:1])
    out = {"cpu_batched_vs_alone": divergence(hop, alone, batched)}
    cache = blocks[b].new_cache()
    with torch.no_grad():  # cached: positions one by one
        parts = [
            euler_step(blocks[b], th, x[:1, p : p + 1], z[:1, p : p + 1], sigma, nxt, cache)[1]
            for p in range(x.shape[1])
        ]
    out["cpu_cached_vs_uncached"] = divergence(hop, alone, Answer(torch.cat(parts, 1), alone.message))
    if cfg.message_dim:
        out["cpu_cached_vs_uncached"] = divergence(hop, Answer(alone.out, None), Answer(torch.cat(parts, 1), None))
    if device != "cpu":
        torch.backends.cuda.matmul.allow_tf32 = False
        out[f"cpu_vs_{device}_fp32"] = divergence(
            hop, alone, hop_answers(cfg, blocks[b], th, x[:1], z[:1], sigma, nxt, device)
        )
        torch.backends.cuda.matmul.allow_tf32 = True
        out[f"cpu_vs_{device}_tf32"] = divergence(
            hop, alone, hop_answers(cfg, blocks[b], th, x[:1], z[:1], sigma, nxt, device)
        )
        torch.backends.cuda.matmul.allow_tf32 = False
        bf16 = hop_answers(cfg, blocks[b], th, x[:1], z[:1], sigma, nxt, device, torch.bfloat16)
        out[f"cpu_vs_{device}_bf16_autocast"] = divergence(hop, alone, bf16)
        for blk in blocks:
            blk.cpu()
    # a base one round later: the block after H = 10 more AdamW steps on wikitext bytes, at several stages
    out.update(round_apart(cfg, blocks[b], emb, hop, x[:1], z[:1], th, sigma, nxt, alone))
    return out


def round_apart(cfg, block, emb, hop, x, z, th, sigma, nxt, alone, stages=(0, 300, 1000), h=10) -> dict:
    """Divergence between a block and the same block H steps later, after `stage` steps of training."""
    from swarmd.core.model import block_loss

    text = Path("/work/shared/data/wikitext-2/train.txt")
    raw = torch.tensor(list(text.read_bytes()[:400_000]) if text.exists() else [0] * 1000, dtype=torch.int64)
    moved = init_block(cfg, 0, 0)
    moved.load_state_dict(block.state_dict())
    opt = torch.optim.AdamW(moved.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)

    def train(steps: int) -> None:
        for _ in range(steps):
            starts = torch.randint(0, raw.numel() - cfg.seq_len - 1, (8,), generator=gen)
            xb = torch.stack([raw[s : s + cfg.seq_len + 1] for s in starts.tolist()])
            loss, _ = block_loss(moved, emb, xb[:, :-1], xb[:, 1:], torch.full((8,), sigma))
            opt.zero_grad()
            loss.backward()
            opt.step()

    result, done = {}, 0
    for stage in stages:
        train(stage - done)
        done = stage
        before = hop_answers(cfg, moved, th, x, z, sigma, nxt, "cpu")
        train(h)
        done += h
        after = hop_answers(cfg, moved, th, x, z, sigma, nxt, "cpu")
        result[f"round_apart_H{h}_after_{stage}_steps"] = divergence(hop, before, after)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--windows", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--tiebreak-only", action="store_true", help="only the two-replica liar case (tie-break cost)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "verify_cost.json")
    a = ap.parse_args()
    cfg = ModelConfig(
        blocks=a.blocks, layers_per_block=2, d_model=a.d_model, n_heads=4, hidden=4 * a.d_model, seq_len=a.seq_len
    )
    blocks = [init_block(cfg, b, 0).eval() for b in range(cfg.blocks)]
    emb = init_embedding(cfg, 0)
    gen = torch.Generator().manual_seed(2)
    data = torch.randint(0, 256, (a.windows, cfg.seq_len + 1), generator=gen)
    x, y = data[:, :-1], data[:, 1:]
    report = {"config": {"blocks": a.blocks, "d_model": a.d_model, "seq_len": a.seq_len, "windows": a.windows}}
    if not a.tiebreak_only:
        report["divergence_D_units"] = honest_divergence(cfg, blocks, emb, x[:4], a.device)
        report["cost"] = [
            asyncio.run(sweep_cost(cfg, blocks, emb, x, y, share, a.batch_size)) for share in (0.0, 0.5, 1.0)
        ]
    report["two_replica_liar_tiebreak"] = asyncio.run(tiebreak_cost(cfg, blocks, emb, x, y, a.batch_size))
    print(json.dumps(report, indent=2))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
