"""The markdown summary of a CI run, fit for a pull-request comment or $GITHUB_STEP_SUMMARY:
a verdict line, then a table per model (one row per target/device)."""

from __future__ import annotations

from edgekit.ci.run import CiResult, Run

MARK = {True: "✅", False: "❌", None: "—"}


def markdown(result: CiResult) -> str:
    code = result.exit_code
    head = "✅ passed" if code == 0 else ("❌ gate failed" if code == 5 else "❌ error")
    lines = [f"## edgekit ci: {head}", "", result.verdict() + f" in {result.seconds:.0f} s."]
    if result.no_baseline:
        lines.append("Gates marked — have no baseline yet: this run becomes the baseline of the next one.")
    for spec in result.config.models:
        runs = [r for r in result.runs if r.model == spec.name]
        gates = [g.text for g in spec.gates]
        lines += ["", f"### {spec.name}", ""]
        cols = ["device", "variant", "backend", "p50 ms", "p99 ms", "accuracy", *gates, "baseline"]
        lines.append("| " + " | ".join(_cell(c) for c in cols) + " |")
        lines.append("|" + "---|" * len(cols))
        notes = []
        for run in runs:
            lines.append("| " + " | ".join(_cell(c) for c in _row(run, len(gates))) + " |")
            if run.error:
                notes.append(f"- **{run.classname}**: error: {run.error}" + (f" (hint: {run.hint})" if run.hint else ""))
            notes += [f"- **{run.classname}** {MARK[g.passed]} {g.line}" for g in run.gates if g.passed is not True]
        lines += ["", *notes] if notes else []
    return "\n".join(lines) + "\n"


def _row(run: Run, n_gates: int) -> list[str]:
    f = run.facts()
    device = f"{run.device} ({run.target})"
    if run.error:
        return [device, "-", "-", "-", "-", "-", *(["error"] * n_gates), "-"]
    acc = f.get("accuracy_pct")
    return [
        device, f.get("variant", "-"), f.get("backend", "-"), _ms(f.get("p50_ms")), _ms(f.get("p99_ms")),
        "-" if acc is None else f"{acc:.1f}%", *(MARK[g.passed] for g in run.gates), run.baseline_note or "-",
    ]  # fmt: skip


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}" if value < 10 else f"{value:.1f}"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")
