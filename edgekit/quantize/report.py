"""fp32 vs int8 agreement: one pure comparison of outputs, and the host's estimate of it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx

from edgekit.errors import CalibrationError
from edgekit.quantize import dynamic, qmath

HOST_ESTIMATE = "host (Q/DQ reference semantics)"


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
    measured_on: str = HOST_ESTIMATE
    estimate: bool = True  # False only when the outputs came from the device's own backend

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


def session(model: bytes | str | Path, *, reference: bool, threads: int | None = None):
    """An ONNX Runtime CPU session; ``reference=True`` runs a QDQ model with Q/DQ reference semantics,
    ``threads``: on that many threads (None: ORT's default).

    With graph optimizations on, ORT fuses Q/DQ pairs into its int8 kernels, whose results depend
    on the host CPU: on x86 without VNNI the u8s8 path (VPMADDUBSW) saturates its 16-bit
    intermediate and differs from the model's meaning by many steps. ORT_DISABLE_ALL executes the
    Q/DQ nodes as written (float math between them): the model's meaning, whatever the CPU's int8
    instructions. MatMulInteger / ConvInteger (``--method dynamic``) run the int8 kernels even
    then, so a reference session computes them in float instead (``dynamic.reference_form``).
    """
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads is not None:
        opts.intra_op_num_threads = opts.inter_op_num_threads = threads
    if reference:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        model = _reference_model(model)
    return ort.InferenceSession(model if isinstance(model, bytes) else str(model), opts, providers=["CPUExecutionProvider"])


def _reference_model(model: bytes | str | Path) -> bytes | str | Path:
    """``model`` with its integer matmuls and convolutions computed in float (see ``session``)."""
    blob = model if isinstance(model, bytes) else Path(model).read_bytes()
    if not any(op.encode() in blob for op in dynamic.INTEGER_OPS):
        return model
    proto = onnx.load_from_string(blob)
    if not any(n.op_type in dynamic.INTEGER_OPS for n in proto.graph.node):
        return model
    return dynamic.reference_form(proto).SerializeToString()


def _stack(arrays: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.reshape(a, (1, -1)) if np.ndim(a) == 0 else np.asarray(a) for a in arrays]).astype(np.float64)


def compare(
    fp32: Mapping[str, Sequence[np.ndarray]],
    int8: Mapping[str, Sequence[np.ndarray]],
    labels: np.ndarray | None = None,
    *,
    source: str,
    measured_on: str = HOST_ESTIMATE,
    estimate: bool = True,
) -> AgreementReport:
    """Agreement of int8 outputs with fp32 outputs (name -> one array per sample), wherever they ran.

    Accuracy against ``labels`` is computed on the first class-vector output.
    """
    outputs = []
    class_output = None
    stacked = {}
    for n, ref in fp32.items():
        r, q = _stack(ref), _stack(int8[n])
        stacked[n] = r, q
        top1 = None
        if r.ndim == 2 and r.shape[1] > 1:
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
    if labels is not None and class_output is not None:
        r, q = stacked[class_output]
        if labels.size and int(labels.max()) >= r.shape[1]:
            i = int(np.argmax(labels >= r.shape[1]))
            raise CalibrationError(
                f"labels of {source}: sample {i} has class index {int(labels[i])}, but output '{class_output}' has {r.shape[1]} classes",
                f"class indices run from 0 to {r.shape[1] - 1}: check the labels belong to this model and its evaluation data",
            )
        if r.shape[0] == labels.shape[0]:
            acc_f = float(np.mean(r.argmax(axis=1) == labels))
            acc_q = float(np.mean(q.argmax(axis=1) == labels))
    samples = len(next(iter(fp32.values()), ()))
    return AgreementReport(samples, source, tuple(outputs), acc_f, acc_q, measured_on, estimate)


def outputs(model: bytes, reference: bool, feeds: Sequence[Mapping[str, np.ndarray]]) -> dict[str, list[np.ndarray]]:
    """Output name -> one array per feed, by ORT (``reference``: with Q/DQ reference semantics, see ``session``)."""
    sess = session(model, reference=reference)
    names = [o.name for o in sess.get_outputs()]
    runs = [sess.run(names, feed) for feed in feeds]
    return {n: [np.asarray(r[i]) for r in runs] for i, n in enumerate(names)}
