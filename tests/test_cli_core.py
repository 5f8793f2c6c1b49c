"""CLI of the model core: --help everywhere, clear errors and exit codes, a tiny train/eval run."""

import json
import math

import pytest
from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()
TINY = ["--blocks", "2", "--layers-per-block", "1", "--d-model", "32", "--n-heads", "2", "--seq-len", "16"]


def _commands(group, prefix=()):
    import typer.main

    click_group = typer.main.get_command(group)
    for name, cmd in click_group.commands.items():
        yield (*prefix, name)
        if hasattr(cmd, "commands"):
            for sub in cmd.commands:
                yield (*prefix, name, sub)


@pytest.mark.parametrize("command", sorted(set(_commands(app))))
def test_help_for_every_command(command):
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


def test_model_info_json_paper_config():
    result = runner.invoke(
        app,
        [
            "model-info",
            "--blocks",
            "3",
            "--layers-per-block",
            "4",
            "--d-model",
            "512",
            "--n-heads",
            "8",
            "--hidden",
            "2048",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    gib = info["active_adamw_bytes"] / 2**30
    assert abs(gib - 0.198) / 0.198 < 0.10  # the litepaper's active-worker figure
    assert info["full_stack_adamw_bytes"] > 2.9 * info["active_adamw_bytes"]
    assert info["block_params"] > 0


@pytest.mark.parametrize("start", ["zero", "identity"])
def test_the_message_input_s_start_is_a_model_flag(start):
    result = runner.invoke(app, ["model-info", "--pred-in-init", start, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["config"]["pred_in_init"] == start


@pytest.mark.parametrize(
    "args, needle",
    [
        (["train", "--out", "OUT", "--data", "MISSING"], "does not exist"),
        (["train", "--out", "OUT", "--data", "EMPTY"], "no bytes"),
        (["train", "--out", "OUT", "--data", "TEXT", "--blocks", "0"], "blocks must be >= 1"),
        (["train", "--out", "OUT", "--data", "TEXT", "--d-model", "30"], "divisible"),
        (["train", "--out", "OUT", "--data", "TEXT", "--rounds", "0"], "must be >= 1"),
        (["eval", "--checkpoint", "MISSING", "--data", "TEXT"], "does not exist"),
        (["model-info", "--n-heads", "3"], "divisible"),
        (["model-info", "--pred-in-init", "random"], "pred_in_init must be one of zero, identity"),
        (["train", "--out", "OUT", "--data", "TEXT", "--block-init", "copy"], "block_init must be"),
    ],
)
def test_bad_input_gives_one_line_error(tmp_path, args, needle):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "text.txt").write_bytes(b"some text " * 50)
    subst = {
        "OUT": str(tmp_path / "out"),
        "MISSING": str(tmp_path / "missing"),
        "EMPTY": str(tmp_path / "empty.txt"),
        "TEXT": str(tmp_path / "text.txt"),
    }
    result = runner.invoke(app, [subst.get(a, a) for a in args])
    assert result.exit_code in (1, 2)
    assert needle in result.output
    assert "Traceback" not in result.output


def test_train_then_eval_tiny(tmp_path):
    text = tmp_path / "text.txt"
    text.write_bytes(b"the quick brown fox jumps over the lazy dog. " * 200)
    out = tmp_path / "ck"
    result = runner.invoke(
        app,
        [
            "train",
            "--out",
            str(out),
            "--data",
            str(text),
            *TINY,
            "--steps-per-round",
            "5",
            "--rounds",
            "2",
            "--batch-size",
            "4",
            "--eval-tokens",
            "256",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)  # stderr has the one-line note on the held-out tail
    # one block after the other (train's default schedule): block 0's two rounds, then block 1's
    assert len(summary["history"]) == 4 and len(summary["history"][0]["trace"]) == 2
    assert [r["steps_per_block"] for r in summary["history"]] == [5, 10, 10, 10]
    result = runner.invoke(
        app, ["eval", "--checkpoint", str(out), "--data", str(text), "--eval-tokens", "256", "--trace", "--json"]
    )
    assert result.exit_code == 0, result.output
    ev = json.loads(result.output)
    assert {"ce", "ppl", "tokens"} <= set(ev) and ev["tokens"] == 256
    assert ev["ppl"] == pytest.approx(math.exp(ev["ce"]))
    assert [s["block"] for s in ev["trace"]] == [0, 1]
    result = runner.invoke(
        app,
        [
            "train",
            "--e2e",
            "--out",
            str(tmp_path / "e2e"),
            "--data",
            str(text),
            *TINY,
            "--steps-per-round",
            "5",
            "--rounds",
            "1",
            "--batch-size",
            "4",
            "--eval-tokens",
            "256",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    result = runner.invoke(
        app, ["eval", "--checkpoint", str(tmp_path / "e2e"), "--data", str(text), "--eval-tokens", "256", "--json"]
    )
    assert result.exit_code == 0 and json.loads(result.output)["kind"] == "e2e"


def test_data_fetch_without_network_fails_cleanly(tmp_path, monkeypatch):
    import swarmd.core.corpus as corpus

    monkeypatch.setenv("BLOCKTRAIN_CACHE", str(tmp_path))
    monkeypatch.setattr(corpus, "BASE_URL", "http://127.0.0.1:9/nothing")  # discard port: refused at once
    result = runner.invoke(app, ["data", "fetch", "wikitext-2"])
    assert result.exit_code == 2
    assert "cannot download WikiText-2" in result.output and "Traceback" not in result.output


def test_version_prints_the_package_version():
    from swarmd import __version__

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"blocktrain {__version__}"


def test_help_and_a_peer_status_do_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from cli.main import app\n"
        "assert CliRunner().invoke(app, ['--help']).exit_code == 0\n"
        "assert CliRunner().invoke(app, ['status', '127.0.0.1:1', '--timeout-s', '0.5']).exit_code == 1\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    "args, needle",
    [
        (["run", "--data", "TEXT", "--block", "x"], "--block must be a number or 'auto'"),
        (["run", "--data", "TEXT", "--block", "7"], "block must be -1 (auto) or in [0, 3)"),
        (["run", "--data", "TEXT", "--lr", "0"], "lr must be > 0"),
        (["demo", "--data", "TEXT", "--peers", "0"], "must be >= 1"),
    ],
)
def test_bad_swarm_options_exit_2_before_anything_starts(tmp_path, args, needle):
    (tmp_path / "text.txt").write_bytes(b"some text " * 50)
    result = runner.invoke(app, [str(tmp_path / "text.txt") if a == "TEXT" else a for a in args])
    assert result.exit_code == 2, result.output
    assert needle in result.output and "Traceback" not in result.output
