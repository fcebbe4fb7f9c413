"""JUnit XML of a CI run, in the subset Jenkins, GitLab and GitHub test reporters all read
(tests/data/junit.xsd describes it): one <testsuite> per model, one <testcase> per
model x target x device x gate, classname MODEL/TARGET/DEVICE."""

from __future__ import annotations

import socket
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path

from edgekit.ci.run import CiResult, Run
from edgekit.fsutil import write_bytes_atomic


def junit_xml(result: CiResult) -> bytes:
    """The document; relative gates with no baseline yet are <skipped>, a deploy that failed is <error>."""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    root = ET.Element("testsuites", name="edgekit ci")
    totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    for spec in result.config.models:
        runs = [r for r in result.runs if r.model == spec.name]
        suite = ET.SubElement(root, "testsuite", name=spec.name, timestamp=stamp, hostname=socket.gethostname())
        props = ET.SubElement(suite, "properties")
        ET.SubElement(props, "property", name="model", value=str(spec.path))
        for run in runs:
            for key, value in run.facts().items():
                ET.SubElement(props, "property", name=f"{run.target}/{run.device}.{key}", value=str(value))
            ET.SubElement(props, "property", name=f"{run.target}/{run.device}.baseline", value=run.baseline_note or "-")
        cases = [case for run in runs for case in _cases(run, spec.gates)]
        suite.extend(cases)
        counts = {"tests": len(cases)}
        for kind, key in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
            counts[key] = sum(case.find(kind) is not None for case in cases)
        suite.set("time", f"{sum(r.seconds for r in runs):.3f}")
        for key, n in counts.items():
            suite.set(key, str(n))
            totals[key] += n
    for key, n in totals.items():
        root.set(key, str(n))
    root.set("time", f"{result.seconds:.3f}")
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"


def _cases(run: Run, gates: tuple) -> list[ET.Element]:
    if run.error:
        names = [g.text for g in gates] or ["deploy"]
        cases = []
        for name in names:
            case = ET.Element("testcase", name=name, classname=run.classname, time=f"{run.seconds:.3f}")
            err = ET.SubElement(case, "error", message=f"deploy failed: {run.error}", type=f"exit {run.exit_code}")
            err.text = "\n".join(x for x in (run.error, run.hint and f"hint: {run.hint}") if x)
            cases.append(case)
        return cases
    if not run.gates:
        return [ET.Element("testcase", name="deploy", classname=run.classname, time=f"{run.seconds:.3f}")]
    cases = []
    for g in run.gates:
        case = ET.Element("testcase", name=g.gate.text, classname=run.classname, time="0")
        if g.passed is False:
            ET.SubElement(case, "failure", message=g.line, type="gate").text = f"{g.line}\nbaseline: {run.baseline_note}"
        elif g.passed is None:
            ET.SubElement(case, "skipped", message=f"{g.line} ({run.baseline_note})")
        ET.SubElement(case, "system-out").text = f"{g.line}\nbaseline: {run.baseline_note}"
        cases.append(case)
    return cases


def write_junit(result: CiResult, path: Path) -> Path:
    write_bytes_atomic(path, junit_xml(result))
    return path
