"""The one events protocol: what a long operation tells its caller (info, warnings, progress).

The library reports through an ``Events``; the CLI passes its ``Output`` (same methods), a
fleet wraps each device's in ``DeviceEvents``, and library callers get the silent default.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol


class Progress(Protocol):
    def advance(self, n: int = 1) -> None: ...

    def update(self, description: str) -> None: ...


class Events:
    """Silent by default; subclass (or pass any object with these methods) to listen."""

    def info(self, message: str) -> None:
        pass

    def warn(self, message: str) -> None:
        pass

    @contextlib.contextmanager
    def progress(self, description: str, total: int | None = None) -> Iterator[Progress]:
        yield QuietProgress()


class QuietProgress:
    def advance(self, n: int = 1) -> None:
        pass

    def update(self, description: str) -> None:
        pass


class DeviceEvents(Events):
    """Events of one device of a fleet: every line prefixed ``[name]``, no live progress bars
    (a terminal holds one live display at a time, and several devices' bars would fight)."""

    def __init__(self, sink: Any, name: str) -> None:
        self.sink, self.name = sink, name

    def info(self, message: str) -> None:
        self.sink.info(f"[{self.name}] {message}")

    def warn(self, message: str) -> None:
        self.sink.warn(f"[{self.name}] {message}")

    @contextlib.contextmanager
    def progress(self, description: str, total: int | None = None) -> Iterator[Progress]:
        self.sink.info(f"[{self.name}] {description} ...")
        yield QuietProgress()
