"""Backends, one module each. This registry is the single list of what edgekit can run."""

from __future__ import annotations

from edgekit.profiles import BACKENDS as KNOWN_BACKENDS
from edgekit.targets.base import Backend, Unavailable, Verdict
from edgekit.targets.onnxruntime import OnnxRuntimeBackend

_IMPLEMENTED: dict[str, Backend] = {b.name: b for b in (OnnxRuntimeBackend(),)}


def get_backend(name: str) -> Backend:
    """The backend called ``name``; a known-but-unavailable one reports why it can't run."""
    if name in _IMPLEMENTED:
        return _IMPLEMENTED[name]
    return Unavailable(name)


def available_backends() -> list[str]:
    return sorted(_IMPLEMENTED)


__all__ = ["KNOWN_BACKENDS", "Backend", "Verdict", "available_backends", "get_backend"]
