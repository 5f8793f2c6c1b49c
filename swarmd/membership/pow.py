"""Proof of work on a peer identity: a nonce that makes a fresh Ed25519 key cost 2^D hashes.

Owns the work function and its check. An identity carries a nonce (PeerRecord.pow_nonce, signed with the record)
such that sha256(POW_DOMAIN || public key || nonce as 8 bytes big-endian) has at least D leading zero bits; D is a
swarm setting (0 = off: private swarms, tests). One key's nonce is found once (expected 2^D hashes) and kept with
the identity; checking it is one hash. It does not stop a rich attacker: it prices each identity, so that the
per-range cap and the probation (swarmd.membership.sybil) bound what a budget buys. The work is over the public key
alone (not the swarm id), so one identity's work serves every swarm of the same difficulty.
Measured (solve_seconds, one core of a shared 2-core VM, 0.4-0.8 M nonces/s): 16 bits 0.10 s, 20 bits 1.2 s,
24 bits ~22 s, 28 bits ~6 min on average; a GPU hashes sha256 some 1,000-10,000x faster, so a difficulty honest
peers can bear prices scripts, not a funded attacker. Pure: hashlib only; no torch, grpc or hivemind.
"""

from __future__ import annotations

import hashlib
import time

from swarmd.membership.identity import public_key_of

POW_DOMAIN = b"blocktrain-pow-v1"
MAX_DIFFICULTY = 40  # bits; beyond, generating one identity takes CPU-days
NONCE_BYTES = 8


def pow_digest(public_key: bytes, nonce: int) -> bytes:
    """sha256(POW_DOMAIN || public key || nonce, 8 bytes big-endian)."""
    return hashlib.sha256(POW_DOMAIN + public_key + nonce.to_bytes(NONCE_BYTES, "big")).digest()


def leading_zero_bits(digest: bytes) -> int:
    """How many leading bits of `digest` are zero."""
    value = int.from_bytes(digest, "big")
    return len(digest) * 8 - value.bit_length()


def pow_ok(peer_id: str, nonce: int, difficulty: int) -> bool:
    """Whether `nonce` is a proof of work of `difficulty` bits for the key `peer_id` names (difficulty 0: always)."""
    if difficulty <= 0:
        return True
    if not isinstance(nonce, int) or isinstance(nonce, bool) or not 0 <= nonce < 2 ** (8 * NONCE_BYTES):
        return False
    try:
        key = public_key_of(peer_id)
    except ValueError:
        return False
    return leading_zero_bits(pow_digest(key, nonce)) >= difficulty


def pow_problem(record: object, difficulty: int) -> str:
    """Why a (signed) record's identity lacks the swarm's proof of work ("" when it has it or difficulty is 0)."""
    if difficulty <= 0:
        return ""
    nonce = getattr(record, "pow_nonce", 0)
    if pow_ok(str(getattr(record, "peer_id", "")), nonce, difficulty):
        return ""
    return f"no proof of work of {difficulty} bits on its key"


def solve_pow(public_key: bytes, difficulty: int, start: int = 0, max_tries: int | None = None) -> int | None:
    """The first nonce from `start` on that gives `difficulty` leading zero bits (0 for difficulty 0); None when
    max_tries nonces were tried without one.

    :note: blocks: expected 2^difficulty sha256 calls (see the module doc for the time per difficulty)
    """
    if not 0 <= difficulty <= MAX_DIFFICULTY:
        raise ValueError(f"difficulty must be in [0, {MAX_DIFFICULTY}] bits, got {difficulty}")
    if difficulty == 0:
        return 0
    prefix = hashlib.sha256(POW_DOMAIN + public_key)  # the common prefix hashed once, copied per nonce
    limit = 2 ** (8 * NONCE_BYTES) if max_tries is None else min(2 ** (8 * NONCE_BYTES), start + max_tries)
    threshold = 1 << (256 - difficulty)  # a digest below this has `difficulty` leading zero bits
    for nonce in range(start, limit):
        h = prefix.copy()
        h.update(nonce.to_bytes(NONCE_BYTES, "big"))
        if int.from_bytes(h.digest(), "big") < threshold:
            return nonce
    return None


def solve_seconds(difficulty: int, samples: int = 3, seed: int = 0) -> float:
    """Mean wall seconds solve_pow takes for `difficulty` over `samples` fixed keys (a measurement, for the docs)."""
    total = 0.0
    for i in range(samples):
        key = hashlib.sha256(f"pow-bench-{seed}-{i}".encode()).digest()
        t0 = time.perf_counter()
        solve_pow(key, difficulty)
        total += time.perf_counter() - t0
    return total / samples
