"""PeerRecord, the announcement every peer signs and publishes, and the pure reads over a list of them.

The DHT key of a block (block_key / parse_block_key), the record's schema check (PeerRecord.from_value:
anything malformed is None), the record a peer's GetStatus carries (record_from_status), and the
throughput view a joiner chooses its block from (choose_block, block_throughput; who moves once it has
announced is swarmd.membership.balance). Signing and checking
records is swarmd.membership.trust; finding them is swarmd.membership.discovery. No torch, grpc or hivemind.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from swarmd.core.pipeline import in_window

logger = logging.getLogger(__name__)

KEY_DELIMITER = "."
ALL_BLOCKS = "all"  # the swarm-wide key every peer also announces under (find_all reads it)


def block_key(swarm_id: str, block_index: int | None) -> str:
    """DHT key of one block of a swarm ('<swarm>.block.<n>'); None gives the swarm-wide key."""
    return KEY_DELIMITER.join((swarm_id, "block", ALL_BLOCKS if block_index is None else str(int(block_index))))


def parse_block_key(key: str) -> tuple[str, int | None]:
    """Inverse of block_key: (swarm_id, block_index or None for the swarm-wide key)."""
    swarm_id, sep, rest = key.rpartition(KEY_DELIMITER + "block" + KEY_DELIMITER)
    if not sep or not swarm_id:
        raise ValueError(f"not a block key: {key!r}")
    if rest == ALL_BLOCKS:
        return swarm_id, None
    if not rest.isdigit():
        raise ValueError(f"bad block index in key {key!r}")
    return swarm_id, int(rest)


@dataclass
class PeerRecord:
    peer_id: str
    address: str  # host:port of the peer's gRPC server ("" in client mode)
    block_index: int
    round: int  # averaging rounds completed
    samples_per_s: float  # training throughput EMA
    config_hash: str
    base_hash: str  # hash of the block weights the peer's current round started from
    client_mode: bool
    swarm_id: str
    emb_hash: str = ""  # hash of the shared byte table the current round started from
    # the record is signed by the Ed25519 key its peer_id names (swarmd.membership.trust); readers drop
    # unsigned, forged and expired records. tls_fingerprint: sha256 of the gRPC server's certificate ("" = no TLS)
    tls_fingerprint: str = ""
    # started on an explicit --block, so it never moves to another block (swarmd.membership.balance)
    pinned: bool = False
    expires: float = 0.0  # unix time the owner signed this record to be valid until
    signature: str = ""  # hex Ed25519 signature over swarmd.membership.trust.record_bytes(self)
    # proof of work on the peer's public key (swarmd.membership.pow), needed where the swarm sets a
    # difficulty. Left out of the value and of the signed bytes while 0, so records of peers that predate it
    # still verify, and theirs still read ours
    pow_nonce: int = 0
    # the swarm rounds this peer takes local steps in (TrainConfig.pipeline's window,
    # swarmd.core.pipeline.pipeline_rounds; 0, 0 = every round). A peer that sits a round out waits only for the
    # peers that train it; a false window costs its writer its own place in others' waits, nothing more. Absent
    # while 0 (pow_nonce's rule)
    train_first: int = 0
    train_last: int = 0
    # the open-ended grow schedule (TrainConfig.open_gain): the held-out CE (nats, swarmd.averaging.validation) of
    # the peer's block after its last merged round, 0 = not measured (swarmd.membership.opening reads it). A false
    # one opens at most one block early per the rule's patience (that module's doc). Absent while 0
    held_out_ce: float = 0.0

    def trains(self, round_no: int) -> bool:
        """Whether this peer takes local steps in swarm round `round_no` (1-based: the round after `round_no` - 1
        merged rounds), as its record says."""
        return in_window(round_no, self.train_first, self.train_last)

    def to_value(self) -> dict:
        value = asdict(self)
        for name in OMITTED_WHEN_ZERO:
            if not value[name]:
                del value[name]
        return value

    @classmethod
    def from_value(cls, value: Any) -> PeerRecord | None:
        """Parse a DHT value; None (and a debug log) for anything malformed (the schema check)."""
        try:
            names = {f.name for f in fields(cls)}
            if not isinstance(value, dict) or not set(value) <= names or not set(_REQUIRED) <= set(value):
                raise ValueError("wrong fields")
            rec = cls(**value)
            if not all(isinstance(getattr(rec, k), int) and not isinstance(getattr(rec, k), bool) for k in _INTS):
                raise ValueError("wrong field types")
            numbers = (rec.samples_per_s, rec.expires, rec.held_out_ce)
            if not all(isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in numbers):
                raise ValueError("samples_per_s, expires and held_out_ce must be finite numbers")
            if rec.samples_per_s < 0 or rec.held_out_ce < 0:
                raise ValueError("negative samples_per_s or held_out_ce")
            if not 0 <= rec.pow_nonce < 2**64:
                raise ValueError("pow_nonce out of range")
            if not (0 <= rec.train_first < 2**63 and 0 <= rec.train_last < 2**63):
                raise ValueError("training window out of range")
            rec.samples_per_s, rec.expires, rec.held_out_ce = map(float, numbers)
            if not all(isinstance(getattr(rec, k), str) for k in _STRS) or not all(
                isinstance(getattr(rec, k), bool) for k in _BOOLS
            ):
                raise ValueError("wrong field types")
            return rec
        except (TypeError, ValueError, OverflowError) as exc:
            logger.debug("ignoring malformed peer record %r: %s", value, exc)
            return None


# newer fields an older reader would call malformed: absent while zero
OMITTED_WHEN_ZERO = ("pow_nonce", "train_first", "train_last", "held_out_ce")
_INTS = ("block_index", "round", "pow_nonce", "train_first", "train_last")
_BOOLS = ("client_mode", "pinned")
_STRS = ("peer_id", "address", "config_hash", "base_hash", "swarm_id", "emb_hash", "tls_fingerprint", "signature")
_REQUIRED = (
    *("peer_id", "address", "block_index", "round", "samples_per_s"),
    *("config_hash", "base_hash", "client_mode", "swarm_id"),
)


def choose_block(records: list[PeerRecord], blocks: int) -> int:
    """The block with the least combined throughput (a peer with no EMA yet counts 1 sample/s); ties -> lowest index."""
    load = [0.0] * blocks
    for r in records:
        if 0 <= r.block_index < blocks:
            load[r.block_index] += max(r.samples_per_s, 1.0)
    return min(range(blocks), key=lambda b: (load[b], b))


def block_throughput(records: list[PeerRecord], blocks: int) -> list[dict]:
    """Per block: peer count and combined samples/s."""
    return [
        {
            "block": b,
            "peers": sum(r.block_index == b for r in records),
            "samples_per_s": sum(r.samples_per_s for r in records if r.block_index == b),
        }
        for b in range(blocks)
    ]


def record_from_status(st: Any, address: str = "") -> PeerRecord:
    """PeerRecord from a pb.PeerStatus: the signed record it carries when it parses (verify it before use),
    else one built from its fields, unsigned (address falls back to the dialled one)."""
    if st.signed_record:
        try:
            signed = PeerRecord.from_value(json.loads(st.signed_record))
        except ValueError:
            signed = None
        if signed is not None and signed.peer_id == st.peer_id:
            return signed
    return PeerRecord(
        st.peer_id,
        st.address or ("" if st.client_mode else address),
        st.block_index,
        st.round,
        st.samples_per_s,
        st.config_hash,
        st.base_hash,
        st.client_mode,
        st.swarm_id,
        st.emb_hash,
    )
