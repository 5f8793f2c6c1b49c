"""Issue 9 membership: a private swarm's key on a real gRPC server (every RPC but health needs a proof),
replayed and stale proofs, `blocktrain keygen swarm-key`, and TLS pinned to the signed record's fingerprint."""

from __future__ import annotations

import asyncio
import os

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from test_transport import META, FakeHandler, delta

from swarmd.averaging.delta import encode
from swarmd.errors import ConfigError, Unauthenticated, ValidationError
from swarmd.transport import PeerClient, start_server
from swarmd.transport.auth import (
    AUTH_HEADER,
    ProofChecker,
    load_swarm_key,
    make_proof,
    new_swarm_key,
    parse_swarm_key,
    use_swarm_key,
    write_swarm_key,
)
from swarmd.transport.server import SERVICE_NAME
from swarmd.transport.tls import fingerprint, make_self_signed
from swarmd.v1 import swarm_pb2 as pb
from swarmd.wire import to_proto

KEY = parse_swarm_key(new_swarm_key())


async def _every_rpc(client: PeerClient, address: str) -> dict[str, object]:
    """Each swarmd.v1 RPC once: its answer, or the exception it raised."""
    calls = {
        "GetStatus": lambda: client.status(address, 5),
        "GetConfig": lambda: client.swarm_config(address, 5),
        "PullState": lambda: client.pull_state(
            address, pb.PullStateRequest(config_hash=META["config_hash"], kind=pb.PAYLOAD_KIND_BLOCK_STATE), 5
        ),
        "ExchangeDeltas": lambda: client.exchange(address, encode(delta(1), "int8", **META, peer_id="peer-a"), 5),
        "Forward": lambda: client.forward_session(address, 5).step(
            pb.ForwardRequest(session_id="s", config_hash=META["config_hash"], z=to_proto(torch.zeros(1, 2)))
        ),
    }
    out: dict[str, object] = {}
    for name, call in calls.items():
        try:
            out[name] = await call()
        except Exception as exc:
            out[name] = exc
    return out


def test_a_private_swarm_refuses_every_rpc_without_the_key_and_keeps_health_open():
    async def main():
        server = await start_server(FakeHandler(), swarm_key=KEY)
        stranger, wrong, member = (
            PeerClient(),
            PeerClient(swarm_key=parse_swarm_key(new_swarm_key())),
            PeerClient(swarm_key=KEY),
        )
        try:
            refused = await _every_rpc(stranger, server.address)
            wrong_key = await _every_rpc(wrong, server.address)
            answered = await _every_rpc(member, server.address)
            health = await stranger.health(server.address)
            return refused, wrong_key, answered, health
        finally:
            for c in (stranger, wrong, member):
                await c.close()
            await server.stop(0)

    refused, wrong_key, answered, health = asyncio.run(main())
    assert set(refused) == {"GetStatus", "GetConfig", "PullState", "ExchangeDeltas", "Forward"}
    for name, result in [*refused.items(), *wrong_key.items()]:
        assert isinstance(result, Unauthenticated), (name, result)
        assert "--swarm-key" in str(result) and "\n" not in str(result)
    assert "no proof" in str(refused["GetStatus"]) and "another swarm key" in str(wrong_key["GetStatus"])
    assert not any(isinstance(r, Exception) for r in answered.values()), answered
    assert health == "SERVING"


def test_a_public_swarm_needs_no_key():
    async def main():
        server = await start_server(FakeHandler())
        client = PeerClient(swarm_key=KEY)  # a proof nobody asked for is ignored
        try:
            return await _every_rpc(PeerClient(), server.address), await _every_rpc(client, server.address)
        finally:
            await client.close()
            await server.stop(0)

    for results in asyncio.run(main()):
        assert not any(isinstance(r, Exception) for r in results.values()), results


