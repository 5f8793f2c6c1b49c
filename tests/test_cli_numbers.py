"""Every numeric flag of every command refuses a number outside its bounds while the command line is parsed.

For each command and each int / float option (found by walking the CLI, so a new flag is covered, and a
new flag without bounds fails here), an out-of-range value (below, above, NaN, inf, a gap such as
--group-size 1) exits 2 with one `error: bad value: --flag must be ...` line and no traceback, before the
command body runs: nothing loads, nothing starts. The bounds come from cli.options (check_bounds).
"""

from __future__ import annotations

import contextlib
import io
import math
import subprocess
import sys
import time
from typing import Any

import pytest
import typer.main
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.main import app
from cli.options import AT_LEAST_1, PORT, POSITIVE, SEED, SEED_MAX, UNIT, Bounds

COMMAND = typer.main.get_command(app)
# what each command needs besides options (given after the bad flag: the bad flag is parsed first)
REQUIRED: dict[tuple[str, ...], list[str]] = {
    ("train",): ["--out", "OUT"],
    ("eval",): ["--checkpoint", "CKPT"],
    ("join",): ["127.0.0.1:1"],
    ("score",): ["--checkpoint", "CKPT", "FILE"],
    ("generate",): ["--checkpoint", "CKPT", "prompt"],
    ("simulate",): ["--regime", "custom"],
}


def _commands(cmd: Any, prefix: tuple[str, ...] = ()):
    if hasattr(cmd, "commands"):
        for name, sub in cmd.commands.items():
            yield from _commands(sub, (*prefix, name))
    else:
        yield prefix, cmd


def _numeric_flags() -> list[tuple[tuple[str, ...], str, type, Bounds | None]]:
    found = []
    for path, cmd in _commands(COMMAND):
        for p in cmd.params:
            kind = p.type_descriptor.annotation
            if kind in (int, float) and p.opts[0].startswith("--"):
                found.append((path, p.opts[0], kind, getattr(p.callback, "bounds", None)))
    return found


FLAGS = _numeric_flags()
BOUNDED = [f for f in FLAGS if f[3] is not None]


def _arg(value: int | float) -> str:
    return str(value) if isinstance(value, int) else repr(value)  # repr: nan, inf, 1e+300 parse back


def invoke(path: tuple[str, ...], flag: str, value: int | float) -> tuple[int | None, str, float]:
    """(exit code, stdout + stderr, seconds) of parsing `blocktrain PATH FLAG VALUE REQUIRED...` in this process.

    Parses only (click's make_context runs the option callbacks), never the command's body: a value the
    bounds let through gives exit code None instead of a training run or a daemon."""
    cmd = COMMAND
    for name in path:
        cmd = cmd.commands[name]
    args = [flag, _arg(value), *REQUIRED.get(path, [])]
    out = io.StringIO()
    code = None
    start = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            with cmd.make_context(" ".join(("blocktrain", *path)), args):
                pass
        except typer.Exit as exc:
            code = exc.exit_code
    return code, out.getvalue(), time.monotonic() - start


def assert_refused(path: tuple[str, ...], flag: str, value: int | float) -> None:
    code, output, seconds = invoke(path, flag, value)
    where = f"blocktrain {' '.join(path)} {flag} {_arg(value)}"
    assert code == 2, f"{where}: exit {code}: {output}"
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: bad value: {flag} must be "), f"{where}: {output}"
    assert "Traceback" not in output
    assert seconds < 1.0, f"{where}: {seconds:.2f}s to refuse"  # parse time: nothing loaded, nothing started


def outside(bounds: Bounds, kind: type) -> st.SearchStrategy[int | float]:
    """Numbers of `kind` outside `bounds` (NaN and +-inf too for floats)."""
    parts: list[st.SearchStrategy[Any]] = []
    if kind is int:
        if bounds.lo is not None:
            lo = math.floor(bounds.lo) if bounds.lo_open else math.ceil(bounds.lo) - 1  # the largest bad int below
            parts.append(st.integers(max_value=lo, min_value=-(2**70)))
        if bounds.hi is not None:
            hi = math.ceil(bounds.hi) if bounds.hi_open else math.floor(bounds.hi) + 1
            parts.append(st.integers(min_value=hi, max_value=2**70))
    else:
        parts.append(st.sampled_from([math.nan, math.inf, -math.inf]))
        if bounds.lo is not None:
            parts.append(st.floats(max_value=bounds.lo, exclude_max=not bounds.lo_open, allow_nan=False))
        if bounds.hi is not None:
            parts.append(st.floats(min_value=bounds.hi, exclude_min=not bounds.hi_open, allow_nan=False))
    values = st.one_of(parts)
    return values.filter(lambda v: v not in bounds) if bounds.or_zero else values


