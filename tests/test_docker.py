"""The Docker image built and run for real (benchmarks/docker_image.py with a small budget).

Builds (or reuses) the debootstrap base and the project image with the local torch wheel, runs the
daemon in container A until its HEALTHCHECK says healthy, joins container B to it over a docker
network, and checks B merges a round with A and A's `blocktrain status --swarm` lists both. Slow
(minutes: a build, two daemons) and needs root and docker (skipped otherwise):
`python -m pytest -m slow tests/test_docker.py`. The layer cache is on here (the cold build's
figures are the benchmark's: `python benchmarks/docker_image.py`).
"""

from __future__ import annotations

import faulthandler
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.docker_image import default_wheel, unavailable  # noqa: E402

BUDGET_S = 1800  # from nothing on 2 shared cores: the base ~1-2 min, the build 2-5 min, the run 1-10 min (load)

pytestmark = pytest.mark.slow


def test_image_builds_gets_healthy_and_a_second_container_joins(tmp_path):
    why = unavailable()  # here, not at collection: it asks the docker daemon
    if why:
        pytest.skip(f"docker image test: {why}")
    out = tmp_path / "docker_image.json"
    args = [sys.executable, str(ROOT / "benchmarks" / "docker_image.py"), "--cache", "--no-rebuild"]
    # a generous stop timeout: under heavy load the interpreter's teardown after `stopped at` can pass docker's 10 s
    args += ["--timeout-s", str(BUDGET_S), "--wait-s", "600", "--stop-timeout-s", "60", "--out", str(out)]
    args += ["--build-log", str(tmp_path / "build.log")]
    if default_wheel() is None:
        pytest.skip("no local torch wheel (/opt/wheels/torch-*cp311*.whl or $BLOCKTRAIN_TORCH_WHEEL)")
    # minutes by design: pytest's faulthandler_timeout (300 s) would dump every thread's stack mid-run; the
    # script's --timeout-s and this subprocess timeout bound it instead
    faulthandler.cancel_dump_traceback_later()
    res = subprocess.run(args, capture_output=True, text=True, timeout=BUDGET_S + 120)
    assert out.exists(), res.stdout + res.stderr
    r = json.loads(out.read_text())
    assert res.returncode == 0 and r["ok"], r.get("error") or res.stdout + res.stderr
    assert r["image_size_bytes"] > 0
    assert r["a_healthy_s"] is not None and r["b_healthy_s"] is not None
    assert r["b_merged_round"]["participation"] == 1.0
    assert r["b_merged_round"]["block"] == r["block"]
    assert len(r["status_peers"]) == 2
    assert len({p["address"] for p in r["status_peers"]}) == 2  # each at its own container address
    assert r["b_corpus"] and "standard library" in r["b_corpus"]  # B runs without --data: the stdlib corpus
    for peer in ("a", "b"):  # SIGTERM: each checkpoints, says so and exits 0 (137 would be docker's SIGKILL)
        assert r["stop"][peer]["exit_code"] == 0, r["stop"]
        assert r["stop"][peer]["last_line"].startswith("stopped at round "), r["stop"]
