"""The one place that talks to the terminal (and the only importer of rich).

Data goes to stdout; logs, progress, warnings and errors go to stderr. In JSON mode stdout
carries exactly one JSON document. When stderr is not a TTY, or ``CI`` is set, there are no
animations: progress becomes plain lines.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from edgekit.errors import EdgekitError
from edgekit.events import Events, QuietProgress


def _plain() -> bool:
    return bool(os.environ.get("CI")) or not sys.stderr.isatty()


class Output(Events):
    """The terminal: an ``Events`` for the library, plus the data channels (json, table, line)."""

    def __init__(self, mode: str = "human") -> None:
        if mode not in ("human", "json", "quiet"):
            raise ValueError(mode)
        self.mode = mode
        # markup/highlight off: user strings (paths, node names) are printed verbatim.
        # Piped output (CI logs, `| grep`) gets wide lines instead of rich's 80-column default.
        width = None if sys.stdout.isatty() else 200
        self.out = Console(file=sys.stdout, markup=False, highlight=False, soft_wrap=False, width=width)
        self.err = Console(file=sys.stderr, markup=False, highlight=False, soft_wrap=True)

    # -- stderr -----------------------------------------------------------------------
    def info(self, message: str) -> None:
        if self.mode != "quiet":
            self.err.print(message)

    def warn(self, message: str) -> None:
        self.err.print(f"warning: {message}", style="yellow" if not _plain() else None)

    def error(self, exc: EdgekitError) -> None:
        self.err.print(f"error: {exc.message}")
        if exc.hint:
            self.err.print(f"hint: {exc.hint}")

    @contextlib.contextmanager
    def progress(self, description: str, total: int | None = None) -> Iterator[Any]:
        """A progress reporter with ``advance(n=1)`` and ``update(description)``."""
        if self.mode == "quiet":
            yield QuietProgress()
            return
        if _plain():
            self.err.print(f"{description} ...")
            yield QuietProgress()
            return
        columns = [TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}")]
        if total is None:
            columns = [TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn()]
        with Progress(*columns, console=self.err, transient=True) as prog:
            task = prog.add_task(description, total=total)
            yield _RichProgress(prog, task)

    # -- stdout -----------------------------------------------------------------------
    def json(self, document: Any) -> None:
        sys.stdout.write(json.dumps(document, indent=2, sort_keys=False, default=_json_default))
        sys.stdout.write("\n")
        sys.stdout.flush()

    def table(self, columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
        table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
        for col in columns:
            table.add_column(col, overflow="fold")
        for row in rows:
            table.add_row(*("" if v is None else str(v) for v in row))
        self.out.print(table)

    def line(self, text: str = "") -> None:
        self.out.print(text)


class _RichProgress:
    def __init__(self, prog: Progress, task: Any) -> None:
        self._prog, self._task = prog, task

    def advance(self, n: int = 1) -> None:
        self._prog.advance(self._task, n)

    def update(self, description: str) -> None:
        self._prog.update(self._task, description=description)


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    try:
        import numpy as np

        if isinstance(obj, np.generic):
            return obj.item()
        if isinstance(obj, np.ndarray):
            return obj.tolist()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
