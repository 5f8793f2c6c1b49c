"""The web swarm map: its JSON and CE history, its HTTP server (the page carries the view; a page asked for
before the first survey waits for it), the CLI's errors, and a real browser (headless Chromium) showing
every peer of a live 3-peer swarm on the real DHT, its first paint included (the live page's screenshot is
kept in docs/images/dashboard.png, which docs/operations.md shows)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import shutil
import socket
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from swarm_utils import daemon_config, running, wait_until
from typer.testing import CliRunner

from cli.main import app
from swarmd.errors import ConfigError
from swarmd.tools.dashboard import FIRST_VIEW, CeHistory, DashboardServer, page_bytes, run_dashboard, swarm_view

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOT = ROOT / "docs" / "images" / "dashboard.png"  # the screenshot docs/operations.md shows
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
runner = CliRunner()
nan = math.nan


def row(peer_id: str, block: int, round_: int, train_ce: float = nan, last_ce: float = nan) -> dict:
    """A peer row as survey.peer_row gives it (only the fields the dashboard reads matter)."""
    return {
        "peer_id": peer_id,
        "block": block,
        "state": "training",
        "round": round_,
        "local_steps": 2 * round_,
        "samples_per_s": 10.0,
        "participation": 1.0,
        "consensus_distance": 0.01,
        "train_ce": train_ce,
        "last_ce": last_ce,
        "bytes_sent": 100,
        "bytes_received": 200,
        "uptime_s": 5.0,
        "address": f"127.0.0.1:{1000 + round_}",
        "client_mode": False,
    }


def summary(*rows: dict, blocks: int = 3) -> dict:
    return {
        "peers": list(rows),
        "blocks": [{"block": b, "peers": 0, "samples_per_s": 0.0, "consensus_distance": nan} for b in range(blocks)],
        "consensus_distance": nan,
    }


def test_view_has_a_column_per_block_with_its_peers_and_strict_json():
    s = summary(row("p-b", 0, 2, 3.1), row("p-a", 0, 2, 3.3, 3.5), row("p-c", 1, 1))
    history = CeHistory()
    history.add(s, 1.0)
    view = swarm_view(s, history, "test")
    json.dumps(view, allow_nan=False)  # NaN became null
    assert [b["block"] for b in view["blocks"]] == [0, 1, 2]  # block 2 has no peer and still gets its column
    assert [p["peer_id"] for p in view["blocks"][0]["peers"]] == ["p-a", "p-b"]
    assert view["blocks"][2]["peers"] == [] and view["blocks"][0]["samples_per_s"] == 20.0
    assert view["peers"] == 3 and view["round"] == 2 and view["status"] == "ok"
    assert view["blocks"][1]["peers"][0]["train_ce"] is None and view["blocks"][1]["consensus_distance"] is None
    first = view["blocks"][0]["history"]
    assert first["round"] == [2] and first["train_ce"] == [pytest.approx(3.2)] and first["eval_ce"] == [3.5]
    assert view["blocks"][1]["history"]["t_s"] == []  # no CE known yet: no point


def test_history_adds_a_point_only_when_round_or_ce_changes():
    history = CeHistory(max_points=3)
    history.add(summary(row("p", 0, 1, 3.0)), 1.0)
    history.add(summary(row("p", 0, 1, 3.0)), 2.0)  # same round, same CE: nothing new
    assert history.series(0)["t_s"] == [1.0]
    for t, (r, ce) in enumerate([(2, 2.9), (3, 2.8), (4, 2.7)], start=3):
        history.add(summary(row("p", 0, r, ce)), float(t))
    series = history.series(0)
    assert series["round"] == [2, 3, 4] and series["train_ce"] == [2.9, 2.8, 2.7]  # bounded: the oldest went


def test_connecting_view_before_any_survey():
    view = swarm_view(None, CeHistory(), "s", status="connecting")
    assert view["blocks"] == [] and view["peers"] == 0 and view["status"] == "connecting"


def get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, reply.headers["Content-Type"], reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


def test_server_serves_the_page_and_the_json_on_an_ephemeral_port():
    server = DashboardServer(lambda: b'{"peers": 0}')
    port = server.start("127.0.0.1", 0)
    try:
        assert port > 0 and server.url == f"http://127.0.0.1:{port}/"
        code, ctype, page = get(server.url)
        assert code == 200 and ctype.startswith("text/html") and b"/api/swarm" in page
        assert b'<script id="first-view" type="application/json">{"peers": 0}</script>' in page  # drawn at once
        assert not re.search(rb"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # nothing from the internet
        assert get(server.url + "api/swarm") == (200, "application/json", b'{"peers": 0}')
        assert get(server.url + "nope")[0] == 404
        with pytest.raises(ConfigError, match="cannot serve the dashboard"):
            DashboardServer(lambda: b"{}").start("127.0.0.1", port)  # taken
    finally:
        server.stop()
        server.stop()  # idempotent
    assert server.url == ""


def test_the_page_carries_the_view_and_no_peer_string_can_close_its_script():
    assert FIRST_VIEW in page_bytes()
    hostile = {"blocks": [{"peers": [{"peer_id": "</script><script>alert(1)</script>", "address": "a&b<!--"}]}]}
    view = json.dumps(hostile).encode()
    served = DashboardServer(lambda: view)
    served.start("127.0.0.1", 0)
    try:
        page = get(served.url)[2]
    finally:
        served.stop()
    embedded = page.split(b'<script id="first-view" type="application/json">', 1)[1].split(b"</script>", 1)[0]
    assert b"<" not in embedded and b">" not in embedded and b"&" not in embedded
    assert json.loads(embedded) == hostile  # the escapes are plain JSON: the page parses the same view
    assert page.count(b"</script>") == page_bytes().count(b"</script>")


def test_a_page_asked_for_before_the_first_survey_waits_for_it():
    first = threading.Event()
    view = [b'{"status": "connecting"}']
    server = DashboardServer(lambda: view[0], first.wait)
    server.start("127.0.0.1", 0)
    pages: list[bytes] = []
    try:
        asking = threading.Thread(target=lambda: pages.append(get(server.url)[2]))
        asking.start()
        asking.join(0.5)
        assert asking.is_alive() and not pages  # held until the first survey
        assert get(server.url + "api/swarm")[2] == b'{"status": "connecting"}'  # the JSON never waits
        view[0] = b'{"status": "ok"}'
        first.set()
        asking.join(10)
        assert pages and b'type="application/json">{"status": "ok"}</script>' in pages[0]
    finally:
        first.set()
        server.stop()


def test_cli_errors_are_one_line_and_fast():
    started = time.monotonic()
    missing = runner.invoke(app, ["dashboard"], env={"BLOCKTRAIN_SWARM": ""})
    assert missing.exit_code == 2 and "error: pass --swarm" in missing.output
    bad = runner.invoke(app, ["dashboard", "--swarm", "not-a-multiaddr"])
    assert bad.exit_code == 2 and "error:" in bad.output and "Traceback" not in bad.output
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = runner.invoke(app, ["dashboard", "--swarm", "/ip4/127.0.0.1/tcp/1/p2p/QmNothing", "--port", str(port)])
    assert busy.exit_code == 2 and "cannot serve the dashboard" in busy.output, busy.output
    assert "Traceback" not in busy.output
    assert time.monotonic() - started < 10


async def chromium(*args: str, timeout_s: float = 60.0) -> str:
    """Run headless Chromium (fresh profile, no network besides the page) and return its stdout."""
    with tempfile.TemporaryDirectory() as profile:
        proc = await asyncio.create_subprocess_exec(
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    return out.decode(errors="replace")


async def live_swarm_in_a_browser(tmp_path: Path) -> tuple[list[str], dict, str, str]:
    first = daemon_config(tmp_path, 0, seed=0, eval_every=1)
    async with running(first) as (d0,):
        joiners = [
            daemon_config(tmp_path, b, seed=i, eval_every=1, initial_peers=tuple(d0.multiaddrs()))
            for i, b in ((1, 0), (2, 1))
        ]
        async with running(*joiners) as others:
            daemons = [d0, *others]
            stop = asyncio.Event()

            async def rounds() -> None:
                while not stop.is_set():
                    await asyncio.gather(*(d.run_round() for d in daemons))

            urls: list[str] = []
            board = asyncio.create_task(
                run_dashboard(d0.multiaddrs(), "test", "127.0.0.1", 0, 2.0, urls.append, stop, period_s=0.5)
            )
            training = asyncio.create_task(rounds())
            try:
                await wait_until(lambda: urls, 10, what="the dashboard to serve")
                # asked for at once, before any survey: the page comes with the first one, and its first paint
                # (500 virtual ms: before the page's first poll of /api/swarm, due at 1 s) shows the swarm
                at_once = ("--virtual-time-budget=500", "--window-size=1280,800")
                first_paint = await chromium(*at_once, "--dump-dom", urls[0], timeout_s=180)
                first_shot = tmp_path / "first_paint.png"
                await chromium(*at_once, "--hide-scrollbars", f"--screenshot={first_shot}", urls[0], timeout_s=180)

                async def view() -> dict:
                    return json.loads((await asyncio.to_thread(get, urls[0] + "api/swarm"))[2])

                seen: dict = {}

                async def ready() -> bool:
                    seen.update(await view())
                    histories = [b["history"]["t_s"] for b in seen["blocks"]]
                    return seen["peers"] == 3 and len(histories) == 2 and all(len(h) >= 2 for h in histories)

                await wait_until(ready, 120, poll_s=0.5, what="3 peers and 2 CE points per block on the page")
                common = ("--virtual-time-budget=4000", "--window-size=1280,800")
                ids = [d.peer_id for d in daemons]
                doms: list[str] = []

                async def rendered() -> bool:  # a live page: a survey under load may miss a peer for a moment
                    doms.append(await chromium(*common, "--dump-dom", urls[0]))
                    return all(f'data-peer-id="{i}"' in doms[-1] for i in ids)

                with contextlib.suppress(TimeoutError):
                    await wait_until(rendered, 60, poll_s=0.5, what="a DOM with every peer")
                shot = tmp_path / "dashboard.png"
                await chromium(*common, "--hide-scrollbars", f"--screenshot={shot}", urls[0])
                SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(shot, SCREENSHOT)
                return ids, seen, doms[-1], first_paint
            finally:
                stop.set()
                await asyncio.wait_for(board, 30)
                await asyncio.wait_for(training, 60)


@pytest.mark.swarm
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; .ci/run does)")
def test_a_browser_shows_every_peer_of_a_live_swarm(tmp_path):
    peer_ids, view, dom, first_paint = asyncio.run(live_swarm_in_a_browser(tmp_path))
    # the first paint: block columns with peer cards, not "connecting…" and empty panels (issue 22)
    assert 'id="note">connecting' not in first_paint, first_paint[-3000:]
    assert re.search(r'<section class="block" data-block="\d+"', first_paint) and 'data-peer-id="' in first_paint
    assert sum(f'data-peer-id="{i}"' in first_paint for i in peer_ids) >= 1
    assert view["status"] == "ok" and view["round"] >= 1
    by_block = {b["block"]: sorted(p["peer_id"] for p in b["peers"]) for b in view["blocks"]}
    assert by_block == {0: sorted(peer_ids[:2]), 1: [peer_ids[2]]}
    for peer_id in peer_ids:  # the browser rendered a card per peer, in its block's column
        assert f'data-peer-id="{peer_id}"' in dom, dom[-3000:]
        assert peer_id[-8:] in dom
    columns = re.findall(r'<section class="block" data-block="(\d+)"', dom)
    assert columns == ["0", "1"]
    assert "<path" in dom  # the CE chart drew its lines
    for png in (SCREENSHOT, tmp_path / "first_paint.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
