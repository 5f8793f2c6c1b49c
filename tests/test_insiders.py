"""The insider rows' plumbing (benchmarks/insiders.py): the lying Forward on a real BlockServing, the fixed
directions of the delta insiders, the insider table, and (slow) one short run of a real insider daemon."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import torch

from benchmarks import insiders
from swarmd.core.train import init_block, init_embedding
from swarmd.serve.serving import BlockServing
from swarmd.v1 import swarm_pb2 as pb
from swarmd.wire import from_proto, to_proto

CFG = insiders.FORWARD_CFG


def _request(final: bool) -> pb.ForwardRequest:
    req = pb.ForwardRequest(
        session_id="s", block_index=1, config_hash=CFG.config_hash(), sigma=1.0, sigma_next=0.5, final=final
    )
    req.context.CopyFrom(to_proto(torch.zeros(2, CFG.seq_len, dtype=torch.uint8)))
    req.z.CopyFrom(to_proto(torch.randn(2, CFG.seq_len, CFG.d_model, generator=torch.Generator().manual_seed(1))))
    return req


def _answer(serving: BlockServing, final: bool) -> torch.Tensor:
    reply = asyncio.run(serving.forward(_request(final)))
    return from_proto(reply.logits if final else reply.z)


def test_lying_forward_answers_as_its_mode_file_says(tmp_path: Path):
    block, emb = init_block(CFG, 1), init_embedding(CFG)
    honest, liar = BlockServing(CFG, 1), insiders._lying_serving(tmp_path / "mode")(CFG, 1)
    for s in (honest, liar):
        s.update_weights(block.state_dict(), emb.table)
    for final in (False, True):
        truth = _answer(honest, final)
        assert torch.equal(_answer(liar, final), truth)  # no mode file: honest
        (tmp_path / "mode").write_text("garbage")
        garbage = _answer(liar, final)
        (tmp_path / "mode").write_text("bias")
        bias = _answer(liar, final)
        (tmp_path / "mode").write_text("honest")
        assert torch.equal(_answer(liar, final), truth)
        assert garbage.shape == truth.shape and bool(torch.isfinite(garbage).all())
        assert float((garbage - truth).abs().mean()) > 1.0
        offset = (bias - truth).abs()
        assert 0 < float(offset.mean()) < float((garbage - truth).abs().mean())


def test_fixed_directions_are_unit_and_the_same_in_every_process():
    like = {"b": torch.zeros(3), "a": torch.zeros(2, 4)}
    u, v = insiders._unit(like, 7), insiders._unit(like, 7)
    norm = float(torch.sqrt(sum((t**2).sum() for t in u.values())))
    assert abs(norm - 1.0) < 1e-6
    assert all(torch.equal(u[k], v[k]) for k in like)
    assert not torch.equal(insiders._unit(like, 8)["a"], u["a"])


def test_insider_table_shows_the_insider_rows_only():
    rows = [
        {"name": "clean run (4 honest replicas)", "survived": True, "ce": 2.3, "ce_clean": 2.3, "ce_delta": 0.0},
        {
            "name": "insider drift (1 of 4): x",
            "survived": False,
            "ce": 2.4,
            "ce_clean": 2.3,
            "ce_delta": 0.1,
            "tolerance": 0.02,
            "worse_adoptions": 3,
            "logs": {"drift": 2, "banned": 0},
            "timing": {"round_s": 0.5, "clean_round_s": 0.1},
            "seconds": 40.0,
        },
    ]
    lines = insiders.insider_table(rows)
    body = [line for line in lines if line.startswith("| insider drift")]
    assert len(body) == 1 and "**no**" in body[0] and "+0.1000" in body[0] and '{"drift": 2}' in body[0]
    assert not any("clean run" in line for line in lines)
    assert insiders.insider_table(rows[:1]) == []


@pytest.mark.slow
def test_a_drift_insider_daemon_runs_its_rounds_with_an_honest_peer():
    data = Path(os.environ.get("BLOCKTRAIN_DATA", "/work/shared/data/wikitext-2"))
    if not (data / "train.txt").is_file():
        pytest.skip("no training text (BLOCKTRAIN_DATA)")
    import argparse

    a = argparse.Namespace(data_dir=data, rounds=3, steps=2, deadline_max=10.0, timeout=300.0, eval_tokens=1024)
    out = insiders.run_swarm(a, 1, {1: "drift"})
    assert out.done["exit"] == [0] and out.done["tracebacks"] == 0
    assert out.ce is not None and out.rounds == 3
    assert out.insider_ce is not None
