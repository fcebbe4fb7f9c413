"""`edgekit report`: one self-contained HTML file from stored runs or an export file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from edgekit.cli import common
from edgekit.cli.output import Output


def report(
    runs: Annotated[
        list[str],
        typer.Argument(metavar="RUN...", help="Run ids (see `edgekit results list`) or results export JSON files.", show_default=False),
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="The HTML file to write (atomically).")] = Path("edgekit-report.html"),
    history: Annotated[int, typer.Option("--history", min=0, help="Draw up to N earlier stored runs of each model/device/variant.")] = 20,
    json_out: common.Json = False,
) -> None:
    """Write an HTML report of benchmark runs: verdict, latency charts, layers, device, history.

    The file works offline (inline CSS and SVG, no scripts, nothing fetched).

    \b
    Examples:
      edgekit report 7 8 -o report.html
      edgekit report lab-results.json --history 0
    """
    from edgekit.bench.compare import read_records
    from edgekit.bench.store import ResultsStore
    from edgekit.fsutil import check_output_path
    from edgekit.report import earlier_runs, write_report

    o = Output()
    check_output_path(output)  # before any work: a bad -o fails fast and leaves nothing
    records: list[dict] = []
    with ResultsStore() as store:
        for run in runs:
            if run.isdigit():
                records.append(store.get(int(run)))
            else:
                records += read_records(Path(run))
        older = earlier_runs(store, records, history) if history else []
    path = write_report(records, output, history=older)
    doc = {
        "report": str(path),
        "bytes": path.stat().st_size,
        "runs": [{"id": r.get("id"), "run_uuid": r["run_uuid"], "model": r["model_name"], "variant": r["agent"]["variant"]} for r in records],
        "history_runs": len(older),
    }
    if json_out:
        o.json(doc)
    else:
        o.info(f"report of {len(records)} run(s) ({len(older)} earlier for history) written to {path}")
