"""Metrics of one peer: samples/s EMA, training CE, byte counters, participation, round history, uptime.

Pure bookkeeping (swarmd.swarm.metrics.Metrics): every expected value below is computed by hand.
"""

from __future__ import annotations

import math
import time

import pytest

from swarmd.swarm.metrics import Metrics


def test_throughput_starts_at_the_first_rate_then_follows_an_ema():
    m = Metrics(alpha=0.2)
    assert m.samples_per_s == 0.0
    m.observe_throughput(100, 1.0)
    assert m.samples_per_s == pytest.approx(100.0)  # first observation: the rate itself, no decay from 0
    m.observe_throughput(400, 2.0)  # 200/s: 0.8 * 100 + 0.2 * 200
    assert m.samples_per_s == pytest.approx(120.0)
    m.observe_throughput(30, 0.5)  # 60/s: 0.8 * 120 + 0.2 * 60
    assert m.samples_per_s == pytest.approx(108.0)


def test_throughput_ema_uses_alpha_and_survives_a_zero_duration():
    m = Metrics(alpha=0.5)
    m.observe_throughput(10, 1.0)
    m.observe_throughput(30, 1.0)
    assert m.samples_per_s == pytest.approx(20.0)  # 0.5 * 10 + 0.5 * 30
    m.observe_throughput(5, 0.0)  # no ZeroDivisionError; a huge but finite rate
    assert math.isfinite(m.samples_per_s) and m.samples_per_s > 1e6


def test_byte_counters_add_up():
    m = Metrics()
    assert (m.bytes_sent, m.raw_bytes_sent, m.bytes_received) == (0, 0, 0)
    m.add_sent(100, raw_bytes=400)
    m.add_sent(50)  # raw bytes default to 0 (e.g. a state upload, not a compressed delta)
    m.add_received(70)
    m.add_received(30)
    assert (m.bytes_sent, m.raw_bytes_sent, m.bytes_received) == (150, 400, 100)
    assert all(isinstance(v, int) for v in (m.bytes_sent, m.raw_bytes_sent, m.bytes_received))


def test_train_ce_keeps_the_last_measured_value():
    m = Metrics()
    assert math.isnan(m.last_train_ce)
    m.observe_train_ce(2.5)
    m.observe_train_ce(float("nan"))  # a round without local steps: nothing new to report
    assert m.last_train_ce == 2.5
    m.observe_train_ce(2.25)
    assert m.last_train_ce == 2.25


def test_participation_is_the_mean_over_merged_rounds():
    m = Metrics()
    assert m.rounds == 0 and m.participation == 1.0  # before the first round
    m.end_round(1.0, 2.0)
    m.end_round(0.5, 3.0)
    m.end_round(0.0, 4.0)
    assert m.rounds == 3
    assert m.participation == pytest.approx(0.5)  # (1 + 0.5 + 0) / 3
    assert m.last_round_s == 4.0


def test_round_history_keeps_the_extras_and_only_the_last_50_rounds():
    m = Metrics()
    m.end_round(0.75, 1.5, round=1, accepted=3)
    assert m.round_history == [{"participation": 0.75, "seconds": 1.5, "round": 1, "accepted": 3}]
    for i in range(2, 121):
        m.end_round(1.0, 0.1, round=i)
    assert m.rounds == 120
    assert len(m.round_history) == 50
    assert [r["round"] for r in m.round_history] == list(range(71, 121))  # oldest dropped first
    assert m.participation == pytest.approx((0.75 + 119) / 120)  # the mean covers every round, not the kept ones


def test_uptime_counts_from_start():
    m = Metrics(started=time.monotonic() - 5.0)
    assert 5.0 <= m.uptime_s < 60.0
    first = m.uptime_s
    assert m.uptime_s >= first
    fresh = Metrics()
    assert 0.0 <= fresh.uptime_s < 60.0
    assert math.isnan(fresh.last_ce) and math.isnan(fresh.consensus_distance)  # unknown until measured
