"""Data with no network and no user input: the stdlib corpus, held-out tails, binary input, BLOCKTRAIN_DATA.

Every test runs with $BLOCKTRAIN_CACHE in a temp folder and $BLOCKTRAIN_DATA unset, so what the
CLI falls back to is exactly what a fresh clone with no ../shared and no network gets.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import swarmd.core.corpus as corpus
from cli.common import eval_path_for, resolve_data, resolve_train_eval
from cli.main import app
from swarmd.core.data import load_bytes
from swarmd.errors import DataError

runner = CliRunner()
TINY = ["--blocks", "2", "--layers-per-block", "1", "--d-model", "32", "--n-heads", "2", "--seq-len", "16"]
TRAIN_TINY = [*TINY, "--steps-per-round", "2", "--rounds", "1", "--batch-size", "2", "--eval-tokens", "64", "--json"]


@pytest.fixture
def clean_env(tmp_path, monkeypatch):
    """No user data anywhere, a fresh cache, and no network (a download would hit a closed port)."""
    monkeypatch.delenv("BLOCKTRAIN_DATA", raising=False)
    monkeypatch.delenv("BLOCKTRAIN_TRAIN_DATA", raising=False)
    monkeypatch.setenv("BLOCKTRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(corpus, "BASE_URL", "http://127.0.0.1:9/nothing")
    return tmp_path / "cache"


def _fake_stdlib(root: Path) -> Path:
    """A stdlib-like tree: library modules, plus a test package, site-packages and a non-UTF-8 file to skip."""
    for i in range(40):
        sub = root / ("pkg" if i % 3 else "") / f"mod{i:02d}.py"
        sub.parent.mkdir(parents=True, exist_ok=True)
        sub.write_text(f'"""module {i}."""\n\n\ndef f{i}(x):\n    return x * {i}  # {"word " * (i + 5)}\n')
    for skipped in ("test/test_x.py", "pkg/tests/t.py", "site-packages/third/party.py", "encodings/cp1.py"):
        (root / skipped).parent.mkdir(parents=True, exist_ok=True)
        (root / skipped).write_text("SKIPPED = True\n")
    (root / "latin.py").write_bytes(b"# caf\xe9\n")
    (root / "README.txt").write_text("not python\n")
    return root


def test_stdlib_corpus_is_deterministic_disjoint_and_skips_tests(tmp_path):
    root = _fake_stdlib(tmp_path / "lib")
    a = corpus.stdlib_corpus(root, cache=tmp_path / "c1", train_cap=1500, eval_cap=400)
    b = corpus.stdlib_corpus(root, cache=tmp_path / "c2", train_cap=1500, eval_cap=400)
    train, held = a.train.read_bytes(), a.eval.read_bytes()
    assert train == b.train.read_bytes() and held == b.eval.read_bytes()  # same interpreter, same bytes
    assert 0 < len(train) <= 1500 and 0 < len(held) <= 400
    assert (a.train_bytes, a.eval_bytes) == (len(train), len(held))
    assert b"SKIPPED" not in train + held and b"not python" not in train + held and b"caf" not in train + held
    train_mods = {line for line in train.splitlines() if line.startswith(b'"""module')}
    held_mods = {line for line in held.splitlines() if line.startswith(b'"""module')}
    assert train_mods and held_mods and not train_mods & held_mods  # held out by file: no overlap
    line = a.announce()
    assert line.startswith("data: Python ") and f"train {len(train):,} bytes" in line
    assert f"held-out {len(held):,} bytes" in line


def test_stdlib_corpus_is_cached_and_rebuilt_when_edited(tmp_path):
    root = _fake_stdlib(tmp_path / "lib")
    first = corpus.stdlib_corpus(root, cache=tmp_path / "c", train_cap=1500, eval_cap=400)
    good = first.train.read_bytes()
    stamp = first.train.stat().st_mtime_ns
    again = corpus.stdlib_corpus(root, cache=tmp_path / "c", train_cap=1500, eval_cap=400)
    assert again.train == first.train and again.train.stat().st_mtime_ns == stamp  # reused, not rewritten
    first.train.write_bytes(b"truncated")
    assert corpus.stdlib_corpus(root, cache=tmp_path / "c", train_cap=1500, eval_cap=400).train.read_bytes() == good


def test_real_stdlib_corpus_is_text_of_a_few_megabytes(tmp_path):
    c = corpus.stdlib_corpus(cache=tmp_path)
    assert 1 << 20 < c.train_bytes <= corpus.STDLIB_TRAIN_BYTES
    assert 64 << 10 < c.eval_bytes <= corpus.STDLIB_EVAL_BYTES
    assert load_bytes(c.train).size == c.train_bytes and load_bytes(c.eval).size == c.eval_bytes  # passes as text
    assert c.eval.read_bytes()[:4096] not in c.train.read_bytes()


