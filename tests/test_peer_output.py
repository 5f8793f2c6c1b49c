"""What a peer tells its user: the training CE in `status` (table and JSON), and one line per round.

`status` shows the training CE the daemon knows (train_ce) next to the held-out CE (last_ce, only
with --eval-every); a daemon prints each round once on stdout, and its stderr stays quiet unless
-v / --verbose asks for the per-exchange INFO logs (hivemind's log routing no longer resets the
level to INFO).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import subprocess
import sys
import threading
import time

import pytest
from swarm_utils import daemon_config, running

from cli.status import no_nan, render
from swarmd.node.runner import setup_logging, started_worker_pool
from swarmd.tools.survey import record_row, survey_peer

pytestmark = pytest.mark.usefixtures("one_thread")


def test_status_shows_the_training_ce_without_eval_every(tmp_path, capsys):
    async def scenario():
        async with running(daemon_config(tmp_path, 0, seed=0, discovery="static")) as (d,):
            before = await survey_peer(d.server.address, 5)
            await d.run_round()
            after = await survey_peer(d.server.address, 5)
            return before, after, d.metrics.last_train_ce, d.service.status()

    before, after, train_ce, st = asyncio.run(scenario())
    assert math.isnan(before["peers"][0]["train_ce"])  # no step yet: unknown, not 0
    (row,) = after["peers"]
    assert 0 < row["train_ce"] < 10 and row["train_ce"] == train_ce == st.train_ce
    assert math.isnan(row["last_ce"])  # the held-out CE needs --eval-every
    as_json = json.loads(json.dumps(no_nan(after)))
    assert as_json["peers"][0]["train_ce"] == pytest.approx(train_ce) and as_json["peers"][0]["last_ce"] is None
    render(after)
    table = capsys.readouterr().out
    assert "train CE" in table and f"{train_ce:.4f}" in table
    assert math.isnan(record_row(_record()).get("train_ce"))  # a peer known only from the DHT: unknown


def _record():
    from swarmd.membership.records import PeerRecord

    return PeerRecord("p", "", 0, 3, 1.0, "h", "", True, "test")


@pytest.fixture
def root_logging():
    """Put the root logger's level and handlers back after a test that configures logging (hivemind's, grpc's too)."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    libraries = {name: logging.getLogger(name).level for name in ("hivemind", "grpc")}
    yield root
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, library_level in libraries.items():
        logging.getLogger(name).setLevel(library_level)


@pytest.mark.parametrize(("verbose", "level"), [(False, logging.WARNING), (True, logging.INFO)])
def test_setup_logging_keeps_its_level_after_routing_hivemind_logs(root_logging, monkeypatch, verbose, level):
    monkeypatch.delenv("HIVEMIND_LOGLEVEL", raising=False)
    monkeypatch.setenv("GRPC_VERBOSITY", "ERROR")  # setup_logging sets it only where unset
    setup_logging(verbose)
    assert root_logging.level == level
    assert logging.getLogger("swarmd.averaging.gossip").getEffectiveLevel() == level
    # hivemind's and grpc's own lines (e.g. the DHT process's ERROR + traceback for a client-mode node's
    # multiaddrs) reach stderr only with -v (issue 22)
    library = level if verbose else logging.CRITICAL
    assert logging.getLogger("hivemind.dht").getEffectiveLevel() == library
    assert logging.getLogger("grpc._cython.cygrpc").getEffectiveLevel() == library


def test_grpcs_traceback_for_a_caller_that_hung_up_is_one_info_line(root_logging, monkeypatch, caplog):
    """A refused peer hangs up before the server's status goes out: grpc logs ExecuteBatchError with a traceback, which
    the fault matrix counted as an honest peer's traceback; it is one INFO line now, other grpc errors unchanged."""
    monkeypatch.setenv("GRPC_VERBOSITY", "ERROR")
    setup_logging(True, hivemind=False)
    server = logging.getLogger("grpc._cython.cygrpc")
    for message in ("ExecuteBatchError raised in core by servicer method [/swarmd.v1.Swarm/ExchangeDeltas]", "other"):
        try:
            raise RuntimeError("Failed execute_batch")
        except RuntimeError:
            server.exception(message)
    hung_up, other = (r for r in caplog.records if r.name == "grpc._cython.cygrpc")
    assert (hung_up.levelname, hung_up.exc_info) == ("INFO", None)
    assert hung_up.getMessage().startswith("the caller hung up before our answer (ExecuteBatchError")
    assert (other.levelname, other.getMessage(), other.exc_info is not None) == ("ERROR", "other", True)


def test_an_explicit_hivemind_loglevel_is_kept(root_logging, monkeypatch):
    monkeypatch.setenv("HIVEMIND_LOGLEVEL", "DEBUG")
    monkeypatch.setenv("GRPC_VERBOSITY", "ERROR")
    setup_logging(False)
    assert logging.getLogger("hivemind.p2p").getEffectiveLevel() == logging.DEBUG
    assert logging.getLogger("swarmd").getEffectiveLevel() == logging.WARNING


def test_a_daemon_prints_each_round_once_and_keeps_stderr_quiet_without_verbose(tmp_path):
    # one process (python -m swarmd, as LocalSwarm spawns peers, without --verbose); the verbose level is
    # the parametrized test above
    config = tmp_path / "peer.json"
    config.write_text(json.dumps(daemon_config(tmp_path, 0, discovery="static", max_rounds=2).to_dict()))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GRPC_VERBOSITY": "ERROR"}
    cmd = [sys.executable, "-m", "swarmd", "--config", str(config)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr
    rounds = [line for line in done.stdout.splitlines() if line.startswith("round ")]
    assert len(rounds) == 2 and rounds[0].startswith("round 1: block 0 train ce "), done.stdout
    assert "INFO" not in done.stderr and "merged" not in done.stderr, done.stderr


def test_a_daemons_worker_pool_starts_every_thread_up_front_and_never_grows():
    """Lazy pool growth under bursts of slow calls read as a thread leak in the soak; started up front, it is flat."""
    workers = lambda: sum(t.name.startswith("swarmd-worker") for t in threading.enumerate())
    before = workers()  # the pool's own threads: other tests' threads may come and go meanwhile
    pool = started_worker_pool(5)
    try:
        assert workers() - before == 5
        list(pool.map(time.sleep, [0.05] * 20))  # a burst of blocking calls
        assert workers() - before == 5
    finally:
        pool.shutdown(wait=True)
    assert workers() == before
