"""Delayed averaging ("no pause for the network"): a round's merge lands one round late.

Owns the correction rule and its application to a BlockState. With GossipConfig.overlap on, a peer
snapshots round r's delta (own_r = live - base_r, exact, before the codec and error feedback) and
keeps training from its live weights while the deltas are encoded, exchanged and merged (as in
delayed averaging / streaming DiLoCo). When the merged delta lands:

    base_{r+1} = base_r + merged_r                 BlockState.apply_merge, unchanged (an outer optimizer
                                                   there applies too): the same on every replica, so
                                                   base hashes, the delta check and re-sync keep working
    live      := base_{r+1} + (live - base_r - own_r)
               = live + (base_{r+1} - base_r) - own_r

so the steps taken meanwhile are kept and the next delta (live - base_{r+1}) holds exactly them. With
no step taken meanwhile, live - base_r - own_r is exactly 0 and live = base_{r+1}, bit for bit what a
merge without overlap gives. AdamW moments are left as they are (as apply_merge does). The whole
landing happens under the state's lock, so the training thread, serving snapshots and checkpoints see
either the old or the new generation, never a mix.
No grpc, no asyncio here.
"""

from __future__ import annotations

import torch

from swarmd.averaging.state import BlockState

Tensors = dict[str, torch.Tensor]


def corrected(live: Tensors, old_base: Tensors, new_base: Tensors, own: Tensors) -> Tensors:
    """The live weights after a late merge: new_base + (live - old_base - own), per tensor (fp32).

    :param live: the live weights now (own_r plus the steps taken since the snapshot, on old_base)
    :param own: the exact delta this peer snapshotted for the merged round (live - old_base back then)
    """
    return {k: new_base[k] + ((live[k].float() - old_base[k]) - own[k]) for k in new_base}


def _live(module: torch.nn.Module) -> Tensors:
    return {k: v.detach().to("cpu", torch.float32).clone() for k, v in module.state_dict().items()}


@torch.no_grad()
def land_merge(
    state: BlockState,
    block_delta: Tensors | None,
    emb_delta: Tensors | None,
    own_block: Tensors,
    own_emb: Tensors,
) -> None:
    """Apply a round's merge one round late (see the module doc): base moves by the merge, live keeps the steps
    taken since own_block / own_emb were snapshotted; round += 1. Atomic under the state's lock.

    :param block_delta: the merged block delta (None: keep the base, as apply_merge does)
    :param own_block: this peer's exact block delta of that round (zeros if it sent none)
    """
    with state.lock:
        trainer = state.trainer
        live = {"block": _live(trainer.block), "emb": _live(trainer.emb)}
        old = {"block": dict(state.base_block), "emb": dict(state.base_emb)}
        old = {part: {k: v.clone() for k, v in tensors.items()} for part, tensors in old.items()}
        state.apply_merge(block_delta, emb_delta)  # base_{r+1}, live := base_{r+1}, round += 1, hashes
        for part, module, own, base in (
            ("block", trainer.block, own_block, state.base_block),
            ("emb", trainer.emb, own_emb, state.base_emb),
        ):
            params = module.state_dict()
            for k, v in corrected(live[part], old[part], base, own).items():
                params[k].copy_(v.to(params[k].dtype))
