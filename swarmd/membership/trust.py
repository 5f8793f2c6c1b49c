"""What a peer believes of another: signed discovery records and signed payloads.

Owns the two canonical byte strings peers sign with their identity (swarmd.membership.identity):
  - a discovery record (swarmd.membership.records.PeerRecord): every field but the signature, each coerced
    to its declared type, as compact JSON behind a domain tag; `expires` (unix seconds) is signed too,
    so a replayed record cannot outlive what its owner signed, and the DHT record validator requires
    the DHT expiration not to exceed it;
  - a delta or state payload: the header fields that say what the bytes are (swarm, config, kind,
    block, round, base hash, codec, tensor specs, sizes, weight, sender, zstd; the phase when set) plus the payload's
    sha256; the signature travels in PayloadHeader.signature. A receiver checks it before it looks at
    anything but the header (verify_payload), and the sender is the key its peer id names.
Also what a PeerClient takes from valid records: the peer id at each address, for its call proofs
(bind_callees), and the certificate to pin (pin_tls). And dht_record_problem, the pure check the hivemind
validator in swarmd.membership.dht applies to a DHT entry (signature, schema, and that the entry sits under its
own peer id and block key).
Works on any dataclass record through dataclasses.fields, so it imports no discovery code.
Pure: no torch, grpc or hivemind.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, TypeVar

from swarmd.errors import ValidationError
from swarmd.membership.identity import Identity, public_key_of, verify
from swarmd.transport.framing import Encoded
from swarmd.v1 import swarm_pb2 as pb

if TYPE_CHECKING:
    from swarmd.membership.records import PeerRecord

logger = logging.getLogger(__name__)

RECORD_DOMAIN = "blocktrain-record-v1"
PAYLOAD_DOMAIN = "blocktrain-payload-v1"
UNSIGNED = ("signature",)  # record fields left out of what is signed
# newer record fields left out of what is signed while they hold 0, so a record signed before they existed
# verifies as it did (the pow_nonce, the training window, the open-ended grow's held-out CE)
SIGNED_UNLESS_ZERO = ("pow_nonce", "train_first", "train_last", "held_out_ce")
CLOCK_SLACK_S = 5.0  # a record's own `expires` may lie this far in the past (clock skew between hosts)

R = TypeVar("R")

_COERCE = {"int": int, "float": float, "bool": bool, "str": str}


def _field_values(record: Any) -> dict[str, Any]:
    """Every signed field of a record, coerced to its declared type (int, float, bool, str)."""
    out = {}
    for f in dataclasses.fields(record):
        if f.name in UNSIGNED:
            continue
        value = getattr(record, f.name)
        if f.name in SIGNED_UNLESS_ZERO and not value:
            continue
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        coerce = _COERCE.get(str(kind).split("|")[0].strip())
        out[f.name] = coerce(value) if coerce is not None else value
    return out


def record_bytes(record: Any) -> bytes:
    """The canonical bytes a record's owner signs."""
    values = _field_values(record)
    for k, v in values.items():
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"record field {k} is not finite")
    return json.dumps([RECORD_DOMAIN, values], sort_keys=True, separators=(",", ":")).encode()


def sign_record(record: PeerRecord, identity: Identity, ttl_s: float, now: float | None = None) -> PeerRecord:
    """`record` with `expires` = now + ttl_s and its owner's signature (the record must name identity's peer id)."""
    if record.peer_id != identity.peer_id:
        raise ValueError("a peer signs only its own record")
    expires = round((time.time() if now is None else now) + ttl_s, 3)
    unsigned = dataclasses.replace(record, expires=expires, signature="")
    return dataclasses.replace(unsigned, signature=identity.sign(record_bytes(unsigned)).hex())


def record_problem(record: Any, now: float | None = None) -> str:
    """Why a record must not be used ("" when it is signed by the peer it names and not expired)."""
    signature = getattr(record, "signature", "")
    if not signature:
        return "unsigned"
    try:
        public_key_of(record.peer_id)
        sig = bytes.fromhex(signature)
        data = record_bytes(record)
    except (ValueError, TypeError) as exc:
        return f"malformed ({exc})"
    if not verify(record.peer_id, data, sig):
        return "signature does not match the peer id"
    if float(record.expires) + CLOCK_SLACK_S < (time.time() if now is None else now):
        return "expired"
    return ""


# signatures checked already (a record is re-read every round)
_VERIFIED: OrderedDict[tuple[str, bytes], None] = OrderedDict()
_VERIFIED_MAX = 4096


def is_valid(record: Any, now: float | None = None) -> bool:
    """record_problem(record) == "", remembering good signatures (expiry is checked every time)."""
    sig = getattr(record, "signature", "")
    try:
        key = (sig, record_bytes(record))
    except (ValueError, TypeError):
        return False
    if sig and key in _VERIFIED:
        _VERIFIED.move_to_end(key)
        return float(record.expires) + CLOCK_SLACK_S >= (time.time() if now is None else now)
    problem = record_problem(record, now)
    if problem:
        logger.debug("dropping the record of %s: %s", str(getattr(record, "peer_id", "?"))[-6:], problem)
        return False
    _VERIFIED[key] = None
    while len(_VERIFIED) > _VERIFIED_MAX:
        _VERIFIED.popitem(last=False)
    return True


