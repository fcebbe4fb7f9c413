"""QDQ ONNX -> ``.ekm``: fuse DequantizeLinear -> op -> QuantizeLinear into ekrt's integer ops.

The QDQ model (what ``edgekit quantize`` writes) says, for every int8 tensor, its scale and
zero point: each ``QuantizeLinear`` on an activation becomes one int8 tensor of the runtime,
and a ``DequantizeLinear`` of it is that same tensor seen as float. Between them sit float
nodes; the lowering turns each float node into the integer op that produces exactly the
quantized value the QuantizeLinear asks for (docs/ekrt.md "Numbers" and "Ops"):

* Conv / Gemm / MatMul with int8 weights (+ int32 bias) (+ Relu/Clip) -> CONV2D /
  FULLY_CONNECTED with per-channel (multiplier, shift) of ``s_x * s_w[c] / s_y``;
* Add / Mul of two int8 tensors -> ADD / MUL; Concat, MaxPool, AveragePool,
  GlobalAveragePool, Reshape / Flatten / Squeeze / Unsqueeze / Transpose, Resize, Softmax;
* any chain of elementwise float ops of ONE int8 tensor (Sigmoid, Tanh, HardSigmoid,
  HardSwish, Div by a constant, ...) -> one LUT of 256 entries, computed by running the
  chain in ONNX Runtime on the 256 dequantized values, so the table holds what ORT computes;
* data movement (MaxPool, Reshape, ...) commutes with a monotone quantization, so a float
  island like ``DQ -> Div -> MaxPool -> Q`` quantizes before the MaxPool, exactly.

Layout: 4-D int8 activations are stored NHWC; graph inputs and outputs keep the model's NCHW.
``ops.LOWERINGS`` (op type -> function) is the single list of what lowers; ``check_lowerable``
answers the planner from it without calibration data. ``walk`` holds the graph walk and its
state, ``lut`` the elementwise-chain tables, ``passes`` what runs on the lowered model.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from edgekit.targets.native import ekm
from edgekit.targets.native.lower.islands import FLOAT_LOWERINGS
from edgekit.targets.native.lower.ops import LOWERINGS
from edgekit.targets.native.lower.passes import plan_memory
from edgekit.targets.native.lower.walk import Lowerer, LoweringError, LowerReport, stored


def lower(model: onnx.ModelProto) -> tuple[ekm.EkmModel, LowerReport]:
    """Lower a QDQ ONNX model (float islands where int8 is not possible); LoweringError names the
    first node ekrt cannot run at all."""
    lw = Lowerer(model, LOWERINGS, float_lowerings=FLOAT_LOWERINGS)
    return lw.run(), lw.report


def lower_file(onnx_path: str | Path, ekm_path: str | Path) -> LowerReport:
    """QDQ ``.onnx`` -> ``.ekm`` (written atomically)."""
    m, report = lower(onnx.load(str(onnx_path)))
    ekm.save(m, ekm_path)
    return report


def check_lowerable(loaded) -> str | None:
    """None when ekrt can run ``loaded`` quantized with the native scheme, else why not (naming
    the first node it cannot run)."""
    cov = coverage(loaded)
    return cov["reason"] if cov["unsupported_nodes"] or cov.get("error") else None


def coverage(loaded) -> dict:
    """Which nodes of ``loaded`` ekrt runs, quantized with the native scheme: ``int8`` (integer
    ops) and ``tables`` (float functions of one int8 value, run as 256-entry tables), by op type;
    ``float``: nodes run in float32 islands (by op type; ``float_nodes`` per node with the reason
    int8 was not possible); ``unsupported``: nodes ekrt runs neither way (by op type, and per
    node with the reason); ``blocked``: nodes not lowered
    only because an input was not. Lowers the QDQ graph built with placeholder ranges (no
    calibration needed), going on past each failure; remembered on ``loaded`` (the planner asks
    once per backend choice and again on replan)."""
    from collections import Counter

    from edgekit.quantize import analyze_model
    from edgekit.quantize.rewrite import rewrite, tensor_params
    from edgekit.quantize.scheme import NATIVE

    if "native.coverage" in loaded.memo:
        return loaded.memo["native.coverage"]
    prepared, analysis = analyze_model(loaded, NATIVE)
    ranges = {t: (-1.0, 1.0) for t in analysis.calibrated}
    qmodel = rewrite(prepared, analysis, tensor_params(analysis, ranges, NATIVE), NATIVE)
    cov: dict = {"runtime": "ekrt", "int8": {}, "tables": {}, "float": {}, "float_nodes": [], "unsupported": {}, "unsupported_nodes": [], "blocked": 0, "reason": None}
    try:
        lw = Lowerer(qmodel, LOWERINGS, collect=True, float_lowerings=FLOAT_LOWERINGS)
        lw.run()
    except LoweringError as exc:  # before or after the walk (shape inference, graph inputs/outputs)
        cov.update(error=exc.message, reason=exc.message)
        loaded.memo["native.coverage"] = cov
        return cov
    compute = [n for n in qmodel.graph.node if n.op_type not in ("QuantizeLinear", "DequantizeLinear", "Constant") and n.name not in lw.folded]
    failed = {n.name for n, _ in lw.failures if n is not None}
    cov["int8"] = dict(Counter(n.op_type for n in compute if n.name in lw.lowered and n.name not in lw.tabled and n.name not in lw.islands))
    cov["float"] = dict(Counter(op for op, _ in lw.islands.values()))
    cov["float_nodes"] = [{"name": name, "op": op, "reason": why} for name, (op, why) in lw.islands.items()]
    cov["tables"] = dict(Counter(n.op_type for n in compute if n.name in lw.tabled))
    cov["unsupported"] = dict(Counter(n.op_type for n, _ in lw.failures if n is not None))
    cov["unsupported_nodes"] = [{"name": n.name if n is not None else "", "op": n.op_type if n is not None else "", "reason": msg} for n, msg in lw.failures]
    cov["blocked"] = sum(1 for n in compute if n.name not in lw.lowered and n.name not in lw.tabled and n.name not in failed and n.name not in lw.islands)
    if lw.failures:
        ops = ", ".join(f"{op} x{k}" for op, k in sorted(cov["unsupported"].items()))
        cov["reason"] = f"{len(lw.failures)} node(s) have no int8 lowering ({ops}); first: {lw.failures[0][1]}"
    loaded.memo["native.coverage"] = cov
    return cov


__all__ = ["FLOAT_LOWERINGS", "LOWERINGS", "LowerReport", "Lowerer", "LoweringError", "check_lowerable", "coverage", "lower", "lower_file", "plan_memory", "stored"]
