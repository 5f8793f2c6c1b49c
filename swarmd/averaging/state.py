"""BlockState: the one shared mutable object of a daemon (block + byte table + AdamW) under a lock.

Owns the weights a peer trains and the base they started from this round: local steps
(train_steps, run by the daemon's single worker thread), deltas (now - base), merges
(apply_merge: base + mean delta, written into the parameters in place so AdamW keeps its
moments), adoption of a peer's state (join / re-sync), snapshots for PullState and serving, the
hashes and count-sketch that identify and compare weights, trajectory training on or off for a
round (swarmd.averaging.predecessors, its base class), and its own checkpoint
(save / restore, atomic files through swarmd.core.checkpoint). No grpc, no asyncio here.
Follows hivemind's averager.get_tensors(): every reader takes a copy under the lock.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from swarmd.averaging.outer import OuterOptimizer
from swarmd.averaging.predecessors import TrajectoryPredecessors
from swarmd.averaging.sketch import count_sketch, flatten
from swarmd.core import checkpoint as ck
from swarmd.core.optim import replica_gain
from swarmd.core.train import BlockTrainer
from swarmd.errors import CheckpointError, ConfigMismatch

logger = logging.getLogger(__name__)


def weights_hash(tensors: dict[str, torch.Tensor]) -> str:
    """Short sha256 over names, shapes and fp32 bytes (sorted by name): equal weights, equal hash."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu", torch.float32).contiguous()
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:16]


