"""What the benchmarks share: ``Skip`` and the real models that tests/realmodels.py finds."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


class Skip(Exception):
    """A model or runtime can't run here (e.g. its package is missing); the message says why."""


def realmodels() -> ModuleType:
    """tests/realmodels.py (the catalogue of real models and their data), or Skip."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        import realmodels
    except ImportError as exc:
        raise Skip(f"tests/realmodels.py unavailable: {exc}") from None
    finally:
        sys.path.pop(0)
    return realmodels


def catalogue_names() -> list[str]:
    return list(realmodels().CATALOGUE)


def catalogue(name: str) -> tuple[object, ModuleType]:
    """The catalogue entry ``name`` (its wheel installed) and the realmodels module, or Skip
    naming the pip line that installs it."""
    rm = realmodels()
    model = rm.CATALOGUE[name]
    try:
        model.locate()
    except LookupError as exc:
        raise Skip(str(exc)) from None
    return model, rm


def rapidocr_cls() -> tuple[ModuleType, Path]:
    """tests/realmodels.py and the path of RapidOCR's text-direction classifier, or Skip."""
    rm = realmodels()
    try:
        return rm, rm.find_rapidocr_model("cls")
    except LookupError as exc:
        raise Skip(str(exc)) from None
