"""The values a numeric `blocktrain` flag accepts, and the parse-time check that refuses the others.

A Bounds is one flag's range (finite, >= / > lo, <= / < hi, or 0 besides); check_bounds turns it into a
typer callback that refuses a value outside it while the command line is parsed, before the command runs
(nothing loads, nothing starts), with one `error: bad value: --flag must be ..., got ...` line and exit
code 2. cli.flags declares every flag with its Bounds; tests/test_cli_numbers.py checks that every numeric
flag of every command has one. Imports no torch (`--help` stays fast).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import typer


@dataclass(frozen=True)
class Bounds:
    """The values a numeric flag accepts: finite, >= lo (> lo if lo_open), <= hi (< hi if hi_open); or_zero: 0 too."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    or_zero: bool = False  # 0 is accepted besides the range (e.g. --group-size: 0 = all-to-all, else >= 2)

    def __contains__(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.or_zero and value == 0:
            return True
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            return False
        return self.hi is None or (value < self.hi if self.hi_open else value <= self.hi)

    def __str__(self) -> str:
        lo, hi = _num(self.lo), _num(self.hi)
        if self.lo is not None and self.hi is not None:
            text = f"in {'(' if self.lo_open else '['}{lo}, {hi}{')' if self.hi_open else ']'}"
        elif self.lo is not None:
            text = f"{'>' if self.lo_open else '>='} {lo}"
        elif self.hi is not None:
            text = f"{'<' if self.hi_open else '<='} {hi}"
        else:
            text = "a finite number"
        return f"0 or {text}" if self.or_zero else text


def _num(x: float | None) -> str:
    return "2^63 - 1" if x == SEED_MAX else f"{x:g}" if isinstance(x, float) else str(x)


SEED_MAX = 2**63 - 1
AT_LEAST_1, AT_LEAST_0, POSITIVE = Bounds(1), Bounds(0), Bounds(0, lo_open=True)
UNIT, PORT, SEED = Bounds(0, 1), Bounds(0, 65535), Bounds(0, SEED_MAX)


def check_bounds(name: str, bounds: Bounds) -> Callable[..., Any]:
    """A typer callback refusing a value of flag `name` outside `bounds` (one `error:` line, exit 2) at parse time.

    The callback carries `.bounds` (tests read it). None (a flag not given) and shell completion pass."""

    def check(ctx: typer.Context, value: Any) -> Any:
        if value is None or ctx.resilient_parsing or value in bounds:
            return value
        typer.echo(f"error: bad value: {name} must be {bounds}, got {value}", err=True)
        raise typer.Exit(2)

    check.bounds = bounds  # type: ignore[attr-defined]
    return check
