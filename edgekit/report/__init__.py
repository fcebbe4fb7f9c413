"""The HTML report of benchmark runs: one self-contained file (see edgekit.report.html)."""

from __future__ import annotations

from edgekit.bench.store import ResultsStore
from edgekit.report.html import render_report, write_report

__all__ = ["earlier_runs", "render_report", "write_report"]


def earlier_runs(store: ResultsStore, records: list[dict], limit: int = 20) -> list[dict]:
    """The history to draw: up to ``limit`` stored runs of each record's model/target/device/variant
    made before it, none of ``records`` themselves."""
    seen = {r["run_uuid"] for r in records}
    older: dict[str, dict] = {}
    for r in records:
        like = dict(model=r["model_name"], target=r["target"], device=r["device"], variant=r["agent"]["variant"])
        earlier = [h for h in store.records(limit=limit + 100, **like) if h["created"] < r["created"]]
        for h in earlier[:limit]:
            if h["run_uuid"] not in seen:
                older.setdefault(h["run_uuid"], h)
    return list(older.values())
