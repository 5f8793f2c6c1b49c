"""Why nothing merges: one line naming the cause when a peer's rounds keep merging nothing for a known reason.

A peer that can talk to nobody of its swarm gets no error from any single call: its rounds merge nothing
(participation 0.00) or, when no record is of its swarm and config, expect nobody (participation 1.00). What
each side sees, per cause (tests/test_diagnosis.py runs the key cases with real daemons):
  - the dialling side of a private swarm's refusal gets UNAUTHENTICATED, its class naming why:
    SwarmKeyRequired (it has no key), SwarmKeyMismatch (another key), Unauthenticated (a stale, replayed or
    malformed proof); the refusing side's gossip sees nothing, only its server's interceptor counts the
    refusals (Metrics.refused_calls); a keyed peer dialling a public one is answered (a proof nobody asked for
    is ignored), so a key on one side only fails the pairs in which the public peer dials;
  - a peer of another model config (same swarm id) is found in the DHT but never expected (its records are
    filtered by config hash): the rounds expect nobody;
  - a peer of another swarm id is never found through the DHT (its keys are scoped by the swarm id); static
    discovery sees its status and drops it (StaticDiscovery.foreign).
Each round the daemon hands its MergeReport to a Watch (observe_report makes it a RoundOutcome, round_outcome);
diagnose() names the cause shared by the last `rounds` rounds in which nothing merged although there were peers
to talk to (a round that merged anything ends the streak, a round with nobody at all neither counts nor ends it),
or for a peer given peers to join through that has found nobody at all for `rounds` rounds and alone_s seconds,
the swarm id. Failures without a known
cause (timeouts, stale rounds while catching up, peers gone) name nothing: "" is fine.
The Watch says what the daemon does with a line: stop (swarmd.errors.NothingMerges, exit code 3; a clean
shutdown) when the peer joined through peers and has merged nothing in this run, unless keep_trying; else a
warning, once per `rounds` rounds and at most every warn_gap_s. A founding peer, or one that merged before,
only warns: a stranger with another key or config never stops a running swarm. Pure: no I/O, no torch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from swarmd.membership.discovery import StaticDiscovery
from swarmd.membership.records import PeerRecord
from swarmd.metrics import Metrics, failure_reason
from swarmd.node.config import DaemonConfig

if TYPE_CHECKING:  # (at run time this module loads no torch)
    from swarmd.averaging.round import MergeReport

ROUNDS = 3  # failed rounds in a row (with peers to talk to) before a cause is named
ALONE_S = 30.0  # ... and, for a joiner that found nobody at all, this long since its first round
WARN_GAP_S = 30.0  # a repeated warning waits this long after the last one (and `rounds` rounds)
HISTORY = 32  # rounds kept
KEY_REFUSALS = ("swarm_key_required", "swarm_key_mismatch", "unauthenticated")  # swarmd.metrics.failure_reason's


@dataclass(frozen=True)
class RoundOutcome:
    """What one round showed of the swarm: whether anything merged, whom the lookup found, which calls failed."""

    expected: int = 0  # (peer, kind) deltas expected
    accepted: int = 0  # ... and accepted
    ours: int = 0  # other peers found of our swarm id and model config (banned ones included)
    other_configs: tuple[str, ...] = ()  # config hash of each other peer found of our swarm id and another config
    other_swarms: tuple[str, ...] = ()  # swarm id of each peer found of another swarm (static discovery)
    dial_failures: Mapping[str, int] = field(default_factory=dict)  # our failed calls (swarmd.metrics.failure_reason)
    refused_calls: Mapping[str, int] = field(default_factory=dict)  # calls our server refused for their proof
    at_s: float = 0.0  # when (the peer's uptime)

    @property
    def talked(self) -> bool:
        """Whether there was anybody to talk to: a peer found, a call failed or refused."""
        return bool(self.ours or self.other_configs or self.other_swarms or self.dial_failures or self.refused_calls)


@dataclass(frozen=True)
class PeerFacts:
    """What diagnose() knows of the peer itself."""

    swarm_id: str
    config_hash: str
    has_key: bool  # runs with a swarm key
    joined: bool  # given peers to join through (not the first peer of its swarm)


def round_outcome(
    expected: int,
    accepted: int,
    records: Iterable[PeerRecord],
    me: PeerRecord,
    dial_failures: Mapping[str, int] = {},
    refused_calls: Mapping[str, int] = {},
    at_s: float = 0.0,
    foreign: Iterable[PeerRecord] = (),
) -> RoundOutcome:
    """The RoundOutcome of a round that merged `accepted` of `expected` deltas, with the round's lookup `records`,
    the failures counted during it and `foreign`, records of other swarm ids a static discovery dropped."""
    others = {r.peer_id: r for r in [*records, *foreign] if r.peer_id != me.peer_id}.values()
    return RoundOutcome(
        expected=expected,
        accepted=accepted,
        ours=sum(r.swarm_id == me.swarm_id and r.config_hash == me.config_hash for r in others),
        other_configs=tuple(
            r.config_hash for r in others if r.swarm_id == me.swarm_id and r.config_hash != me.config_hash
        ),
        other_swarms=tuple(r.swarm_id for r in others if r.swarm_id != me.swarm_id),
        dial_failures=dict(dial_failures),
        refused_calls=dict(refused_calls),
        at_s=at_s,
    )


def counts_since(now: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    """The counts added to `now` since `before` (both running totals by reason)."""
    return {k: n - before.get(k, 0) for k, n in now.items() if n > before.get(k, 0)}


def _key_cause(dialled: Counter[str], refused: Counter[str], has_key: bool) -> str:
    """A private swarm's refusal the failed rounds share ("" for none)."""
    if dialled["swarm_key_required"] and not has_key:
        return "the peers require a swarm key and this peer has none (pass --swarm-key FILE with the swarm's key)"
    if dialled["swarm_key_mismatch"] or refused["swarm_key_mismatch"]:
        return "this peer's swarm key differs from theirs (pass --swarm-key with the swarm's own key file)"
    if refused["swarm_key_required"] and has_key:
        return (
            "the peers have no swarm key and this peer has one (their calls carry no proof of it): drop "
            "--swarm-key (and BLOCKTRAIN_SWARM_KEY) to join a public swarm, or give every peer the same key"
        )
    if dialled["unauthenticated"]:
        return "the peers refuse this peer's proofs of the swarm key as stale or malformed (do the clocks agree?)"
    return ""


