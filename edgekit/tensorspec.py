"""The tensor spec every layer shares: a model's inputs and outputs by name, shape and dtype."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class IOSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # numpy dtype name
