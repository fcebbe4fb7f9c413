"""JSON documents: a dataclass as the document its ``to_dict`` returns, and the words a
validator uses for the values it finds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any


def fields_dict(obj: Any) -> dict[str, Any]:
    """Every field of the dataclass ``obj`` by name: a tuple or list becomes a list, an object with
    ``to_dict`` its dict, a mapping a (shallow) dict; other values as they are.

    >>> from edgekit.tensorspec import IOSpec
    >>> fields_dict(IOSpec("x", (1, 3), "float32"))
    {'name': 'x', 'shape': [1, 3], 'dtype': 'float32'}
    """
    return {f.name: _plain(getattr(obj, f.name)) for f in fields(obj)}


class FieldsDict:
    """Base of a dataclass whose JSON document is its fields in order: ``to_dict()`` is ``fields_dict(self)``."""

    def to_dict(self) -> dict[str, Any]:
        return fields_dict(self)


def _plain(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return dict(value)
    return value


def is_int(value: Any) -> bool:
    """An integer, not a boolean (JSON's true is Python's 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def kind(value: Any, none: str = "nothing") -> str:
    """What a JSON value is, for an error message: "an object", "a list", "a string", ..."""
    if value is None:
        return none
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(type(value), type(value).__name__)


MAX_DEPTH = 64  # edgekit's own documents nest a handful of levels


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number {text[:24]} is out of range for a float")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def strict_loads(text: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """JSON that edgekit did not write itself (a device's reply, a file to import), read strictly:
    NaN/Infinity, numbers beyond a float's range (1e400) and nesting deeper than ``max_depth`` are
    errors. Raises ValueError (``json.JSONDecodeError`` for bad syntax) with a one-line reason."""
    import json

    try:
        doc = json.loads(text, parse_float=_finite, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError(f"nested more than {max_depth} levels deep") from None
    stack = [(doc, 0)]
    while stack:  # iterative: the check must not itself recurse
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth >= max_depth:
                raise ValueError(f"nested more than {max_depth} levels deep")
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return doc
