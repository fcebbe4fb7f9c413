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
from types import SimpleNamespace
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from edgekit.errors import EdgekitError, OutputPathError
from edgekit.events import Events, QuietProgress
from edgekit.sanitize import quoted


def _plain() -> bool:
    return bool(os.environ.get("CI")) or not sys.stderr.isatty()


class Output(Events):
    """The terminal: an ``Events`` for the library, plus the data channels (json, table, line)."""

    def __init__(self) -> None:
        # markup/highlight off: user strings (paths, node names) are printed verbatim.
        # Piped output (CI logs, `| grep`) gets wide lines instead of rich's 80-column default.
        width = None if sys.stdout.isatty() else 200
        self.out = Console(file=sys.stdout, markup=False, highlight=False, soft_wrap=False, width=width)
        self.err = Console(file=sys.stderr, markup=False, highlight=False, soft_wrap=True)

    # -- stderr -----------------------------------------------------------------------
    def info(self, message: str) -> None:
        self.err.print(message)

    def warn(self, message: str) -> None:
        self.err.print(quoted("warning: ", message), style="yellow" if not _plain() else None)

    def error(self, exc: EdgekitError) -> None:
        # one line each, whatever a device put in the message: no fake error:/hint:/::error lines
        self.err.print(quoted("error: ", exc.message))
        if exc.hint:
            self.err.print(quoted("hint: ", exc.hint))

    @contextlib.contextmanager
    def progress(self, description: str, total: int | None = None) -> Iterator[Any]:
        """A progress reporter with ``advance(n=1)`` and ``update(description)``."""
        if _plain():
            self.err.print(f"{description} ...")
            yield QuietProgress()
            return
        count = TimeElapsedColumn() if total is None else TextColumn("{task.completed}/{task.total}")
        columns = (TextColumn("{task.description}"), BarColumn(), count)
        with Progress(*columns, console=self.err, transient=True) as prog:
            task = prog.add_task(description, total=total)
            yield SimpleNamespace(
                advance=lambda n=1: prog.advance(task, n),
                update=lambda description: prog.update(task, description=description),
            )

    # -- stdout -----------------------------------------------------------------------
    def json(self, document: Any) -> None:
        with _stdout_errors():
            sys.stdout.write(json.dumps(document, indent=2, default=_json_default) + "\n")
            sys.stdout.flush()

    def table(self, columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
        table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
        for col in columns:
            table.add_column(col, overflow="fold")
        for row in rows:
            table.add_row(*("" if v is None else str(v) for v in row))
        with _stdout_errors():
            self.out.print(table)

    def line(self, text: str = "") -> None:
        with _stdout_errors():
            self.out.print(text, soft_wrap=True)  # one line stays one line: a wrapped tail would start a line with whatever it holds


@contextlib.contextmanager
def _stdout_errors() -> Iterator[None]:
    """A failed write to stdout (``> /dev/full``, a closed pipe) is an output error (exit 3), not a bug,
    and not a success either."""
    try:
        yield
        sys.stdout.flush()
    except OSError as exc:
        # What is still buffered could not be written either: point stdout at /dev/null so the
        # interpreter's flush at exit does not fail a second time.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise OutputPathError(f"cannot write to standard output: {exc.strerror or exc}", "free space on the disk that stdout goes to, or use -o FILE") from None


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    import numpy as np  # a dependency: imported only when a document holds a value JSON lacks

    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
