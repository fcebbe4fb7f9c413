"""The tensor spec every layer shares: a model's inputs and outputs by name, shape and dtype."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class IOSpec:
    name: str
    shape: tuple[int, ...]  # a dimension <= 0 is dynamic (the agent feeds 1)
    dtype: str  # numpy dtype name, e.g. "float32"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


TensorSpec = IOSpec  # the name the bundle manifest's readers use
