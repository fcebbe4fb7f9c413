"""JUnit XML of a CI run that Jenkins (xunit's junit-10.xsd), Ant/Surefire (surefire-test-report.xsd;
each <testsuite> on its own), GitLab and GitHub's reporters all read: one <testsuite> per model,
one <testcase> per model x target x device x gate, classname MODEL/TARGET/DEVICE.

A gate that failed is a <failure>; one that is inconclusive or has no baseline yet is <skipped>
with the reason; a run that could not happen (device unreachable, push failed, agent crashed,
bad model) is one <error> case per gate with the reason. The measured values are in the suite's
<properties> and in each case's <system-out> (GitLab shows only the latter). Device text is made
plain first (``edgekit.sanitize``): an ANSI colour code would make the file unparsable.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from edgekit.ci.run import CiResult, Run
from edgekit.fsutil import write_bytes_atomic
from edgekit.sanitize import plain


def junit_xml(result: CiResult) -> bytes:
    root = ET.Element("testsuites", name="edgekit ci")
    totals = dict.fromkeys(("tests", "failures", "errors"), 0)
    for spec in result.config.models:
        runs = [r for r in result.runs if r.model == spec.name]
        # the attributes both schemas allow (Surefire's has no timestamp/hostname), in its order
        suite = ET.SubElement(root, "testsuite", name=plain(spec.name))
        props = ET.SubElement(suite, "properties")
        ET.SubElement(props, "property", name="model", value=plain(spec.path))
        for run in runs:
            for key, value in _facts(run).items():
                ET.SubElement(props, "property", name=plain(f"{run.target}/{run.device}.{key}"), value=value)
        cases = [case for run in runs for case in _cases(run, spec.gates, result)]
        suite.extend(cases)
        counts = {"tests": len(cases)}
        for kind, key in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
            counts[key] = sum(case.find(kind) is not None for case in cases)
        suite.set("time", f"{sum(r.seconds for r in runs):.3f}")
        for key, n in counts.items():
            suite.set(key, str(n))
            if key in totals:
                totals[key] += n
    for key, n in totals.items():  # junit-10.xsd has no "skipped" on <testsuites>
        root.set(key, str(n))
    root.set("time", f"{result.seconds:.3f}")
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"


def _facts(run: Run) -> dict[str, str]:
    out = {k: plain(v) for k, v in run.facts().items()}
    out["baseline"] = plain(run.baseline_note or "-")
    out["outcome"] = run.outcome
    return out


def _out(run: Run, line: str | None = None) -> str:
    """A case's system-out: the gate's line, then the run's measured values, one per line."""
    lines = [plain(line)] if line else []
    lines += [f"{k}: {v}" for k, v in _facts(run).items()]
    return "\n".join(lines)


def _cases(run: Run, gates: tuple, result: CiResult) -> list[ET.Element]:
    time = f"{run.seconds:.3f}"
    if run.error:
        what = "device unreachable" if run.unreachable else "deploy failed"
        cases = []
        for name in [g.text for g in gates] or ["deploy"]:
            case = ET.Element("testcase", name=plain(name), classname=plain(run.classname), time=time)
            err = ET.SubElement(case, "error", message=plain(f"{what}: {run.error}"), type=f"exit {run.exit_code}")
            err.text = "\n".join(plain(x) for x in (run.error, run.hint and f"hint: {run.hint}") if x)
            ET.SubElement(case, "system-out").text = _out(run)
            cases.append(case)
        return cases
    if not run.gates:
        case = ET.Element("testcase", name="deploy", classname=plain(run.classname), time=time)
        ET.SubElement(case, "system-out").text = _out(run)
        return [case]
    cases = []
    for g in run.gates:
        case = ET.Element("testcase", name=plain(g.gate.text), classname=plain(run.classname), time="0.000")
        if g.outcome == "fail" or (g.outcome == "inconclusive" and result.inconclusive == "fail"):
            kind = "gate" if g.outcome == "fail" else "inconclusive (--inconclusive fail)"
            ET.SubElement(case, "failure", message=plain(g.line), type=kind).text = plain(g.line)
        elif g.outcome == "inconclusive":
            ET.SubElement(case, "skipped", message=plain(f"inconclusive: {g.line}"))
        elif g.outcome == "skipped":
            ET.SubElement(case, "skipped", message=plain(f"{g.line} ({run.baseline_note})"))
        ET.SubElement(case, "system-out").text = _out(run, g.line)
        cases.append(case)
    return cases


def write_junit(result: CiResult, path: Path) -> Path:
    write_bytes_atomic(path, junit_xml(result))
    return path
