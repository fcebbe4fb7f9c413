"""edgekit.quantize.qmath against the ONNX QuantizeLinear / DequantizeLinear spec.

Oracles: the examples of the ONNX operator tests (onnx/backend/test/case/node/quantizelinear.py
and dequantizelinear.py) and onnx.reference.ReferenceEvaluator running real nodes.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from edgekit.quantize import qmath

NP_TO_ONNX = {np.int8: TensorProto.INT8, np.uint8: TensorProto.UINT8}


def run_node(op: str, x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, axis: int | None = None) -> np.ndarray:
    """Run one real QuantizeLinear/DequantizeLinear node with the ONNX reference runtime.

    Opset 19: the reference runtime implements DequantizeLinear from 19 on; for int8/uint8 the
    semantics are those of opset 13, which edgekit writes.
    """
    attrs = {} if axis is None else {"axis": axis}
    node = helper.make_node(op, ["x", "s", "z"], ["y"], **attrs)
    if op == "QuantizeLinear":
        x_type, y_type = TensorProto.FLOAT, NP_TO_ONNX[zero_point.dtype.type]
    else:
        x_type, y_type = NP_TO_ONNX[x.dtype.type], TensorProto.FLOAT
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("x", x_type, list(x.shape)),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, list(scale.shape)),
            helper.make_tensor_value_info("z", NP_TO_ONNX[zero_point.dtype.type], list(zero_point.shape)),
        ],
        [helper.make_tensor_value_info("y", y_type, list(x.shape))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    return ReferenceEvaluator(model).run(None, {"x": x, "s": scale, "z": zero_point})[0]


# -- the spec's examples -------------------------------------------------------------------------

# test_quantizelinear / test_quantizelinear_axis, and their inverses test_dequantizelinear(_axis).
AXIS_X = np.array(
    [[[[-162, 10], [-100, 232], [-20, -50]], [[-76, 0], [0, 252], [32, -44]], [[245, -485], [-960, -270], [-375, -470]]]],
    dtype=np.float32,
)
AXIS_Q = np.array(
    [[[[3, 89], [34, 200], [74, 59]], [[5, 24], [24, 87], [32, 13]], [[245, 99], [4, 142], [121, 102]]]], dtype=np.uint8
)
AXIS_SCALE = np.array([2, 4, 5], dtype=np.float32)
AXIS_ZP = np.array([84, 24, 196], dtype=np.uint8)


def test_spec_quantizelinear_uint8():
    x = np.array([0, 2, 3, 1000, -254, -1000], dtype=np.float32)
    q = qmath.quantize(x, np.float32(2), np.uint8(128), "uint8")
    # 3 / 2 = 1.5 rounds to even (2); 1000 and -1000 saturate to 255 and 0.
    assert q.dtype == np.uint8
    assert q.tolist() == [128, 129, 130, 255, 1, 0]


def test_spec_dequantizelinear_uint8():
    y = qmath.dequantize(np.array([0, 3, 128, 255], dtype=np.uint8), np.float32(2), np.uint8(128))
    assert y.dtype == np.float32
    assert y.tolist() == [-256, -250, 0, 254]


def test_spec_quantizelinear_axis():
    q = qmath.quantize(AXIS_X, AXIS_SCALE, AXIS_ZP, "uint8", axis=1)
    assert q.dtype == np.uint8
    np.testing.assert_array_equal(q, AXIS_Q)


def test_spec_dequantizelinear_axis():
    y = qmath.dequantize(AXIS_Q, AXIS_SCALE, AXIS_ZP, axis=1)
    np.testing.assert_array_equal(y, AXIS_X)


def test_per_axis_uses_the_given_axis_not_the_last():
    # Same numbers laid out channels-last: axis=3 must pick the scale per last index.
    x = np.moveaxis(AXIS_X, 1, 3)
    np.testing.assert_array_equal(qmath.quantize(x, AXIS_SCALE, AXIS_ZP, "uint8", axis=3), np.moveaxis(AXIS_Q, 1, 3))


def test_int8_round_half_to_even_and_saturation():
    x = np.array([0, 1, 3, 5, -1, -3, -5, 7, 1000, -1000, 253, 255, -257, -259], dtype=np.float32)
    q = qmath.quantize(x, np.float32(2), np.int8(-1), "int8")
    # x/2 = 0, .5, 1.5, 2.5, -.5, -1.5, -2.5, 3.5 -> 0, 0, 2, 2, -0, -2, -2, 4 (ties to even), then + zp -1.
    # 253/2 = 126.5 -> 126 -> 125; 255/2 = 127.5 -> 128 -> 127; -257/2 = -128.5 -> -128 -> -129 -> saturates -128.
    assert q.dtype == np.int8
    assert q.tolist() == [-1, -1, 1, 1, -1, -3, -3, 3, 127, -128, 125, 127, -128, -128]
    assert q.tolist() == run_node("QuantizeLinear", x, np.array(2, np.float32), np.array(-1, np.int8)).tolist()


def test_int8_dequantize_by_hand():
    q = np.array([-128, -1, 0, 127], dtype=np.int8)
    assert qmath.dequantize(q, np.float32(0.5), np.int8(-1)).tolist() == [-63.5, 0.0, 0.5, 64.0]


def test_huge_values_saturate_instead_of_wrapping():
    x = np.array([3e9, -3e9, np.float32(1e38)], dtype=np.float32)
    assert qmath.quantize(x, np.float32(1e-3), np.int8(0), "int8").tolist() == [127, -128, 127]
    assert qmath.quantize(x, np.float32(1e-3), np.uint8(0), "uint8").tolist() == [255, 0, 255]


# -- the ONNX reference runtime on random data --------------------------------------------------

CASES = {
    "int8": (np.int8, None),
    "uint8": (np.uint8, None),
    "int8-axis1": (np.int8, 1),
    "uint8-axis0": (np.uint8, 0),
}


def random_case(name: str, seed: int, n: int = 4096):
    dtype, axis = CASES[name]
    rng = np.random.default_rng(seed)
    lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
    channels = 5
    shape = (channels, n // channels) if axis == 0 else (n // channels // 4, channels, 4) if axis == 1 else (n,)
    if axis is None:
        scale = np.array(rng.uniform(0.002, 3.0), dtype=np.float32)
        zp = np.array(rng.integers(lo, hi + 1), dtype=dtype)
    else:
        scale = rng.uniform(0.002, 3.0, channels).astype(np.float32)
        zp = rng.integers(lo, hi + 1, channels).astype(dtype)
    bshape = [1] * len(shape)
    if axis is not None:
        bshape[axis] = channels
    # Mostly in range, some beyond it on both sides (saturation), some exact ties.
    x = (rng.uniform(-170, 170, shape) * scale.reshape(bshape)).astype(np.float32)
    x.flat[::97] = (np.round(rng.uniform(-130, 130, x.flat[::97].shape)) + 0.5) * scale.reshape(-1)[0]
    return x, scale, zp, axis


@pytest.mark.parametrize("name", list(CASES))
def test_dequantize_is_bit_exact_with_reference_runtime(name):
    dtype, axis = CASES[name]
    rng = np.random.default_rng(7)
    x, scale, zp, axis = random_case(name, seed=3)
    q = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max + 1, x.shape).astype(dtype)
    want = run_node("DequantizeLinear", q, scale, zp, axis)
    got = qmath.dequantize(q, scale, zp, axis)
    assert got.dtype == want.dtype == np.float32
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", list(CASES))
def test_quantize_matches_reference_runtime_except_float32_ties(name):
    """Holds today: the only differences are elements where float32 x/scale is exactly k + 0.5."""
    x, scale, zp, axis = random_case(name, seed=11, n=200_000)
    want = run_node("QuantizeLinear", x, scale, zp, axis)
    got = qmath.quantize(x, scale, zp, np.dtype(zp.dtype).name, axis)
    assert got.dtype == want.dtype
    bad = np.flatnonzero(got != want)
    assert bad.size <= x.size // 97 + 20  # at most the ties random_case injects, and rare natural ones
    bshape = [1] * x.ndim
    if axis is not None:
        bshape[axis] = -1
    q32 = np.broadcast_to(x / scale.reshape(bshape), x.shape).ravel()[bad]
    assert np.all(q32 - np.floor(q32) == 0.5), q32
    assert np.all(np.abs(got.ravel()[bad].astype(int) - want.ravel()[bad].astype(int)) == 1)


@pytest.mark.parametrize("name", list(CASES))
def test_quantize_is_bit_exact_with_reference_runtime(name):
    x, scale, zp, axis = random_case(name, seed=11, n=200_000)
    want = run_node("QuantizeLinear", x, scale, zp, axis)
    got = qmath.quantize(x, scale, zp, np.dtype(zp.dtype).name, axis)
    np.testing.assert_array_equal(got, want)


def test_quantize_then_dequantize_error_is_at_most_half_a_step():
    rng = np.random.default_rng(1)
    x = rng.normal(0, 3, 10_000).astype(np.float32)
    scale, zp = qmath.scale_zero_point(x.min(), x.max(), "int8", symmetric=False)
    back = qmath.dequantize(qmath.quantize(x, scale, zp, "int8"), scale, zp)
    assert np.max(np.abs(back - x)) <= scale / 2 * (1 + 1e-5)


# -- scale and zero point ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
@pytest.mark.parametrize("rmin,rmax", [(-1.0, 3.0), (0.5, 4.0), (-6.0, -2.0), (-0.001, 0.002), (0.0, 6.0)])
def test_asymmetric_range_includes_zero_exactly(dtype, rmin, rmax):
    scale, zp = qmath.scale_zero_point(rmin, rmax, dtype, symmetric=False)
    qmin, qmax = qmath.QRANGES[dtype]
    assert scale.dtype == np.float32 and scale > 0
    assert zp.dtype == np.dtype(dtype)
    lo, hi = min(rmin, 0.0), max(rmax, 0.0)
    assert scale == pytest.approx((hi - lo) / (qmax - qmin), rel=1e-6)
    assert qmin <= int(zp) <= qmax
    # Zero is exactly representable: it quantizes to the zero point and comes back as 0.
    q0 = qmath.quantize(np.zeros(1, np.float32), scale, zp, dtype)
    assert int(q0[0]) == int(zp)
    assert qmath.dequantize(q0, scale, zp)[0] == 0.0
    # The ends of the widened range map to the ends of the integer range (within one rounding).
    q = qmath.quantize(np.array([lo, hi], np.float32), scale, zp, dtype).astype(int)
    assert abs(q[0] - qmin) <= 1 and abs(q[1] - qmax) <= 1


def test_positive_only_range_puts_zero_point_at_qmin():
    # ReLU outputs: [0, 6] uses the whole int8 range, 0 -> -128.
    scale, zp = qmath.scale_zero_point(0.0, 6.0, "int8", symmetric=False)
    assert int(zp) == -128
    assert scale == pytest.approx(6.0 / 255)
    scale, zp = qmath.scale_zero_point(2.0, 6.0, "uint8", symmetric=False)
    assert int(zp) == 0
    assert scale == pytest.approx(6.0 / 255)


def test_negative_only_range_puts_zero_point_at_qmax():
    scale, zp = qmath.scale_zero_point(-5.1, -1.0, "int8", symmetric=False)
    assert int(zp) == 127
    assert scale == pytest.approx(5.1 / 255)


def test_symmetric_is_zero_point_zero_and_narrow_range():
    scale, zp = qmath.scale_zero_point(-2.0, 5.08, "int8", symmetric=True)
    assert int(zp) == 0 and zp.dtype == np.int8
    assert scale == pytest.approx(5.08 / 127)
    q = qmath.quantize(np.array([5.08, -5.08, -2.0, 0.0], np.float32), scale, zp, "int8")
    assert q.tolist()[:2] == [127, -127]  # -x maps to -q: -128 is never used
    assert q[3] == 0


def test_symmetric_uint8_is_refused():
    with pytest.raises(ValueError, match="int8"):
        qmath.scale_zero_point(-1.0, 1.0, "uint8", symmetric=True)


@pytest.mark.parametrize("symmetric", [False, True])
def test_degenerate_range_gets_scale_one(symmetric):
    scale, zp = qmath.scale_zero_point(0.0, 0.0, "int8", symmetric=symmetric)
    assert float(scale) == 1.0
    assert qmath.dequantize(qmath.quantize(np.zeros(3, np.float32), scale, zp, "int8"), scale, zp).tolist() == [0, 0, 0]


def test_per_channel_scale_zero_point():
    rmin = np.array([-1.0, 0.0, -4.0, 0.0])
    rmax = np.array([1.0, 2.55, 0.0, 0.0])
    scale, zp = qmath.scale_zero_point(rmin, rmax, "int8", symmetric=False)
    assert scale.shape == zp.shape == (4,)
    np.testing.assert_allclose(scale, [2 / 255, 2.55 / 255, 4 / 255, 1.0], rtol=1e-6)
    assert zp.tolist() == [0, -128, 127, -128]


def test_tiny_range_never_gives_scale_zero():
    scale, _ = qmath.scale_zero_point(0.0, 1e-43, "int8", symmetric=False)
    assert float(scale) > 0.0


# -- weights and biases --------------------------------------------------------------------------


def test_weight_params_per_output_channel():
    rng = np.random.default_rng(0)
    w = rng.normal(0, 1, (6, 3, 3, 3)).astype(np.float32)
    w[2] *= 10
    w[4] = 0.0  # a dead channel
    scale, zp = qmath.weight_params(w, axis=0)
    absmax = np.abs(w).reshape(6, -1).max(axis=1)
    assert scale.shape == (6,) and zp.dtype == np.int8
    assert zp.tolist() == [0] * 6
    np.testing.assert_allclose(scale[[0, 1, 2, 3, 5]], absmax[[0, 1, 2, 3, 5]] / 127, rtol=1e-6)
    assert scale[4] == 1.0
    q = qmath.quantize(w, scale, zp, "int8", axis=0)
    # Each channel's largest weight lands on +-127; nothing uses -128.
    assert np.abs(q.astype(int)).reshape(6, -1).max(axis=1).tolist() == [127, 127, 127, 127, 0, 127]
    assert q.min() >= -127


def test_weight_params_other_axis_and_per_tensor():
    w = np.array([[1.0, -8.0, 0.5], [-2.0, 4.0, 0.25]], dtype=np.float32)  # [K, N], channels on axis 1
    scale, zp = qmath.weight_params(w, axis=1)
    np.testing.assert_allclose(scale, np.array([2.0, 8.0, 0.5]) / 127, rtol=1e-6)
    scale_t, zp_t = qmath.weight_params(w, axis=None)
    assert scale_t.shape == () and zp_t.shape == ()
    assert float(scale_t) == pytest.approx(8.0 / 127)


def test_quantize_bias_scale_is_input_scale_times_weight_scale():
    w_scale = np.array([0.01, 0.02, 0.5], dtype=np.float32)
    bias = np.array([0.123, -1.0, 7.3], dtype=np.float32)
    q, scale = qmath.quantize_bias(bias, 0.05, w_scale)
    assert q.dtype == np.int32 and scale.dtype == np.float32
    np.testing.assert_allclose(scale, 0.05 * w_scale, rtol=1e-6)
    np.testing.assert_array_equal(q, np.rint(bias.astype(np.float64) / scale.astype(np.float64)).astype(np.int32))
    assert np.max(np.abs(q * scale - bias)) <= np.max(scale) / 2 * (1 + 1e-6)


def test_quantize_bias_saturates_to_int32():
    q, _ = qmath.quantize_bias(np.array([1e6, -1e6], np.float32), 1e-4, np.array([1e-4, 1e-4], np.float32))
    assert q.tolist() == [2**31 - 1, -(2**31)]


# -- agreement metrics ---------------------------------------------------------------------------


def test_snr_db():
    ref = np.array([3.0, -4.0])  # power 25
    assert qmath.snr_db(ref, ref) == float("inf")
    assert qmath.snr_db(ref, ref + np.array([0.3, -0.4])) == pytest.approx(20.0)  # noise power 0.25
    assert qmath.snr_db(np.zeros(3), np.ones(3)) == float("-inf")
    assert qmath.snr_db(np.zeros(3), np.zeros(3)) == float("inf")
    assert qmath.snr_db(ref, np.zeros(2)) == pytest.approx(0.0)
    # Shapes are flattened; dtypes don't matter.
    assert qmath.snr_db(ref.reshape(2, 1).astype(np.float32), ref.astype(np.float16)) == float("inf")


def test_cosine():
    a = np.array([1.0, 2.0, 3.0])
    assert qmath.cosine(a, a) == pytest.approx(1.0)
    assert qmath.cosine(a, 5 * a) == pytest.approx(1.0)  # scale-blind
    assert qmath.cosine(a, -a) == pytest.approx(-1.0)
    assert qmath.cosine(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == 0.0
    assert qmath.cosine(np.zeros(3), np.zeros(3)) == 1.0
    assert qmath.cosine(np.zeros(3), a) == 0.0
    assert qmath.cosine(a, np.zeros(3)) == 0.0
    assert isinstance(qmath.cosine(a, a), float)
