"""What a new identity must do before it counts, and how many identities of one network count.

Anyone can make Ed25519 identities for free, so in a public swarm a count of signed records or deltas is a count of
keys, not of people. Two pure rules make a key cost something (the third, a proof of work on the key, is
swarmd.membership.pow):
  - Probation: an identity first seen at some round counts (its records towards a quorum, its deltas in the
    normal merge) only after it passed the one-by-one held-out check of `rounds_required` distinct rounds
    (swarmd.averaging's loss-checked merge reports who passed and who failed). Until then its deltas still merge,
    but only in rounds where they pass that check alone, so a fresh public swarm, where everyone is new to
    everyone, merges from its first round and everyone counts after `rounds_required` rounds. A failure on
    probation starts it again and makes it longer (rounds_required x (1 + failures), at most
    `max_rounds_required`); a peer that counts goes back on probation after `demote_after` failures in a row.
    Where the byte-table deltas are checked one by one too (every peer's table delta reaches every peer), the
    probation of a peer of another block advances as well.
  - A cap per network range: at most `per_range` identities count per IPv4 /24 or IPv6 /48 of the host in
    their record's address (counting_by_range): the oldest-known first (the round probation first saw them),
    then the lowest peer id, the same choice on every replica that saw the same rounds. Loopback and private
    addresses are capped like any other: in a public swarm a record's private address is one LAN behind one NAT
    (one party to everyone else), or a claim nobody else can check, and exempting them would let a liar escape
    the cap by announcing 10.x addresses; a swarm on one host or one LAN (tests, a lab) turns the cap off
    (per_range 0). Records without an address (client mode) share one range, and a host name is its own range
    (resolve names before calling, where that matters).
Deterministic: verdicts depend only on the (round, passed, failed) sequence given, and ties break by peer id.
Kept across restarts: a checkpoint holds the identities remembered (to_rows, load_rows), so a restarted peer neither
puts every peer it knew back on probation (its merges would leave out deltas its block's other peers take) nor
lets a crowd of fresh identities count while it knows nobody.
Bounded: at most `max_identities` identities remembered; the least recently seen identities on probation are
forgotten first, then those that count (a forgotten identity starts its probation again).
Pure: no torch, grpc or hivemind, no clock.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from swarmd.membership.addresses import split_host_port

logger = logging.getLogger(__name__)

ROUNDS_REQUIRED = 3  # rounds of passed one-by-one checks before a new identity counts
MAX_ROUNDS_REQUIRED = 24  # the longest a repeated failure makes a probation
DEMOTE_AFTER = 2  # failures in a row that put an identity that counts back on probation
MAX_IDENTITIES = 4096  # identities remembered
PER_RANGE = 4  # identities that count per IPv4 /24 or IPv6 /48 (0 = no cap)
IPV4_PREFIX, IPV6_PREFIX = 24, 48
NO_ADDRESS = "none"  # the range of records without an address (client mode)


@dataclass
class _Identity:
    first_round: int  # the round it was first seen (older counts first under the range cap)
    last_round: int  # the round it was last seen
    passes: int = 0  # distinct rounds passed since its probation (re)started
    failures: int = 0  # failures on probation so far (each lengthens the next probation)
    in_a_row: int = 0  # failures in a row
    counts: bool = False  # passed its probation
    last_pass_round: int = -1  # a round counts once, whichever parts it passed in
    last_fail_round: int = -1  # and a failed round fails once, whichever parts it failed in


_ROW = ("first_round", "last_round", "passes", "failures", "in_a_row", "counts", "last_pass_round", "last_fail_round")


class Probation:
    """Which identities count yet (see the module doc).

    :param rounds_required: distinct rounds of passed checks a new identity needs
    :param max_rounds_required: cap on the longer probations that failures cause
    :param demote_after: failures in a row that send an identity that counts back on probation
    :param max_identities: identities remembered at most
    :param trusted: peer ids that always count (own id; operator-listed peers of a private swarm)
    """

    def __init__(
        self,
        rounds_required: int = ROUNDS_REQUIRED,
        max_rounds_required: int = MAX_ROUNDS_REQUIRED,
        demote_after: int = DEMOTE_AFTER,
        max_identities: int = MAX_IDENTITIES,
        trusted: Iterable[str] = (),
    ):
        if rounds_required < 0 or max_rounds_required < rounds_required or demote_after < 1 or max_identities < 1:
            raise ValueError(
                "need rounds_required >= 0, max_rounds_required >= rounds_required, demote_after >= 1, "
                "max_identities >= 1"
            )
        self.rounds_required, self.max_rounds_required = rounds_required, max_rounds_required
        self.demote_after, self.max_identities = demote_after, max_identities
        self.trusted = frozenset(trusted)
        self._ids: dict[str, _Identity] = {}

    # -- a checkpoint's copy -------------------------------------------------------------------------------
    def to_rows(self) -> list[list]:
        """Every identity remembered as one JSON-able row (a checkpoint keeps them: a restarted peer's standing)."""
        return [[p, *(getattr(k, f) for f in _ROW)] for p, k in self._ids.items()]

    def load_rows(self, rows: object) -> int:
        """Take the rows to_rows wrote (a malformed row, or one beyond max_identities, is skipped); how many."""
        want = [bool if f == "counts" else int for f in _ROW]
        taken = 0
        for row in rows if isinstance(rows, list) else ():
            well_formed = isinstance(row, list) and len(row) == len(_ROW) + 1 and isinstance(row[0], str)
            if well_formed and [type(v) for v in row[1:]] == want and taken < self.max_identities:
                self._ids[row[0]] = _Identity(*row[1:])
                taken += 1
        return taken

    # -- reading -----------------------------------------------------------------------------------------
    def on_probation(self, peer_id: str) -> bool:
        """Whether `peer_id` does not count yet (an unknown identity is on probation)."""
        if peer_id in self.trusted or self.rounds_required == 0:
            return False
        known = self._ids.get(peer_id)
        return known is None or not known.counts

    def counting(self, peer_ids: Iterable[str]) -> set[str]:
        """The ones of `peer_ids` that count."""
        return {p for p in peer_ids if not self.on_probation(p)}

    def rounds_left(self, peer_id: str) -> int:
        """Passed rounds `peer_id` still needs (0 when it counts)."""
        if not self.on_probation(peer_id):
            return 0
        known = self._ids.get(peer_id)
        return self.required(known) - known.passes if known is not None else self.rounds_required

    def required(self, known: _Identity) -> int:
        return min(self.max_rounds_required, self.rounds_required * (1 + known.failures))

    def first_seen(self, peer_id: str) -> int | None:
        """The round `peer_id` was first seen (None: not remembered)."""
        known = self._ids.get(peer_id)
        return known.first_round if known is not None else None

    def __len__(self) -> int:
        return len(self._ids)

    # -- updating ----------------------------------------------------------------------------------------
    def see(self, round: int, peer_ids: Iterable[str]) -> None:
        """Note identities seen at `round` (records or deltas), so their age counts from their first sighting."""
        for peer_id in sorted(set(peer_ids)):
            known = self._ids.get(peer_id)
            if known is None:
                self._ids[peer_id] = _Identity(round, round)
            else:
                known.last_round = max(known.last_round, round)
        self._evict()

    def observe(self, round: int, passed: Iterable[str], failed: Iterable[str]) -> set[str]:
        """Take one round's (or one part's) one-by-one check results; returns the identities that started to count.

        A peer in both sets failed. Calling it for the block and for the byte table of the same round counts the
        round once for a peer that passed both, and as a failure for one that failed either.
        """
        failed = set(failed)
        passed = set(passed) - failed
        self.see(round, passed | failed)
        graduated = set()
        for peer_id in sorted(failed):
            known = self._ids.get(peer_id)
            if known is None or known.last_fail_round >= round:
                continue
            known.last_fail_round = round
            known.in_a_row += 1
            if not known.counts:
                known.failures += 1
                known.passes = 0
            elif known.in_a_row >= self.demote_after:
                known.counts, known.passes, known.failures = False, 0, known.failures + 1
                logger.warning(
                    "round %d: %s failed the held-out check %d rounds in a row: on probation again (%d rounds)",
                    round,
                    peer_id[-6:],
                    known.in_a_row,
                    self.required(known),
                )
            known.last_pass_round = max(known.last_pass_round, round)  # no pass of this round counts later
        for peer_id in sorted(passed):
            known = self._ids.get(peer_id)
            if known is None or known.last_pass_round >= round:
                continue
            known.last_pass_round, known.in_a_row = round, 0
            if known.counts:
                continue
            known.passes += 1
            if known.passes >= self.required(known):
                known.counts = True
                graduated.add(peer_id)
                logger.info("round %d: %s passed its probation (%d rounds)", round, peer_id[-6:], known.passes)
        return graduated

    def admit(self, round: int, peer_ids: Iterable[str]) -> set[str]:
        """Count these identities from now on, without probation (a joiner's incumbents: the peers whose signed
        state it scored and adopted); returns the ones that did not count before."""
        admitted = set()
        for peer_id in sorted(set(peer_ids) - self.trusted):
            known = self._ids.get(peer_id)
            if known is None:
                known = self._ids[peer_id] = _Identity(first_round=round, last_round=round)
            if not known.counts:
                known.counts, known.passes, known.in_a_row = True, 0, 0
                admitted.add(peer_id)
        self._evict()
        return admitted

    def _evict(self) -> None:
        if len(self._ids) <= self.max_identities:
            return
        order = sorted(self._ids, key=lambda p: (self._ids[p].counts, self._ids[p].last_round, p))
        for peer_id in order[: len(self._ids) - self.max_identities]:
            del self._ids[peer_id]


# -- the cap per network range -----------------------------------------------------------------------------
def address_range(address: str) -> str:
    """The network range an address's host counts under: 'v4:a.b.c.0/24', 'v6:x::/48' (IPv4-mapped IPv6 as IPv4),
    'name:<host>' for a host name, NO_ADDRESS for an empty or unparsable address."""
    if not address:
        return NO_ADDRESS
    try:
        host, _ = split_host_port(address)
    except ValueError:
        return NO_ADDRESS
    try:
        ip = ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        return "name:" + host.lower().rstrip(".")
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if isinstance(ip, ipaddress.IPv4Address):
        return "v4:" + str(ipaddress.ip_network(f"{ip}/{IPV4_PREFIX}", strict=False))
    return "v6:" + str(ipaddress.ip_network(f"{ip}/{IPV6_PREFIX}", strict=False))


def counting_by_range(
    addresses: dict[str, str], per_range: int = PER_RANGE, first_seen: dict[str, int] | None = None
) -> set[str]:
    """The peer ids that count under the cap: at most `per_range` per address_range, oldest-known first
    (first_seen round; unknown ones last), then lowest peer id. per_range 0: all of them.

    :param addresses: peer id -> the address of its (signed) record
    """
    if per_range <= 0:
        return set(addresses)
    ages = first_seen or {}
    by_range: dict[str, list[str]] = {}
    for peer_id, address in addresses.items():
        by_range.setdefault(address_range(address), []).append(peer_id)
    out = set()
    for members in by_range.values():
        members.sort(key=lambda p: (p not in ages, ages.get(p, 0), p))
        out.update(members[:per_range])
    return out


def counting_records(records: Iterable, probation: Probation, per_range: int = PER_RANGE) -> list:
    """The records (PeerRecord-like: peer_id, address) whose identities count: past probation, then within the cap
    of their range (ages from the probation's first sightings). Order kept."""
    records = list(records)
    past = {r.peer_id: r.address for r in records if not probation.on_probation(r.peer_id)}
    ages = {p: a for p in past if (a := probation.first_seen(p)) is not None}
    keep = counting_by_range(past, per_range, ages)
    return [r for r in records if r.peer_id in keep]