def test_replayed_stale_and_misdirected_proofs_are_refused():
    checker = ProofChecker(KEY, window_s=60)
    method = f"/{SERVICE_NAME}/GetStatus"
    now = 1_000_000.0
    proof = make_proof(KEY, method, now=now)
    assert checker.problem(method, proof, now=now + 1) == ""
    assert checker.problem(method, proof, now=now + 2) == "a replayed proof"
    assert "allowed" in checker.problem(method, make_proof(KEY, method, now=now - 120), now=now)
    assert "allowed" in checker.problem(method, make_proof(KEY, method, now=now + 120), now=now)
    assert checker.problem(f"/{SERVICE_NAME}/PullState", make_proof(KEY, method, now=now), now=now) == (
        "a proof made with another swarm key"  # a proof is bound to its method
    )
    assert checker.problem(method, "v1.garbage", now=now) == "a malformed proof of the swarm key"

    async def replay_on_the_wire():  # the same metadata sent twice to a real server
        server = await start_server(FakeHandler(), swarm_key=KEY)
        channel = grpc.aio.insecure_channel(server.address)
        try:
            stub = __import__("swarmd.v1.swarm_pb2_grpc", fromlist=["SwarmStub"]).SwarmStub(channel)
            meta = ((AUTH_HEADER, make_proof(KEY, method)),)
            first = await stub.GetStatus(pb.StatusRequest(), metadata=meta, timeout=5)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.GetStatus(pb.StatusRequest(), metadata=meta, timeout=5)
            old = ((AUTH_HEADER, make_proof(KEY, method, now=__import__("time").time() - 3600)),)
            with pytest.raises(grpc.aio.AioRpcError) as err_old:
                await stub.GetStatus(pb.StatusRequest(), metadata=old, timeout=5)
            health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            return first, err.value, err_old.value, health
        finally:
            await channel.close()
            await server.stop(0)

    first, replayed, old, health = asyncio.run(replay_on_the_wire())
    assert first.peer_id == "peer-b"
    assert replayed.code() == grpc.StatusCode.UNAUTHENTICATED and "replayed" in replayed.details()
    assert old.code() == grpc.StatusCode.UNAUTHENTICATED and "check the clocks" in old.details()
    assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_swarm_key_files_and_the_process_default(tmp_path, monkeypatch):
    path = tmp_path / "swarm.key"
    write_swarm_key(path)
    assert os.stat(path).st_mode & 0o777 == 0o600 and len(load_swarm_key(path)) == 32
    with pytest.raises(ConfigError, match="never overwritten"):
        write_swarm_key(path)
    (tmp_path / "bad.key").write_text("hello")
    with pytest.raises(ConfigError, match="not a swarm key file"):
        load_swarm_key(tmp_path / "bad.key")
    with pytest.raises(ConfigError, match="cannot read"):
        load_swarm_key(tmp_path / "missing.key")
    monkeypatch.setenv("BLOCKTRAIN_SWARM_KEY", str(path))
    assert PeerClient().swarm_key == load_swarm_key(path)  # every client of this process proves it
    use_swarm_key(None)
    try:
        assert PeerClient().swarm_key is None
    finally:
        import swarmd.transport.auth as auth

        monkeypatch.setattr(auth, "_default_set", False)


