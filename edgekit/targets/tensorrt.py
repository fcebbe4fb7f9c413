"""TensorRT (Jetson and NVIDIA GPUs): the QDQ lint, the plan, and the engine built on the device.

The host never builds an engine: an engine only runs on the GPU, TensorRT version and flags it
was built with, so the device builds it with ``trtexec`` from the bundle's QDQ ONNX model and
caches it (``edgekit/agent/backends/tensorrt/``; its ``trtexec`` module holds the command builders,
the engine cache key and the output parsers, and this module re-exports them). What the host does is
make sure the int8 model is one TensorRT takes: ``lint_qdq`` checks the explicit-quantization
rules TensorRT documents, on the planned graph (``edgekit plan``) and on the calibrated model
before it is bundled (``edgekit deploy``).

Verified only against documentation and recorded trtexec output (see docs/tensorrt.md): no
TensorRT or Jetson was available where this was written.
"""

from __future__ import annotations

import shlex
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from edgekit.agent.backends.tensorrt.session import BUILD_TIMEOUT_S
from edgekit.agent.backends.tensorrt.trtexec import (
    MIN_VERSION,
    PRECISIONS,
    TrtexecOutputError,
    build_flags,
    decode_version_code,
    engine_key,
    parse_export_profile,
    parse_export_times,
    parse_trtexec_log,
    shapes_spec,
    trtexec_bench_argv,
    trtexec_build_argv,
    version_tuple,
)
from edgekit.errors import ModelError
from edgekit.profiles import BackendSpec, Profile
from edgekit.quantize.rewrite import Analysis, rewrite, tensor_params
from edgekit.quantize.rules import attr
from edgekit.quantize.scheme import TENSORRT
from edgekit.targets.base import Backend, DeviceStep, Verdict, runtime_version

__all__ = [
    "BACKEND", "LINT_RULES", "LintIssue", "TensorRTBackend", "TrtexecOutputError", "build_flags",
    "decode_version_code", "engine_key", "lint_qdq", "parse_export_profile", "parse_export_times",
    "parse_trtexec_log", "preview_qdq", "shapes_spec", "trtexec_bench_argv", "trtexec_build_argv",
]

# TensorRT's explicit-quantization rules, as the lint names them (docs/tensorrt.md cites sources).
LINT_RULES = {
    "opset": "opset >= 13: the per-channel axis of QuantizeLinear/DequantizeLinear arrived in opset 13",
    "int8": "Q/DQ are int8: QuantizeLinear takes an int8 zero point, DequantizeLinear an int8 input (no int32 bias)",
    "zero-point": "zero points are 0: TensorRT quantization is symmetric",
    "scale": "scales are constant, finite and positive",
    "per-tensor-activation": "activations are quantized per tensor (one scale)",
    "weight-axis": "per-channel scales only on Conv/ConvTranspose/Gemm/MatMul weights, along the output-channel axis",
    "weight-range": "int8 weights lie in [-127, 127]",
    "pairing": "every QuantizeLinear feeds DequantizeLinear nodes only; a DequantizeLinear reads a QuantizeLinear or a constant",
    "placement": "Conv/ConvTranspose/Gemm/MatMul have both their input and their weight quantized, or neither",
}
_QDQ = ("QuantizeLinear", "DequantizeLinear")
_LINEAR = ("Conv", "ConvTranspose", "Gemm", "MatMul")
_WEIGHT_RANGE = (-127, 127)


@dataclass(frozen=True)
class LintIssue:
    node: str
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.node}: {self.message} [{self.rule}]"


class _Graph:
    """Lookups over one ONNX graph that the lint rules share."""

    def __init__(self, model: onnx.ModelProto) -> None:
        g = model.graph
        self.consts: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = defaultdict(list)
        self.names: dict[int, str] = {}
        for k, node in enumerate(g.node):
            self.names[id(node)] = node.name or f"{node.op_type}#{k}"
            for out in node.output:
                self.producer[out] = node
            for i, name in enumerate(node.input):
                if name:
                    self.consumers[name].append((node, i))
            if node.op_type == "Constant" and node.output:
                for attr in node.attribute:
                    if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                        self.consts[node.output[0]] = numpy_helper.to_array(attr.t)
        self.outputs = {o.name for o in g.output}

    def name(self, node: onnx.NodeProto) -> str:
        return self.names[id(node)]

    def made_by(self, tensor: str, op: str) -> onnx.NodeProto | None:
        node = self.producer.get(tensor)
        return node if node is not None and node.op_type == op else None

    def weight_source(self, tensor: str) -> np.ndarray | None:
        """The constant behind a DequantizeLinear input: the tensor itself or what a Q quantizes."""
        if tensor in self.consts:
            return self.consts[tensor]
        q = self.made_by(tensor, "QuantizeLinear")
        return self.consts.get(q.input[0]) if q is not None else None


