"""What a benchmark writes: its result JSON, the command line and machine it records, its markdown fragment.

Also rendered_or (--render's saved result, else a fresh run), table, replace_section (a script's section of a page
several scripts share, such as BENCHMARKS.md) and pyplot / save_figure (a plot, where matplotlib is installed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

RESULTS = Path("benchmarks/results")  # where results go, relative to the checkout root the scripts run in
BENCHMARKS = Path("BENCHMARKS.md")  # the page whose <!-- name --> sections replace_section rewrites


def command_line(script: str, argv: list[str] | None) -> str:
    """'python benchmarks/<script> <args>': the command a result records."""
    return (f"python benchmarks/{script} " + shlex.join(argv if argv is not None else sys.argv[1:])).strip()


def write_json(path: Path, out: dict, sort_keys: bool = True) -> None:
    """out as indented JSON at path (its folder made if needed), its keys sorted unless sort_keys is False."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, sort_keys=sort_keys) + "\n")


def write_text(path: Path, text: str) -> None:
    """text at path (its folder made if needed): a markdown fragment."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def rendered_or(a: argparse.Namespace, run: Callable[[], dict]) -> dict:
    """The saved result JSON that --render names (nothing runs), else run()'s result, written to --out."""
    if a.render is not None:
        return json.loads(a.render.read_text())
    out = run()
    write_json(a.out, out)
    return out


def machine() -> str:
    """'x86_64, 16 CPUs, Python 3.11.7': the machine line of a result."""
    return f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def table(head: str, rows: Iterable[str], align: str = "") -> list[str]:
    """A markdown table: its head ("a | b | c"), the separator (align: an l or r per column; default the first left,
    the rest right) and a line per row (its cells joined by " | ")."""
    align = align or "l" + "r" * head.count(" | ")
    return [f"| {head} |", "|" + "".join("---:|" if c == "r" else "---|" for c in align), *(f"| {r} |" for r in rows)]


def pyplot():
    """matplotlib.pyplot on the Agg backend; None (and a line saying so) where matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib not installed (pip install '.[bench]'): no plot", flush=True)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path, dpi: int = 110) -> None:
    """fig laid out tight, saved at path (its folder made if needed) and closed."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def paragraphs(*parts) -> list[str]:
    """The lines of a markdown fragment: each part (a line, or a table's lines) followed by a blank line; a part that
    is empty or false (a paragraph this run has not) is left out."""
    return [line for part in parts if part for line in [*([part] if isinstance(part, str) else part), ""]]


def machine_footer(line: str) -> list[str]:
    """The closing lines of a fragment: a blank line, 'Machine: <line>', a blank line."""
    return ["", f"Machine: {line}", ""]


def replace_section(path: Path, name: str, lines: list[str]) -> None:
    """Write lines between <!-- name --> and <!-- /name --> in path (appended the first time)."""
    existing = path.read_text() if path.exists() else ""
    start, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    block = start + "\n" + "\n".join(lines) + "\n" + end
    if start in existing:
        pre, rest = existing.split(start, 1)
        existing = pre + block + rest.split(end, 1)[1]
    else:
        existing = (existing + "\n" if existing else "") + block + "\n"
    write_text(path, existing)
