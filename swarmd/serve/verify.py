"""Verified inference: what a swarm client checks in every Forward answer, and how it judges replicas.

Owns the pure part of verified inference (no grpc, no routing; swarmd.serve.remote calls it):
  - `out_of_range()`: range checks any answer must pass, from the sampler math alone. An Euler step returns
    z' = r z + (1 - r) D with r = sigma_next / sigma and D = softmax(logits) @ E_hat, a convex combination
    of unit-norm table rows, so ||D|| <= 1 at every position: the client knows z and r, so it checks that
    D' = (z' - r z) / (1 - r) lies in the unit ball (up to fp32 rounding). Messages must stay within the
    serving peers' own input limit, logits within what a z_hat inside the inputs' limit can produce; all
    finite. This is all a client can check where one peer holds a block (no weights here);
  - `divergence()`: how far two answers to the same hop are apart, in units a tolerance can be set in:
    for z, the largest per-position distance of the implied D's (the unit ball has radius 1); for
    messages and logits, max |a - b| / (1 + max |b|);
  - `tolerance()` for a pair of replicas: SAME_BASE_TOL where both announce the same base_hash/emb_hash
    (or none: inference-only peers serve fixed weights), OTHER_BASE_TOL where they differ (group averaging,
    a replica mid-merge); a checker that shares the primary's base is preferred. `between()` for a pair of
    answers: where both name the weights that computed them (ForwardReply.block_hash / emb_hash,
    `named_weights()`), SAME_BASE_TOL for the same named weights and OTHER_BASE_TOL for different ones (a merge
    landed between: no disagreement at the same-base tolerance), whatever the records say;
  - `judge()`: majority of three when two disagree: which replicas agree, which one is the odd one out;
  - `VerifyPolicy`: which hops are recomputed on a second replica (the first answer of every replica in a
    session, then each hop with probability `share`, from an unpredictable RNG) and `VerifyStats`, the
    counts the CLI prints.
Why these defaults: a persistent liar answers its first hop wrong, and the first answer of every replica is
checked, so it is caught in the first sweep. A liar that answers its first hop honestly and lies later is
caught per hop with probability `share`: after s sweeps with one hop each on its block it is still unseen
with probability (1 - share)^s, 3% at s = 5 for the default share 0.5 (mean 1 / share = 2 sweeps).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

import torch

from swarmd.core.config import ModelConfig
from swarmd.errors import ValidationError
from swarmd.serve.serving import MESSAGE_LIMIT, Z_LIMIT_PER_SIGMA
from swarmd.serve.snapshots import valid_hash

DEFAULT_SHARE = 0.5  # chance a hop past a replica's first is recomputed on a second replica (see the docstring)
# Honest replicas of one base differ by fp32 rounding only: measured 0 (CPU, batched vs alone) and 5.6e-6
# (cached vs uncached) in D units by benchmarks/verify_cost.py; CPU vs CUDA fp32 and TF32 matmuls are expected
# near 1e-4 and 1e-3 (not measured here: no GPU); bf16 autocast serving would need ~1e-2.
SAME_BASE_TOL = 1e-3
# Replicas on different bases (one merge apart, another group's average) differ by what a round of training moves:
# measured 0.79-0.94 / 0.52-0.57 / 0.40-0.54 D units (two runs) for H = 10 AdamW steps after 0 / 300 / 1000 steps
# (benchmarks/verify_cost.py, d 64, 4 blocks), so a
# comparison across bases only catches gross lies; a disagreement between different bases with no same-base
# majority leaves the hop unverified (the block is named) instead of dropping an honest, merely stale peer.
OTHER_BASE_TOL = 1.0
BALL_SLACK = 1e-3  # ||D'|| may exceed 1 by this much (plus fp32 rounding of z' - r z) before it is out of range
FP32_EPS = float(torch.finfo(torch.float32).eps)


@dataclass(frozen=True)
class Answer:
    """One replica's answer to one hop, unpacked: next z (or logits at the last step) and the step's message."""

    out: torch.Tensor  # (n, t, d) next z, or (n, t, vocab) logits when final
    message: torch.Tensor | None  # (n, t, message_dim) or None
    weights: tuple[str, str] = ("", "")  # (block_hash, emb_hash) of the weights that computed it, as its sender names

    @property
    def named(self) -> bool:
        """Whether the answer names the weights that computed it (a peer pulls them by hash)."""
        return all(self.weights)

    def tail(self, t: int) -> Answer:
        """The answer for the last t positions (a resent prefix covers more)."""
        return Answer(self.out[:, -t:], None if self.message is None else self.message[:, -t:], self.weights)


def named_weights(reply: Any) -> tuple[str, str]:
    """(block_hash, emb_hash) a ForwardReply names; ("", "") where it names none (a peer before the names, or
    one serving unnamed weights); ValidationError for a name no honest peer sends (a malformed answer)."""
    got = (reply.block_hash, reply.emb_hash)
    if not any(got):
        return "", ""
    if not all(valid_hash(h) for h in got):
        raise ValidationError("the answer names its weights by malformed hashes (want 1..64 lower-case hex each)")
    return got


@dataclass(frozen=True)
class Hop:
    """What the client sent for one hop: enough to check an answer against the sampler math."""

    z: torch.Tensor  # (n, t, d) the z sent
    sigma: float
    sigma_next: float | None  # None at the last step (the answer is logits)

    @property
    def keep(self) -> float:
        """r = sigma_next / sigma: the share of z an Euler step keeps."""
        return 0.0 if self.sigma_next is None else self.sigma_next / self.sigma


def implied_denoised(hop: Hop, z_next: torch.Tensor) -> torch.Tensor:
    """D' = (z' - r z) / (1 - r): the denoised estimate an Euler step with output z' must have used."""
    r = hop.keep
    return (z_next.double() - r * hop.z.double()) / (1.0 - r)