def _weight_axis(consumer: onnx.NodeProto, index: int, rank: int) -> int | None:
    """The output-channel axis of input ``index`` of ``consumer`` if it is a weight slot, else None."""
    op = consumer.op_type
    if op == "Conv" and index == 1:
        return 0  # [C_out, C_in/group, k...]
    if op == "ConvTranspose" and index == 1:
        return 1  # [C_in, C_out/group, k...]
    if op == "Gemm" and index == 1:
        return 0 if attr(consumer, "transB", 0) else 1  # B is [K, N], or [N, K] transposed
    if op == "MatMul" and index == 1 and rank >= 2:
        return rank - 1  # [..., K, N]: N columns
    return None


def lint_qdq(model: onnx.ModelProto) -> list[LintIssue]:
    """Where ``model``'s Q/DQ nodes break TensorRT's explicit-quantization rules (empty: none).

    Rules (``LINT_RULES``): opset >= 13; int8 only (an int32 bias DequantizeLinear is refused by
    TensorRT's ONNX parser); zero points 0; constant positive scales; activations per tensor;
    per-channel weights along the output-channel axis (Conv 0, ConvTranspose 1, Gemm 0/1 by
    transB, MatMul last); weights in [-127, 127]; each Q followed by DQ; linear layers with both
    input and weight quantized. Each issue names the node.
    """
    g = _Graph(model)
    issues: list[LintIssue] = []
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 13:
        issues.append(
            LintIssue(model.graph.name or "<graph>", "opset", f"opset {opset}: TensorRT's per-channel Q/DQ needs opset 13 or newer")
        )
    for node in model.graph.node:
        if node.op_type in _QDQ:
            issues.extend(_lint_qdq_node(g, node))
        elif node.op_type in _LINEAR:
            issues.extend(_lint_linear(g, node))
    return issues


def _lint_qdq_node(g: _Graph, node: onnx.NodeProto) -> list[LintIssue]:
    name, op = g.name(node), node.op_type
    out: list[LintIssue] = []

    def issue(rule: str, message: str) -> None:
        out.append(LintIssue(name, rule, message))

    x = node.input[0]
    scale_name = node.input[1] if len(node.input) > 1 else ""
    zp_name = node.input[2] if len(node.input) > 2 else ""
    scale = g.consts.get(scale_name)
    if scale is None:
        issue("scale", f"scale '{scale_name}' is not a constant: TensorRT needs scales fixed at build time")
    elif not np.all(np.isfinite(scale)) or not np.all(scale > 0):
        issue("scale", f"scale '{scale_name}' has a value <= 0 or not finite (min {float(np.min(scale)):g})")
    zp = g.consts.get(zp_name) if zp_name else None
    if zp_name and zp is None:
        issue("zero-point", f"zero point '{zp_name}' is not a constant")
    if zp is not None and np.any(zp != 0):
        nonzero = np.unique(zp[zp != 0])[:3].tolist()
        issue("zero-point", f"zero point {nonzero} is not 0: TensorRT quantizes symmetrically (zero point 0)")

    weight = g.weight_source(x) if op == "DequantizeLinear" else g.consts.get(x)
    bad_dtype = False
    if op == "QuantizeLinear":
        if not zp_name:
            issue("int8", "no zero point, so the output is uint8: TensorRT quantizes to int8 (give an int8 zero point of 0)")
        elif zp is not None and zp.dtype != np.int8:
            issue("int8", f"{zp.dtype} zero point: TensorRT quantizes to int8 only")
        for consumer, _ in g.consumers.get(node.output[0], []):
            if consumer.op_type != "DequantizeLinear":
                issue("pairing", f"output feeds {consumer.op_type} '{g.name(consumer)}': TensorRT expects each QuantizeLinear to be followed by DequantizeLinear")
        if node.output[0] in g.outputs:
            issue("pairing", "its int8 output is a graph output: TensorRT expects a DequantizeLinear after it")
    else:
        xt = g.consts.get(x)
        bad_dtype = xt is not None and xt.dtype != np.int8
        if bad_dtype:
            if xt.dtype == np.int32:
                issue(
                    "int8",
                    f"int32 input '{x}' (a quantized bias): TensorRT's ONNX parser rejects it (\"only activation "
                    "types allowed as input to this layer\"); keep the bias float",
                )
            else:
                issue("int8", f"{xt.dtype} input '{x}': TensorRT dequantizes int8 only")
        elif xt is None and zp is not None and zp.dtype != np.int8:
            issue("int8", f"{zp.dtype} zero point: TensorRT dequantizes int8 only")
        elif xt is None and g.made_by(x, "QuantizeLinear") is None:
            src = g.producer.get(x)
            what = f"{src.op_type} '{g.name(src)}'" if src is not None else "a graph input"
            issue("pairing", f"input '{x}' comes from {what}, not from a QuantizeLinear or a constant")

    per_channel = scale is not None and scale.size > 1
    if per_channel and weight is None:
        issue("per-tensor-activation", f"{scale.size} scales on activation '{x}': TensorRT quantizes activations per tensor")
    elif per_channel and op == "DequantizeLinear" and not bad_dtype:
        out.extend(_lint_weight_axis(g, node, weight, scale))
    if op == "DequantizeLinear" and x in g.consts and g.consts[x].dtype == np.int8:
        lo = int(g.consts[x].min(initial=0))
        if lo < _WEIGHT_RANGE[0] and any(_weight_axis(c, i, g.consts[x].ndim) is not None for c, i in g.consumers.get(node.output[0], [])):
            issue("weight-range", f"weight '{x}' holds {lo}: TensorRT takes int8 weights in [-127, 127]")
    return out


