"""Backends, one host module each: ``edgekit.targets.<name>`` for every name of the one
registry (``profiles.BACKENDS``, the agent's list). Each module defines ``BACKEND``, an instance
of a ``targets.base.Backend`` subclass. A name whose module is absent is a backend this version
cannot use: the planner skips it and says why.
"""

from __future__ import annotations

import importlib

from edgekit.profiles import BACKENDS as KNOWN_BACKENDS
from edgekit.targets.base import Backend, Unavailable, Verdict

_cache: dict[str, Backend] = {}


def get_backend(name: str) -> Backend:
    """The backend called ``name``; a known-but-unavailable one reports why it can't run."""
    if name not in _cache:
        module = f"{__name__}.{name}"
        try:
            _cache[name] = importlib.import_module(module).BACKEND if name in KNOWN_BACKENDS else Unavailable(name)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            _cache[name] = Unavailable(name)
    return _cache[name]


def available_backends() -> list[str]:
    return sorted(n for n in KNOWN_BACKENDS if get_backend(n).implemented)


__all__ = ["KNOWN_BACKENDS", "Backend", "Verdict", "available_backends", "get_backend"]