def diagnose(
    outcomes: Sequence[RoundOutcome],
    facts: PeerFacts,
    *,
    rounds: int = ROUNDS,
    alone_s: float = ALONE_S,
    seen_peers: bool | None = None,
) -> str:
    """Why the last rounds merged nothing, in one line ("" when fine or when no cause is known; see the module doc).

    :param outcomes: the rounds of this run, oldest first (the first one at least while no peer was ever seen)
    :param seen_peers: whether this run ever had anybody to talk to (default: whether one of `outcomes` did)
    """
    failed: list[RoundOutcome] = []
    for o in reversed(outcomes):
        if o.accepted:
            break
        if o.talked:
            failed.append(o)
    n = len(failed)
    if n >= rounds:
        dialled = Counter[str]()
        refused = Counter[str]()
        for o in failed:
            dialled.update(o.dial_failures)
            refused.update(o.refused_calls)
        if cause := _key_cause(dialled, refused, facts.has_key):
            verb = "was refused" if any(dialled[k] for k in KEY_REFUSALS) else "failed"
            return f"every exchange {verb} for {n} rounds: {cause}"
        if not any(o.ours for o in failed):  # records exist, but none of our swarm and config
            configs = Counter(h for o in failed for h in o.other_configs)
            swarms = Counter(s for o in failed for s in o.other_swarms)
            if configs:
                theirs = configs.most_common(1)[0][0]
                return (
                    f"nothing merged for {n} rounds: the peers found run another model config (config hash {theirs}, "
                    f"ours {facts.config_hash}): `blocktrain join` takes the swarm's config"
                )
            if swarms:
                theirs = swarms.most_common(1)[0][0]
                return (
                    f"nothing merged for {n} rounds: the peers found run another swarm id ({theirs!r}, ours "
                    f"{facts.swarm_id!r}): pass --swarm-id {theirs}"
                )
    if seen_peers is None:
        seen_peers = any(o.talked for o in outcomes)
    if facts.joined and not seen_peers and len(outcomes) >= rounds:
        took = outcomes[-1].at_s - outcomes[0].at_s
        if took >= alone_s:
            return (
                f"no peer of swarm {facts.swarm_id!r} was found through the peers given in {took:.0f} s: do they run "
                "another --swarm-id (their `join with:` line shows it)?"
            )
    return ""


class Verdict(NamedTuple):
    line: str  # the diagnosis
    stop: bool  # stop the peer with it (else: warn)


