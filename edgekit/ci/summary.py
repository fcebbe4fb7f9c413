"""The markdown summary of a CI run, fit for a pull-request comment or $GITHUB_STEP_SUMMARY: a
verdict line, a devices line, a link to the HTML report, then a table per model (one row per
target/device, seven columns) and, below it, every gate that did not pass with its reason.

Every piece of device text goes through ``edgekit.sanitize.markdown``: it renders as the text it
is (no links, images, HTML or table cells of its own).
"""

from __future__ import annotations

from edgekit.bench.compare import latency_change
from edgekit.ci.run import CiResult, Run
from edgekit.sanitize import markdown as md

RESULT = {
    "pass": "✅ pass", "fail": "❌ fail", "inconclusive": "⚠️ inconclusive",
    "error": "❌ error", "unreachable": "❌ unreachable", "skipped": "— no baseline",
}  # fmt: skip
COLUMNS = ("device", "result", "p50", "Δ p50 vs baseline (95% CI)", "int8 speed-up", "accuracy drop", "baseline commit (date)")


def markdown(result: CiResult, report_link: str | None = None) -> str:
    code = result.exit_code
    head = "✅ passed" if code == 0 else ("❌ gate failed" if code == 5 else "❌ error")
    lines = [f"## edgekit ci: {head}", "", result.verdict() + f" in {result.seconds:.0f} s."]  # edgekit's own words
    if report_link:
        lines += ["", f"[HTML report]({_url(report_link)})"]
    if result.no_baseline:
        lines += ["", "Gates marked — have no baseline yet: this run becomes the baseline of the next one."]
    for spec in result.config.models:
        runs = [r for r in result.runs if r.model == spec.name]
        lines += ["", f"### {md(spec.name)}", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        notes = []
        for run in runs:
            lines.append("| " + " | ".join(_row(run)) + " |")
            if run.error:
                notes.append(f"- **{md(run.classname)}** {RESULT[run.outcome]}: {md(run.error)}" + (f" (hint: {md(run.hint)})" if run.hint else ""))
            # a gate's text is parse_gate's (no backtick can be in it); its line is edgekit's words and numbers
            notes += [f"- **{md(run.classname)}** {RESULT[g.outcome]} `{g.gate.text}`: {md(g.line)}" for g in run.gates if g.outcome != "pass"]
        lines += ["", *notes] if notes else []
    return "\n".join(lines) + "\n"


def _row(run: Run) -> list[str]:
    device = md(f"{run.device} ({run.target})")
    outcome = run.outcome
    if run.error:
        return [device, RESULT[outcome], "-", "-", "-", "-", "-"]
    f = run.facts()
    p50 = f.get("p50_ms")
    speed, drop = run.speedup(), run.accuracy_drop()
    return [
        device, RESULT[outcome], "-" if p50 is None else f"{_ms(p50)} ms", _delta(run),
        "-" if speed is None else f"{speed:.2f}×", "-" if drop is None else f"{drop:+.2f} pt", _baseline(run),
    ]  # fmt: skip


def _delta(run: Run) -> str:
    """p50 vs the baseline with the 95 % bootstrap interval of the change."""
    if run.baseline is None or run.record is None:
        return "— (no baseline)"
    ch = latency_change(run.baseline["agent"], run.record["agent"], 50.0)
    return f"{ch.change * 100:+.1f}% ({(ch.low - 1) * 100:+.1f}..{(ch.high - 1) * 100:+.1f}%)"


def _baseline(run: Run) -> str:
    b = run.baseline
    if b is None:
        return "—"
    commit = (b.get("vcs") or {}).get("commit")
    name = f"run {b['id']}" if b.get("id") is not None else "record"
    when = b["created"][:16].replace("T", " ")
    return f"{md(commit[:10])} ({when}, {name})" if commit else f"no commit ({when}, {name})"


def _ms(value: float) -> str:
    return f"{value:.3f}" if value < 10 else f"{value:.1f}"


def _url(link: str) -> str:
    """A link target markdown keeps whole: no spaces or parentheses of its own."""
    return "".join(c if c.isprintable() and c not in " ()<>" else "".join(f"%{b:02X}" for b in c.encode()) for c in link)
