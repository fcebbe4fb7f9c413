"""Unknown keys in a TOML file the user writes (model sidecar, profile, edgekit.toml, devices.toml):
refused, with the closest known key. One helper, so every file says it the same way."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any


def unknown_key(table: Mapping[str, Any], allowed: Iterable[str]) -> tuple[str, str, str] | None:
    """The first key of ``table`` not in ``allowed``, as ``(key, message, hint)``, or None when all
    are known. ``message`` is "unknown key 'dat'"; ``hint`` is "did you mean 'data'? known keys: ...".
    """
    known = list(allowed)
    for key in table:
        if key not in known:
            close = closest(str(key), known)
            mean = f"did you mean '{close}'? " if close else ""
            return str(key), f"unknown key '{key}'", f"{mean}known keys: {', '.join(known) or '(none)'}"
    return None


def closest(key: str, known: Iterable[str]) -> str | None:
    """The known key ``key`` is most likely a typo of, if any is close."""
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return close[0] if close else None
