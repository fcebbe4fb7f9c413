"""The tensor spec every layer shares: a model's inputs and outputs by name, shape and dtype."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from edgekit.errors import UsageError
from edgekit.jsonable import FieldsDict


@dataclass(frozen=True)
class IOSpec(FieldsDict):
    name: str
    shape: tuple[int, ...]  # a dimension <= 0 is dynamic (the agent feeds 1)
    dtype: str  # numpy dtype name, e.g. "float32"


TensorSpec = IOSpec  # the name the bundle manifest's readers use


def shape_overrides(
    sidecar: Mapping[str, tuple[int, ...]], given: Mapping[str, tuple[int, ...]] | None, inputs: Collection[str]
) -> dict[str, tuple[int, ...]]:
    """The sidecar's input shapes, then ``--shape``'s over them; each must name one of ``inputs``."""
    wanted = {**sidecar, **(given or {})}
    for name in wanted:
        if name not in inputs:
            raise UsageError(
                f"--shape names input '{name}', but the model's inputs are: {', '.join(sorted(inputs))}",
                "use one of the model's input names",
            )
    return wanted
