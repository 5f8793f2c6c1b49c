"""Cost of verified inference per sweep, and the divergence honest replicas show (issue 21 item 3).

Two replicas of every block (real gRPC servers on 127.0.0.1) score the same windows at verify shares 0, 0.5 and 1:
extra Forward calls and seconds per sweep. Then how far honest answers to one hop lie apart (D units; batched, cached,
--device, a round later) and one tie-break by recomputation against a lying replica. Writes --out (JSON).

    python benchmarks/verify_cost.py [--device cuda] [--d-model 64] [--blocks 4] [--windows 256]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.test_verified_inference: the signed replicas

from benchmarks.harness import options, results
from benchmarks.serving import Swarm
from swarmd.core.config import ModelConfig
from swarmd.core.model import euler_step, sampler_plan
from swarmd.core.train import init_block, init_embedding
from swarmd.serve.inference import score_windows
from swarmd.serve.remote import RemoteSweeper
from swarmd.serve.verify import Answer, Hop, VerifyPolicy, divergence

DEVICE_MODES = (("fp32", False, None), ("tf32", True, None), ("bf16_autocast", False, torch.bfloat16))  # name, tf32
INT_OPTIONS = {"--blocks": 4, "--d-model": 64, "--seq-len": 64, "--windows": 128, "--batch-size": 16}


def replicated(cfg: ModelConfig) -> list[int]:
    """The layout of two servers per block."""
    return [b for b in range(cfg.blocks) for _ in range(2)]


async def sweep_cost(cfg, blocks, emb, x, y, share: float, batch_size: int) -> dict:
    async with Swarm(cfg, blocks, emb, replicated(cfg), status_s=2.0) as swarm:
        cfg2, router = await swarm.covered()
        sweeper = RemoteSweeper(cfg2, router, swarm.client, verify=VerifyPolicy(share, rng=random.Random(0)))
        await score_windows(sweeper, x[:batch_size], y[:batch_size], seed=1, batch_size=batch_size)  # warm up
        sweeper.stats.__init__()
        t0 = time.perf_counter()
        got = await score_windows(sweeper, x, y, seed=1, batch_size=batch_size)
        seconds, s, n = time.perf_counter() - t0, sweeper.stats, got["sweeps"]
        await sweeper.close()
    return {
        "share": share,
        "sweeps": n,
        "hops_per_sweep": s.hops / n,
        "extra_calls_per_sweep": s.extra_calls / n,
        "s_per_sweep": seconds / n,
        "ce": got["ce"],
    }


async def tiebreak_cost(cfg, blocks, emb, x, y, batch_size: int) -> dict:
    """Two signed replicas of every block (records announce base/emb hashes; PullState answered); the second replica
    of block 1 answers its first hop honestly, then with a 0.02 bias, and is the fastest (routed to first). Share
    1.0 checks every hop, so the lie is disputed on its second hop and, with no third replica, broken by
    recomputation (pulls of block 1 and the byte table, a local build, one recomputed hop). Run twice, the second
    without the liar: the tie-break's own timer and the whole run's difference."""
    from swarmd.serve.serving import BlockServing
    from tests.test_verified_inference import LyingServing, SignedHandler, state_checks

    out, liar = {}, 3  # the second replica of block 1

    def signed(case: str, handlers: list, i: int, b: int):
        if case == "liar" and i == liar:
            serving = LyingServing(cfg, b, peer_id=f"host{i}", lie="bias", bias=0.02, honest_first=1)
        else:
            serving = BlockServing(cfg, b, peer_id=f"host{i}")
        state = blocks[b].state_dict()
        serving.update_weights(state, emb.table)
        handlers.append(SignedHandler(serving, state, emb.table, seed=i, swarm_id="bench"))
        return handlers[-1]

    for case in ("liar", "honest"):
        handlers: list = []
        make = functools.partial(signed, case, handlers)
        async with Swarm(cfg, blocks, emb, replicated(cfg), make_handler=make) as swarm:
            cfg2, router = await swarm.covered()
            for r in router.known(1):
                if r.address == swarm.servers[liar].address:
                    r.latency_s = 0.0
            verify = VerifyPolicy(1.0, rng=random.Random(0))
            sweeper = RemoteSweeper(cfg2, router, swarm.client, verify=verify, state_checks=state_checks())
            t0 = time.perf_counter()
            got = await score_windows(sweeper, x, y, seed=1, batch_size=batch_size)
            seconds, s = time.perf_counter() - t0, sweeper.stats
            await sweeper.close()
        out[case] = {"s": seconds, "sweeps": got["sweeps"], "ce": got["ce"], "dropped": len(s.dropped)}
        for key in ("tiebreaks", "tiebreak_s", "state_downloads", "state_download_bytes", "redone_sweeps"):
            out[case][key] = getattr(s, key)
        out[case]["pulls_served"] = sum(h.pulls for h in handlers)
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
    with torch.no_grad():  # cached: positions one by one
        cache = blocks[b].new_cache()
        parts = [
            euler_step(blocks[b], th, x[:1, p : p + 1], z[:1, p : p + 1], sigma, nxt, cache)[1]
            for p in range(x.shape[1])
        ]
    message = None if cfg.message_dim else alone.message
    out["cpu_cached_vs_uncached"] = divergence(hop, Answer(alone.out, message), Answer(torch.cat(parts, 1), message))
    if device != "cpu":
        for name, tf32, autocast in DEVICE_MODES:
            torch.backends.cuda.matmul.allow_tf32 = tf32
            there = hop_answers(cfg, blocks[b], th, x[:1], z[:1], sigma, nxt, device, autocast)
            out[f"cpu_vs_{device}_{name}"] = divergence(hop, alone, there)
        torch.backends.cuda.matmul.allow_tf32 = False
        for blk in blocks:
            blk.cpu()
    # a base one round later: the block after H = 10 more AdamW steps on wikitext bytes, at several stages
    out.update(round_apart(cfg, blocks[b], emb, hop, x[:1], z[:1], th, sigma, nxt))
    return out


def round_apart(cfg, block, emb, hop, x, z, th, sigma, nxt, stages=(0, 300, 1000), h=10) -> dict:
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
        before = hop_answers(cfg, moved, th, x, z, sigma, nxt, "cpu")
        train(h)
        done = stage + h
        after = hop_answers(cfg, moved, th, x, z, sigma, nxt, "cpu")
        result[f"round_apart_H{h}_after_{stage}_steps"] = divergence(hop, before, after)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    for flag, default in INT_OPTIONS.items():
        ap.add_argument(flag, type=int, default=default)
    ap.add_argument("--tiebreak-only", action="store_true", help="only the two-replica liar case (tie-break cost)")
    options.add_outputs(ap, "verify_cost.json")
    a = ap.parse_args()
    shape = dict(blocks=a.blocks, d_model=a.d_model, seq_len=a.seq_len)
    cfg = ModelConfig(**shape, layers_per_block=2, n_heads=4, hidden=4 * a.d_model)
    blocks, emb = [init_block(cfg, b, 0).eval() for b in range(cfg.blocks)], init_embedding(cfg, 0)
    data = torch.randint(0, 256, (a.windows, cfg.seq_len + 1), generator=torch.Generator().manual_seed(2))
    x, y = data[:, :-1], data[:, 1:]
    report = {"config": shape | {"windows": a.windows}}
    if not a.tiebreak_only:
        report["divergence_D_units"] = honest_divergence(cfg, blocks, emb, x[:4], a.device)
        report["cost"] = [asyncio.run(sweep_cost(cfg, blocks, emb, x, y, s, a.batch_size)) for s in (0.0, 0.5, 1.0)]
    report["two_replica_liar_tiebreak"] = asyncio.run(tiebreak_cost(cfg, blocks, emb, x, y, a.batch_size))
    results.write_json(a.out, report, sort_keys=False)
    print(a.out.read_text(), end="")


if __name__ == "__main__":
    main()
