"""CLI of the swarm: --help of every command, `status` and `join` against a live daemon, the demo (slow)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path

import pytest
from swarm_utils import daemon_config, write_corpus
from typer.testing import CliRunner

from cli.main import app
from swarmd.node.daemon import Daemon

runner = CliRunner()


@pytest.mark.parametrize("command", ["run", "join", "status", "demo"])
def test_help_of_every_swarm_command(command):
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


class LiveDaemon:
    """A Daemon serving in a background thread with its own event loop (the CLI runs asyncio.run)."""

    def __init__(self, config):
        self.daemon = Daemon(config)
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self):
        async def main():
            try:
                await self.daemon.start()
                await self.daemon.run_round()
            except BaseException as exc:  # surfaced by __enter__
                self.error = exc
                self.ready.set()
                await self.daemon.shutdown()
                return
            self.ready.set()
            await self.daemon.stopping.wait()
            await self.daemon.shutdown()

        self.loop.run_until_complete(main())
        self.loop.close()

    def __enter__(self):
        self.thread.start()
        if not self.ready.wait(120):
            self.__exit__()
            raise AssertionError("daemon did not start within 120 s")
        if self.error:
            self.thread.join(30)
            raise self.error
        return self.daemon

    def __exit__(self, *exc):
        self.loop.call_soon_threadsafe(self.daemon.stop)
        self.thread.join(30)
        assert not self.thread.is_alive()


def test_status_of_a_live_daemon_table_and_json(tmp_path):
    with LiveDaemon(daemon_config(tmp_path, 1, discovery="static")) as d:
        address = d.server.address
        table = runner.invoke(app, ["status", address])
        as_json = runner.invoke(app, ["status", address, "--json"])
        swarm = runner.invoke(app, ["status", "--swarm", address, "--swarm-id", "test", "--json"])
    assert table.exit_code == 0, table.output
    assert d.peer_id[-6:] in table.output and "consensus" in table.output and "reachable" in table.output
    body = json.loads(as_json.output)
    (peer,) = body["peers"]
    assert peer["block"] == 1 and peer["round"] == 1 and peer["local_steps"] == 2 and peer["address"] == address
    for key in (
        "state",
        "samples_per_s",
        "last_ce",
        "bytes_sent",
        "bytes_received",
        "participation",
        "uptime_s",
        "peer_id",
        "reachable",
    ):
        assert key in peer
    assert [b["peers"] for b in body["blocks"]] == [0, 1]
    assert json.loads(swarm.output)["peers"][0]["peer_id"] == d.peer_id


@pytest.mark.swarm
def test_status_of_the_whole_swarm_through_the_dht(tmp_path):
    with LiveDaemon(daemon_config(tmp_path, 0)) as d:
        multiaddr = d.discovery.multiaddrs()[0]
        result = runner.invoke(app, ["status", "--swarm", multiaddr, "--swarm-id", "test", "--json"])
        wrong_id = runner.invoke(app, ["status", "--swarm", multiaddr, "--swarm-id", "nobody", "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert [p["peer_id"] for p in body["peers"]] == [d.peer_id] and body["peers"][0]["round"] == 1
    assert body["blocks"][0]["peers"] == 1 and body["blocks"][0]["samples_per_s"] > 0
    assert json.loads(wrong_id.stdout)["peers"] == [] and "no peer of swarm 'nobody'" in wrong_id.stderr


def test_status_errors_are_one_line():
    result = runner.invoke(app, ["status", "127.0.0.1:1", "--timeout", "1"])
    assert result.exit_code == 1 and "error:" in result.output and "Traceback" not in result.output
    both = runner.invoke(app, ["status"])
    assert both.exit_code == 2 and "either ADDRESS or --swarm" in both.output


def test_join_refuses_a_mismatched_explicit_model_flag(tmp_path):
    data = write_corpus(tmp_path)
    with LiveDaemon(daemon_config(tmp_path, 0, discovery="static")) as d:
        result = runner.invoke(
            app, ["join", d.server.address, "--swarm-id", "test", "--data", str(data), "--d-model", "64"]
        )
        wrong_swarm = runner.invoke(app, ["join", d.server.address, "--swarm-id", "other", "--data", str(data)])
    assert result.exit_code == 2, result.output
    assert "--d-model 64 (swarm: 32)" in result.output
    assert wrong_swarm.exit_code == 2 and "--swarm-id test" in wrong_swarm.output


def test_join_fetches_the_config_and_the_state(tmp_path):
    # HOST:PORT (static discovery) keeps this test free of a DHT process forked late in a busy
    # test process; the DHT path of join is what `blocktrain demo` and benchmarks/*.py run.
    data = write_corpus(tmp_path)
    with LiveDaemon(daemon_config(tmp_path, 0, discovery="static")) as d:
        result = runner.invoke(
            app,
            [
                "join",
                d.server.address,
                "--swarm-id",
                "test",
                "--data",
                str(data),
                "--rounds",
                "2",
                "--steps-per-round",
                "2",
                "--batch-size",
                "4",
                "--deadline-max",
                "2",
                "--codec",
                "fp32",
            ],
        )
    assert result.exit_code == 0, result.output
    assert (
        f"swarm config {d.cfg.config_hash()}" in result.output and "block: 1" in result.output
    )  # auto: block 1 had nobody
    assert (
        "round 2:" in result.output and "stopped at round 2" in result.output
    )  # adopted round 1 from the peer, then one round


@pytest.mark.swarm
def test_run_reports_a_dht_that_cannot_start(tmp_path):
    data = write_corpus(tmp_path)
    result = runner.invoke(
        app,
        [
            "run",
            "/ip4/127.0.0.1/tcp/1/p2p/QmXnnt3xYtRb1Y4RrTC8mkThQGr5rhr7DVvbTNmY5bMwPi",
            "--data",
            str(data),
            "--blocks",
            "2",
            "--d-model",
            "32",
            "--n-heads",
            "2",
            "--seq-len",
            "16",
            "--layers-per-block",
            "1",
        ],
    )
    assert result.exit_code == 1 and "could not start the DHT" in result.output


@pytest.mark.slow
@pytest.mark.swarm
def test_demo_six_peers_trains_the_assembled_model(tmp_path):
    """The README's command at a tiny size: 6 processes, B=3 x 2 replicas, from-noise CE goes down."""
    data = (
        Path(
            os.environ.get("BLOCKTRAIN_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data" / "wikitext-2"
        )
        / "train.txt"
    )
    if not data.is_file():
        data = write_corpus(tmp_path)
    result = runner.invoke(
        app,
        [
            "demo",
            "--peers",
            "6",
            "--blocks",
            "3",
            "--data",
            str(data),
            "--rounds",
            "3",
            "--steps-per-round",
            "10",
            "--d-model",
            "32",
            "--n-heads",
            "2",
            "--seq-len",
            "32",
            "--batch-size",
            "8",
            "--eval-tokens",
            "2048",
            "--workdir",
            str(tmp_path / "demo"),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    body = json.loads(result.output[result.output.index("{") :])
    assert (
        body["rounds"] == 3
        and body["ce_end"] < body["ce_start"]
        and body["participation"] > 0.8
        and body["bytes_sent"] > 0
    )
