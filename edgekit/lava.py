"""Boards behind a LAVA lab: a job definition that benches a bundle there, and its results back.

``job_definition`` writes a LAVA job for a device that LAVA reaches over SSH (``deploy: to:
ssh``, ``boot: method: ssh``: the board is already booted, as in a lab's ssh device type), whose
inline test definition fetches the packed bundle (``pack`` : the bundle and the agent zipapp, one
tar.gz the lab can download from ``bundle_url``), checks its sha256 and runs ``agent.pyz lava``
(``edgekit/agent/lava.py``): each variant benched in its own process, each bench document
printed to the job log on one ``EDGEKIT-DOC`` line, and p50/p90/p99/mean reported as LAVA test
cases with measurements in ms.

``import_documents`` reads what ``lavacli`` gives back for a finished job: the job log
(``lavacli jobs logs JOB --raw``, YAML lines with ``lvl``/``msg``) carries the documents, so the
records are the ones a direct bench would store, raw samples included; the results file
(``lavacli results JOB --yaml``) is checked against them (a case LAVA recorded as failed, or a
measurement that disagrees with the samples, is an error) and gives the job its id.

The job follows LAVA's job schema (``lava_common.schemas``; tests validate with it).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.agent.lava import DOC_MARK, case_name, metrics_ms, parse_gate
from edgekit.bench.record import make_record
from edgekit.bench.store import EXPORT_KIND, EXPORT_SCHEMA
from edgekit.errors import InputError, UsageError
from edgekit.transport.agentzip import agent_zip_bytes

TEST_NAME = "edgekit-bench"
PACK_ROOT = "edgekit"  # inside the tar.gz: edgekit/agent.pyz and edgekit/bundle/...
_TAR_EPOCH = 315532800  # 1980-01-01: a pack's bytes depend only on its contents


@dataclass(frozen=True)
class LavaJob:
    """What a LAVA job benches and where the board gets it."""

    bundle_dir: Path
    device_type: str
    bundle_url: str
    bundle_sha256: str
    iterations: int = 100
    variants: tuple[str, ...] = ()
    gates: tuple[str, ...] = ()
    threads: int | None = None
    job_name: str | None = None
    timeout_minutes: int = 30
    tags: tuple[str, ...] = field(default_factory=tuple)


def read_manifest(bundle_dir: Path) -> dict:
    path = Path(bundle_dir) / "manifest.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{bundle_dir} is not a bundle (no manifest.json)",
                         "make one with `edgekit deploy MODEL --target T --no-bench -o DIR`") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read {path}: {exc}", "rebuild the bundle with edgekit deploy --no-bench") from None


def pack(bundle_dir: Path) -> bytes:
    """The tar.gz a LAVA board downloads: the agent zipapp and the bundle, deterministic bytes."""
    bundle_dir = Path(bundle_dir)
    read_manifest(bundle_dir)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add(name: str, data: bytes, mode: int = 0o644) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, _TAR_EPOCH
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))

        add(f"{PACK_ROOT}/agent.pyz", agent_zip_bytes())
        for path in sorted(p for p in bundle_dir.rglob("*") if p.is_file()):
            rel = path.relative_to(bundle_dir).as_posix()
            add(f"{PACK_ROOT}/bundle/{rel}", path.read_bytes(), 0o755 if path.stat().st_mode & 0o111 else 0o644)
    return gzip.compress(buf.getvalue(), mtime=0)  # gzip's header carries a time too


def job_definition(job: LavaJob) -> dict:
    """The LAVA job (a dict to dump as YAML)."""
    manifest = read_manifest(job.bundle_dir)
    names = [v["name"] for v in manifest.get("variants", [])]
    variants = list(job.variants) or names
    unknown = [v for v in variants if v not in names]
    if unknown:
        raise UsageError(f"the bundle has no variant '{unknown[0]}'", f"its variants: {', '.join(names)}")
    for gate in job.gates:
        try:
            parse_gate(gate)
        except ValueError as exc:
            raise UsageError(str(exc), "a LAVA job checks absolute latency gates only: p50/p90/p99/mean:<N(us|ms|s)") from None
    if job.iterations < 1:
        raise UsageError(f"--iterations must be >= 1, got {job.iterations}", "e.g. --iterations 200")
    model, target = manifest.get("model_name", "model"), manifest.get("profile", "target")
    lava_argv = ["python3", f"{PACK_ROOT}/agent.pyz", "lava", f"{PACK_ROOT}/bundle", "--model", model, "--target", target,
                 "--iterations", str(job.iterations)]
    for v in variants:
        lava_argv += ["--variant", v]
    for g in job.gates:
        lava_argv += ["--fail", g]
    if job.threads:
        lava_argv += ["--threads", str(job.threads)]
    fetch = ("python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' "
             f"{_q(job.bundle_url)} edgekit.tar.gz")
    steps = [
        'cd "$(mktemp -d)"',
        f"{fetch} || {{ lava-test-raise edgekit-bundle-download-failed; exit 1; }}",
        f"echo '{job.bundle_sha256}  edgekit.tar.gz' | sha256sum -c - || {{ lava-test-raise edgekit-bundle-checksum-mismatch; exit 1; }}",
        "tar -xzf edgekit.tar.gz",
        " ".join(_q(a) for a in lava_argv),
    ]
    minutes = max(1, job.timeout_minutes)
    return {
        "job_name": job.job_name or f"edgekit {model} on {target}"[:200],
        "device_type": job.device_type,
        "visibility": "public",
        "priority": "medium",
        "timeouts": {"job": {"minutes": minutes}, "action": {"minutes": minutes}, "connection": {"minutes": 2}},
        **({"tags": list(job.tags)} if job.tags else {}),
        "metadata": {"edgekit.model": model, "edgekit.target": target, "edgekit.bundle_sha256": job.bundle_sha256},
        "actions": [
            {"deploy": {"to": "ssh", "os": "debian", "timeout": {"minutes": minutes}}},
            {"boot": {"method": "ssh", "connection": "ssh", "prompts": ["# ", "$ "], "timeout": {"minutes": 5}}},
            {"test": {
                "timeout": {"minutes": minutes},
                "definitions": [{
                    "from": "inline",
                    "name": TEST_NAME,
                    "path": f"inline/{TEST_NAME}.yaml",
                    "repository": {
                        "metadata": {"format": "Lava-Test Test Definition 1.0", "name": TEST_NAME,
                                     "description": f"edgekit: bench {model} ({', '.join(variants)}) on {target}"},
                        "run": {"steps": steps},
                    },
                }],
            }},
        ],
    }


def _q(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


# -- results back ---------------------------------------------------------------------------


def _load_yaml(path: Path) -> Any:
    try:
        import yaml
    except ImportError:
        raise InputError("reading LAVA's YAML needs PyYAML, which is not installed", "pip install pyyaml") from None
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {path}: {exc}", "give the files lavacli wrote") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: invalid YAML: {' '.join(str(exc).split())}", "give the files lavacli wrote") from None


def _kind(doc: Any) -> str | None:
    """'log' (lavacli jobs logs --raw), 'results' (lavacli results --yaml), or None."""
    if not isinstance(doc, list) or not doc or not all(isinstance(x, dict) for x in doc):
        return None
    if all("lvl" in x and "msg" in x for x in doc):
        return "log"
    if all("name" in x and "result" in x for x in doc):
        return "results"
    return None


def import_documents(paths: list[Path]) -> dict:
    """An export document (as ``edgekit results export`` writes) of the runs a finished LAVA job measured."""
    logs, results = [], []
    for p in paths:
        doc = _load_yaml(p)
        kind = _kind(doc)
        if kind is None:
            raise InputError(f"{p} is neither a LAVA job log nor a LAVA results file",
                             "give `lavacli jobs logs JOB --raw > log.yaml` and `lavacli results JOB --yaml > results.yaml`")
        (logs if kind == "log" else results).append((p, doc))
    if not logs:
        raise InputError("no LAVA job log given: the raw samples travel in the job's log, not in its results",
                         "add the log: lavacli jobs logs JOB --raw > log.yaml, then import both files")
    lines = []
    for p, log in logs:
        for i, entry in enumerate(log):
            msg = entry.get("msg")
            if entry.get("lvl") == "target" and isinstance(msg, str) and msg.startswith(DOC_MARK):
                try:
                    lines.append((f"{p}: line {i + 1}", json.loads(msg[len(DOC_MARK):]), msg))
                except ValueError:
                    raise InputError(f"{p}: line {i + 1}: a cut or damaged EDGEKIT-DOC line",
                                     "the log may be truncated; download it again with lavacli jobs logs JOB --raw") from None
    if not lines:
        raise InputError("the LAVA log has no edgekit bench documents", "was the job written by `edgekit lava-job`? did its test run?")
    cases = {(c.get("name")): c for _, res in results for c in res if str(c.get("suite", "")).endswith(TEST_NAME)}
    job_ids = {str(c["job"]) for _, res in results for c in res if c.get("job") not in (None, "")}
    records = []
    for where, line, raw in lines:
        doc = line.get("doc") if isinstance(line, dict) else None
        if not isinstance(doc, dict) or doc.get("kind") != "edgekit.bench":
            continue  # a failed bench: LAVA's results say so; there is no run to store
        record = make_record(doc, model_name=str(line.get("model") or "model"), target=str(line.get("target") or "lava"),
                             device=f"lava:{line.get('device') or 'device'}",
                             extra={"lava": {"job": sorted(job_ids)[0] if len(job_ids) == 1 else None}})
        # the same log imported twice is the same run: its id comes from the document's bytes
        record["run_uuid"] = hashlib.sha256(raw.encode()).hexdigest()[:32]
        if cases:
            _check_against_results(where, line["variant"], doc, cases)
        records.append(record)
    if not records:
        raise InputError("every bench in the LAVA job failed: nothing to store", "see the job's log for the agent's errors")
    return {"schema": EXPORT_SCHEMA, "kind": EXPORT_KIND, "records": records}


def _check_against_results(where: str, variant: str, doc: dict, cases: dict) -> None:
    bench = cases.get(case_name(variant, "bench"))
    if bench is not None and bench.get("result") != "pass":
        raise InputError(f"{where}: LAVA recorded {variant}'s bench as {bench.get('result')}",
                         "the log and the results are of different jobs, or the run failed")
    for metric, value in metrics_ms(doc["samples_ns"]).items():
        case = cases.get(case_name(variant, metric))
        if case is None or case.get("measurement") in (None, ""):
            continue
        try:
            reported = float(case["measurement"])
        except (TypeError, ValueError):
            raise InputError(f"{where}: LAVA's {case_name(variant, metric)} measurement {case['measurement']!r} is not a number",
                             "give the results file lavacli wrote") from None
        if abs(reported - value) > max(1e-6, 1e-3 * abs(value)):
            raise InputError(f"{where}: LAVA's {case_name(variant, metric)} is {reported} ms, the log's samples give {value:.6f} ms",
                             "the log and the results are of different jobs; download both for the same job id")