def test_keygen_command_writes_a_key(tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    path = tmp_path / "k"
    first = CliRunner().invoke(app, ["keygen", "swarm-key", str(path)])
    assert first.exit_code == 0, first.output
    assert len(load_swarm_key(path)) == 32
    again = CliRunner().invoke(app, ["keygen", "swarm-key", str(path)])
    assert again.exit_code == 2 and "never overwritten" in again.output


def test_tls_server_with_the_certificate_pinned_from_the_signed_record():
    cert, key = make_self_signed()
    other_cert, _ = make_self_signed()

    async def main():
        server = await start_server(FakeHandler(), tls=(cert, key), swarm_key=KEY)
        client, plain, liar = PeerClient(swarm_key=KEY), PeerClient(swarm_key=KEY), PeerClient(swarm_key=KEY)
        try:
            await client.pin(server.address, fingerprint(cert))
            status = await client.status(server.address, 5)
            results = await _every_rpc(client, server.address)
            try:
                await plain.status(server.address, 3)  # plaintext against a TLS-only server
                plain_error = None
            except Exception as exc:
                plain_error = exc
            with pytest.raises(ValidationError, match="does not name"):
                await liar.pin(server.address, fingerprint(other_cert))
            return status, results, plain_error
        finally:
            for c in (client, plain, liar):
                await c.close()
            await server.stop(0)

    status, results, plain_error = asyncio.run(main())
    assert status.peer_id == "peer-b"
    assert not any(isinstance(r, Exception) for r in results.values()), results
    assert plain_error is not None


def test_a_real_tensor_goes_through_a_keyed_tls_exchange():
    cert, key = make_self_signed()

    async def main():
        h = FakeHandler()
        server = await start_server(h, tls=(cert, key), swarm_key=KEY)
        client = PeerClient(swarm_key=KEY)
        try:
            await client.pin(server.address, fingerprint(cert))
            reply = await client.exchange(server.address, encode(delta(2), "int8", **META, peer_id="peer-a"), 10)
            return reply, h
        finally:
            await client.close()
            await server.stop(0)

    reply, h = asyncio.run(main())
    assert reply.header.peer_id == "peer-b" and len(h.received) == 1
    assert torch.isfinite(h.received[0]["w"]).all()


def test_two_daemons_of_a_private_tls_swarm_merge_and_a_stranger_is_refused(tmp_path):
    """Real daemons (static discovery): keyed + TLS + signed everything; both merge each other's deltas."""
    from dataclasses import replace

    from swarm_utils import daemon_config, running

    from swarmd.transport.tls import make_self_signed

    key_path = tmp_path / "swarm.key"
    write_swarm_key(key_path)
    for i in range(2):
        cert, pem_key = make_self_signed()
        (tmp_path / f"c{i}.pem").write_bytes(cert)
        (tmp_path / f"k{i}.pem").write_bytes(pem_key)
    configs = [
        replace(
            cfg,
            net=replace(
                cfg.net,
                swarm_key=str(key_path),
                tls_cert=str(tmp_path / f"c{i}.pem"),
                tls_key=str(tmp_path / f"k{i}.pem"),
            ),
        )
        for i, cfg in enumerate(daemon_config(tmp_path, 0, seed=i, discovery="static") for i in range(2))
    ]

    async def scenario():
        async with running(*configs) as daemons:
            addresses = [d.server.address for d in daemons]
            for d in daemons:
                d.discovery.addresses = addresses
            # static discovery asks GetStatus over TLS: pin each other's certificate first (the DHT path pins
            # from the signed records it reads)
            for d in daemons:
                for other in daemons:
                    if other is not d:
                        await d.client.pin(other.server.address, other.gossip.me.tls_fingerprint)
            reports = await asyncio.wait_for(asyncio.gather(*(d.run_round() for d in daemons)), 60)
            stranger = PeerClient(swarm_key=None)
            stranger.swarm_key = None
            await stranger.pin(addresses[0], daemons[0].gossip.me.tls_fingerprint)
            try:
                await stranger.status(addresses[0], 5)
                refused = None
            except Exception as exc:
                refused = exc
            finally:
                await stranger.close()
            return reports, refused, [d.state.block_hash for d in daemons]

    reports, refused, hashes = asyncio.run(scenario())
    assert all(r.accepted_block for r in reports) and hashes[0] == hashes[1]
    assert isinstance(refused, Unauthenticated)


@pytest.mark.slow  # back under -m slow: it timed out in a fresh-clone CI run (DHT stores and lookups over 20 s)
@pytest.mark.swarm  # two real-DHT daemons over TLS: ~6.5 s alone (like the other real-DHT swarm tests, slow under load)
def test_a_private_tls_swarm_on_the_real_dht_trains_and_never_uses_forged_records(tmp_path):
    """Two keyed TLS daemons on a real DHT; a stranger's DHT node (no validator, no key) stores an unsigned record
    and a record signed by another key, both claiming block 0 at round 1,000,000: never stored by the honest
    nodes, never read, never adopted. `blocktrain status` (survey) reaches both peers over pinned TLS."""
    from dataclasses import replace

    import hivemind
    from hivemind.utils import get_dht_time
    from swarm_utils import daemon_config, running, wait_until

    from swarmd.membership.identity import Identity
    from swarmd.membership.records import PeerRecord, block_key
    from swarmd.membership.trust import sign_record
    from swarmd.tools.survey import survey_discovered

    key_path = tmp_path / "swarm.key"
    write_swarm_key(key_path)

    def keyed(cfg, i):
        cert, pem_key = make_self_signed()
        (tmp_path / f"c{i}.pem").write_bytes(cert)
        (tmp_path / f"k{i}.pem").write_bytes(pem_key)
        tls = dict(tls_cert=str(tmp_path / f"c{i}.pem"), tls_key=str(tmp_path / f"k{i}.pem"))
        return replace(cfg, net=replace(cfg.net, swarm_key=str(key_path), **tls))

    reports: list[list] = []

    async def scenario():
        first = keyed(daemon_config(tmp_path, 0, seed=0, min_peers=2), 0)
        async with running(first, reports=reports) as (d0,):
            multiaddrs = tuple(d0.discovery.multiaddrs())
            stranger = hivemind.DHT(initial_peers=list(multiaddrs), start=True)
            try:
                liar, other = Identity.generate(), Identity.generate()
                claim = PeerRecord(
                    liar.peer_id, "127.0.0.1:1", 0, 1_000_000, 1e6, first.model.config_hash(), "x", False, "test"
                )
                signed_by_other = sign_record(replace(claim, peer_id=other.peer_id), other, 30)
                forged = replace(signed_by_other, peer_id=liar.peer_id)  # another key's signature
                for value in (claim, forged):
                    stranger.store(block_key("test", 0), value.to_value(), get_dht_time() + 30, subkey=liar.peer_id)
                second = keyed(daemon_config(tmp_path, 0, seed=1, initial_peers=multiaddrs, min_peers=2), 1)
                async with running(second, reports=reports) as (d1,):
                    daemons = [d0, d1]

                    async def both_announced():
                        return len(await d1.discovery.find_all()) == 2

                    await wait_until(both_announced, timeout_s=30, poll_s=0.5, what="both peers' records")
                    seen = [r.peer_id for r in await d1.records()]
                    client = PeerClient(swarm_key=load_swarm_key(key_path))
                    views: list[dict] = []

                    async def surveyed() -> bool:  # one DHT lookup can miss a record under load: ask again
                        views.append(await survey_discovered(d1.discovery, client))
                        return len(views[-1]["peers"]) == 2

                    try:  # what `blocktrain status` shows: both peers' status, over TLS pinned from their records
                        await wait_until(surveyed, timeout_s=30, poll_s=0.5, what="a survey that lists both peers")
                    except TimeoutError:
                        pass  # the assertions below show what the last survey saw
                    finally:
                        await client.close()
                    view = views[-1]
                    # train until both replicas hold one state at one round >= 2 (a round's merge can miss on a
                    # loaded machine: the next round's re-sync heals it), with a deadline; then stop
                    serving = [asyncio.create_task(d.serve()) for d in daemons]
                    converged: list = []

                    def same_state() -> bool:
                        (r0, h0), (r1, h1) = [(d.state.round, d.state.block_hash) for d in daemons]
                        if r0 >= 2 and (r0, h0) == (r1, h1) and any(r.accepted_block for log in reports for r in log):
                            converged.append((r0, h0))
                        return bool(converged)

                    try:
                        await wait_until(same_state, timeout_s=120, poll_s=0.05, what="one state at one round >= 2")
                    finally:
                        for d in daemons:
                            d.stop()
                        await asyncio.wait_for(asyncio.gather(*serving, return_exceptions=True), 60)
            finally:
                stranger.shutdown()
        return daemons, seen, liar.peer_id, view, converged

    (d0, d1), seen, liar_id, view, converged = asyncio.run(scenario())
    assert liar_id not in seen
    assert converged and converged[0][0] >= 2  # both replicas held one state at one round (checked while running)
    assert all(r.round < 1_000 for log in reports for r in log)  # the forged round 1,000,000 was never adopted
    assert any(r.accepted_block for log in reports for r in log)  # deltas crossed keyed TLS (load may cost one)
    assert d0.gossip.me.tls_fingerprint and d1.gossip.me.tls_fingerprint
    assert sorted(p["peer_id"] for p in view["peers"]) == sorted(d.peer_id for d in (d0, d1))
    assert all(p["state"] not in ("unreachable", "unknown") for p in view["peers"]), view["peers"]
