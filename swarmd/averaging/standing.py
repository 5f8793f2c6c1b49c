"""Standing: which peers' deltas and records count in this peer's rounds.

Owns, for one peer, the round-to-round memory that the loss check of one round (swarmd.averaging.merge) cannot have:
  - probation (public swarms, with a held-out check; swarmd.membership.sybil.Probation): a new identity's deltas
    merge only in rounds where they pass the one-by-one held-out check (merge_parts' must_pass) until they passed
    cfg.probation_rounds rounds; a failure makes its probation longer. Its records do not count towards a re-sync
    quorum until then (vouched), except for a joiner or a peer that knows none of them yet: verified adoption is
    what guards it;
  - the cap per address range (public swarms): beyond cfg.identities_per_range identities whose signed records
    name one IPv4 /24 (IPv6 /48), the youngest are treated as on probation (their deltas merge when they pass alone);
    the cap is counted among the peers of the quorum or merge at hand (a block's own peers for its block), so
    other blocks' identities of a shared range never crowd a block's peers out;
  - slow drift (swarmd.averaging.drift.DriftTracker): each part's accepted deltas against the merge they landed in
    (the byte table among our block's peers only: other blocks pull it their own way); a flagged peer's deltas are
    left out (leave_out) from then on;
  - proof of work on the key (cfg.pow_bits, swarmd.membership.pow): a record without it is not used (usable_record).
Probation's identities go into every checkpoint (saved, restore): a restarted peer resumes its standing.
A private swarm (a swarm key: every member was let in by the operator) keeps the drift check only.
Deterministic: replicas that saw the same records and accepted the same deltas reach the same verdicts.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch

from swarmd.averaging.config import GossipConfig
from swarmd.averaging.drift import DriftTracker
from swarmd.membership.pow import pow_problem
from swarmd.membership.records import PeerRecord
from swarmd.membership.sybil import Probation, counting_records
from swarmd.protocol import PayloadKind

logger = logging.getLogger(__name__)

BLOCK, EMB = PayloadKind.BLOCK_DELTA, PayloadKind.EMBEDDING_DELTA
Tensors = dict[str, torch.Tensor]


class Standing:
    """One peer's standing of the others (see the module doc).

    :param me: our peer id (always counts; never flagged)
    :param public: no swarm key: probation and the range cap apply
    :param checked: the peer has a held-out check (without one, nothing could pass probation: it is off)
    """

    def __init__(self, me: str, cfg: GossipConfig, public: bool, checked: bool):
        strangers = public and checked
        self.me, self.pow_bits = me, cfg.pow_bits
        self.probation = Probation(rounds_required=cfg.probation_rounds if strangers else 0, trusted=(me,))
        self.per_range = cfg.identities_per_range if strangers else 0
        self.drift = {kind: DriftTracker(me=me, part=kind.part) if cfg.drift_check else None for kind in (BLOCK, EMB)}
        self._refused_pow: set[str] = set()  # peers whose records lacked the proof of work (logged once)

    def usable_record(self, record: PeerRecord) -> bool:
        """Whether a signed record's identity carries the swarm's proof of work (logged once per peer)."""
        problem = pow_problem(record, self.pow_bits)
        if problem and record.peer_id not in self._refused_pow:
            self._refused_pow.add(record.peer_id)
            logger.warning("ignoring peer %s: %s", record.peer_id[-6:], problem)
        return not problem

    def saved(self) -> dict:
        """What a checkpoint keeps of this standing: the identities probation remembers (drift starts afresh)."""
        return {"probation": self.probation.to_rows()}

    def restore(self, saved: object) -> int:
        """Take what saved() wrote (a checkpoint's; anything malformed is skipped); how many identities."""
        return self.probation.load_rows(saved.get("probation") if isinstance(saved, dict) else None)

    def vouched(self, records: list[PeerRecord], joining: bool) -> list[PeerRecord]:
        """The records that count towards a re-sync quorum: past probation and within their range's cap. A joiner, or a
        peer that knows none of them yet (a restart whose checkpoint kept no standing), counts all of them: verified
        adoption is what guards it, or it could never re-sync to the swarm it left."""
        if joining:
            return records
        return counting_records(records, self.probation, self.per_range) or records

    def admit_incumbents(self, round: int, peer_ids: Iterable[str]) -> None:
        """A joiner adopted the state these peers' signed records announce, after scoring it on its held-out sample:
        they count from now on. Judging the incumbents' deltas against its own fresh delta, a joiner kept some out
        round after round and merged apart from its block every time (a split a round, healed by the next re-sync);
        it trusts their state already, and every round's merge still passes the held-out check."""
        if not self.probation.rounds_required:
            return
        admitted = self.probation.admit(round, peer_ids)
        if admitted:
            logger.info("joined: %d incumbent identities count without probation", len(admitted))

    def plan(
        self, round: int, records: Iterable[PeerRecord], block: int | None = None
    ) -> tuple[frozenset[str], frozenset[str]]:
        """(must_pass, leave_out) of this round's merge, given the signed records of the peers it may merge. With
        `block` (ours), a peer of that block counts when it is within the range cap among the block's peers: other
        blocks' older identities of a shared range never push our block's own peers out of its merge."""
        records = [r for r in records if r.peer_id != self.me]
        self.probation.see(round, [r.peer_id for r in records])
        counted = {r.peer_id for r in counting_records(records, self.probation, self.per_range)}
        if block is not None:
            ours = [r for r in records if r.block_index == block]
            counted |= {r.peer_id for r in counting_records(ours, self.probation, self.per_range)}
        must_pass = frozenset(r.peer_id for r in records) - counted
        leave_out = frozenset().union(*(t.excluded() for t in self.drift.values() if t is not None))
        return must_pass, leave_out

    def observe(
        self,
        round: int,
        own: dict[str, Tensors],
        inbox: dict[str, dict[str, Tensors]],
        merged: dict[str, Tensors | None],
        merged_from: dict[str, tuple[str, ...]],
        passed: Iterable[str],
        failed: Iterable[str],
    ) -> None:
        """After a merge: the one-by-one check results move probation; each part's merged deltas, and the accepted
        deltas the merge left out (probation's check, the outlier test), feed the drift test against the merge: a
        drifting insider whose delta fails the held-out check in some rounds is still seen in every round it sends
        (the byte table only among the peers that sent a block delta too: our block's). Parts are keyed by kind."""
        self.probation.observe(round, passed, failed)  # logs the identities that start to count
        block_peers = set(merged_from.get(BLOCK, ())) | set(inbox.get(BLOCK, {}))
        for kind, tracker in self.drift.items():
            centre = merged.get(kind)
            if tracker is None or centre is None:
                continue
            seen = set(merged_from.get(kind, ())) | set(inbox.get(kind, {}))
            ids = sorted(p for p in seen if kind == BLOCK or p in block_peers)
            deltas = {p: own[kind] if p == self.me else inbox[kind][p] for p in ids}
            if len(deltas) < 3:  # two deltas are symmetric about their mean: nothing to tell apart
                continue
            tracker.observe(round, deltas, None if kind == EMB else centre)
