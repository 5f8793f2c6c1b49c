"""Metrics of one peer: samples/s EMA, steps, training CE, byte counters, rejections by reason, histograms,
peers per block, participation, round history, uptime.

Pure bookkeeping (swarmd.metrics.Metrics): every expected value below is computed by hand.
"""

from __future__ import annotations

import math
import time

import pytest

from swarmd.errors import (
    BaseMismatch,
    ConfigMismatch,
    DataError,
    PeerRejected,
    StaleRound,
    SwarmdError,
    ValidationError,
    WrongBlock,
)
from swarmd.metrics import REJECT_REASONS, Histogram, Metrics, reject_reason


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
    assert (m.bytes_sent, m.raw_bytes_sent, m.bytes_received, m.raw_bytes_received) == (0, 0, 0, 0)
    m.add_sent(100, raw_bytes=400)
    m.add_sent(50)  # raw bytes default to 0 (e.g. a state upload, not a compressed delta)
    m.add_received(70, raw_bytes=280)
    m.add_received(30)
    assert (m.bytes_sent, m.raw_bytes_sent, m.bytes_received, m.raw_bytes_received) == (150, 400, 100, 280)
    counters = (m.bytes_sent, m.raw_bytes_sent, m.bytes_received, m.raw_bytes_received)
    assert all(isinstance(v, int) for v in counters)


def test_steps_add_up_with_each_round_of_training():
    m = Metrics()
    m.observe_throughput(8, 1.0, steps=2)
    m.observe_throughput(4, 1.0)  # steps default to 0: the EMA alone
    m.observe_throughput(12, 1.0, steps=3)
    assert m.steps == 5


def test_rejections_are_counted_by_reason_and_sum_to_the_total():
    m = Metrics()
    for reason in ("stale_round", "invalid", "stale_round"):
        m.reject(reason)
    assert m.rejected == 3
    assert m.rejected_by_reason == {"stale_round": 2, "invalid": 1}


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (StaleRound("x"), "stale_round"),
        (BaseMismatch("x"), "base_mismatch"),
        (WrongBlock("x"), "wrong_block"),
        (ConfigMismatch("x"), "other"),  # gossip refuses another swarm or config as an invalid payload
        (ValidationError("x"), "invalid"),
        (PeerRejected("x"), "invalid"),  # a ValidationError subclass
        (DataError("x"), "other"),
        (SwarmdError("x"), "other"),
    ],
)
def test_reject_reason_names_the_error_class(error, reason):
    assert reject_reason(error) == reason
    assert reason in REJECT_REASONS


def test_histogram_buckets_are_upper_bounds_and_cumulative():
    h = Histogram((0.1, 1.0, 10.0))
    for v in (0.05, 0.1, 0.5, 1.0, 3.0, 50.0):
        h.observe(v)
    assert h.counts == [2, 2, 1, 1]  # a value equal to a bound counts in that bound's bucket (le)
    assert h.cumulative() == [(0.1, 2), (1.0, 4), (10.0, 5), (math.inf, 6)]
    assert h.count == 6 and h.sum == pytest.approx(54.65)
    with pytest.raises(ValueError, match="strictly increasing"):
        Histogram((1.0, 0.5))


def test_exchange_and_round_durations_go_to_their_own_histograms():
    m = Metrics()
    m.observe_exchange(0.02)
    m.observe_exchange(0.3)
    m.observe_round(4.0)
    assert (m.exchange_s.count, m.round_s.count) == (2, 1)
    assert m.exchange_s.sum == pytest.approx(0.32) and m.round_s.sum == pytest.approx(4.0)


def test_peers_per_block_counts_distinct_peers_of_the_last_lookup():
    m = Metrics()
    m.observe_peers([("a", 0), ("b", 0), ("a", 0), ("c", 2)])  # "a" twice (two records): one peer
    assert m.peers_per_block == {0: 2, 2: 1}
    m.observe_peers([("a", 1)])  # the last lookup replaces the previous one
    assert m.peers_per_block == {1: 1}


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
    assert m.rounds == 0 and m.participation == 1.0 and math.isnan(m.last_participation)  # before the first round
    m.end_round(1.0, 2.0)
    m.end_round(0.5, 3.0)
    m.end_round(0.0, 4.0)
    assert m.rounds == 3
    assert m.participation == pytest.approx(0.5)  # (1 + 0.5 + 0) / 3
    assert m.last_participation == 0.0
    assert m.last_round_s == 4.0


def test_round_history_keeps_the_extras_and_only_the_last_50_rounds():
    m = Metrics()
    m.end_round(0.75, 1.5, round=1, accepted=3)
    first = {"participation": 0.75, "seconds": 1.5, "train_s": 0.0, "round": 1, "accepted": 3, "steps": 0}
    assert m.round_history == [first]
    m.observe_throughput(32, 0.25, 4)  # a round's local steps: its entry says how long they took, and how many
    m.end_round(1.0, 0.1, round=2)
    assert (m.round_history[-1]["train_s"], m.round_history[-1]["steps"]) == (0.25, 4)
    for i in range(3, 121):
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
