"""Config validation: every invalid value of ModelConfig, TrainConfig, GossipConfig, NetConfig and
DaemonConfig raises ValueError naming what is wrong; valid configs round-trip through plain dicts;
ModelConfig.config_hash is stable (same config, same hash, in any process) and changes with every field.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from swarmd.averaging.config import GossipConfig
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.node.config import DaemonConfig, NetConfig


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"blocks": 0}, "blocks must be >= 1"),
        ({"layers_per_block": 0}, "layers_per_block must be >= 1"),
        ({"d_model": 0}, "d_model must be >= 1"),
        ({"n_heads": 0}, "n_heads must be >= 1"),
        ({"hidden": -1}, "hidden must be >= 1"),
        ({"seq_len": 0}, "seq_len must be >= 1"),
        ({"d_model": 30, "n_heads": 4}, r"d_model \(30\) must be divisible by n_heads \(4\)"),
        ({"sigma_lo": 0.0}, "sigma_lo < sigma_hi"),
        ({"sigma_lo": 10.0, "sigma_hi": 1.0}, "sigma_lo < sigma_hi"),
        ({"gamma": 1.0}, r"gamma must be in \[0, 1\)"),
        ({"gamma": -0.1}, r"gamma must be in \[0, 1\)"),
        ({"p_std": 0.0}, "p_std"),
        ({"sigma_data": -1.0}, "sigma_data"),
        ({"logit_scale": 0.0}, "logit_scale must be > 0"),
        ({"vocab": 512}, "vocab is fixed at 256"),
    ],
)
def test_model_config_rejects(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"batch_size": 0}, "batch_size must be >= 1"),
        ({"lr": 0.0}, "lr must be > 0"),
        ({"lr": -1e-3}, "lr must be > 0"),
        ({"warmup_steps": -1}, "warmup_steps"),
        ({"total_steps": -5}, "total_steps"),
        ({"trajectory_prob": 1.5}, r"trajectory_prob must be in \[0, 1\]"),
        ({"trajectory_prob": -0.1}, r"trajectory_prob must be in \[0, 1\]"),
        ({"trajectory_steps": -1}, "trajectory_steps must be >= 0"),
        ({"sigma_sampling": "uniform"}, "sigma_sampling must be"),
        ({"sigma_jitter": -0.5}, "sigma_jitter"),
        ({"table_lr_scale": 0.0}, "table_lr_scale"),
    ],
)
def test_train_config_rejects(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"steps_per_round": 0}, "steps_per_round must be >= 1"),
        ({"codec": "zip"}, "codec"),
        ({"deadline_min_s": 0.0}, "deadline_min_s"),
        ({"deadline_min_s": 5.0, "deadline_max_s": 1.0}, "deadline_min_s <= deadline_max_s"),
        ({"deadline_factor": 0.0}, "deadline_factor"),
        ({"rpc_timeout_s": -1.0}, "rpc_timeout_s"),
        ({"max_payload_bytes": 0}, "max_payload_bytes"),
        ({"min_cosine": 1.0}, "min_cosine"),
        ({"min_cosine": -1.5}, "min_cosine"),
        ({"distance_factor": 0.5}, "distance_factor"),
    ],
)
def test_gossip_config_rejects(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GossipConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"swarm_id": ""}, "swarm_id must be a non-empty name"),
        ({"swarm_id": "my swarm"}, "without spaces or slashes"),
        ({"swarm_id": "a/b"}, "without spaces or slashes"),
        ({"discovery": "mdns"}, "discovery must be"),
        ({"listen": "8000"}, "listen must be HOST:PORT"),
        ({"listen": "127.0.0.1:port"}, "listen must be HOST:PORT"),
        ({"listen": ":8000"}, "listen must be HOST:PORT"),
        ({"announce_period_s": 0.0}, "announce_period_s < record_ttl_s"),
        ({"announce_period_s": 20.0, "record_ttl_s": 15.0}, "announce_period_s < record_ttl_s"),
    ],
)
def test_net_config_rejects(kwargs, message):
    with pytest.raises(ValueError, match=message):
        NetConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_streams_per_identity": -1}, r"net.max_streams_per_identity must be a whole number >= 0"),
        ({"max_streams": 2.5}, r"net.max_streams must be a whole number"),
        ({"request_rate": -1.0}, r"net.request_rate must be a number >= 0"),
        ({"pull_rate": float("nan")}, r"net.pull_rate must be a number >= 0"),
        ({"forward_burst": 0.5}, r"net.forward_burst must be a number >= 1"),
        ({"host_shares": 0.5}, r"net.host_shares must be a number >= 1"),
        ({"forward_host_shares": True}, r"net.forward_host_shares must be a number >= 1"),
    ],
)
def test_server_limits_out_of_range_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        NetConfig(**kwargs)


def test_server_limit_flags_reach_the_daemon_config_and_its_json():
    from dataclasses import fields

    from cli import options as o

    given = {f.name: o.PeerOptions.DEFAULTS.get(f.name) for f in fields(o.PeerOptions)}
    train = o.TrainOptions(**{f.name: None for f in fields(o.TrainOptions)})
    limits = {"max_streams_per_identity": 3, "request_rate": 7.0, "pull_rate": 0.5, "host_shares": 2.0}
    peer = o.PeerOptions(**{**given, "group_size": 0, **limits, "max_streams_per_host": 5})
    config = peer.config(ModelConfig(), train, [], Path(__file__), None)
    again = DaemonConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    for net in (config.net, again.net):
        assert {name: getattr(net, name) for name in limits} == limits
        assert net.max_streams_per_peer == 5


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"block": -2}, r"block must be -1 \(auto\) or in \[0, 3\)"),
        ({"block": 3}, r"block must be -1 \(auto\) or in \[0, 3\)"),
        ({"max_rounds": -1}, "max_rounds must be >= 0"),
        ({"eval_tokens": 0}, "eval_tokens >= 1"),
        ({"device": "tpu"}, "device must be cpu or cuda"),
    ],
)
def test_daemon_config_rejects(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DaemonConfig(**kwargs)


def test_valid_edge_values_are_accepted():
    ModelConfig(blocks=1, layers_per_block=1, d_model=2, n_heads=2, hidden=1, seq_len=1, gamma=0.0)
    TrainConfig(batch_size=1, warmup_steps=0, total_steps=0, trajectory_prob=1.0, sigma_sampling="sampler")
    GossipConfig(steps_per_round=1, deadline_min_s=1.0, deadline_max_s=1.0)
    NetConfig(listen="0.0.0.0:0", discovery="static", swarm_id="a-b_c.1")
    for block in (-1, 0, 2):
        assert DaemonConfig(block=block).block == block
    for device in ("cpu", "cuda", "cuda:1"):
        assert DaemonConfig(device=device).device == device
    assert DaemonConfig(model=ModelConfig(blocks=5), block=4).with_block(0).block == 0


def test_configs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ModelConfig().blocks = 7
    with pytest.raises(dataclasses.FrozenInstanceError):
        DaemonConfig().block = 0


def test_model_config_round_trips_through_a_plain_dict():
    cfg = ModelConfig(blocks=4, layers_per_block=1, d_model=64, n_heads=2, hidden=96, seq_len=32, gamma=0.1)
    data = cfg.to_dict()
    assert json.loads(json.dumps(data)) == data  # plain JSON types only
    assert ModelConfig.from_dict(data) == cfg
    assert ModelConfig.from_dict(json.loads(json.dumps(data))) == cfg
    assert ModelConfig.from_dict({"blocks": 5}) == ModelConfig.documented(blocks=5)  # missing keys: the defaults,
    assert ModelConfig.from_dict({}).pred_input == "none"  # and a config from before issue 8 reads as documented
    with pytest.raises(ValueError, match=r"unknown model config keys: \['depth'\]"):
        ModelConfig.from_dict({**data, "depth": 3})
    with pytest.raises(ValueError, match="blocks must be >= 1"):
        ModelConfig.from_dict({**data, "blocks": 0})  # a dict goes through the same validation


def test_train_config_round_trips_through_a_plain_dict():
    cfg = TrainConfig(batch_size=8, lr=3e-4, warmup_steps=10, total_steps=100, trajectory_prob=0.5, seed=7)
    data = cfg.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert TrainConfig(**data) == cfg


def test_config_hash_is_stable():
    cfg = ModelConfig(blocks=2, d_model=64)
    digest = cfg.config_hash()
    assert len(digest) == 16 and int(digest, 16) >= 0  # 16 hex characters
    assert cfg.config_hash() == digest
    assert ModelConfig(d_model=64, blocks=2).config_hash() == digest  # same values, same hash
    assert ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))).config_hash() == digest
    # another interpreter (other hash seed) computes the same identity: peers compare it across machines
    code = "from swarmd.core.config import ModelConfig; print(ModelConfig(blocks=2, d_model=64).config_hash())"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == digest


def test_config_hash_changes_with_every_field():
    base = ModelConfig.documented()
    changed = {
        "blocks": 4,
        "layers_per_block": 3,
        "d_model": 256,
        "n_heads": 8,
        "hidden": 1024,
        "seq_len": 64,
        "sigma_lo": 0.5,
        "sigma_hi": 20.0,
        "p_mean": -1.0,
        "p_std": 1.0,
        "gamma": 0.1,
        "sigma_data": 1.0,
        "noise_feature_scale": 100.0,
        "logit_scale": 2.0,
        "context_input": "own_table",
        "z_in_init": "zero",
        "noise_embedding": "off",
        "pred_input": "feature",
        "pred_output": "add",
        "handoff_loss": "prev_byte",
        "out_head": "mlp",
        "pred_in_init": "identity",
    }
    fixed = {"vocab"}  # the only value it accepts is the default
    assert set(changed) | fixed == {f.name for f in dataclasses.fields(ModelConfig)}, "a new field needs a case here"
    hashes = {name: dataclasses.replace(base, **{name: value}).config_hash() for name, value in changed.items()}
    assert base.config_hash() not in hashes.values()
    assert len(set(hashes.values())) == len(hashes)  # every change gives its own hash
