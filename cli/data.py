"""`blocktrain data fetch`: download a corpus into the local cache."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn

from cli.common import cli_errors

app = typer.Typer(help="Training corpora.", no_args_is_help=True)


class Corpus(str, Enum):
    wikitext2 = "wikitext-2"


@app.command("fetch")
def fetch(
    corpus: Annotated[Corpus, typer.Argument(help="Corpus to download.")] = Corpus.wikitext2,
    force: Annotated[bool, typer.Option("--force", help="Download again even if cached.")] = False,
) -> None:
    """Download WikiText-2 (raw bytes) into the cache, with a progress bar and SHA-256 manifest."""
    from swarmd.core.corpus import ensure_wikitext2

    with cli_errors(), Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn()) as bar:
        tasks: dict[str, TaskID] = {}

        def on_progress(split: str, got: int, total: int) -> None:
            if split not in tasks:
                tasks[split] = bar.add_task(f"wikitext-2 {split}", total=total or None)
            bar.update(tasks[split], completed=got)

        paths = ensure_wikitext2(on_progress, force=force)
    for split, path in paths.items():
        typer.echo(f"{split}: {path}")