def out_of_range(cfg: ModelConfig, hop: Hop, answer: Answer) -> str | None:
    """Why no honest peer could have given this answer (a sentence), or None when it passes the range checks."""
    if not bool(torch.isfinite(answer.out).all()):
        return "non-finite " + ("logits" if hop.sigma_next is None else "z")
    if answer.message is not None:
        if not bool(torch.isfinite(answer.message).all()):
            return "a non-finite message"
        peak = float(answer.message.abs().max()) if answer.message.numel() else 0.0
        if peak > MESSAGE_LIMIT:
            return f"a message beyond +-{MESSAGE_LIMIT:g} (got {peak:.3g})"
    if hop.sigma_next is None:
        limit = Z_LIMIT_PER_SIGMA * (cfg.sigma_hi + 1) * abs(cfg.logit_scale) * math.sqrt(cfg.d_model)
        peak = float(answer.out.abs().max()) if answer.out.numel() else 0.0
        return f"logits beyond +-{limit:.3g} (got {peak:.3g})" if peak > limit else None
    norm = implied_denoised(hop, answer.out).norm(dim=-1)  # (n, t)
    rounding = 8 * FP32_EPS * (hop.z.double().norm(dim=-1) + answer.out.double().norm(dim=-1)) / (1.0 - hop.keep)
    excess = norm - 1.0 - BALL_SLACK - rounding
    if bool((excess > 0).any()):
        return (
            f"z outside the Euler step's reach: ||z' - r z|| / (1 - r) = {float(norm.max()):.4g} > 1 "
            f"(sigma {hop.sigma:g} -> {hop.sigma_next:g})"
        )
    return None


def divergence(hop: Hop, a: Answer, b: Answer) -> float:
    """How far two answers to one hop are apart: D-units for z (max per-position distance), relative otherwise."""
    if hop.sigma_next is None:
        worst = _relative(a.out, b.out)
    else:
        worst = float((implied_denoised(hop, a.out) - implied_denoised(hop, b.out)).norm(dim=-1).max())
    if a.message is not None and b.message is not None:
        worst = max(worst, _relative(a.message, b.message))
    elif (a.message is None) != (b.message is None):
        return math.inf
    return worst


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.numel() == 0:
        return 0.0
    return float((a.double() - b.double()).abs().max() / (1.0 + b.double().abs().max()))


