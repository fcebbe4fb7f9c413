"""fp32 vs int8 agreement, measured on held-out samples with ONNX Runtime."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from edgekit.quantize import qmath
from edgekit.quantize.calib import FeedSet


@dataclass(frozen=True)
class OutputAgreement:
    name: str
    cosine: float
    snr_db: float
    max_abs_err: float
    top1: float | None  # fraction of samples whose argmax agrees (class vectors only)


@dataclass(frozen=True)
class AgreementReport:
    samples: int
    source: str
    outputs: tuple[OutputAgreement, ...]
    accuracy_fp32: float | None = None  # against labels, when given
    accuracy_int8: float | None = None

    @property
    def accuracy_drop(self) -> float | None:
        if self.accuracy_fp32 is None or self.accuracy_int8 is None:
            return None
        return self.accuracy_fp32 - self.accuracy_int8

    def to_dict(self) -> dict:
        d = asdict(self)
        d["outputs"] = [asdict(o) for o in self.outputs]
        d["accuracy_drop"] = self.accuracy_drop
        for o in d["outputs"]:
            if o["snr_db"] == float("inf"):
                o["snr_db"] = None  # identical outputs; JSON has no infinity
        return d


def session(model_bytes: bytes, threads: int | None = None):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads:
        opts.intra_op_num_threads = threads
    return ort.InferenceSession(model_bytes, opts, providers=["CPUExecutionProvider"])


def _is_class_vector(arrays: list[np.ndarray]) -> bool:
    a = arrays[0]
    return a.ndim == 2 and a.shape[1] > 1


def measure_agreement(float_model: bytes, quant_model: bytes, heldout: FeedSet) -> AgreementReport:
    fs, qs = session(float_model), session(quant_model)
    names = [o.name for o in fs.get_outputs()]
    ref: dict[str, list[np.ndarray]] = {n: [] for n in names}
    got: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for feed in heldout.feeds:
        for n, v in zip(names, fs.run(names, feed)):
            ref[n].append(np.asarray(v))
        for n, v in zip(names, qs.run(names, feed)):
            got[n].append(np.asarray(v))
    outputs = []
    class_output = None
    for n in names:
        r = np.concatenate([a.reshape(1, -1) if a.ndim == 0 else a for a in ref[n]]).astype(np.float64)
        q = np.concatenate([a.reshape(1, -1) if a.ndim == 0 else a for a in got[n]]).astype(np.float64)
        top1 = None
        if np.issubdtype(r.dtype, np.floating) and _is_class_vector(ref[n]):
            top1 = float(np.mean(r.argmax(axis=1) == q.argmax(axis=1)))
            class_output = class_output or n
        outputs.append(
            OutputAgreement(
                name=n,
                cosine=round(float(qmath.cosine(r, q)), 6),
                snr_db=round(float(qmath.snr_db(r, q)), 2),
                max_abs_err=float(np.max(np.abs(r - q))) if r.size else 0.0,
                top1=top1,
            )
        )
    acc_f = acc_q = None
    if heldout.labels is not None and class_output is not None:
        r = np.concatenate(ref[class_output])
        q = np.concatenate(got[class_output])
        labels = heldout.labels
        if r.shape[0] == labels.shape[0]:
            acc_f = float(np.mean(r.argmax(axis=1) == labels))
            acc_q = float(np.mean(q.argmax(axis=1) == labels))
    return AgreementReport(len(heldout.feeds), heldout.source, tuple(outputs), acc_f, acc_q)