def edges(bounds: Bounds, kind: type) -> list[int | float]:
    """The nearest bad values on each side (and NaN, inf for floats)."""
    bad: list[int | float] = []
    if kind is int:
        if bounds.lo is not None:
            bad.append(math.floor(bounds.lo) if bounds.lo_open else math.ceil(bounds.lo) - 1)
        if bounds.hi is not None:
            bad.append(math.ceil(bounds.hi) if bounds.hi_open else math.floor(bounds.hi) + 1)
    else:
        bad += [math.nan, math.inf, -math.inf]
        if bounds.lo is not None:
            bad.append(bounds.lo if bounds.lo_open else math.nextafter(bounds.lo, -math.inf))
        if bounds.hi is not None:
            bad.append(bounds.hi if bounds.hi_open else math.nextafter(bounds.hi, math.inf))
    return [v for v in bad if v not in bounds and not (bounds.or_zero and v == 0)]


def test_every_numeric_flag_of_every_command_has_bounds():
    assert len({f[0] for f in FLAGS}) >= 10 and len(FLAGS) > 100  # the walk found the commands' flags
    unbounded = [f"{' '.join(path)} {flag}" for path, flag, _, bounds in FLAGS if bounds is None]
    assert not unbounded, f"numeric flags without bounds (cli.options.flag(..., bounds=...)): {unbounded}"


@pytest.mark.parametrize(("path", "flag", "kind", "bounds"), BOUNDED, ids=[f"{' '.join(f[0])} {f[1]}" for f in BOUNDED])
def test_the_nearest_bad_values_are_refused(path, flag, kind, bounds):
    values = edges(bounds, kind)
    assert values, f"{flag}: no bad value next to {bounds}"
    for value in values:
        assert_refused(path, flag, value)


@pytest.mark.parametrize("path", sorted({f[0] for f in BOUNDED}), ids=" ".join)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_any_out_of_range_value_is_refused_in_one_line(path, data):
    path_flags = [f for f in BOUNDED if f[0] == path]
    _, flag, kind, bounds = data.draw(st.sampled_from(path_flags), label="flag")
    value = data.draw(outside(bounds, kind), label="value")
    assert value not in bounds
    assert_refused(path, flag, value)


@given(st.integers(min_value=1, max_value=2**40))
@settings(max_examples=30, deadline=None)
def test_in_range_values_pass_the_check(value):
    assert value in AT_LEAST_1 and value in POSITIVE and value in SEED and float(value) in POSITIVE
    assert (value in Bounds(2, or_zero=True)) == (value != 1)
    assert (value in PORT) == (value <= 65535) and (value in UNIT) == (value == 1)
    assert SEED_MAX in SEED and SEED_MAX + 1 not in SEED and -1 not in SEED


def test_bounds_read_as_ranges():
    assert str(AT_LEAST_1) == ">= 1" and str(POSITIVE) == "> 0" and str(UNIT) == "in [0, 1]"
    assert str(Bounds(0, 1, hi_open=True)) == "in [0, 1)" and str(Bounds(2, or_zero=True)) == "0 or >= 2"
    assert 0 in Bounds(2, or_zero=True) and 1 not in Bounds(2, or_zero=True)
    assert math.nan not in Bounds() and math.inf not in Bounds() and 0.5 in Bounds(0, 1, lo_open=True)


def test_an_environment_variable_is_checked_like_its_flag(monkeypatch):
    monkeypatch.setenv("BLOCKTRAIN_DHT_PORT", "70000")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), pytest.raises(typer.Exit) as exit_:
        COMMAND.commands["run"].make_context("blocktrain run", [])
    assert exit_.value.exit_code == 2
    assert out.getvalue() == "error: bad value: --dht-port must be in [0, 65535], got 70000\n"


def test_the_console_script_refuses_a_negative_round_length_in_one_line():
    # issue 22: `blocktrain run --steps-per-round -5` printed a 49-line traceback after 18 s
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "cli.main", "run", "--steps-per-round", "-5"], capture_output=True, text=True, timeout=60
    )
    seconds = time.monotonic() - start
    assert out.returncode == 2, out.stderr
    assert out.stdout == "" and out.stderr == "error: bad value: --steps-per-round must be >= 1, got -5\n"
    assert seconds < 15, f"{seconds:.1f}s"  # no torch, no daemon: ~1 s on an idle machine