def same_base(a: Any, b: Any) -> bool:
    """Whether two peer records announce the same weights (a record without hashes serves fixed weights)."""
    ha = (getattr(a, "base_hash", ""), getattr(a, "emb_hash", ""))
    hb = (getattr(b, "base_hash", ""), getattr(b, "emb_hash", ""))
    return ha == hb or not any(ha) or not any(hb)


def tolerance(a: Any, b: Any, same_tol: float = SAME_BASE_TOL, other_tol: float = OTHER_BASE_TOL) -> float:
    """The divergence two honest replicas (records a, b) may show on one hop."""
    return same_tol if same_base(a, b) else other_tol


def between(
    ra: Any, a: Answer, rb: Any, b: Answer, same_tol: float = SAME_BASE_TOL, other_tol: float = OTHER_BASE_TOL
) -> float:
    """The divergence two honest answers (a from the peer of record ra, b from rb) to one hop may show: by the
    weights both name where they do (the same: same_tol; different: other_tol), else by the records."""
    if a.named and b.named:
        return same_tol if a.weights == b.weights else other_tol
    return tolerance(ra, rb, same_tol, other_tol)


def alike(ra: Any, a: Answer, rb: Any, b: Answer) -> bool:
    """Whether two answers come from the same weights: as both name them, else as the records announce."""
    return a.weights == b.weights if a.named and b.named else same_base(ra, rb)


@dataclass(frozen=True)
class Verdict:
    agree: tuple[str, ...]  # addresses whose answers agree (the majority); empty when no two agree
    dissent: tuple[str, ...]  # addresses that disagree with the majority (to distrust)


def judge(hop: Hop, answers: dict[str, Answer], tol: dict[frozenset[str], float]) -> Verdict:
    """Majority among the replicas' answers to one hop: the largest set that agrees pairwise within tol.

    :param tol: per pair of addresses, the divergence they may show (tolerance())
    With two answers that disagree there is no majority (agree is empty); with three, the pair that agrees
    wins and the third dissents; no two agreeing is again no majority.
    """
    names = list(answers)
    best: tuple[str, ...] = ()
    for size in range(len(names), 1, -1):
        for group in _subsets(names, size):
            if all(
                divergence(hop, answers[x], answers[y]) <= tol[frozenset((x, y))]
                for i, x in enumerate(group)
                for y in group[i + 1 :]
            ):
                best = group
                break
        if best:
            break
    if len(best) * 2 <= len(names):  # no strict majority: nobody can be told apart
        return Verdict((), ())
    return Verdict(best, tuple(n for n in names if n not in best))


def _subsets(names: list[str], size: int) -> list[tuple[str, ...]]:
    from itertools import combinations

    return list(combinations(names, size))