@pytest.mark.parametrize("n", [10, 500, 9_000, 100_000, 30_000_000])
def test_heldout_size_bounds(n):
    k = corpus.heldout_size(n)
    assert 0 < k <= n // 2 and k <= corpus.HELDOUT_MAX_BYTES
    assert k >= min(n // 2, corpus.HELDOUT_MIN_BYTES) and (n < 50_000 or k >= min(n // 10, corpus.HELDOUT_MAX_BYTES))


def test_heldout_split_carves_the_tail_out_of_training(tmp_path):
    text = b"".join(b"line %d of the training text\n" % i for i in range(3000))
    (tmp_path / "mine.txt").write_bytes(text)
    c = corpus.heldout_split(tmp_path / "mine.txt", cache=tmp_path / "cache")
    train, held = c.train.read_bytes(), c.eval.read_bytes()
    assert train + held == text and held.startswith(b"line ")  # the tail, cut at a line start
    assert len(held) >= len(text) // 10 - 4096 and held not in train
    assert "--eval-data" in c.announce() and f"{len(held):,}" in c.announce()
    again = corpus.heldout_split(tmp_path / "mine.txt", cache=tmp_path / "cache")
    assert (again.train, again.eval) == (c.train, c.eval)


@pytest.mark.parametrize(
    "blob, needle",
    [
        (b"PK\x03\x04\x14\x00\x00\x00" + bytes(range(256)) * 40, "NUL byte at offset 5"),
        (bytes(np.random.default_rng(0).integers(1, 256, 50_000, dtype=np.uint8)), "control codes"),
        (b"text " * 100 + b"\x00", None),  # a NUL past the first 8 KiB alone is tolerated ...
        (b"text " * 2000 + b"\x00", None),
        ("héllo wörld — 日本語 \x1b[1mbold\x1b[0m\t\f\r\n".encode() * 50, None),  # UTF-8, ANSI, \t \f \r: text
    ],
)
def test_load_bytes_refuses_binary(tmp_path, blob, needle):
    path = tmp_path / "data.bin"
    path.write_bytes(blob)
    if needle is None and b"\x00" in blob[:8192]:
        needle = "NUL byte"
    if needle is None:
        assert load_bytes(path).size == len(blob)
    else:
        with pytest.raises(DataError, match=needle):
            load_bytes(path)


JOIN = ["join", "/ip4/127.0.0.1/tcp/1/p2p/QmXnnt3xYtRb1Y4RrTC8mkThQGr5rhr7DVvbTNmY5bMwPi"]
REFUSE_BEFORE_TORCH = """
import json, sys, time
from typer.testing import CliRunner
from cli.main import app
start = time.monotonic()
r = CliRunner().invoke(app, json.loads(sys.argv[1]))
print(json.dumps({"code": r.exit_code, "output": r.output, "torch": "torch" in sys.modules,
                  "s": time.monotonic() - start}))
"""


def test_binary_training_file_is_refused_before_torch_loads(tmp_path, clean_env):
    """train, demo, run and join refuse a binary --data with exit 2 and never import torch (the demo checks
    for NUL bytes itself, swarmd.tools.demo.plan_demo; train, run and join also refuse mostly-control bytes)."""
    import subprocess
    import sys

    (tmp_path / "model.pt").write_bytes(b"\x80\x02}q\x00(X\x06\x00\x00\x00weight" + bytes(5000))
    (tmp_path / "noise.bin").write_bytes(bytes(np.random.default_rng(1).integers(1, 256, 20_000, dtype=np.uint8)))
    commands = [["train", "--out", str(tmp_path / "o")], ["demo"], ["run"], JOIN]
    for cmd, data in zip(commands, ["noise.bin", "model.pt", "noise.bin", "noise.bin"], strict=True):
        args = [*cmd, "--data", str(tmp_path / data)]
        out = subprocess.run(
            [sys.executable, "-c", REFUSE_BEFORE_TORCH, json.dumps(args)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=Path(__file__).resolve().parents[1],
        )
        body = json.loads(out.stdout.strip().splitlines()[-1])
        assert body["code"] == 2 and body["output"].startswith("error: ") and "looks binary" in body["output"], body
        assert "Traceback" not in body["output"] and not body["torch"], body
        assert body["s"] < 3.0, f"{cmd[0]} took {body['s']:.1f}s to refuse binary data"


def test_no_data_anywhere_uses_the_stdlib_corpus_without_network(tmp_path, clean_env):
    result = runner.invoke(app, ["train", "--out", str(tmp_path / "o"), *TRAIN_TINY])
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stderr.splitlines() if line.startswith("data: ")]
    assert len(notes) == 1 and "standard library sources" in notes[0] and "held-out" in notes[0], result.stderr
    assert "WikiText-2 cache" in notes[0]
    assert json.loads(result.stdout)["history"][0]["eval_ce"] > 0
    assert not (clean_env / "wikitext-2").exists()  # nothing was downloaded


def test_wikitext_cache_wins_over_the_stdlib_corpus(tmp_path, clean_env):
    root = clean_env / "wikitext-2"
    root.mkdir(parents=True)
    manifest = {}
    for split in ("train", "eval"):
        blob = f"= {split} =\n".encode() + b"the wiki text . " * 500
        (root / f"{split}.txt").write_bytes(blob)
        manifest[split] = {"sha256": __import__("hashlib").sha256(blob).hexdigest(), "bytes": len(blob)}
    (root / "manifest.json").write_text(json.dumps(manifest))
    assert resolve_data(None, "train") == root / "train.txt" and resolve_data(None, "eval") == root / "eval.txt"
    (root / "eval.txt").write_bytes(b"edited")
    with pytest.raises(DataError, match="SHA-256"):
        resolve_data(None, "eval")


def test_training_file_without_eval_holds_out_its_tail(tmp_path, clean_env):
    text = b"".join(b"sentence number %d, plain text.\n" % i for i in range(2000))
    (tmp_path / "mine.txt").write_bytes(text)
    result = runner.invoke(
        app, ["train", "--out", str(tmp_path / "o"), "--data", str(tmp_path / "mine.txt"), *TRAIN_TINY]
    )
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stderr.splitlines() if line.startswith("data: ")]
    assert len(notes) == 1 and "no eval.txt" in notes[0] and "held out" in notes[0], result.stderr
    train, held = resolve_train_eval(tmp_path / "mine.txt", None)
    assert train != tmp_path / "mine.txt" and train.read_bytes() + held.read_bytes() == text
    with pytest.raises(DataError, match="--eval-data"):
        eval_path_for(tmp_path / "mine.txt", None)  # never the training text itself
    # given --eval-data, training keeps the whole file
    assert resolve_train_eval(tmp_path / "mine.txt", tmp_path / "x.txt") == (tmp_path / "mine.txt", tmp_path / "x.txt")


