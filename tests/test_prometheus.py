"""Prometheus endpoint of a peer (swarmd.node.prometheus): names, labels, values, one registry per daemon.

Every test scrapes a real HTTP endpoint on 127.0.0.1 (an ephemeral port) with urllib and parses
the text with prometheus_client.parser; the daemon tests run real daemons (static discovery).
"""

from __future__ import annotations

import asyncio
import math
import socket
import urllib.error
import urllib.request
from dataclasses import replace

import pytest
import torch
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from swarm_utils import daemon_config, memory_swarm, running
from typer.testing import CliRunner

from cli.main import app
from swarmd.averaging.context import BLOCK
from swarmd.averaging.delta import encode
from swarmd.errors import ConfigError, SwarmdError
from swarmd.membership.identity import Identity
from swarmd.membership.trust import sign_payload, sign_record
from swarmd.metrics import REJECT_REASONS, Metrics
from swarmd.node.config import NetConfig
from swarmd.node.prometheus import MetricsCollector, MetricsServer
from swarmd.node.runner import run_foreground

pytestmark = pytest.mark.usefixtures("one_thread")

COUNTERS = ("rounds", "steps", "sent_bytes", "received_bytes", "rejected_payloads")
GAUGES = ("samples_per_second", "train_ce", "eval_ce", "participation", "consensus_distance", "peers")
HISTOGRAMS = ("exchange_duration_seconds", "round_duration_seconds")