@dataclass
class VerifyStats:
    """What verification did in one client's life (the CLI's `verified` figures)."""

    hops: int = 0  # hops whose answers were used (every one passed the range checks)
    checked: int = 0  # hops recomputed on a second replica and compared
    extra_calls: int = 0  # Forward calls made for checks (second and third opinions)
    extra_s: float = 0.0  # client wall time spent waiting on checks beyond the primary's answer
    loose: int = 0  # of the checked hops, compared with a replica on another base (OTHER_BASE_TOL)
    disagreements: int = 0  # checks whose answers differed beyond the pair's tolerance
    redone_sweeps: int = 0  # sweeps run again because a peer they used was dropped
    dropped: dict[str, str] = field(default_factory=dict)  # address -> why it was dropped for the session
    unverified_blocks: set[int] = field(default_factory=set)  # blocks only one peer held (range checks only)
    apart_blocks: set[int] = field(default_factory=set)  # blocks whose replicas disagree on different bases
    tiebreaks: int = 0  # disputes of two same-base replicas settled by recomputing the hop (swarmd.serve.tiebreak)
    state_downloads: int = 0  # PullState answers received for tie-breaks (block and byte table count one each)
    state_download_bytes: int = 0  # their wire bytes
    failed_pulls: int = 0  # of those pulls (or attempts), the ones unreachable, refused or not the announced weights
    tiebreak_s: float = 0.0  # client wall time of tie-breaks (pulls, local build, recomputation)
    inconclusive: int = 0  # tie-break judgements of a replica whose named weights could not be had (hop re-run)

    def summary(self) -> dict:
        return {
            "hops": self.hops,
            "checked": self.checked,
            "checked_across_bases": self.loose,
            "extra_calls": self.extra_calls,
            "extra_s": self.extra_s,
            "disagreements": self.disagreements,
            "redone_sweeps": self.redone_sweeps,
            "dropped": dict(self.dropped),
            "unverified_blocks": sorted(self.unverified_blocks | self.apart_blocks),
            "unverified_across_bases": sorted(self.apart_blocks),
            "tiebreaks": self.tiebreaks,
            "state_downloads": self.state_downloads,
            "state_download_bytes": self.state_download_bytes,
            "failed_pulls": self.failed_pulls,
            "tiebreak_s": self.tiebreak_s,
            "inconclusive": self.inconclusive,
        }

    def line(self) -> str:
        """One line for a terminal."""
        parts = [f"verified {self.checked} of {self.hops} hops on a second replica"]
        if self.dropped:
            parts.append("dropped " + ", ".join(f"{a} ({why})" for a, why in self.dropped.items()))
        else:
            parts.append("no peer dropped")
        if self.unverified_blocks:
            blocks = ", ".join(str(b) for b in sorted(self.unverified_blocks))
            parts.append(f"UNVERIFIED: block(s) {blocks} held by one peer (range checks only)")
        if self.apart_blocks:
            blocks = ", ".join(str(b) for b in sorted(self.apart_blocks))
            parts.append(f"UNVERIFIED: block(s) {blocks} whose replicas on different bases disagree")
        if self.tiebreaks:
            parts.append(f"{self.tiebreaks} tie(s) broken by recomputation ({self.state_downloads} state download(s))")
        if self.inconclusive:
            parts.append(f"{self.inconclusive} inconclusive tie-break(s): named weights not served (hops re-run)")
        return "; ".join(parts)


class VerifyPolicy:
    """Which hops get a second opinion: the first answer of each replica in a session, then a share of the rest.

    :param share: chance in [0, 1] a later hop is checked (0: first answers only; 1: every hop)
    :param rng: the draws (default: the OS's, so a peer cannot predict which of its answers are checked)
    """

    def __init__(
        self,
        share: float = DEFAULT_SHARE,
        rng: random.Random | None = None,
        same_tol: float = SAME_BASE_TOL,
        other_tol: float = OTHER_BASE_TOL,
    ):
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"verify share must be in [0, 1], got {share}")
        self.share, self.same_tol, self.other_tol = share, same_tol, other_tol
        self.rng = rng if rng is not None else random.SystemRandom()
        self._seen: set[tuple[str, str, int]] = set()  # (session, address, block) answered before

    def wants_check(self, session_id: str, address: str, block_index: int) -> bool:
        key = (session_id, address, block_index)
        if key not in self._seen:
            self._seen.add(key)
            return True
        return self.share > 0 and self.rng.random() < self.share

    def forget(self, session_id: str) -> None:
        self._seen = {k for k in self._seen if k[0] != session_id}

    def tolerance(self, a: Any, b: Any) -> float:
        return tolerance(a, b, self.same_tol, self.other_tol)

    def between(self, ra: Any, a: Answer, rb: Any, b: Answer) -> float:
        return between(ra, a, rb, b, self.same_tol, self.other_tol)