def test_blocktrain_data_is_the_one_variable(tmp_path, clean_env, monkeypatch):
    split = tmp_path / "split"
    split.mkdir()
    (split / "train.txt").write_bytes(b"train text. " * 300)
    (split / "eval.txt").write_bytes(b"eval text. " * 300)
    monkeypatch.setenv("BLOCKTRAIN_DATA", str(split))
    assert resolve_train_eval(None, None) == (split / "train.txt", split / "eval.txt")
    assert resolve_train_eval(split, None) == (split / "train.txt", split / "eval.txt")  # --data DIR: the same
    result = runner.invoke(app, ["train", "--out", str(tmp_path / "o"), *TRAIN_TINY])  # --data from the env var
    assert result.exit_code == 0 and "data: " not in result.stderr, result.output
    monkeypatch.setenv("BLOCKTRAIN_DATA", str(split / "train.txt"))  # a file: its eval.txt sibling
    assert resolve_data(None, "eval") == split / "eval.txt"
    monkeypatch.delenv("BLOCKTRAIN_DATA")
    monkeypatch.setenv("BLOCKTRAIN_TRAIN_DATA", str(split))  # the deprecated alias still works, with a warning
    result = runner.invoke(app, ["train", "--out", str(tmp_path / "o2"), *TRAIN_TINY])
    assert result.exit_code == 0, result.output
    assert "BLOCKTRAIN_TRAIN_DATA is deprecated" in result.stderr and "data: " not in result.stderr


def test_eval_of_a_lone_training_file_scores_its_held_out_tail(tmp_path, clean_env, monkeypatch):
    text = b"".join(b"row %d: some words here\n" % i for i in range(1500))
    (tmp_path / "solo.txt").write_bytes(text)
    monkeypatch.setenv("BLOCKTRAIN_DATA", str(tmp_path / "solo.txt"))
    train, held = resolve_train_eval(None, None)
    assert resolve_data(None, "eval") == held and train.read_bytes() + held.read_bytes() == text