def verified(records: list[R], now: float | None = None) -> list[R]:
    """The records signed by the peers they name (unsigned, forged and expired ones dropped)."""
    return [r for r in records if is_valid(r, now)]


def dht_record_problem(
    record: Any, subkey: Any, expiration_time: float, key_block: int | None, swarm_id: str, now: float | None = None
) -> str:
    """Why a parsed DHT entry of our swarm must not be stored or returned ("" when it may).

    :param record: the PeerRecord parsed from the value (None: it did not parse: schema violation)
    :param subkey: the entry's subkey (must be the record's peer id)
    :param key_block: the block of the DHT key it sits under (None: the swarm-wide key)
    """
    if record is None:
        return "not a peer record"
    if record.swarm_id != swarm_id:
        return f"record of swarm {record.swarm_id!r} under a key of {swarm_id!r}"
    if subkey != record.peer_id:
        return "stored under another peer's subkey"
    if key_block is not None and key_block != record.block_index:
        return f"record of block {record.block_index} under the key of block {key_block}"
    problem = record_problem(record, now)
    if problem:
        return problem
    if expiration_time > float(record.expires) + 1.0:
        return "DHT expiration beyond the signed one"
    return ""


# -- payloads ----------------------------------------------------------------------------------------
def payload_bytes(header: pb.PayloadHeader, sha256: str) -> bytes:
    """The canonical bytes a payload's sender signs: what the header says the bytes are, and their sha256."""
    specs = [[t.name, t.dtype, [int(s) for s in t.shape], int(t.nbytes)] for t in header.tensors]
    fields = [
        PAYLOAD_DOMAIN,
        header.swarm_id,
        header.config_hash,
        int(header.kind),
        int(header.block_index),
        int(header.round),
        header.base_hash,
        int(header.codec),
        specs,
        int(header.raw_bytes),
        int(header.payload_bytes),
        repr(float(header.weight)),
        header.peer_id,
        bool(header.zstd),
        sha256,
    ]
    if header.phase:  # signed only when set: a delta's bytes (phase 0) are what peers without the field sign
        fields.append(int(header.phase))
    return json.dumps(fields, separators=(",", ":")).encode()


def sign_payload(enc: Encoded, identity: Identity) -> Encoded:
    """Sign `enc` in place as `identity` (its header must name identity's peer id); returns it."""
    if enc.header.peer_id != identity.peer_id:
        raise ValueError("a peer signs only its own payloads")
    enc.header.signature = b""
    enc.header.signature = identity.sign(payload_bytes(enc.header, enc.sha256()))
    return enc


def verify_payload(enc: Encoded) -> None:
    """Check a payload's signature against the peer id in its header (before anything else is decoded).

    :raises ValidationError: unsigned, or not signed by the peer it names, or altered since
    """
    h = enc.header
    if not h.signature:
        raise ValidationError(f"unsigned payload from {h.peer_id[-6:] or '?'}")
    if not verify(h.peer_id, payload_bytes(h, enc.sha256()), h.signature):
        raise ValidationError(f"payload signature does not match its sender {h.peer_id[-6:] or '?'} or its bytes")


def bind_callees(client: Any, records: list[Any], skip: str = "") -> None:
    """Make `client` (a PeerClient) sign its calls to each address that a valid signed record names for the peer
    that record is of (PeerClient.bind: a call proof is bound to its callee); where two records name one address,
    the one that expires last. :param skip: a peer id not to bind (our own)."""
    newest: dict[str, Any] = {}
    for r in records:
        if not r.address or r.peer_id == skip or not is_valid(r):
            continue
        if r.address not in newest or float(r.expires) > float(newest[r.address].expires):
            newest[r.address] = r
    for address, r in newest.items():
        client.bind(address, r.peer_id)


async def pin_tls(client: Any, records: list[Any], skip: str = "") -> None:
    """Make `client` (a PeerClient) dial every peer whose valid signed record names a TLS certificate over TLS,
    pinned to that certificate; a peer whose certificate cannot be fetched or does not match is logged and
    left unpinned (calls to it then fail). :param skip: a peer id not to pin (our own)."""
    for r in records:
        if getattr(r, "tls_fingerprint", "") and r.address and r.peer_id != skip and is_valid(r):
            try:
                await client.pin(r.address, r.tls_fingerprint)
            except Exception as exc:  # PeerUnavailable, ValidationError: one line, the call to it fails later
                logger.warning("cannot pin the TLS certificate of %s at %s: %s", r.peer_id[-6:], r.address, exc)
