"""Quantize once: the int8 model and its report, cached by everything that decides them.

The key covers the float model (sha256), the scheme, the calibration method and exclusions,
the calibration and held-out data as loaded (array bytes, so a folder of images preprocessed
the same way hits too), edgekit's version and the quantizer's own source (a development
checkout that changes how it quantizes does not get an older result back). An unchanged redeploy, and every device of a
fleet that shares a scheme, reuses the entry instead of calibrating again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import onnx

from edgekit import __version__
from edgekit.fsutil import atomic_path, cache_dir
from edgekit.quantize.calib import FeedSet
from edgekit.quantize.report import AgreementReport, OutputAgreement
from edgekit.quantize.scheme import QuantScheme

FORMAT = 5  # 2: the report carries per-layer errors (layers); 3: and the mixed-precision decision; 4: entropy never clips inside the MSE optimum; 5: the threshold check
MODEL, REPORT = "int8.onnx", "report.json"


def key(
    model_sha256: str, scheme: QuantScheme, method: str, exclude: Sequence[str], calibration: FeedSet, heldout: FeedSet,
    *, max_drop: float | None = None, metric: str | None = None, threshold: float | None = None, backend: str | None = None,
) -> str:
    """The cache key of one quantization (hex sha256); ``max_drop`` and ``metric``: mixed precision's
    (a metric module's source is part of the key, so editing it quantizes again); ``backend``: the
    one mixed precision plans for (what it can keep in float)."""
    h = hashlib.sha256()
    head = {
        "format": FORMAT, "edgekit": __version__, "code": code_digest(), "model": model_sha256, "scheme": scheme.to_dict(), "method": method, "exclude": sorted(exclude),
        "max_drop": max_drop, "metric": metric, "metric_source": _metric_source(metric) if metric is not None else None, "threshold": threshold,
        "backend": backend,
    }  # fmt: skip
    h.update(json.dumps(head, sort_keys=True).encode())
    for part in (calibration, heldout):
        h.update(f"|{part.random}|{len(part.feeds)}|".encode())
        for feed in part.feeds:
            for name in sorted(feed):
                arr = feed[name]
                h.update(f"{name}:{arr.dtype.str}:{arr.shape}".encode())
                h.update(arr.tobytes())
        if part.labels is not None:
            h.update(part.labels.tobytes())
    return h.hexdigest()


@functools.cache
def code_digest() -> str:
    """sha256 over the quantizer's source files (this package), in name order."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _metric_source(metric: str | None) -> str | None:
    path, colon, _ = (metric or "").rpartition(":")
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest() if colon and path else None
    except OSError:
        return None  # the metric loader reports a missing module, in its own words


def load(k: str) -> tuple[onnx.ModelProto, dict, AgreementReport] | None:
    """The cached int8 model, its report and agreement; None when absent or unreadable."""
    root = cache_dir("quantized") / k
    try:
        report = json.loads((root / REPORT).read_text(encoding="utf-8"))
        model = onnx.load(str(root / MODEL))
        a = report["agreement"]
        outputs = tuple(OutputAgreement(**{**o, "snr_db": float("inf") if o["snr_db"] is None else o["snr_db"]}) for o in a["outputs"])
        agreement = AgreementReport(
            a["samples"], a["source"], outputs, a["accuracy_fp32"], a["accuracy_int8"], a["measured_on"], a["estimate"]
        )
    except (OSError, ValueError, KeyError, TypeError, onnx.onnx_cpp2py_export.checker.ValidationError):
        return None  # a half-written or old entry is rebuilt, never trusted
    return model, report, agreement


def save(k: str, model_path: Path, report: dict) -> None:
    """Store an entry; written beside and renamed, so readers never see half of one."""
    root = cache_dir("quantized")
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{k}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    shutil.copyfile(model_path, tmp / MODEL)
    with atomic_path(tmp / REPORT) as p:
        p.write_text(json.dumps(report), encoding="utf-8")
    try:
        tmp.rename(root / k)
    except OSError:  # another job stored the same entry meanwhile: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)


def load_ranking(k: str) -> dict | None:
    """A --max-drop search's cached ranking of int8 nodes (``mixed.rank``); None when absent or unreadable."""
    try:
        doc = json.loads((cache_dir("sensitivity") / f"{k}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("layers"), list) else None


def save_ranking(k: str, doc: dict) -> None:
    root = cache_dir("sensitivity")
    root.mkdir(parents=True, exist_ok=True)
    with atomic_path(root / f"{k}.json") as p:
        p.write_text(json.dumps(doc), encoding="utf-8")
