"""Measure once: an identical earlier measurement stands in for a new one.

A redeploy that changes nothing (the same bundle, by content hash; the same device, by its facts:
CPU, cores, ISA, kernel, OS, runtimes and their versions, the governor, the interpreter and the
agent that run the model; the same bench settings) would measure the same thing again. The Bench
and Eval steps a plan marks ``reuse`` look for such a measurement first: a bench run in the
results store, found by the key its record keeps (``measurement_key``), and an evaluation's
outputs in the user cache. The deploy result names the runs it reused and when they were
measured. ``--remeasure``, ``edgekit bench``, ``edgekit ci`` and ``--fail`` gates always measure.

What is left out of the key on purpose: the device's temperature, clock and free memory at the
time (they change between any two runs; a throttled run says so in its own warnings).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from edgekit.bench.store import ResultsStore
from edgekit.fsutil import atomic_path, cache_dir

FORMAT = 1  # bump when what a key covers changes
RECORD_FIELD = "measurement_key"
_SCAN = 200  # newest runs of one model/target/device/variant searched for the key


def device_fingerprint(facts: dict | None) -> dict[str, Any]:
    """The facts that decide what a measurement on the device would be; not its momentary state."""
    facts = facts or {}
    state = facts.get("device_state") or {}
    probe = facts.get("probe") or {}
    return {
        "agent_version": facts.get("agent_version"),
        "device": facts.get("device"),
        "governor": state.get("governor"),
        "freq_max_mhz": state.get("freq_max_mhz"),
        "libc": probe.get("libc"),
        "python": (probe.get("python") or {}).get("executable"),
    }


def key(kind: str, *, bundle_hash: str, variant: dict, settings: dict, device: str, facts: dict | None, agent: str) -> str:
    """The key of one measurement (hex sha256): ``kind`` "bench" or "eval", the bundle, the variant
    (name, backend, options), the settings (bench config, eval samples and threads), the device's
    name and fingerprint, and the agent (its content-addressed path on the device)."""
    doc = {
        "format": FORMAT, "kind": kind, "bundle": bundle_hash, "variant": variant, "settings": settings,
        "device": device, "fingerprint": device_fingerprint(facts), "agent": agent,
    }  # fmt: skip
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def find_run(k: str, *, model: str, target: str, device: str, variant: str) -> dict | None:
    """The newest stored run measured under key ``k`` (with its ``id``), or None."""
    with ResultsStore() as store:
        if not store.path.exists():
            return None
        stored = store.records(limit=_SCAN, model=model, target=target, device=device, variant=variant)
        return next((r for r in stored if r.get(RECORD_FIELD) == k), None)


def outputs_path(k: str) -> Path | None:
    """The cached outputs of the evaluation measured under key ``k``, or None."""
    path = cache_dir("measurements") / f"{k}.npz"
    return path if path.is_file() else None


def save_outputs(k: str, local: Path) -> None:
    """Keep an evaluation's outputs under key ``k`` (written beside and renamed)."""
    root = cache_dir("measurements")
    root.mkdir(parents=True, exist_ok=True)
    with atomic_path(root / f"{k}.npz") as p:
        shutil.copyfile(local, p)