def scrape(url: str) -> dict:
    """{family name: family} of a /metrics page."""
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.status == 200
        text = response.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families: dict, sample_name: str, **labels: str) -> float:
    """The one sample called sample_name whose labels include `labels`."""
    found = [
        s.value
        for family in families.values()
        for s in family.samples
        if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, (sample_name, labels, found)
    return found[0]


def closed(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2)
    except (urllib.error.URLError, ConnectionError):
        return True
    return False


def filled_metrics() -> Metrics:
    m = Metrics()
    m.observe_throughput(64, 2.0, steps=4)
    m.observe_train_ce(2.5)
    m.last_ce = 2.75
    m.add_sent(1000, raw_bytes=4000)
    m.add_received(600, raw_bytes=2400)
    m.reject("stale_round")
    m.reject("stale_round")
    m.reject("invalid")
    m.observe_exchange(0.02)
    m.observe_exchange(0.3)
    m.observe_round(4.0)
    m.observe_peers([("a", 0), ("b", 0), ("c", 1)])
    m.end_round(0.5, 1.0)
    return m


def test_the_endpoint_serves_every_metric_with_conventional_names_and_labels():
    server = MetricsServer(MetricsCollector(filled_metrics(), "swarm-a", 1, "peer-xyz", "9.9"))
    server.start("127.0.0.1", 0)
    try:
        assert server.port > 0 and server.url == f"http://127.0.0.1:{server.port}/metrics"
        families = scrape(server.url)
    finally:
        server.stop()
    assert closed(server.url or f"http://127.0.0.1:{server.port}/metrics") and server.url == ""
    kinds = {name: f.type for name, f in families.items()}
    assert all(kinds[f"blocktrain_{n}"] == "counter" for n in COUNTERS)
    assert all(kinds[f"blocktrain_{n}"] == "gauge" for n in GAUGES)
    assert all(kinds[f"blocktrain_{n}"] == "histogram" for n in HISTOGRAMS)
    assert kinds["blocktrain_peer_info"] == "gauge"  # an info metric, as the text format 0.0.4 writes it
    own = {"swarm_id": "swarm-a", "block": "1"}
    for family in families.values():  # every sample says which swarm and (but peers) which block
        for s in family.samples:
            assert s.labels["swarm_id"] == "swarm-a", s
            if family.name != "blocktrain_peers":
                assert s.labels["block"] == "1", s
    assert value(families, "blocktrain_peer_info", peer_id="peer-xyz", version="9.9", **own) == 1
    assert value(families, "blocktrain_rounds_total") == 1
    assert value(families, "blocktrain_steps_total") == 4
    assert value(families, "blocktrain_samples_per_second") == pytest.approx(32.0)
    assert value(families, "blocktrain_train_ce") == 2.5 and value(families, "blocktrain_eval_ce") == 2.75
    assert value(families, "blocktrain_participation") == 0.5
    assert math.isnan(value(families, "blocktrain_consensus_distance"))  # unknown until measured
    assert value(families, "blocktrain_sent_bytes_total", encoding="wire") == 1000
    assert value(families, "blocktrain_sent_bytes_total", encoding="raw") == 4000
    assert value(families, "blocktrain_received_bytes_total", encoding="wire") == 600
    assert value(families, "blocktrain_received_bytes_total", encoding="raw") == 2400
    reasons = {s.labels["reason"]: s.value for s in families["blocktrain_rejected_payloads"].samples}
    assert reasons == {r: {"stale_round": 2, "invalid": 1}.get(r, 0) for r in REJECT_REASONS}  # all known, from 0
    assert value(families, "blocktrain_exchange_duration_seconds_count") == 2
    assert value(families, "blocktrain_exchange_duration_seconds_sum") == pytest.approx(0.32)
    assert value(families, "blocktrain_exchange_duration_seconds_bucket", le="0.025") == 1
    assert value(families, "blocktrain_exchange_duration_seconds_bucket", le="0.5") == 2
    assert value(families, "blocktrain_exchange_duration_seconds_bucket", le="+Inf") == 2
    assert value(families, "blocktrain_round_duration_seconds_count") == 1
    peers = {s.labels["block"]: s.value for s in families["blocktrain_peers"].samples}
    assert peers == {"0": 2, "1": 1}


def test_two_servers_in_one_process_keep_separate_registries():
    first, second = Metrics(), Metrics()
    first.add_sent(111)
    second.add_sent(222)
    servers = [MetricsServer(MetricsCollector(m, "s", b)) for b, m in enumerate((first, second))]
    try:
        ports = [s.start("127.0.0.1", 0) for s in servers]
        a, b = (scrape(s.url) for s in servers)
    finally:
        for s in servers:
            s.stop()
    assert ports[0] != ports[1]
    assert value(a, "blocktrain_sent_bytes_total", encoding="wire", block="0") == 111
    assert value(b, "blocktrain_sent_bytes_total", encoding="wire", block="1") == 222
    assert REGISTRY.get_sample_value("blocktrain_rounds_total") is None  # never the global registry


def test_a_taken_port_is_a_config_error_naming_it():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = MetricsServer(MetricsCollector(Metrics(), "s", 0))
        with pytest.raises(ConfigError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            server.start("127.0.0.1", port)
    server.stop()  # nothing started: a no-op
    with pytest.raises(ConfigError, match="metrics_port must be in"):
        NetConfig(metrics_port=70000)


def test_gossip_counts_rejected_payloads_by_reason():
    async def scenario():
        (g,), _, _ = memory_swarm([0], codec="fp32")
        await g.open_round()
        await g.publish()
        rs = g.current
        zeros = {k: torch.zeros(v) for k, v in g.state.block_shapes().items()}
        # intruders sign, and hold signed records: the reasons below count (one intruder per payload: a peer gets
        # one delta per round and kind judged)
        intruders = [Identity.generate(bytes([99 - i]) * 32) for i in range(4)]
        g.remember([sign_record(replace(g.record(), peer_id=i.peer_id, address="mem:x"), i, 300) for i in intruders])
        hdr = dict(swarm_id="test", config_hash=g.me.config_hash, kind=BLOCK, block_index=0)
        bad = [
            encode(zeros, "fp32", round=7, base_hash=rs.hashes[BLOCK], **hdr),  # far ahead: stale_round
            encode(zeros, "fp32", round=rs.round, base_hash="other", **hdr),  # answered, but base_mismatch
            encode(zeros, "fp32", round=rs.round, base_hash=rs.hashes[BLOCK], **{**hdr, "block_index": 1}),
            # another swarm: invalid
            encode(zeros, "fp32", round=rs.round, base_hash=rs.hashes[BLOCK], **{**hdr, "swarm_id": "other"}),
        ]
        for intruder, enc in zip(intruders, bad, strict=True):
            enc.header.peer_id = intruder.peer_id
            try:
                await g.handle_exchange(sign_payload(enc, intruder))
            except SwarmdError:
                pass
        await g.average([])
        return g.metrics

    m = asyncio.run(scenario())
    assert m.rejected_by_reason == {"stale_round": 1, "base_mismatch": 1, "wrong_block": 1, "invalid": 1}
    assert m.rejected == 4


def test_two_daemons_serve_their_own_metrics_and_the_counters_move_after_a_round(tmp_path):
    configs = [daemon_config(tmp_path, 0, seed=i, discovery="static") for i in range(2)]
    configs = [replace(c, net=replace(c.net, metrics_port=0)) for c in configs]

    async def scenario():
        async with running(*configs) as daemons:
            addresses = [d.server.address for d in daemons]
            for d in daemons:
                d.discovery.addresses = addresses
            urls = [d.metrics_url for d in daemons]
            before = [await asyncio.to_thread(scrape, u) for u in urls]
            await asyncio.wait_for(asyncio.gather(*(d.run_round() for d in daemons)), 60)
            after = [await asyncio.to_thread(scrape, u) for u in urls]
            peer_ids = [d.peer_id for d in daemons]
        return urls, before, after, peer_ids, daemons

    urls, before, after, peer_ids, daemons = asyncio.run(scenario())
    assert urls[0] != urls[1] and all(u.startswith("http://127.0.0.1:") for u in urls)
    assert all(closed(u) for u in urls) and all(d.metrics_url == "" for d in daemons)  # stopped with the daemon
    for pid, b, a in zip(peer_ids, before, after, strict=True):
        assert value(b, "blocktrain_peer_info", peer_id=pid, swarm_id="test", block="0") == 1  # its own registry
        assert value(b, "blocktrain_rounds_total") == 0 and value(a, "blocktrain_rounds_total") == 1
        assert value(b, "blocktrain_steps_total") == 0 and value(a, "blocktrain_steps_total") == 2
        assert value(a, "blocktrain_round_duration_seconds_count") == 1
        assert value(a, "blocktrain_samples_per_second") > 0
        assert 0 < value(a, "blocktrain_train_ce") < 10 and math.isnan(value(a, "blocktrain_eval_ce"))
        assert value(a, "blocktrain_participation") == 1.0
        for direction in ("sent", "received"):
            for encoding in ("wire", "raw"):
                name = f"blocktrain_{direction}_bytes_total"
                assert value(a, name, encoding=encoding) > value(b, name, encoding=encoding) == 0
        assert value(a, "blocktrain_peers", block="0") == 2
    # one side of the pair dials both kinds (block, embedding); the other answers
    dialled = sorted(value(a, "blocktrain_exchange_duration_seconds_count") for a in after)
    assert dialled == [0, 2]


def test_the_runner_prints_the_metrics_url_and_the_cli_refuses_a_bad_port(tmp_path):
    config = daemon_config(tmp_path, 0, discovery="static", max_rounds=1)
    lines: list[str] = []
    run_foreground(replace(config, net=replace(config.net, metrics_port=0)), echo=lines.append)
    (url,) = [line.removeprefix("metrics: ") for line in lines if line.startswith("metrics: ")]
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics") and closed(url)
    assert lines.index(f"metrics: {url}") < lines.index("ready")
    plain: list[str] = []
    run_foreground(config, echo=plain.append)  # off by default: no line, no server
    assert not any(line.startswith("metrics:") for line in plain)
    data = str(tmp_path / "train.txt")
    bad = CliRunner().invoke(app, ["run", "--data", data, "--static", "--metrics-port", "70000"])
    assert bad.exit_code == 2 and "--metrics-port must be in [0, 65535]" in bad.output, bad.output
    assert "Traceback" not in bad.output
    help_text = " ".join(CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"}).output.split())
    assert "--metrics-port" in help_text
