"""`edgekit ci`: run an edgekit.toml (models x targets x devices), gate, write JUnit/markdown/JSON/HTML."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from edgekit.cli import common
from edgekit.cli.output import Output


def ci(
    config: Annotated[Path, typer.Option("--config", "-c", metavar="FILE", help="The CI file (default: ./edgekit.toml).")] = Path("edgekit.toml"),
    junit: Annotated[Path | None, typer.Option("--junit", metavar="FILE", help="Write JUnit XML here (one testcase per model x device x gate).")] = None,
    report: Annotated[Path | None, typer.Option("--report", metavar="FILE", help="Write the HTML report of every run here.")] = None,
    summary: Annotated[Path | None, typer.Option("--summary", metavar="FILE", help="Write the markdown summary here (also to $GITHUB_STEP_SUMMARY when set).")] = None,
    baseline: Annotated[
        str | None,
        typer.Option("--baseline", metavar="REF", help='Compare with: "latest", "latest@BRANCH", run ids "12,13", or an export file (overrides [baseline]).'),
    ] = None,
    json_out: common.Json = False,
) -> None:
    """Deploy and bench every model of edgekit.toml on its targets' devices, check its gates,
    and exit 0 (all passed, or no baseline yet), 5 (a gate failed), 4 (a device failed) or 3 (bad config or model).

    Example:

        edgekit ci --junit edgekit-junit.xml --report edgekit-report.html

    Files are written only after every run, and not at all when the config is bad.
    """
    from edgekit.ci.config import load_config
    from edgekit.ci.junit import write_junit
    from edgekit.ci.run import run_ci
    from edgekit.ci.summary import markdown
    from edgekit.errors import EdgekitError, GateError
    from edgekit.fsutil import check_output_path, write_bytes_atomic, write_error

    o = Output()
    for path in (junit, report, summary):
        if path is not None:
            check_output_path(path)
    cfg = load_config(config, baseline=baseline)
    o.info(f"edgekit ci: {len(cfg.models)} model(s) from {cfg.path}, baseline: {cfg.baseline.describe()}")
    result = run_ci(cfg, o)

    text = markdown(result)
    if junit is not None:
        write_junit(result, junit)
    if summary is not None:
        write_bytes_atomic(summary, text.encode())
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        try:
            with open(step_summary, "a", encoding="utf-8") as fh:  # GitHub collects what each step appends
                fh.write(text)
        except OSError as exc:
            raise write_error(Path(step_summary), exc) from None
    if report is not None and not any(run.records for run in result.runs):
        o.warn(f"no run finished: no report written to {report}")
        report = None
    if report is not None:
        _write_report(result, report)
    if json_out:
        o.json(result.to_dict())
    else:
        for run in result.runs:
            if run.error:
                o.line(f"ERROR {run.classname}: {run.error}")
            for g in run.gates:
                word = {True: "PASS ", False: "FAIL ", None: "NOBASE"}[g.passed]
                o.line(f"{word} {run.classname} {g.gate.text}: {g.line}")
            if not run.error:
                o.line(f"      {run.classname} baseline: {run.baseline_note}")
        o.line(result.verdict())
    for path, what in ((junit, "JUnit XML"), (summary, "summary"), (report, "report")):
        if path is not None:
            o.info(f"{what} written to {path}")
    if result.no_baseline:
        o.info("no baseline yet for some gates: not a failure; these runs are stored and are the next run's baseline")
    code = result.exit_code
    if code == 5:
        failed = [f"{r.classname} {g.gate.text}" for r in result.runs for g in r.failed_gates]
        raise GateError(f"{len(failed)} gate(s) failed: {', '.join(failed)}", "the numbers are in the lines above, the JUnit file and the summary")
    if code:
        bad = [r for r in result.runs if r.error]
        err = EdgekitError(f"{len(bad)} of {len(result.runs)} run(s) failed: {bad[0].classname}: {bad[0].error}", bad[0].hint or "")
        err.exit_code = code
        raise err


def _write_report(result, path: Path) -> None:
    """The HTML report of every run, with each run's earlier stored runs as its history."""
    from edgekit.bench.store import ResultsStore
    from edgekit.report import earlier_runs, write_report

    records = [r for run in result.runs for r in run.records]
    with ResultsStore() as store:
        history = earlier_runs(store, records)
    gates = [{**g.to_dict(), "model": run.model, "target": run.target, "device": run.device} for run in result.runs for g in run.gates]
    write_report(records, path, title=f"edgekit ci: {result.config.path.name}", history=history or None, gates=gates)