class Watch:
    """One run's rounds, diagnosed after each (see the module doc).

    :param keep_trying: never stop: warn once per `rounds` rounds (and warn_gap_s) instead
    """

    def __init__(
        self,
        facts: PeerFacts,
        *,
        keep_trying: bool = False,
        rounds: int = ROUNDS,
        alone_s: float = ALONE_S,
        warn_gap_s: float = WARN_GAP_S,
    ):
        self.facts, self.keep_trying = facts, keep_trying
        self.rounds, self.alone_s, self.warn_gap_s = rounds, alone_s, warn_gap_s
        self.outcomes: list[RoundOutcome] = []
        self.merged = False  # a delta was accepted in this run
        self.seen_peers = False  # somebody was there to talk to in this run
        self.observed = 0  # rounds observed
        self._warned: tuple[int, float] | None = None  # (rounds observed, at_s) of the last warning of this streak
        self._totals: tuple[dict[str, int], dict[str, int]] = ({}, {})  # failure totals at the last observe_totals

    @classmethod
    def of_peer(cls, config: DaemonConfig, has_key: bool) -> Watch:
        """The Watch of a daemon's run: its swarm id, model config, whether it joined through peers; keep_trying from
        the config, alone_s twice the record TTL. :param has_key: the peer runs with a swarm key"""
        net = config.net
        facts = PeerFacts(net.swarm_id, config.model.config_hash(), has_key, bool(net.initial_peers))
        return cls(facts, keep_trying=config.keep_trying, alone_s=2 * net.record_ttl_s)

    def observe(self, outcome: RoundOutcome) -> Verdict | None:
        """Add a round; what to do now (None: nothing to say this round)."""
        self.observed += 1
        self.merged |= outcome.accepted > 0
        self.seen_peers |= outcome.talked
        self.outcomes.append(outcome)
        if len(self.outcomes) > HISTORY:  # while nobody was seen, the first round stays (the time alone)
            recent = self.outcomes[-HISTORY + (not self.seen_peers) :]
            self.outcomes = recent if self.seen_peers else [self.outcomes[0], *recent]
        line = diagnose(self.outcomes, self.facts, rounds=self.rounds, alone_s=self.alone_s, seen_peers=self.seen_peers)
        if not line:
            self._warned = None
            return None
        if not self.keep_trying and self.facts.joined and not self.merged:
            return Verdict(line, stop=True)
        warned = self._warned
        if warned is None or (self.observed - warned[0] >= self.rounds and outcome.at_s - warned[1] >= self.warn_gap_s):
            self._warned = (self.observed, outcome.at_s)
            return Verdict(line, stop=False)
        return None

    def observe_totals(
        self,
        expected: int,
        accepted: int,
        records: Iterable[PeerRecord],
        me: PeerRecord,
        totals: tuple[Mapping[str, int], Mapping[str, int], float],
        skipped: Iterable[str] = (),
        foreign: Iterable[PeerRecord] = (),
    ) -> Verdict | None:
        """observe() the round that just ended (round_outcome's arguments) from running totals: `totals` is
        (dial failures, refused calls, at_s), swarmd.metrics.Metrics' counts by reason and uptime; the round's are
        what they gained since the last call, plus `skipped`, the reasons a static discovery skipped peers."""
        dial_failures, refused_calls, at_s = totals
        failures = counts_since(dial_failures, self._totals[0])
        for reason in skipped:
            failures[reason] = failures.get(reason, 0) + 1
        refusals = counts_since(refused_calls, self._totals[1])
        self._totals = (dict(dial_failures), dict(refused_calls))
        return self.observe(round_outcome(expected, accepted, records, me, failures, refusals, at_s, foreign))

    def observe_report(
        self, report: MergeReport, records: Iterable[PeerRecord], me: PeerRecord, metrics: Metrics, discovery: object
    ) -> Verdict | None:
        """observe_totals() the round `report` merged, from the peer's running `metrics` and, with a StaticDiscovery,
        the peers its last lookup skipped (and why) and the foreign ones it dropped."""
        foreign: Sequence[PeerRecord] = []
        skipped: list[str] = []
        if isinstance(discovery, StaticDiscovery):  # the peers its last lookup skipped, and why
            foreign, skipped = discovery.foreign, [failure_reason(e) for e in discovery.failures.values()]
        expected = len(report.expected_block) + len(report.expected_emb)
        accepted = len(report.accepted_block) + len(report.accepted_emb)
        totals = (metrics.dial_failures, metrics.refused_calls, metrics.uptime_s)
        return self.observe_totals(expected, accepted, records, me, totals, skipped, foreign)
