"""ONNX's own backend-test cases (``onnx.backend.test``) as the oracle for ekrt's lowering of
the data-movement and per-channel ops: each case's first input is quantized (Q/DQ around the
node, params from the case's own value ranges; weights per-channel int8, bias int32), the QDQ
model is lowered to ``.ekm`` and run by the numpy golden model and by the C runtime.

* the C runtime equals the golden model bit for bit;
* the dequantized output is within 2 output steps of the case's expected output, plus what
  quantizing the inputs alone changes (the float op run on the dequantized inputs by ONNX's
  reference evaluator: an exact bound, not a guess);
* the cases ekrt does not run are refused at lowering with a message naming the node.

Cast has no case here (the spec's cases cast between non-int8 types); tests/test_native_lower.py
covers the float-to-float Cast ekrt treats as nothing to run.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from edgekit import _ekrt
from edgekit.quantize import qmath
from edgekit.targets.native import ekm, ekm_reference
from edgekit.targets.native.lower import LoweringError, lower

# float islands' ops (run in float32 between DEQUANTIZE and QUANTIZE): their float32 cases
ISLAND_OPS = ("Div", "Sub", "Pow", "Sqrt", "Sigmoid", "Tanh", "Exp", "Erf", "Max", "Min", "ReduceSum", "ReduceMax", "MatMul", "Expand")
OPS = ("Pad", "Slice", "Split", "PRelu", "ReduceMean", "ConvTranspose", "Concat", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Softmax", *ISLAND_OPS)
# cases ekrt refuses on purpose, with the words its error names
REFUSED = {
    "test_wrap_pad": "mode wrap",
    "test_convtranspose_1d": "2-D",
    "test_convtranspose_3d": "rank 5",
    "test_prelu_example": "slope",
    "test_unsqueeze_negative_axes": "rank 5",  # ekrt's graph inputs and outputs have rank <= 4
    "test_unsqueeze_three_axes": "rank 6",
    "test_unsqueeze_two_axes": "rank 5",
    "test_unsqueeze_unsorted_axes": "rank 6",
    "test_convtranspose_group_2": "group",
    "test_convtranspose_group_2_image_3": "group",
    "test_matmul_1d_1d": "rank-1 operand",
    "test_matmul_1d_3d": "rank-1 operand",
    "test_matmul_4d_1d": "rank-1 operand",
}
# not a case for an int8 runtime: empty tensors, sequences, non-float data, rank > 4
SKIP_WORDS = ("zero_size", "allowzero_reordered", "out_of_bounds", "to_sequence", "expanded", "FLOAT16", "BFLOAT16", "FLOAT8", "INT4", "UINT4",
              "INT2", "UINT2", "FLOAT4", "e8m0", "STRING", "no_saturate",
              "empty_set", "empty_axes_input_noop")  # reductions of nothing, and a Reduce that is no node at all


def _cases() -> dict[str, object]:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = {c.name: c for c in collect_testcases(None) if c.model.graph.node and c.model.graph.node[0].op_type in OPS}
    return {n: c for n, c in sorted(found.items()) if not any(w in n for w in SKIP_WORDS) and _float_case(c)}


def _float_case(case) -> bool:
    """An island op's case feeds float32 activations (its int16/uint32 Div or Max cases are not an int8 runtime's)."""
    if case.model.graph.node[0].op_type not in ISLAND_OPS:
        return True
    inputs = case.data_sets[0][0] if case.data_sets else []
    return bool(inputs) and np.asarray(inputs[0]).dtype == np.float32


CASES = _cases()


def _qparams(values: np.ndarray) -> tuple[np.float32, np.int8]:
    lo, hi = float(min(values.min(), 0.0)), float(max(values.max(), 0.0))
    s, z = qmath.scale_zero_point(lo, hi if hi > lo else lo + 1.0, "int8", False)
    return np.float32(s), np.int8(z)


def qdq_case(case) -> tuple[onnx.ModelProto, onnx.ModelProto, list[np.ndarray], list[np.ndarray], list[float]]:
    """(QDQ model, the float op with its constants dequantized, the case's activation inputs, its
    expected outputs, the output scales)."""
    node = case.model.graph.node[0]
    inputs, outputs = case.data_sets[0]
    g_in = case.model.graph.input
    inits, nodes, flt_inits = [], [], []
    n_act = len(inputs) if node.op_type == "Concat" else 1
    xs, x_vis, names = [], [], []
    for k in range(n_act):
        x = np.asarray(inputs[k], np.float32)
        sx, zx = _qparams(x)
        inits += [numpy_helper.from_array(np.array(sx), f"sx{k}"), numpy_helper.from_array(np.array(zx), f"zx{k}")]
        nodes += [helper.make_node("QuantizeLinear", [g_in[k].name, f"sx{k}", f"zx{k}"], [f"xq{k}"]),
                  helper.make_node("DequantizeLinear", [f"xq{k}", f"sx{k}", f"zx{k}"], [f"xdq{k}"])]
        names.append(f"xdq{k}")
        xs.append(x)
        x_vis.append(helper.make_tensor_value_info(g_in[k].name, TensorProto.FLOAT, x.shape))
    for vi, v in zip(g_in[n_act:], inputs[n_act:]):
        v = np.asarray(v)
        if node.op_type == "ConvTranspose" and vi.name == node.input[1]:  # int8 per output channel (axis 1)
            per = (1, -1) + (1,) * (v.ndim - 2)
            sw = np.maximum(np.abs(v).max(axis=tuple(i for i in range(v.ndim) if i != 1)), 1e-6).astype(np.float32) / 127
            wq = np.clip(np.rint(v / sw.reshape(per)), -127, 127).astype(np.int8)
            inits += [numpy_helper.from_array(wq, "wq"), numpy_helper.from_array(sw, "sw"),
                      numpy_helper.from_array(np.zeros_like(sw, np.int8), "zw")]
            nodes.append(helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wdq"], axis=1))
            names.append("wdq")
            flt_inits.append(numpy_helper.from_array((wq.astype(np.float32) * sw.reshape(per)), vi.name))
        else:
            inits.append(numpy_helper.from_array(v, vi.name))
            flt_inits.append(numpy_helper.from_array(v, vi.name))
            names.append(vi.name)
    op = helper.make_node(node.op_type, names, [f"y{i}" for i in range(len(node.output))], name="op")
    op.attribute.extend(node.attribute)
    nodes.append(op)
    outs, scales = [], []
    for i, (vo, y) in enumerate(zip(case.model.graph.output, outputs)):
        sy, zy = _qparams(np.asarray(y, np.float32))
        scales.append(float(sy))
        inits += [numpy_helper.from_array(np.array(sy), f"sy{i}"), numpy_helper.from_array(np.array(zy), f"zy{i}")]
        nodes += [helper.make_node("QuantizeLinear", [f"y{i}", f"sy{i}", f"zy{i}"], [f"yq{i}"]),
                  helper.make_node("DequantizeLinear", [f"yq{i}", f"sy{i}", f"zy{i}"], [vo.name])]
        outs.append(helper.make_tensor_value_info(vo.name, TensorProto.FLOAT, np.asarray(y).shape))
    opset = [o for o in case.model.opset_import if o.domain in ("", "ai.onnx")]
    qdq = helper.make_model(helper.make_graph(nodes, case.name, x_vis, outs, inits), opset_imports=opset)
    # the float op alone on the dequantized input and weights: what input quantization changes
    fop = helper.make_node(node.op_type, list(node.input), [f"f{i}" for i in range(len(node.output))])
    fop.attribute.extend(node.attribute)
    f_outs = [helper.make_tensor_value_info(f"f{i}", TensorProto.FLOAT, None) for i in range(len(node.output))]
    flt = helper.make_model(helper.make_graph([fop], "float", x_vis, f_outs, flt_inits), opset_imports=opset)
    return qdq, flt, xs, [np.asarray(y, np.float32) for y in outputs], scales


@pytest.mark.parametrize("name", [n for n in CASES if n not in REFUSED])
def test_onnx_case_runs_in_int8(name):
    qdq, flt, xs, expected, scales = qdq_case(CASES[name])
    m, _ = lower(qdq)
    ref = ekm_reference.run(m, xs)
    got = _ekrt.Model(ekm.to_bytes(m)).run(xs)
    consts = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    x_dq = {vi.name: (qmath.quantize(x, consts[f"sx{k}"], consts[f"zx{k}"], "int8").astype(np.float32) - np.float32(consts[f"zx{k}"])) * consts[f"sx{k}"]
            for k, (vi, x) in enumerate(zip(flt.graph.input, xs))}
    on_dq = ReferenceEvaluator(flt).run(None, x_dq)
    for i, (g, r, want, s, f) in enumerate(zip(got, ref.values(), expected, scales, on_dq)):
        np.testing.assert_array_equal(g, r, err_msg=f"{name} output {i}: C runtime vs golden model")
        assert g.shape == want.shape
        bound = 2 * s + np.abs(np.asarray(f, np.float32) - want).max(initial=0.0) + 1e-6
        assert np.abs(g - want).max(initial=0.0) <= bound, (name, i, np.abs(g - want).max(), bound)
    ops = {op.type_name for op in m.ops} - {"QUANTIZE", "DEQUANTIZE"}
    assert ops or CASES[name].model.graph.node[0].op_type in ("Slice", "Split", "Concat")


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_onnx_case_ekrt_refuses_names_the_node(name):
    qdq, *_ = qdq_case(CASES[name])
    with pytest.raises(LoweringError, match=REFUSED[name]) as info:
        lower(qdq)
    assert any(f"'{n}'" in info.value.message for n in ("op", "X", "x", "y"))  # the node, or the rank-5 graph input/output
