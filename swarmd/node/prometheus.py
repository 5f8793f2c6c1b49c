"""Prometheus endpoint of one peer: a per-daemon CollectorRegistry read from its Metrics at scrape time.

Owns the metric names (Prometheus conventions: `blocktrain_` prefix, `_total` counters, `_seconds`
and `_bytes` units) and the HTTP server that serves them (prometheus_client's own WSGI server, on a
daemon thread). Every daemon has its own registry, never prometheus_client's global REGISTRY, so
several daemons in one process (tests, benchmarks) do not collide. Nothing is copied on the hot
path: MetricsCollector turns swarmd.metrics.Metrics into metric families when scraped.

Every sample carries `swarm_id` and `block` (the block this peer trains), except blocktrain_peers,
whose `block` is the block the counted peers train. The only module that imports prometheus_client.
Starts one thread (the HTTP server) between MetricsServer.start() and stop(); start_metrics_server
starts a daemon's from its NetConfig (--metrics-port).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from swarmd.errors import ConfigError
from swarmd.metrics import REJECT_REASONS, Histogram, Metrics
from swarmd.node.config import NetConfig
from swarmd.node.http_endpoint import HttpEndpoint

PREFIX = "blocktrain"


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


class MetricsCollector(Collector):
    """Metric families of one peer's Metrics, labelled with its swarm id and block.

    :param metrics: the peer's Metrics (read, never written)
    :param swarm_id: swarm name, on every sample
    :param block_index: the block this peer trains, on every sample but blocktrain_peers
    :param peer_id: the peer's id (only in blocktrain_peer_info)
    """

    def __init__(self, metrics: Metrics, swarm_id: str, block_index: int, peer_id: str = "", version: str = ""):
        self.metrics, self.peer_id, self.version = metrics, peer_id, version
        self.label_names = ["swarm_id", "block"]
        self.label_values = [swarm_id, str(block_index)]

    def set_block(self, block_index: int) -> None:
        """Label the samples with another block (the peer moved: swarmd.membership.balance)."""
        self.label_values = [self.label_values[0], str(block_index)]

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=self.label_names)
        family.add_metric(self.label_values, value)
        return family

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=self.label_names)
        family.add_metric(self.label_values, value)
        return family

    def _histogram(self, name: str, doc: str, hist: Histogram) -> HistogramMetricFamily:
        family = HistogramMetricFamily(f"{PREFIX}_{name}", doc, labels=self.label_names)
        family.add_metric(self.label_values, [(_le(b), n) for b, n in hist.cumulative()], hist.sum)
        return family

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        info = InfoMetricFamily(f"{PREFIX}_peer", "This peer: id, swarm, block and software version.")
        info.add_metric(
            [],
            {
                "peer_id": self.peer_id,
                "version": self.version,
                **dict(zip(self.label_names, self.label_values, strict=True)),
            },
        )
        yield info
        yield self._counter("rounds", "Averaging rounds this process merged.", m.rounds)
        yield self._counter("steps", "Local optimiser steps this process took.", m.steps)
        yield self._gauge("samples_per_second", "Training throughput (EMA), sequences per second.", m.samples_per_s)
        yield self._gauge(
            "train_ce", "Mean training CE of the last round's local steps, nats per byte.", m.last_train_ce
        )
        yield self._gauge("eval_ce", "Last held-out from-noise CE of the assembled model, nats per byte.", m.last_ce)
        yield self._gauge(
            "participation", "Fraction of the expected peers' deltas accepted in the last round.", m.last_participation
        )
        yield self._gauge(
            "consensus_distance", "Max relative distance to same-block peers at our round.", m.consensus_distance
        )
        yield self._gauge("start_time_seconds", "Unix time the daemon started.", m.started_wall)
        for direction, what, wire, raw in (
            ("sent", "Gossip and state bytes sent", m.bytes_sent, m.raw_bytes_sent),
            ("received", "Gossip and state bytes received", m.bytes_received, m.raw_bytes_received),
            ("pulled", "Other blocks' states pulled (of those received)", m.bytes_pulled, m.raw_bytes_pulled),
        ):
            family = CounterMetricFamily(
                f"{PREFIX}_{direction}_bytes",
                f"{what}: encoding=wire (codec + zstd) or raw (fp32 before the codec).",
                labels=[*self.label_names, "encoding"],
            )
            family.add_metric([*self.label_values, "wire"], wire)
            family.add_metric([*self.label_values, "raw"], raw)
            yield family
        rejected = CounterMetricFamily(
            f"{PREFIX}_rejected_payloads",
            "Payloads refused by gossip, by reason.",
            labels=[*self.label_names, "reason"],
        )
        by_reason = dict(m.rejected_by_reason)
        for reason in sorted(set(REJECT_REASONS) | set(by_reason)):
            rejected.add_metric([*self.label_values, reason], by_reason.get(reason, 0))
        yield rejected
        yield self._counter("merge_checks", "Merges scored on the held-out sample before landing.", m.merge_checks)
        yield self._counter(
            "merge_fallbacks",
            "Merges that scored above their bound and fell back to the deltas that pass.",
            m.merge_fallbacks,
        )
        yield self._counter(
            "merge_refused_deltas", "Peer deltas the held-out check kept out of a merge.", m.merge_refused
        )
        refused = CounterMetricFamily(
            f"{PREFIX}_adoptions_refused",
            "Pulled states the held-out check refused to adopt, by part.",
            labels=[*self.label_names, "part"],
        )
        for part in ("block", "embedding"):
            refused.add_metric([*self.label_values, part], dict(m.adoptions_refused).get(part, 0))
        yield refused
        yield self._histogram(
            "exchange_duration_seconds", "Wall time of the delta exchanges this peer dialled.", m.exchange_s
        )
        yield self._histogram("round_duration_seconds", "Wall time of whole rounds (sync to publish).", m.round_s)
        peers = GaugeMetricFamily(
            f"{PREFIX}_peers",
            "Peers seen per block in the last discovery lookup (self included).",
            labels=self.label_names,
        )
        for block, n in dict(m.peers_per_block).items():
            peers.add_metric([self.label_values[0], str(block)], n)
        yield peers


class MetricsServer(HttpEndpoint):
    """A per-daemon registry and the HTTP server exposing it at http://HOST:PORT/metrics.

    :param collector: what the registry serves (a MetricsCollector)
    """

    path = "/metrics"

    def __init__(self, collector: Collector):
        super().__init__()
        self.collector = collector
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)

    def set_block(self, block_index: int) -> None:
        """The block label of every sample from now on (a MetricsCollector's; other collectors have none)."""
        if isinstance(self.collector, MetricsCollector):
            self.collector.set_block(block_index)

    def start(self, host: str, port: int) -> int:
        """Serve on host:port (port 0 = any free port); returns the bound port.

        :raises ConfigError: the port is taken or the host cannot be bound
        """
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from None
        self.host, self.port = host, int(self._server.server_port)
        return self.port


def start_metrics_server(metrics: Metrics, net: NetConfig, block_index: int, peer_id: str) -> MetricsServer | None:
    """A daemon's Prometheus endpoint, serving on the --listen host at net.metrics_port (None: off, no server;
    0: any free port). :raises ConfigError: the port is taken or the host cannot be bound"""
    if net.metrics_port is None:
        return None
    from swarmd import __version__

    server = MetricsServer(MetricsCollector(metrics, net.swarm_id, block_index, peer_id, __version__))
    server.start(net.listen.rpartition(":")[0].strip("[]"), net.metrics_port)
    return server
