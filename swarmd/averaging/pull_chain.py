"""Chained predecessor pulls: a round-start pull as an int8 step along a compact chain both sides hold.

A later block runs its predecessors forward only, once a round from their merged weights. Pulled int8 every round
(swarmd.averaging.compact) the whole block goes again. Along a chain it goes once: the puller holds C, what it
decoded of its last pull; the next round it names weights_hash(C) (PullStateRequest.against) and the peer answers
W - C int8 at PULL_CHAIN_LEVELS steps per row rms (about half the bytes of the block int8), from which both sides
compute the same C' = C + decode(step) (the codec is deterministic). Each step is taken against the chain itself, so
what one step rounds off goes into the next (error feedback): the puller runs W to within one round's rounding,
however long the chain.

PullChains is the serving side: the chain states pullers hold, by hash, at most MAX_CHAINS (least recently used
first out), and each step encoded once per (chain state, merged weights) for every puller on that chain. A chain
ends every CHAIN_ROUNDS rounds (round // CHAIN_ROUNDS changes): its pullers then get the block again as a new
chain's start, so the pullers of one peer share one chain however they joined, and a chain's state never ages.
A puller naming a state the peer does not hold (evicted, restarted, another replica's chain) gets a start as well;
one whose request is refused (a peer from before chained pulls) asks again for the block itself (StatePulls).
chain_pull is the simulator's hand-off. Pure: no grpc, no asyncio.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

from swarmd.averaging.compact import encode_compact
from swarmd.averaging.delta import decode, encode, shapes_of
from swarmd.averaging.state import weights_hash
from swarmd.protocol import Codec, PayloadKind
from swarmd.transport.framing import Encoded

Tensors = dict[str, torch.Tensor]
PULL_CHAIN_LEVELS: float | None = 1.0  # int8 steps per row rms of a chain step (error-fed: coarser than a pull)
MAX_CHAINS = 4  # chain states a peer holds for its pullers (one block copy each)
CHAIN_ROUNDS = 32  # every chain restarts when round // CHAIN_ROUNDS changes


def own_decoding(enc: Encoded, like: Tensors) -> Tensors:
    """What a puller decodes of `enc` (a payload we encoded, shaped like `like`): the same decode() it runs."""
    h = enc.header
    meta: dict[str, Any] = dict(swarm_id=h.swarm_id, config_hash=h.config_hash, block_index=h.block_index)
    return decode(enc, shapes_of(like), kind=PayloadKind.from_pb(h.kind), **meta)


def copied(enc: Encoded) -> Encoded:
    """A payload of the same bytes under a header of its own (a kept answer is signed in place per caller)."""
    header = type(enc.header)()
    header.CopyFrom(enc.header)
    return Encoded(header, enc.payload)


def chain_step(held: Tensors, step: Tensors) -> Tensors:
    """The chain's next state: held + step (both sides compute exactly this)."""
    return {k: held[k] + step[k] for k in held}


def encode_step(held: Tensors, weights: Tensors, against: str, **header: Any) -> Encoded:
    """weights - held as a chain step (int8, PULL_CHAIN_LEVELS), its base_hash the held state's hash."""
    step = {k: weights[k].detach().to("cpu", torch.float32) - held[k] for k in held}
    return encode(step, Codec.INT8, int8_rms_levels=PULL_CHAIN_LEVELS, base_hash=against, **header)


class PullChains:
    """The chain states of one peer's block that its pullers hold (see the module doc).

    :param header: kind -> encode()'s header keywords for a payload of that kind (swarm, config, block, round)
    """

    def __init__(self, header: Callable[[PayloadKind], dict[str, Any]], max_chains: int = MAX_CHAINS):
        self.header, self.max_chains = header, max_chains
        self._states: OrderedDict[str, tuple[int, Tensors]] = OrderedDict()  # chain hash -> (epoch, state)
        self._start: tuple[str, int, Encoded] | None = None  # (weights hash, epoch, payload) of the last start
        self._steps: dict[str, Encoded] = {}  # chain hash -> the step to _steps_to
        self._steps_to = ""  # the weights hash every kept step leads to

    def answer(self, weights: Tensors, weights_hash_: str, round: int, against: str = "") -> Encoded:
        """A compact pull's answer (unsigned): a step along the chain whose state hashes to `against` when we hold
        it and it is of this epoch (round // CHAIN_ROUNDS), else the block itself as a new chain's start."""
        epoch = round // CHAIN_ROUNDS
        held = self._states.get(against) if against else None
        if held is None or held[0] != epoch:
            return copied(self.start(weights, weights_hash_, epoch))
        self._states.move_to_end(against)
        if self._steps_to != weights_hash_:
            self._steps, self._steps_to = {}, weights_hash_
        if against not in self._steps:
            enc = encode_step(held[1], weights, against, **self.header(PayloadKind.BLOCK_DELTA))
            self._keep(chain_step(held[1], own_decoding(enc, held[1])), epoch)
            self._steps[against] = enc
        return copied(self._steps[against])

    def start(self, weights: Tensors, weights_hash_: str, epoch: int) -> Encoded:
        """The block int8 (base_hash: its fp32 weights'), its decoding kept as a chain state (once per weights)."""
        if self._start is None or self._start[:2] != (weights_hash_, epoch):
            enc = encode_compact(weights, base_hash=weights_hash_, **self.header(PayloadKind.BLOCK_STATE))
            self._keep(own_decoding(enc, weights), epoch)
            self._start = (weights_hash_, epoch, enc)
        return self._start[2]

    def _keep(self, state: Tensors, epoch: int) -> None:
        self._states[weights_hash(state)] = (epoch, state)
        while len(self._states) > self.max_chains:
            self._states.popitem(last=False)

    def __len__(self) -> int:
        return len(self._states)


def chain_pull(
    weights: Tensors, held: Tensors | None, round: int, started: int, block_index: int
) -> tuple[Tensors, int, bool]:
    """The simulator's hand-off of one chained pull: (what the puller runs, wire bytes, whether it was a start):
    a step from `held` (the chain state the puller holds, started at round `started`) while the epoch lasts, else
    a start."""
    meta: dict[str, Any] = dict(swarm_id="sim", config_hash="sim", block_index=block_index)
    if held is None or round // CHAIN_ROUNDS != started // CHAIN_ROUNDS:
        enc = encode_compact(weights, kind=PayloadKind.BLOCK_STATE, **meta)
        return own_decoding(enc, weights), enc.wire_bytes, True
    enc = encode_step(held, weights, "", kind=PayloadKind.BLOCK_DELTA, **meta)
    return chain_step(held, own_decoding(enc, held)), enc.wire_bytes, False
