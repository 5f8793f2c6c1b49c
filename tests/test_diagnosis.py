"""Issue 22: say why nothing merges. The diagnosis over a run's rounds (pure), the refusal classes a private swarm
sends, what a daemon does with a line (stop with exit code 3, or warn with --keep-trying), and the `join with:`
hint of a keyed swarm; with real daemons, a swarm key mismatch ends the joiner with the one line in bounded time."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from swarm_utils import daemon_config, peer_identities, running, write_corpus
from test_transport import FakeHandler

from swarmd.errors import NothingMerges, SwarmKeyMismatch, SwarmKeyRequired, Unauthenticated
from swarmd.membership.records import PeerRecord
from swarmd.metrics import failure_reason
from swarmd.node.config import DaemonConfig
from swarmd.node.daemon import Daemon
from swarmd.node.diagnosis import (
    HISTORY,
    PeerFacts,
    RoundOutcome,
    Watch,
    counts_since,
    diagnose,
    round_outcome,
)
from swarmd.node.runner import join_hint
from swarmd.transport import PeerClient, start_server
from swarmd.transport.auth import new_swarm_key, parse_swarm_key, write_swarm_key

FACTS = PeerFacts("sw", "ours", has_key=False, joined=True)
KEYED = replace(FACTS, has_key=True)
PEER = RoundOutcome(expected=2, ours=1)  # a round with a peer of our swarm and config that merged nothing
MERGED = RoundOutcome(expected=2, accepted=2, ours=1)


def rounds(outcome: RoundOutcome, n: int = 3, step_s: float = 1.0) -> list[RoundOutcome]:
    return [replace(outcome, at_s=i * step_s) for i in range(n)]


# -- the diagnosis (pure) ------------------------------------------------------------------------------------
def test_refusals_of_three_rounds_name_the_key_problem_each_side_sees():
    required = replace(PEER, dial_failures={"swarm_key_required": 2})
    line = diagnose(rounds(required), FACTS)
    assert line == (
        "every exchange was refused for 3 rounds: the peers require a swarm key and this peer has none "
        "(pass --swarm-key FILE with the swarm's key)"
    )
    mismatch = replace(PEER, dial_failures={"swarm_key_mismatch": 1})
    assert "this peer's swarm key differs from theirs" in diagnose(rounds(mismatch), KEYED)
    # the callee's gossip sees nothing: only its server's refusals say why
    callee = replace(PEER, refused_calls={"swarm_key_mismatch": 4})
    assert diagnose(rounds(callee), KEYED).startswith("every exchange failed for 3 rounds: this peer's swarm key")
    no_key_there = replace(PEER, refused_calls={"swarm_key_required": 2})
    assert "the peers have no swarm key and this peer has one" in diagnose(rounds(no_key_there), KEYED)
    assert diagnose(rounds(no_key_there), FACTS) == ""  # a public peer's server refuses nothing: not ours to say
    stale = replace(PEER, dial_failures={"unauthenticated": 1})
    assert "stale or malformed" in diagnose(rounds(stale), KEYED)


def test_a_cause_needs_three_failed_rounds_with_peers_and_a_merge_ends_the_streak():
    required = replace(PEER, dial_failures={"swarm_key_required": 2})
    assert diagnose(rounds(required, 2), FACTS) == ""
    assert diagnose([*rounds(required, 2), MERGED, required], FACTS) == ""
    nobody = RoundOutcome()  # alone: neither counts nor ends the streak
    assert "for 3 rounds" in diagnose([required, nobody, required, nobody, required], FACTS)
    # a cause seen once counts for the streak (a banned peer is not dialled, but still found: the round fails)
    banned = replace(PEER, expected=0)
    assert "require a swarm key" in diagnose([required, banned, banned], FACTS)
    # failures without a known cause (timeouts, stale rounds, peers gone) name nothing
    unknown = replace(PEER, dial_failures={"deadline": 2, "stale_round": 1, "unavailable": 1})
    assert diagnose(rounds(unknown, 10), FACTS) == ""


def test_records_of_another_config_or_swarm_id_and_none_of_ours():
    other = RoundOutcome(other_configs=("theirs", "theirs", "third"))
    assert diagnose(rounds(other), FACTS) == (
        "nothing merged for 3 rounds: the peers found run another model config (config hash theirs, ours ours): "
        "`blocktrain join` takes the swarm's config"
    )
    assert diagnose(rounds(replace(other, ours=1)), FACTS) == ""  # peers of our config exist: not the cause
    swarm = RoundOutcome(other_swarms=("main",))
    assert "another swarm id ('main', ours 'sw'): pass --swarm-id main" in diagnose(rounds(swarm), FACTS)


def test_a_joiner_that_finds_nobody_at_all_names_the_swarm_id_after_rounds_and_time():
    alone = RoundOutcome()
    assert diagnose(rounds(alone, 3, step_s=20.0), FACTS, alone_s=30) == (
        "no peer of swarm 'sw' was found through the peers given in 40 s: do they run another --swarm-id "
        "(their `join with:` line shows it)?"
    )
    assert diagnose(rounds(alone, 10, step_s=1.0), FACTS, alone_s=30) == ""  # not long enough
    assert diagnose(rounds(alone, 3, step_s=20.0), replace(FACTS, joined=False), alone_s=30) == ""  # a founder
    assert diagnose(rounds(alone, 3, step_s=20.0), FACTS, alone_s=30, seen_peers=True) == ""  # peers left


def test_round_outcome_sorts_the_records_and_counts_since_takes_differences():
    me = PeerRecord("me", "a:1", 0, 0, 0.0, "ours", "", False, "sw")
    records = [
        me,
        replace(me, peer_id="p1"),
        replace(me, peer_id="p2", config_hash="theirs"),
        replace(me, peer_id="p3", swarm_id="other"),
    ]
    foreign = [replace(me, peer_id="p4", swarm_id="main"), replace(me, peer_id="p1")]  # p1 twice: counted once
    o = round_outcome(2, 1, records, me, {"unavailable": 1}, {"swarm_key_required": 2}, 5.0, foreign)
    assert (o.expected, o.accepted, o.ours, o.other_configs, o.other_swarms) == (
        2,
        1,
        1,
        ("theirs",),
        ("other", "main"),
    )
    assert o.dial_failures == {"unavailable": 1} and o.refused_calls == {"swarm_key_required": 2} and o.talked
    assert not round_outcome(0, 0, [me], me).talked
    assert counts_since({"a": 3, "b": 1, "c": 2}, {"a": 1, "c": 2}) == {"a": 2, "b": 1}


def test_the_watch_stops_a_joiner_that_never_merged_and_else_warns_once_per_rounds():
    required = replace(PEER, dial_failures={"swarm_key_required": 1})
    watch = Watch(FACTS)
    verdicts = [watch.observe(o) for o in rounds(required)]
    assert verdicts[:2] == [None, None] and verdicts[2] is not None and verdicts[2].stop
    # --keep-trying: a warning at the 3rd failed round, then every 3 rounds once warn_gap_s passed
    keep = Watch(FACTS, keep_trying=True, warn_gap_s=10)
    said = [(i, v.stop) for i, o in enumerate(rounds(required, 12, step_s=5.0)) if (v := keep.observe(o))]
    assert said == [(2, False), (5, False), (8, False), (11, False)]
    # a founder, or a peer that merged before, only warns: a stranger never stops a running swarm
    for watch, first in ((Watch(replace(FACTS, joined=False)), []), (Watch(FACTS), [MERGED])):
        verdicts = [watch.observe(o) for o in [*first, *rounds(required)]]
        assert verdicts[-1] is not None and not verdicts[-1].stop
    # a merge ends the streak: the next one warns from its 3rd round again
    keep = Watch(FACTS, keep_trying=True)
    assert [bool(keep.observe(o)) for o in [*rounds(required), MERGED, *rounds(required)]] == [
        *(False, False, True),
        False,
        *(False, False, True),
    ]


def test_the_watch_keeps_a_bounded_history_and_the_first_round_while_alone():
    watch = Watch(FACTS, alone_s=30)
    for o in rounds(RoundOutcome(), HISTORY + 10, step_s=1.0):
        verdict = watch.observe(o)
    assert len(watch.outcomes) == HISTORY and watch.outcomes[0].at_s == 0.0
    assert verdict is not None and verdict.stop and "given in 41 s" in verdict.line
    busy = Watch(FACTS)
    for o in rounds(MERGED, HISTORY + 10):
        busy.observe(o)
    assert len(busy.outcomes) == HISTORY and busy.outcomes[0].at_s == 10.0


# -- what the wire says -----------------------------------------------------------------------------------------
def test_a_private_swarm_names_why_it_refused_a_call_on_both_sides():
    key = parse_swarm_key(new_swarm_key())

    async def main():
        heard: list[Unauthenticated] = []
        server = await start_server(FakeHandler(), swarm_key=key, on_refusal=heard.append)
        clients = [PeerClient(), PeerClient(swarm_key=parse_swarm_key(new_swarm_key())), PeerClient(swarm_key=key)]
        clients[0].swarm_key = None  # whatever BLOCKTRAIN_SWARM_KEY says
        results = []
        try:
            for client in clients:
                try:
                    results.append(await client.status(server.address, 5))
                except Exception as exc:
                    results.append(exc)
        finally:
            for client in clients:
                await client.close()
            await server.stop(0)
        return results, heard

    (no_key, other_key, member), heard = asyncio.run(main())
    assert isinstance(no_key, SwarmKeyRequired) and isinstance(other_key, SwarmKeyMismatch)
    assert member.peer_id == "peer-b"
    assert [type(e) for e in heard] == [SwarmKeyRequired, SwarmKeyMismatch]
    assert [failure_reason(e) for e in (no_key, other_key)] == ["swarm_key_required", "swarm_key_mismatch"]
    assert failure_reason(Unauthenticated("stale")) == "unauthenticated"


# -- the hint, the flag, the config ---------------------------------------------------------------------------
def test_the_join_hint_of_a_keyed_swarm_asks_for_the_key_file_never_shows_it():
    loop = "/ip4/127.0.0.1/tcp/4001/p2p/QmPeer"
    assert join_hint([loop], "sw") == f"blocktrain join {loop} --data FILE --swarm-id sw"
    assert join_hint([loop], "sw", keyed=True) == f"blocktrain join {loop} --data FILE --swarm-id sw --swarm-key FILE"


def test_keep_trying_is_a_flag_of_run_and_join_and_survives_the_config_file():
    from typer.testing import CliRunner

    from cli.main import app

    for command in ("run", "join"):
        result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0 and "--keep-trying" in result.output, result.output
    config = DaemonConfig(keep_trying=True)
    assert DaemonConfig.from_dict(json.loads(json.dumps(config.to_dict()))).keep_trying
    assert not DaemonConfig.from_dict({}).keep_trying


# -- real daemons ---------------------------------------------------------------------------------------------
def keyed(config: DaemonConfig, key: Path | None, **daemon) -> DaemonConfig:
    return replace(config, net=replace(config.net, swarm_key=str(key or "")), **daemon)


def test_a_joiner_without_the_key_of_a_private_swarm_stops_with_the_one_line(tmp_path, monkeypatch):
    """Static discovery: the founder has a key, the joiner none (or another one). The joiner's status calls are
    refused, so it finds nobody of its swarm; after three rounds it stops (a clean shutdown) with the cause."""
    monkeypatch.delenv("BLOCKTRAIN_SWARM_KEY", raising=False)
    key, other = tmp_path / "swarm.key", tmp_path / "other.key"
    write_swarm_key(key)
    write_swarm_key(other)
    founder = keyed(daemon_config(tmp_path, 0, seed=0, discovery="static"), key)

    async def scenario():
        async with running(founder) as (d0,):
            out = []
            for joiner_key in (None, other):
                joiner = keyed(
                    daemon_config(tmp_path, 0, seed=1, initial_peers=(d0.address,), discovery="static"), joiner_key
                )
                d1 = Daemon(joiner)
                started = time.monotonic()
                await d1.start()
                with pytest.raises(NothingMerges) as stopped:
                    await asyncio.wait_for(d1.serve(), 60)  # shuts down before it raises
                out.append((str(stopped.value), d1.state.round, d1.discovery, time.monotonic() - started))
            return out, d0.metrics.refused_calls

    (no_key, other_key), refused = asyncio.run(scenario())
    assert no_key[0] == (
        "every exchange was refused for 3 rounds: the peers require a swarm key and this peer has none "
        "(pass --swarm-key FILE with the swarm's key)"
    )
    assert other_key[0].startswith("every exchange was refused for 3 rounds: this peer's swarm key differs")
    for _, round_, discovery, took in (no_key, other_key):
        assert round_ == 3 and discovery is None and took < 60  # stopped after 3 rounds, DHT/discovery closed
    assert refused.get("swarm_key_required") and refused.get("swarm_key_mismatch")
    assert NothingMerges.exit_code == 3


def test_keep_trying_warns_and_goes_on(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("BLOCKTRAIN_SWARM_KEY", raising=False)
    key = tmp_path / "swarm.key"
    write_swarm_key(key)
    founder = keyed(daemon_config(tmp_path, 0, seed=0, discovery="static"), key)

    async def scenario():
        async with running(founder) as (d0,):
            joiner = daemon_config(tmp_path, 0, seed=1, initial_peers=(d0.address,), discovery="static", max_rounds=5)
            async with running(replace(joiner, keep_trying=True)) as (d1,):
                await asyncio.wait_for(d1.serve(), 60)
                return d1.state.round, d1.failure

    with caplog.at_level(logging.WARNING, logger="swarmd.node.daemon"):
        round_, failure = asyncio.run(scenario())
    warned = [r.getMessage() for r in caplog.records if "require a swarm key" in r.getMessage()]
    assert round_ == 5 and failure == "" and len(warned) == 1, warned  # once: the next is due 30 s later


@pytest.mark.swarm
def test_a_keyed_joiner_of_a_public_swarm_exits_3_with_one_line(tmp_path):
    """The issue's case, end to end on the real DHT: `blocktrain join MULTIADDR --swarm-key FILE` of a public swarm
    whose founder dials it (the lower peer id dials): every call of the founder is refused, the joiner's rounds
    merge nothing; it used to run forever at participation 0.00, now it exits 3 with one `error:` line. The
    founder, not joined through anybody, warns and goes on. A keyed founder's hint asks for the key file."""
    data = write_corpus(tmp_path)
    low, high = peer_identities(2)
    for name, identity in (("low.pem", low), ("high.pem", high)):
        (tmp_path / name).write_bytes(identity.to_pem())
        os.chmod(tmp_path / name, 0o600)
    key = tmp_path / "swarm.key"
    write_swarm_key(key)
    founder = replace(daemon_config(tmp_path, 0, seed=0, blocks=1), identity=str(tmp_path / "low.pem"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GRPC_VERBOSITY": "NONE"}
    env.pop("BLOCKTRAIN_SWARM_KEY", None)
    blocktrain = str(Path(sys.executable).with_name("blocktrain"))

    async def scenario():
        async with running(founder) as (d0,):
            serving = asyncio.create_task(d0.serve())
            maddr = d0.discovery.multiaddrs()[0]
            args = [maddr, "--swarm-id", "test", "--data", str(data), "--swarm-key", str(key)]
            args += ["--identity", str(tmp_path / "high.pem"), "--steps-per-round", "2", "--batch-size", "4"]
            args += ["--deadline-max", "2", "--codec", "fp32"]
            proc = await asyncio.create_subprocess_exec(
                blocktrain, "join", *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
            )
            started = time.monotonic()
            try:
                out, err = await asyncio.wait_for(proc.communicate(), 240)
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            took = time.monotonic() - started
            d0.stop()
            await asyncio.wait_for(serving, 30)
            return proc.returncode, out.decode(), err.decode(), took, d0.failure

    code, out, err, took, founder_failure = asyncio.run(scenario())
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 3, (out, err)
    assert errors == [
        "error: every exchange failed for 3 rounds: the peers have no swarm key and this peer has one (their calls "
        "carry no proof of it): drop --swarm-key (and BLOCKTRAIN_SWARM_KEY) to join a public swarm, or give every "
        "peer the same key"
    ], err
    assert "join with: blocktrain join " in out and "--swarm-key FILE" in out  # the joiner's own hint: it is keyed
    assert "stopped at round" in out and took < 240
    assert founder_failure == ""  # the founder only warned


def test_join_with_the_swarm_key_asks_the_config_with_it(tmp_path, monkeypatch):
    """`blocktrain join HOST:PORT --swarm-key FILE` of a private swarm: the config request proves the key too (it was
    refused before, so the `join with: ... --swarm-key FILE` hint could not work)."""
    from test_cli_swarm import LiveDaemon
    from typer.testing import CliRunner

    from cli.main import app
    from swarmd.transport import auth

    monkeypatch.delenv("BLOCKTRAIN_SWARM_KEY", raising=False)
    monkeypatch.setattr(auth, "_default", None)  # join sets the process default: put it back afterwards
    monkeypatch.setattr(auth, "_default_set", False)
    key, data = tmp_path / "swarm.key", write_corpus(tmp_path)
    write_swarm_key(key)
    args = ["--swarm-id", "test", "--data", str(data), "--rounds", "1", "--steps-per-round", "2", "--batch-size", "4"]
    args += ["--deadline-max", "2", "--codec", "fp32", "--swarm-key", str(key)]
    with LiveDaemon(keyed(daemon_config(tmp_path, 0, discovery="static"), key)) as d:
        result = CliRunner().invoke(app, ["join", d.server.address, *args])
    assert result.exit_code == 0, result.output
    assert f"swarm config {d.cfg.config_hash()}" in result.output and "stopped at round" in result.output
