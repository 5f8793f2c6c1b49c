"""Compact predecessor pulls (GossipConfig.pull_codec "int8", swarmd.averaging.compact): the int8 round trip's
error bound and bytes, hostile payloads refused, the request honoured, exact pulls unchanged for adoption, the
simulator's hand-off, and two daemons on 127.0.0.1 whose block-1 peer pulls block 0 compact and trains."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace

import pytest
import torch
from swarm_utils import link_static, running, trajectory_config

from swarmd.averaging.compact import PULL_INT8_LEVELS, compact_decoding, delta_roundtrip, encode_compact, roundtrip
from swarmd.averaging.config import GossipConfig
from swarmd.averaging.delta import decode, shapes_of
from swarmd.averaging.pulls import requested_kind
from swarmd.averaging.state import weights_hash
from swarmd.errors import ConfigError, ValidationError
from swarmd.membership.records import PeerRecord
from swarmd.node.peers import refresh_predecessors
from swarmd.protocol import Codec, PayloadKind
from swarmd.transport import PeerClient
from swarmd.transport.framing import Encoded
from swarmd.v1 import swarm_pb2 as pb

pytestmark = pytest.mark.usefixtures("one_thread")
META = dict(swarm_id="s", config_hash="c", kind=PayloadKind.BLOCK_STATE, block_index=0)


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(32, 64, generator=g) * 0.05, "b": torch.randn(64, generator=g), "z": torch.zeros(8, 8)}


def test_int8_round_trip_is_within_half_a_step_per_row_at_about_a_quarter_of_the_bytes():
    state = _state()
    got, wire = roundtrip(state, "int8", 0)
    for k, x in state.items():
        rows = x.reshape(x.shape[0] if x.dim() >= 2 else 1, -1)
        step = torch.maximum(rows.abs().amax(1) / 127, rows.pow(2).mean(1).sqrt() / PULL_INT8_LEVELS)
        err = (got[k].reshape(rows.shape) - rows).abs()
        assert bool((err <= step[:, None] / 2 + 1e-7).all()), k
    raw = sum(4 * t.numel() for t in state.values())
    assert wire < 0.3 * raw
    exact, n = roundtrip(state, "fp32", 0)
    assert exact is state and n == raw
    with pytest.raises(ValueError, match="pull codec"):
        roundtrip(state, "int4", 0)


def test_a_mid_round_delta_against_the_held_compact_state_is_within_a_step_of_the_delta():
    state = _state()
    held = compact_decoding(state, 0)
    working = {k: v + 0.01 * torch.randn(v.shape, generator=torch.Generator().manual_seed(1)) for k, v in state.items()}
    got, wire = delta_roundtrip(working, held, 0)
    for k in state:
        delta = working[k] - held[k]
        assert float((got[k] - working[k]).norm()) <= 0.3 * float(delta.norm()) + 1e-7, k
    assert wire < 0.2 * sum(4 * t.numel() for t in state.values())


def test_pull_codec_is_validated():
    assert GossipConfig().pull_codec == "int8-chain"
    with pytest.raises(ConfigError, match="pull_codec"):
        GossipConfig(pull_codec="fp16")


def _tampered(enc: Encoded, blob_edit) -> Encoded:
    from swarmd.wire import zstd_compress, zstd_decompress

    blob = bytearray(zstd_decompress(enc.payload, sum(s.nbytes for s in enc.header.tensors)))
    blob_edit(blob)
    payload = zstd_compress(bytes(blob))
    header = pb.PayloadHeader()
    header.CopyFrom(enc.header)
    header.payload_bytes = len(payload)
    return Encoded(header, payload)


def test_hostile_compact_payloads_are_refused_with_one_line_reasons():
    state = _state()
    enc = encode_compact(state, base_hash=weights_hash(state), **META)
    assert enc.header.codec == Codec.INT8.to_pb()
    shapes = shapes_of(state)
    nan = torch.tensor([math.nan], dtype=torch.float32).numpy().tobytes()
    neg = torch.tensor([-1.0], dtype=torch.float32).numpy().tobytes()
    cases = {
        "NaN or infinite": _tampered(enc, lambda b: b.__setitem__(slice(0, 4), nan)),
        ">= 0": _tampered(enc, lambda b: b.__setitem__(slice(0, 4), neg)),
    }
    for reason, bad in cases.items():
        with pytest.raises(ValidationError, match=reason) as exc:
            decode(bad, shapes, **META)
        assert "\n" not in str(exc.value)
    with pytest.raises(ValidationError, match="shape"):
        decode(enc, {**shapes, "w": (64, 32)}, **META)
    with pytest.raises(ValidationError, match="exceeds the limit"):
        decode(enc, shapes, max_bytes=64, **META)
    short = Encoded(enc.header, enc.payload[:-3])
    with pytest.raises(ValidationError):
        decode(short, shapes, **META)


def test_a_compact_request_is_for_a_block_state_only_without_outer_state_or_a_weights_hash():
    me = PeerRecord("p", "127.0.0.1:1", 1, 0, 0.0, "c", "", False, "s")
    base = dict(swarm_id="s", config_hash="c", kind=pb.PAYLOAD_KIND_BLOCK_STATE, block_index=1, compact=True)
    assert requested_kind(me, pb.PullStateRequest(**base)) == PayloadKind.BLOCK_STATE
    for bad in (
        {"outer_state": True},
        {"weights_hash": "ab"},
        {"kind": pb.PAYLOAD_KIND_EMBEDDING_STATE, "block_index": -1},
    ):
        with pytest.raises(ValidationError, match="compact pull"):
            requested_kind(me, pb.PullStateRequest(**{**base, **bad}))
    for held in ({"working": True, "against": "ab"}, {"against": "ab"}):  # mid-round delta; chain step
        assert requested_kind(me, pb.PullStateRequest(**base, **held)) == PayloadKind.BLOCK_STATE
    for bad in ({"against": "ab", "compact": False}, {"against": "ab", "compact": False, "working": True}):
        with pytest.raises(ValidationError, match="against a held state"):
            requested_kind(me, pb.PullStateRequest(**{**base, **bad}))


def test_the_simulator_hands_int8_predecessors_over_and_counts_their_real_bytes(tmp_path):
    from swarmd.core.config import ModelConfig, TrainConfig
    from swarmd.core.data import ByteData
    from swarmd.sim.engine import SimConfig, Simulator
    from swarmd.sim.policies import make_policy
    from swarmd.sim.regimes import regime_named

    corpus = tmp_path / "train.txt"
    corpus.write_bytes(b"the quick brown fox jumps over the lazy dog. " * 60)
    m = ModelConfig(blocks=2, layers_per_block=1, d_model=16, n_heads=2, hidden=32, seq_len=16)
    t = TrainConfig(batch_size=4, lr=3e-3, warmup_steps=0, trajectory_prob=1.0, predecessor_pulls=2)
    data = ByteData.from_path(corpus, m.seq_len)
    xy = next(data.stream(0, 4))
    regime = regime_named("lockstep")
    runs = {}
    for codec in ("fp32", "int8", "int8-delta", "int8-chain"):
        cfg = SimConfig(m, t, workers=1, rounds=1, steps_per_round=4, eval_tokens=64, pull_codec=codec)
        sim = Simulator(cfg, regime, make_policy("lockstep", regime, 4), data, xy)
        sim.step()
        runs[codec] = sim.pulled
    block_raw = sum(4 * v.numel() for v in sim.workers[0].state.base_block.values())
    assert runs["fp32"] == {"b1w0": (2 * block_raw, 2 * block_raw)}  # round start + one refresh of block 0
    wire, raw = runs["int8"]["b1w0"]
    assert raw == 2 * block_raw and wire < 0.35 * raw
    delta_wire, delta_raw = runs["int8-delta"]["b1w0"]
    assert delta_raw == raw and delta_wire < wire  # the refresh an int8 delta against the round-start pull
    with pytest.raises(ValueError, match="pull codec"):
        SimConfig(m, t, pull_codec="int4")


def _compact(cfg):
    return replace(cfg, gossip=replace(cfg.gossip, pull_codec="int8-delta"))


def test_a_block_1_daemon_pulls_block_0_compact_and_trains(tmp_path):
    async def scenario():
        configs = [_compact(trajectory_config(tmp_path, b, blocks=2, predecessor_pulls=2)) for b in range(2)]
        async with running(*configs) as daemons:
            link_static(daemons)
            first, last = daemons
            assert await asyncio.wait_for(last.load_predecessors(), 30) == 1
            merged0 = {k: v.clone() for k, v in first.state.base_block.items()}
            pulled = dict(last.state.predecessors[0])
            start = last.metrics.bytes_pulled, last.metrics.raw_bytes_pulled
            for d in daemons:
                await asyncio.wait_for(d.train(2), 60)
            held = last.state.predecessors[0]
            refreshed = await asyncio.wait_for(refresh_predecessors(last.gossip, last.state, await last.records()), 30)
            working0 = first.state.current()[0]
            runs = {k: v.clone() for k, v in last.state.trainer.others[0].state_dict().items()}
            client = PeerClient()
            try:
                ask = dict(swarm_id="test", config_hash=last.cfg.config_hash(), block_index=0)
                exact = await client.pull_state(
                    first.server.address, pb.PullStateRequest(kind=pb.PAYLOAD_KIND_BLOCK_STATE, **ask), 5.0
                )
                compact = await client.pull_state(
                    first.server.address,
                    pb.PullStateRequest(kind=pb.PAYLOAD_KIND_BLOCK_STATE, compact=True, **ask),
                    5.0,
                )
                replies = []
                for against in (first.state.block_hash, "0" * 16):  # the state it holds; one it never held
                    request = pb.PullStateRequest(
                        kind=pb.PAYLOAD_KIND_BLOCK_STATE, compact=True, working=True, against=against, **ask
                    )
                    replies.append(await client.pull_state(first.server.address, request, 5.0))
            finally:
                await client.close()
            return merged0, pulled, start, refreshed, exact, compact, last, (held, working0, runs, replies)

    merged0, pulled, start, refreshed, exact, compact, last, mid = asyncio.run(scenario())
    assert any(not torch.equal(pulled[k], merged0[k]) for k in merged0)  # int8, not the exact weights ...
    for k, v in merged0.items():  # ... within its steps (~1/sqrt(12) of one in rms)
        assert float((pulled[k] - v).norm()) <= 0.05 * float(v.norm()) + 1e-6, k
    assert start[0] < 0.35 * start[1]  # the real bytes show in the metrics
    assert last.metrics.bytes_pulled < 0.35 * last.metrics.raw_bytes_pulled
    assert refreshed == 1 and last.state.trainer.step_count >= 2
    assert all(bool(torch.isfinite(p).all()) for p in last.state.trainer.block.parameters())
    # the exact pull (adoption, re-sync, joiners) is unchanged: fp32, hashing to what its header names
    assert exact.header.codec == Codec.FP32.to_pb() and compact.header.codec == Codec.INT8.to_pb()
    shapes = shapes_of(merged0)
    meta = dict(swarm_id="test", config_hash=last.cfg.config_hash(), kind=PayloadKind.BLOCK_STATE, block_index=0)
    assert weights_hash(decode(exact, shapes, **meta)) == exact.header.base_hash == compact.header.base_hash
    assert compact.wire_bytes < 0.35 * exact.wire_bytes
    # mid-round: an int8 delta against the compact merged state the block-1 peer holds, added to it
    held, working0, runs, (delta, full) = mid
    assert delta.header.kind == pb.PAYLOAD_KIND_BLOCK_DELTA and delta.header.base_hash == exact.header.base_hash
    assert full.header.kind == pb.PAYLOAD_KIND_BLOCK_STATE and full.header.base_hash == weights_hash(working0)
    for k, v in working0.items():
        moved = float((v - held[k]).norm())
        assert float((runs[k] - v).norm()) <= 0.3 * moved + 1e-6, k  # within the delta's steps, not the weights'


def test_the_pull_codec_flag_reaches_the_gossip_config_and_its_json(tmp_path):
    import json
    from dataclasses import fields
    from pathlib import Path

    from cli import options as o
    from swarmd.core.config import ModelConfig
    from swarmd.node.config import DaemonConfig

    given = {f.name: o.PeerOptions.DEFAULTS.get(f.name) for f in fields(o.PeerOptions)}
    assert given["pull_codec"] == "int8-chain"
    train = o.TrainOptions(**{f.name: None for f in fields(o.TrainOptions)})
    peer = o.PeerOptions(**{**given, "group_size": 0, "pull_codec": "fp32"})
    config = peer.config(ModelConfig(), train, [], Path(__file__), None)
    again = DaemonConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert config.gossip.pull_codec == again.gossip.pull_codec == "fp32"
    with pytest.raises(ConfigError, match="pull_codec"):
        o.PeerOptions(**{**given, "group_size": 0, "pull_codec": "int4"}).config(
            ModelConfig(), train, [], Path(__file__), None
        )
