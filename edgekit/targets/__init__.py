"""Backends, one module each. This registry is the single list of what edgekit can run.

Each backend module defines ``BACKEND``, an instance of a ``targets.base.Backend`` subclass.
A name whose module is absent is a backend this version cannot use: the planner skips it
and says why.
"""

from __future__ import annotations

import importlib

from edgekit.profiles import BACKENDS as KNOWN_BACKENDS
from edgekit.targets.base import Backend, Unavailable, Verdict

_MODULES = {
    "onnxruntime": "edgekit.targets.onnxruntime",
    "openvino": "edgekit.targets.openvino",
    "tensorrt": "edgekit.targets.tensorrt",
    "tflite": "edgekit.targets.tflite",
    "native": "edgekit.targets.native",
    "numpy": "edgekit.targets.numpy",
}
_cache: dict[str, Backend] = {}


def get_backend(name: str) -> Backend:
    """The backend called ``name``; a known-but-unavailable one reports why it can't run."""
    if name not in _cache:
        module = _MODULES.get(name)
        try:
            _cache[name] = importlib.import_module(module).BACKEND if module else Unavailable(name)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            _cache[name] = Unavailable(name)
    return _cache[name]


def available_backends() -> list[str]:
    return sorted(n for n in _MODULES if get_backend(n).implemented)


__all__ = ["KNOWN_BACKENDS", "Backend", "Verdict", "available_backends", "get_backend"]