def relative_distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Exact ||a - b|| / ||a|| over all tensors (tests and benchmarks)."""
    fa, fb = flatten(a), flatten(b)
    return float((fa - fb).norm() / fa.norm().clamp_min(1e-12))


def _clone(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", torch.float32).clone() for k, v in sd.items()}


def merge_train_stats(parts: list[dict]) -> dict:
    """One train_steps result of several in a row: samples and seconds summed, CE weighted by samples (one part:
    itself, bit for bit)."""
    if len(parts) == 1:
        return dict(parts[0])
    n, seconds = sum(p["samples"] for p in parts), sum(p["seconds"] for p in parts)
    ce = sum(p["ce"] * p["samples"] for p in parts if p["samples"]) / n if n else float("nan")
    return {"ce": ce, "samples": n, "seconds": seconds, "samples_per_s": n / max(seconds, 1e-9)}


class BlockState(TrajectoryPredecessors):
    """A BlockTrainer plus the base weights of the current round, behind one lock.

    Takes over a freshly built trainer (its weights become round 0's base; its train_cfg is the
    one use_predecessors switches trajectory training back on with).

    :param round: averaging rounds completed (a resumed or joined peer starts from the saved one)
    :param outer: the outer optimizer apply_merge runs on each merged delta (swarmd.averaging.outer; None = plain
        averaging, base += merged)
    """

    def __init__(self, trainer: BlockTrainer, outer: OuterOptimizer | None = None):
        self.cfg, self.train_cfg, self.block_index = trainer.model_cfg, trainer.train_cfg, trainer.block_index
        self.trainer = trainer
        self.outer = outer
        self.lock = threading.RLock()  # reentrant: swarmd.averaging.delayed.land_merge wraps apply_merge in it
        self.round = 0
        self.samples = 0  # sequences trained on, all rounds
        # trajectory training's predecessors as merged at round start (use_predecessors); None = none this round
        self.predecessors: dict[int, dict[str, torch.Tensor]] | None = None
        self._rebase()

    # -- reading -------------------------------------------------------------------------------
    def _rebase(self) -> None:
        self.base_block = _clone(self.trainer.block.state_dict())
        self.base_emb = _clone(self.trainer.emb.state_dict())
        self.block_hash = weights_hash(self.base_block)
        self.emb_hash = weights_hash(self.base_emb)
        self.sketch = count_sketch(self.base_block)
        self.param_norm = float(flatten(self.base_block).norm())

    @property
    def local_steps(self) -> int:
        """Optimiser steps taken on this block by this peer (all rounds; restored on resume)."""
        return self.trainer.step_count

    def block_shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(v.shape) for k, v in self.base_block.items()}

    def emb_shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(v.shape) for k, v in self.base_emb.items()}

    def snapshot(self) -> tuple[int, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """(round, base block, base embedding): the merged weights everyone agrees on, copied."""
        with self.lock:
            return self.round, _clone(self.base_block), _clone(self.base_emb)

    def named_snapshot(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], str, str]:
        """Copies of the base block and byte table with their hashes, taken together under the lock (what a peer
        serves: its Forward replies name exactly these weights)."""
        with self.lock:
            return _clone(self.base_block), _clone(self.base_emb), self.block_hash, self.emb_hash

    def current(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Copies of the live weights (base plus this round's local progress)."""
        with self.lock:
            return _clone(self.trainer.block.state_dict()), _clone(self.trainer.emb.state_dict())

    def deltas(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """This round's (block delta, embedding delta) = live weights - base."""
        with self.lock:
            block = {
                k: v.detach().float().cpu() - self.base_block[k] for k, v in self.trainer.block.state_dict().items()
            }
            emb = {k: v.detach().float().cpu() - self.base_emb[k] for k, v in self.trainer.emb.state_dict().items()}
        return block, emb

    # -- writing -------------------------------------------------------------------------------
    def train_steps(
        self, steps: int, batches: Iterator[tuple[torch.Tensor, torch.Tensor]], stop: threading.Event | None = None
    ) -> dict:
        """H local AdamW steps (blocking: run it in the worker thread); returns CE, samples, seconds.

        "ce" is the mean training CE of the steps taken (NaN when none was: stopped at once).

        :param stop: checked between steps; when set, returns early with what was done
        """
        ces, n, start = [], 0, time.perf_counter()
        for _ in range(steps):
            if stop is not None and stop.is_set():
                break
            x, y = next(batches)
            with self.lock:
                m = self.trainer.step(x, y)
            ces.append(m["ce"])
            n += x.shape[0]
        seconds = time.perf_counter() - start
        with self.lock:
            self.samples += n
        ce = sum(ces) / len(ces) if ces else float("nan")
        return {"ce": ce, "samples": n, "seconds": seconds, "samples_per_s": n / max(seconds, 1e-9)}

    @torch.no_grad()
    def apply_merge(
        self, block_delta: dict[str, torch.Tensor] | None, emb_delta: dict[str, torch.Tensor] | None
    ) -> None:
        """base += delta for each part given (None: keep the base), live weights := new base; round += 1.

        With an outer optimizer the delta added is its step on the merged delta (swarmd.averaging.outer), unless
        it is local (group averaging: the merged value holds the replicas' steps already).
        AdamW moments are kept (DiLoCo keeps its inner optimiser); parameters are written in place.
        """
        with self.lock:
            for part, base, delta in (("block", self.base_block, block_delta), ("emb", self.base_emb, emb_delta)):
                if delta is not None:
                    if self.outer is not None and not self.outer.local:
                        delta = self.outer.step(part, delta)
                    for k in base:
                        base[k] = base[k] + delta[k]
            self._base_to_live()
            self.round += 1
            self._rebase()

    def local_outer_step(self, part: str, delta: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What a round's own `delta` of `part` ("block", "emb") becomes before it is sent: a local outer
        optimizer's update (group averaging; its buffer advances), else the delta itself."""
        if self.outer is None or not self.outer.local:
            return delta
        with self.lock:  # the buffers are read by snapshot_outer and the checkpoint
            return self.outer.step(part, delta)

    def replica_gain(self, part: str, delta: dict[str, torch.Tensor], replicas: float) -> dict[str, torch.Tensor]:
        """`part`'s own delta scaled by K replicas' step-size ratio (swarmd.core.optim.replica_gain)."""
        module = self.trainer.block if part == "block" else self.trainer.emb
        with self.lock:
            return replica_gain(self.trainer.opt, dict(module.named_parameters()), delta, replicas)

    def set_replicas(self, replicas: int) -> None:
        """The number of same-block deltas (own included) the last merge averaged: the K of the trainer's
        ReplicaAdamW when TrainConfig.replica_adam is on (swarmd.core.optim), ignored otherwise."""
        with self.lock:
            self.trainer.set_replicas(replicas)

    def _base_to_live(self) -> None:
        """Copy the base weights into the trainer's live block and byte table (caller holds the lock)."""
        for base, module in ((self.base_block, self.trainer.block), (self.base_emb, self.trainer.emb)):
            params = module.state_dict()
            for k, v in base.items():
                params[k].copy_(v.to(params[k].dtype))

    @torch.no_grad()
    def rollback(self) -> None:
        """Live weights := base (this round's local steps undone); AdamW moments dropped if they are not finite."""
        with self.lock:
            self._base_to_live()
            moments = [t for st in self.trainer.opt.state.values() for t in st.values() if torch.is_tensor(t)]
            if any(t.is_floating_point() and not bool(torch.isfinite(t).all()) for t in moments):
                self.trainer.opt.state.clear()

    @torch.no_grad()
    def adopt(
        self,
        block: dict[str, torch.Tensor] | None,
        emb: dict[str, torch.Tensor] | None,
        round: int | None = None,
        momentum: dict[str, dict[str, torch.Tensor]] | None = None,
    ) -> None:
        """Replace base and live weights with a peer's state (join / re-sync); AdamW moments kept.

        :param momentum: the peer's outer-optimizer buffers by part ("block", "emb"); an adopted part without
            one gets a zero buffer (swarmd.averaging.outer's reset rule)
        """
        with self.lock:
            for new, module in ((block, self.trainer.block), (emb, self.trainer.emb)):
                if new is None:
                    continue
                params = module.state_dict()
                if set(new) != set(params) or any(tuple(new[k].shape) != tuple(params[k].shape) for k in params):
                    raise ValueError("adopted state does not match the model")
                for k, v in new.items():
                    params[k].copy_(v.to(params[k].dtype))
            if round is not None:
                self.round = int(round)
            if self.outer is not None:
                for part, new in (("block", block), ("emb", emb)):
                    if new is not None:
                        self.outer.load_part(part, (momentum or {}).get(part))
            self._rebase()

    @torch.no_grad()
    def rebase(self, block: dict[str, torch.Tensor] | None, emb: dict[str, torch.Tensor] | None) -> None:
        """Set the base of each part given to these weights exactly (a one-group round's bit-identical landing,
        swarmd.averaging.merge.apply_merged) and move the live weights with it: live := new + (live - base), so
        the steps taken since the round's snapshot (overlap) are kept; bit for bit `new` when none were. Round,
        AdamW moments and outer buffers are left as they are (adopt resets the buffers)."""
        with self.lock:
            parts = [
                (module, base, new, {k: v.detach().clone() for k, v in module.state_dict().items()})
                for module, base, new in (
                    (self.trainer.block, self.base_block, block),
                    (self.trainer.emb, self.base_emb, emb),
                )
            ]
            for module, base, new, _ in parts:  # live := the new base (a part not given: its base, unchanged)
                params = module.state_dict()
                for k, v in (new if new is not None else base).items():
                    params[k].copy_(v.to(params[k].dtype))
            self._rebase()  # base := those weights, hashes
            for module, base, new, live in parts:  # live := new + (live - old base), or back as it was
                params = module.state_dict()
                for k in params:
                    params[k].copy_(
                        live[k] if new is None else (new[k].float() + (live[k].float() - base[k])).to(params[k].dtype)
                    )

    def snapshot_outer(
        self,
    ) -> tuple[int, dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]] | None]:
        """snapshot() plus copies of the outer optimizer's buffers by part (zeros before its first step), taken
        together under the lock; None for the buffers without an outer optimizer (PullState sends them)."""
        with self.lock:
            bases = {"block": self.base_block, "emb": self.base_emb}
            momentum = None if self.outer is None else {p: self.outer.part_tensors(p, b) for p, b in bases.items()}
            return self.round, _clone(self.base_block), _clone(self.base_emb), momentum

    def moved(self) -> float:
        """||working block - base block||: how far this peer's own block has moved this round so far."""
        with self.lock:
            return float(
                sum(
                    float((v.detach().float().cpu() - self.base_block[k]).pow(2).sum())
                    for k, v in self.trainer.block.state_dict().items()
                )
                ** 0.5
            )

    # -- persistence ---------------------------------------------------------------------------
    def save(self, directory: str | Path, **progress: Any) -> None:
        """Write one checkpoint generation: merged block, byte table, AdamW state and progress, taken under the
        lock together and flipped in atomically (ck.save_peer_generation; blocking: worker thread).

        :param progress: more counters for config.json (swarm id, peer id, metrics, ...)
        """
        d = Path(directory)
        with self.lock:
            round, block, emb = self.round, _clone(self.base_block), _clone(self.base_emb)
            if not all(bool(torch.isfinite(t).all()) for t in (*block.values(), *emb.values())):
                raise CheckpointError(f"refusing to checkpoint non-finite weights (round {round}); the last one stays")
            step, samples = self.trainer.step_count, self.samples
            optim = ck.optimizer_tensors(self.trainer.opt)  # taken with the weights: one generation
            if self.outer is not None:
                optim.update(self.outer.state_tensors())  # outer.<part>.<name>: beside AdamW's state.<#>.<key>
        ck.save_peer_generation(
            d,
            self.cfg,
            self.block_index,
            block,
            emb,
            optim,
            step,
            self.train_cfg,
            round=round,
            local_steps=step,
            samples=samples,
            **progress,
        )

    def restore(self, directory: str | Path) -> dict:
        """Resume from a peer checkpoint of this block: weights, round, AdamW and outer-optimizer state, step and
        sample counts.

        Returns the checkpoint's config.json body. Raises ConfigMismatch for another model config, and
        CheckpointError before anything is loaded when a file of the generation is missing or corrupt;
        AdamW state that does not fit is skipped with a warning (the weights still resume).
        """
        d = Path(directory)
        body = ck.read_config(d)
        if body["model_config"].config_hash() != self.cfg.config_hash():
            raise ConfigMismatch(
                f"checkpoint {d} holds another model config ({body['config_hash']}); "
                "use another --checkpoint-dir or the same model flags"
            )
        ck.verify_generation(d, body)  # every file of the generation, or nothing
        block, step = ck.load_block(d, self.cfg, self.block_index)
        emb = ck.load_embedding(d, self.cfg)
        self.adopt(block.state_dict(), emb.state_dict(), int(body.get("round", 0)))
        with self.lock:
            try:
                ck.load_optimizer(d, self.block_index, self.trainer.opt)
            except CheckpointError as exc:
                logger.warning("optimizer state not restored: %s", exc)
            if self.outer is not None:  # its buffers (none in the file: zero, the reset rule)
                path = ck.optim_file(d, self.block_index)
                self.outer.load_state_tensors(ck.load_tensors(path)[0] if path.is_file() else {})
            self.trainer.step_count = step
            self.samples = int(body.get("samples", 0))
        return body