def _lint_weight_axis(g: _Graph, node: onnx.NodeProto, weight: np.ndarray, scale: np.ndarray) -> list[LintIssue]:
    name, rank = g.name(node), weight.ndim
    axis = attr(node, "axis", 1)
    axis = axis + rank if axis < 0 else axis
    out: list[LintIssue] = []
    for consumer, index in g.consumers.get(node.output[0], []):
        expected = _weight_axis(consumer, index, rank)
        where = f"{consumer.op_type} '{g.name(consumer)}' input {index}"
        if expected is None:
            out.append(LintIssue(name, "weight-axis", f"per-channel scales feed {where}: TensorRT takes per-channel scales on Conv/ConvTranspose/Gemm/MatMul weights only"))
        elif axis != expected:
            out.append(LintIssue(name, "weight-axis", f"axis {axis} on the weight of {where}: its output-channel axis is {expected}"))
        elif not 0 <= axis < rank or weight.shape[axis] != scale.size:
            out.append(LintIssue(name, "weight-axis", f"{scale.size} scales for {weight.shape[axis] if 0 <= axis < rank else '?'} output channels of {where}"))
    return out


def _lint_linear(g: _Graph, node: onnx.NodeProto) -> list[LintIssue]:
    """Q/DQ placement TensorRT fuses: an int8 linear layer needs both its operands dequantized."""
    if len(node.input) < 2:
        return []
    a, b = node.input[0], node.input[1]
    a_q, b_q = g.made_by(a, "DequantizeLinear") is not None, g.made_by(b, "DequantizeLinear") is not None
    if a_q == b_q:
        return []
    quantized, plain = (a, b) if a_q else (b, a)
    kind = "weight" if plain in g.consts else "input"
    return [
        LintIssue(
            g.name(node),
            "placement",
            f"'{quantized}' is int8 (from DequantizeLinear) but {kind} '{plain}' is float: TensorRT fuses an int8 "
            f"{node.op_type} only when both operands come from DequantizeLinear",
        )
    ]


def preview_qdq(prepared: onnx.ModelProto, analysis: Analysis) -> onnx.ModelProto:
    """The QDQ graph the TensorRT scheme will write, with placeholder ranges instead of calibration.

    Structure (which nodes get Q/DQ, dtypes, zero points, axes, bias) does not depend on the
    calibrated ranges, so the plan can lint it without running any data through the model.
    """
    params = tensor_params(analysis, {t: (-1.0, 1.0) for t in analysis.calibrated}, TENSORRT)
    return rewrite(prepared, analysis, params, TENSORRT)


def _example_versions(spec: BackendSpec | None) -> list[str]:
    """TensorRT versions whose trtexec flags the plan shows: the profile's bound(s), and 10.x."""
    if spec and spec.max_version:
        return [spec.max_version]
    low = spec.min_version if spec and spec.min_version else "8.6"
    return [low, "10.0"] if version_tuple(low) < (10,) else [low]


def _dla_core(spec: BackendSpec | None) -> int | None:
    device = (spec.device or "GPU").upper() if spec else "GPU"
    return int(device[3:] or 0) if device.startswith("DLA") else None


