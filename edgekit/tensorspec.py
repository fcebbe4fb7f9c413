"""The tensor spec every layer shares: a model's inputs and outputs by name, shape and dtype."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
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


def given_shape(name: str, given: tuple[int, ...], dims: Sequence[int | None]) -> tuple[int, ...]:
    """``--shape``'s ``given`` dimensions for input ``name``, checked against the model's ``dims``
    (None or <= 0: dynamic, the only ones a shape may set)."""
    if len(given) != len(dims):
        raise UsageError(
            f"--shape {name} has {len(given)} dimensions, the model's input has {len(dims)}",
            f"give {len(dims)} dimensions",
        )
    for i, (g, d) in enumerate(zip(given, dims)):
        if d is not None and d > 0 and d != g:
            raise UsageError(
                f"--shape {name}: dimension {i} is fixed to {d} in the model, not {g}",
                "only dynamic dimensions can be set",
            )
    return tuple(given)
