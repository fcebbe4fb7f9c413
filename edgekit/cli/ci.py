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
        typer.Option(
            "--baseline", metavar="REF",
            help='Compare with: run ids "12,13", "branch:NAME", "tag:NAME" (edgekit results pin), "latest", or an export file '
                 "(overrides [baseline]; default: the latest passing run on the default branch, else anywhere).",
        ),
    ] = None,
    fail_on_unreachable: Annotated[
        str, typer.Option("--fail-on-unreachable", metavar="true|false", help="Exit 4 when a device cannot be reached (default true); false: report it, exit by the rest.")
    ] = "true",
    inconclusive: Annotated[
        str, typer.Option("--inconclusive", metavar="warn|fail", help="An inconclusive gate (the runs cannot tell): warn (default, exit 0) or fail (exit 5).")
    ] = "warn",
    report_url: Annotated[
        str | None, typer.Option("--report-url", metavar="URL", help="Where the HTML report will be (CI artifact URL) for the summary's link (default: the --report path).")
    ] = None,
    json_out: common.Json = False,
) -> None:
    """Deploy and bench every model of edgekit.toml on its targets' devices, check its gates,
    and exit 0 (all passed, inconclusive under --inconclusive warn, or no baseline yet), 5 (a gate
    failed), 4 (a device failed or could not be reached) or 3 (bad config or model).

    Example:

        edgekit ci --junit edgekit-junit.xml --summary summary.md --report edgekit-report.html

    One device that fails does not stop the others: it is an error case in the JUnit file, and
    the JUnit file, summary and report are written after every run. Nothing is written when the
    config or a flag is bad.
    """
    from edgekit.ci.config import load_config
    from edgekit.ci.junit import write_junit
    from edgekit.ci.run import run_ci
    from edgekit.ci.summary import markdown
    from edgekit.errors import EdgekitError, GateError, UsageError
    from edgekit.fsutil import check_output_path, write_bytes_atomic, write_error
    from edgekit.sanitize import plain, quoted

    o = Output()
    on_unreachable = _bool(fail_on_unreachable, "--fail-on-unreachable")
    if inconclusive not in ("warn", "fail"):
        raise UsageError(f"--inconclusive must be warn or fail, got {inconclusive!r}", "e.g. --inconclusive fail")
    for path in (junit, report, summary):
        if path is not None:
            check_output_path(path)
    cfg = load_config(config, baseline=baseline)
    o.info(f"edgekit ci: {len(cfg.models)} model(s) from {cfg.path}, baseline: {cfg.baseline.describe()}")
    result = run_ci(cfg, o, fail_on_unreachable=on_unreachable, inconclusive=inconclusive)

    text = markdown(result, report_url or (str(report) if report is not None else None))
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
        words = {"pass": "PASS ", "fail": "FAIL ", "inconclusive": "INCONCLUSIVE", "skipped": "NOBASE"}
        for run in result.runs:
            if run.error:
                o.line(quoted(f"{'UNREACHABLE' if run.unreachable else 'ERROR'} {plain(run.classname)}: ", run.error))
            for g in run.gates:
                o.line(quoted(f"{words[g.outcome]} {plain(run.classname)} {plain(g.gate.text)}: ", g.line))
            if not run.error:
                o.line(quoted(f"      {plain(run.classname)} baseline: ", run.baseline_note))
        o.line(plain(result.verdict()))
    for path, what in ((junit, "JUnit XML"), (summary, "summary"), (report, "report")):
        if path is not None:
            o.info(f"{what} written to {path}")
    if result.no_baseline:
        o.info("no baseline yet for some gates: not a failure; these runs are stored and are the next run's baseline")
    o.info(result.devices_line())
    code = result.exit_code
    if code == 5:
        failed = [f"{r.classname} {g.gate.text}" for r in result.runs for g in result.failing(r)]
        words = "failed" if result.inconclusive == "warn" else "failed or were inconclusive (--inconclusive fail)"
        raise GateError(f"{len(failed)} gate(s) {words}: {', '.join(failed)}", "the numbers are in the lines above, the JUnit file and the summary")
    if code:
        bad = [r for r in result.runs if r.error and (result.fail_on_unreachable or not r.unreachable)]
        err = EdgekitError(f"{len(bad)} of {len(result.runs)} run(s) failed: {bad[0].classname}: {plain(bad[0].error)}", bad[0].hint or "")
        err.exit_code = code
        raise err


def _bool(text: str, flag: str) -> bool:
    from edgekit.errors import UsageError

    value = {"true": True, "yes": True, "1": True, "on": True, "false": False, "no": False, "0": False, "off": False}.get(text.strip().lower())
    if value is None:
        raise UsageError(f"{flag} takes true or false, got {text!r}", f"e.g. {flag}=false")
    return value


def _write_report(result, path: Path) -> None:
    """The HTML report of every run, with each run's earlier stored runs as its history, and the
    runs that could not happen (unreachable device, failed deploy) listed with their reason."""
    from edgekit.bench.store import ResultsStore
    from edgekit.report import earlier_runs, write_report

    records = [r for run in result.runs for r in run.records]
    history = None
    if records:
        with ResultsStore() as store:
            history = earlier_runs(store, records)
    gates = [{**g.to_dict(), "model": run.model, "target": run.target, "device": run.device} for run in result.runs for g in run.gates]
    problems = [(run.classname, run.outcome, run.error) for run in result.runs if run.error]
    write_report(records, path, title=f"edgekit ci: {result.config.path.name}", history=history or None, gates=gates, problems=problems)
