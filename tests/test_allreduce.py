"""swarmd.averaging.allreduce: the butterfly all-reduce over an in-memory exchanger (and once over real gRPC)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from swarmd.averaging.allreduce import ButterflyRound, dials, is_allreduce, part_bounds, relative_error
from swarmd.errors import ValidationError
from swarmd.membership.identity import Identity
from swarmd.transport.framing import Encoded

META = dict(swarm_id="s", config_hash="c", kind="block_delta", block_index=0)


class Memory:
    """Routes exchange(address, payload) to the ButterflyRound at that address; counts bytes sent."""

    def __init__(self, rounds: dict[str, ButterflyRound], down: set[str] = frozenset()):
        self.rounds, self.down, self.sent = rounds, down, 0

    async def exchange(self, address: str, outgoing: Encoded, timeout_s: float) -> Encoded:
        if address in self.down:
            raise ConnectionError(f"{address} is down")
        self.sent += outgoing.wire_bytes
        return await self.rounds[address].handle(outgoing)


def group(n: int, numel: int, seed: int = 0, **kw):
    ids = [Identity.generate(bytes([k]) * 32) for k in range(n)]
    g = torch.Generator().manual_seed(seed)
    vectors = {i.peer_id: torch.randn(numel, generator=g) for i in ids}
    peers = sorted(vectors)
    rounds = {
        i.peer_id: ButterflyRound(vectors[i.peer_id], identity=i, peers=peers, round=3, meta=META, **kw) for i in ids
    }
    return ids, vectors, rounds


def run_all(rounds, client, skip=()):
    addresses = {p: p for p in rounds}

    async def main():
        return await asyncio.gather(*(r.run(client, addresses) for p, r in rounds.items() if p not in skip))

    return asyncio.run(main())


def test_part_bounds_and_dialing():
    assert part_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert part_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    for n in range(1, 9):
        for i in range(n):
            for j in range(n):
                if i != j:
                    assert dials(i, j, n) != dials(j, i, n)  # exactly one side opens each pair's stream
        opened = [sum(dials(i, j, n) for j in range(n) if j != i) for i in range(n)]
        assert max(opened) - min(opened) <= 1


@pytest.mark.parametrize("n, numel", [(1, 10), (2, 10), (3, 1000), (5, 7), (6, 4096)])
def test_every_peer_gets_the_mean(n, numel):
    _, vectors, rounds = group(n, numel)
    client = Memory(rounds)
    results = run_all(rounds, client)
    mean = torch.stack(list(vectors.values())).double().mean(0)
    for r, out in zip(rounds.values(), results):
        assert not r.missing and relative_error(out, mean) < 1e-6
    assert all(torch.equal(results[0], out) for out in results)  # one merge per part: every peer has the same bits
    if n > 1:  # about 2 (n - 1) / n vectors sent per peer
        assert client.sent / n < 2 * (n - 1) / n * numel * 4 + 4096


def test_fp16_codec_is_within_1e_3():
    _, vectors, rounds = group(4, 5000, codec="fp16")
    results = run_all(rounds, Memory(rounds))
    mean = torch.stack(list(vectors.values())).mean(0)
    assert all(relative_error(out, mean) < 1e-3 for out in results)


def test_a_peer_that_is_down_leaves_its_part_unaveraged():
    ids, vectors, rounds = group(4, 400, timeout_s=1.0)
    dead = ids[2].peer_id
    results = run_all(rounds, Memory(rounds, down={dead}), skip={dead})
    alive = [p for p in sorted(vectors) if p != dead]
    mean_alive = torch.stack([vectors[p] for p in alive]).mean(0)
    for p, out in zip([p for p in rounds if p != dead], results):
        r = rounds[p]
        # the dead peer's part is missing; a live owner that waited the whole timeout for the dead peer's chunk may
        # answer just after ours ran out too (both wait timeout_s): that part stays unaveraged as well
        assert dead in r.missing
        for owner in r.missing:
            s, e = r.bounds[r.index[owner]]
            assert torch.equal(out[s:e], vectors[p][s:e])  # a missing owner's part: our own values
        own_s, own_e = r.bounds[r.mine]
        assert relative_error(out[own_s:own_e], mean_alive[own_s:own_e]) < 1e-6  # merged without the dead one


def test_forged_tampered_and_foreign_payloads_are_refused():
    ids, _, rounds = group(3, 30)
    a, b = rounds[ids[0].peer_id], rounds[ids[1].peer_id]
    good = a.scatter_payload(b.mine)
    assert is_allreduce(good)
    tampered = Encoded(good.header, bytes(len(good.payload)))
    with pytest.raises(ValidationError, match="signature"):
        asyncio.run(b.handle(tampered))
    outsider = Identity.generate(b"\x09" * 32)
    stranger = ButterflyRound(
        torch.zeros(30), identity=outsider, peers=[outsider.peer_id, *rounds], round=3, meta=META
    ).scatter_payload(1)
    with pytest.raises(ValidationError, match="not a peer"):
        asyncio.run(b.handle(stranger))
    wrong_part = a.scatter_payload((b.mine + 1) % 3)  # a part b does not own
    with pytest.raises(ValidationError, match="unexpected"):
        asyncio.run(b.handle(wrong_part))
    asyncio.run(b.handle(good))
    with pytest.raises(ValidationError, match="second contribution"):
        asyncio.run(b.handle(good))  # a replay counts once


def test_a_lying_owner_is_refused_by_the_check():
    def check(k, part, own):
        if float(part.norm()) > 10 * float(own.norm()) + 1e-6:
            raise ValidationError(f"merged part {k} is implausibly large")

    ids, vectors, rounds = group(3, 300, check=check)
    liar = rounds[ids[1].peer_id]
    liar.merge = lambda parts, weights: torch.full_like(parts[liar.me], 1e6)
    results = dict(zip(rounds, run_all(rounds, Memory(rounds))))
    for p, r in rounds.items():
        if p == liar.me:
            continue
        s, e = r.bounds[liar.mine]
        assert liar.me in r.missing and torch.equal(results[p][s:e], vectors[p][s:e])


def test_butterfly_over_grpc():
    """Three rounds behind real gRPC servers (the handler routes all-reduce payloads to the round)."""
    from swarmd.transport import PeerClient, start_server

    class Handler:
        def __init__(self, r):
            self.r = r

        async def exchange(self, incoming):
            return await self.r.handle(incoming)

    _, vectors, rounds = group(3, 60_000)

    async def main():
        servers = {p: await start_server(Handler(r), max_chunk_bytes=16 << 10) for p, r in rounds.items()}
        clients = {p: PeerClient(max_chunk_bytes=16 << 10) for p in rounds}
        addresses = {p: s.address for p, s in servers.items()}
        try:
            return await asyncio.gather(*(r.run(clients[p], addresses) for p, r in rounds.items()))
        finally:
            for c in clients.values():
                await c.close()
            for s in servers.values():
                await s.stop(0)

    results = asyncio.run(main())
    mean = torch.stack(list(vectors.values())).double().mean(0)
    assert all(relative_error(out, mean) < 1e-6 for out in results)