class TensorRTBackend(Backend):
    name = "tensorrt"
    scheme = TENSORRT
    no_dynamic = "TensorRT's ONNX parser has no MatMulInteger or ConvInteger (onnx-tensorrt docs/operators.md); onnxruntime runs it"
    archs = ("aarch64", "x86_64")
    runtimes = ("tensorrt",)
    evaluates = False  # trtexec times engines; it gives no per-sample outputs to compare
    missing = "TensorRT is not installed on the device (no libnvinfer, tensorrt package or trtexec found)"

    def runs_on(self, profile: Profile, facts: dict | None = None) -> Verdict:
        verdict = super().runs_on(profile, facts)
        if not verdict.ok:
            return verdict
        spec = profile.backend(self.name)
        version = runtime_version(facts, *self.runtimes)
        if version is None:
            if spec and (spec.min_version or spec.max_version):
                return Verdict(True, (f"planned on paper: the device's TensorRT must be {spec.bounds()}",))
            return Verdict(True)
        trt = (facts.get("device") or facts).get("tensorrt") or {}
        if "trtexec" in trt and not trt["trtexec"]:
            return Verdict(False, (f"the device has TensorRT {version} but no trtexec (on PATH or /usr/src/tensorrt/bin)",), "missing")
        return Verdict(True, (f"the device has TensorRT {version}: engines are built there with trtexec",))

    def version_problem(self, profile: Profile, version: str) -> str | None:
        try:
            too_old = version_tuple(version)[:2] < MIN_VERSION
        except ValueError:
            return f"the device reports an unreadable TensorRT version {version!r}"
        if too_old:
            return f"the device has TensorRT {version}; edgekit needs 8.0+ (Q/DQ int8 and trtexec's report format)"
        spec = profile.backend(self.name)
        if spec and not spec.version_ok(version):
            return f"the device has TensorRT {version}; {profile.name} needs {spec.bounds()}"
        return None

    def variant_options(self, spec: BackendSpec | None, precision: str) -> dict[str, Any]:
        # What to build; the device spells it in its own trtexec's flags (build_flags), because the
        # TensorRT version decides the spelling and only the device knows it for sure.
        return {
            "precision": precision if precision in PRECISIONS else "fp32",
            "dla_core": _dla_core(spec),
            "allow_gpu_fallback": True,
            "workspace_mb": None,
            "build_timeout_s": BUILD_TIMEOUT_S,
        }

    def device_steps(self, spec: BackendSpec | None, precision: str) -> list[DeviceStep]:
        variants = ["fp32", "int8"] if precision == "int8" else [precision]
        dla = _dla_core(spec)
        spelled = []
        for version in _example_versions(spec):
            flags = "; ".join(f"{v}: {' '.join(build_flags(version, v, dla_core=dla if v != 'fp32' else None))}" for v in variants)
            spelled.append(f"TensorRT {version}{'+' if version == '10.0' else ''}: {flags}")
        version = _example_versions(spec)[0]
        example = trtexec_build_argv(
            f"{variants[-1]}/model.onnx", "trt-engines/KEY.engine", build_flags(version, variants[-1], dla_core=dla),
            trt_version=version, timing_cache="trt-engines/timing-VERSION.cache",
        )  # fmt: skip
        bench = trtexec_bench_argv(
            "trt-engines/KEY.engine", warmup_ms=1000, iterations=100, duration_s=None,
            export_times="times.json", export_profile="profile.json", dla_core=dla,
        )  # fmt: skip
        return [
            DeviceStep(
                "build engine",
                f"on the device with trtexec, unless the engine cache has it ({'; '.join(spelled)}); e.g. "
                f"{shlex.join(example)}; cached as trt-engines/KEY.engine, KEY = sha256(model, TensorRT "
                "version, GPU/SoC, flags): an unchanged deploy reuses it",
            ),
            DeviceStep(
                "time engine",
                f"bench with trtexec --loadEngine, e.g. {shlex.join(bench)} (warm-up: 20 ms per requested warm-up "
                "run, at least 200 ms): per-iteration latency (H2D + GPU + D2H) and per-layer times",
            ),
        ]

    def check_plan(self, prepared: onnx.ModelProto, analysis: Analysis) -> list[str]:
        model = preview_qdq(prepared, analysis)
        issues = lint_qdq(model)
        qdq = sum(1 for n in model.graph.node if n.op_type in _QDQ)
        if not issues:
            return [
                f"TensorRT Q/DQ lint passed on the planned graph ({qdq} Q/DQ nodes: int8, zero point 0, per-channel "
                "weights on the output-channel axis, float bias, both operands of each int8 layer quantized); "
                "deploy lints the calibrated model again"
            ]
        shown = "; ".join(str(i) for i in issues[:3]) + (f"; and {len(issues) - 3} more" if len(issues) > 3 else "")
        return [f"TensorRT Q/DQ lint FAILED on the planned graph ({len(issues)} issue(s)): {shown}; deploy will refuse the int8 model"]

    def check_quantized(self, model: onnx.ModelProto) -> None:
        issues = lint_qdq(model)
        if issues:
            shown = "; ".join(str(i) for i in issues[:3]) + (f"; and {len(issues) - 3} more" if len(issues) > 3 else "")
            raise ModelError(
                f"the int8 model breaks TensorRT's Q/DQ rules at {len(issues)} place(s): {shown}",
                "keep the named nodes float with --exclude NODE, or deploy without int8 (--no-quantize)",
            )


BACKEND = TensorRTBackend()
