"""QDQ ONNX -> .ekm lowering, checked whole-model against the Q/DQ reference semantics of the same model.

The oracle is ORT running the QDQ model as written (ORT_DISABLE_ALL: never ORT's fused int8
kernels, whose results depend on the host CPU); the candidate is ekrt's numpy reference interpreter
(``ekm_reference``, the golden model the C runtime must equal bit for bit) running the
lowered ``.ekm``. The bar (issue 4): within 1 int8 step on >= 99.9 % of output elements and
the same top-1 on every held-out sample. When the C extension is built, it must give the
reference's outputs exactly.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.modelio import load_model
from edgekit.plan import make_plan
from edgekit.profiles import load_profile
from edgekit.quantize import SCHEMES, FeedSet, load_feeds, quantize_model
from edgekit.quantize.report import session
from edgekit.targets.native import ekm, ekm_reference
from edgekit.targets.native.lower import (
    LOWERINGS,
    LoweringError,
    check_lowerable,
    coverage,
    lower,
    plan_memory,
    stored,
)
from edgekit.targets.native.requant import (
    mul_by_multiplier,
    multiplier_value,
    quantize_multiplier,
    requant,
)
from tests.builders import Graph, float_io, onnx_model

DIGITS = "examples/digits/digits_cnn.onnx"
MNV2 = "examples/mobilenetv2/mobilenetv2.onnx"


@dataclass
class Agreement:
    within_1: float  # fraction of output elements within 1 int8 step of the reference
    max_steps: float
    top1_same: int
    samples: int
    ekm_model: ekm.EkmModel


def quantize_native(path, calib: FeedSet | None = None, held: FeedSet | None = None, shapes=None, method: str = "minmax", scheme=None):
    loaded = load_model(path, shapes or {})
    if calib is None:
        sc = loaded.sidecar
        calib = load_feeds(sc.calibration, loaded.inputs)
        held = load_feeds(sc.evaluation, loaded.inputs, labels=sc.labels)
    # minmax: the exactness figures below were measured with it. Other ranges move which sums land
    # within float error of a .5 tie (auto: digits 1 step on one logit, PP-OCR cls 2 steps on 2 of 80
    # values; test_auto_ranges_agree_within_ties checks that bound).
    result = quantize_model(loaded, scheme or SCHEMES["native"], calib, held, method=method)
    return result.model, held


def agreement(qdq: onnx.ModelProto, feeds: list[dict]) -> Agreement:
    m, _ = lower(qdq)
    m = ekm.from_bytes(ekm.to_bytes(m))  # what the device gets: written, then read back
    sess = session(qdq.SerializeToString(), reference=True)
    names = [n for _, n in m.outputs]
    # one int8 step of each output: the scale of the int8 tensor its DEQUANTIZE reads
    step = {}
    for op in m.ops:
        if op.type == ekm.DEQUANTIZE:
            step[op.outputs[0]] = m.tensors[op.inputs[0]].scale
    steps = {name: step[idx] for idx, name in m.outputs}
    diffs, same = [], 0
    for feed in feeds:
        want = dict(zip(names, sess.run(names, feed)))
        got = ekm_reference.run(m, feed)
        for name in names:
            # in steps of ekrt's int8 output: ORT's output put on the same grid (it already is
            # when the QDQ model quantizes it; a float output, e.g. after Softmax, is rounded)
            diffs.append(np.abs(np.rint(got[name] / steps[name]) - np.rint(want[name] / steps[name])).ravel())
        same += int(np.argmax(got[names[0]]) == np.argmax(want[names[0]]))
    d = np.concatenate(diffs)
    return Agreement(float(np.mean(d <= 1)), float(d.max()), same, len(feeds), m)


# -- whole models ---------------------------------------------------------------------------------


def test_digits_matches_the_qdq_reference_on_every_heldout_sample():
    qdq, held = quantize_native(DIGITS)
    a = agreement(qdq, held.feeds)
    assert a.samples == 360
    assert a.within_1 >= 0.999 and a.top1_same == a.samples
    # measured: bit-identical to the reference (one rounding of the exact product, as ORT's float path)
    assert a.max_steps == 0
    ops = [op.type_name for op in a.ekm_model.ops]
    assert ops == ["QUANTIZE", "CONV2D", "CONV2D", "MAXPOOL", "CONV2D", "RESHAPE", "FULLY_CONNECTED", "DEQUANTIZE"]


def test_auto_ranges_agree_within_ties():
    # The default (auto) ranges: the same lowering, the same rounding; only which float sums land
    # within float error of a .5 tie moves. Measured: 1 step at most on one logit, top-1 360/360.
    qdq, held = quantize_native(DIGITS, method="auto")
    a = agreement(qdq, held.feeds)
    assert a.max_steps <= 1 and a.within_1 == 1.0 and a.top1_same == a.samples == 360


@pytest.fixture(scope="module")
def mnv2_qdq():
    return quantize_native(MNV2)


def test_mobilenetv2_matches_the_qdq_reference_on_every_heldout_sample(mnv2_qdq):
    qdq, held = mnv2_qdq
    a = agreement(qdq, held.feeds)
    assert a.samples == 100
    # measured (width 0.25): 99.3 % of logits within 1 step, at most 3 steps (7 of 1000 logits, in
    # 5 samples, each over a logit range of ~190 steps), top-1 the same on 100/100. The reference
    # sums each Conv in float, ekrt in exact integers: a sum within float error of a .5 tie rounds
    # the other way, and the 1-step change spreads through the following convs (depthwise ones
    # multiply it). The earlier width-0.5 model measured 99.7 % and 2 steps on 200 samples.
    assert a.within_1 >= 0.99 and a.max_steps <= 3 and a.top1_same == a.samples
    counts = {}
    for op in a.ekm_model.ops:
        counts[op.type_name] = counts.get(op.type_name, 0) + 1
    # 52 convs with their ReLU6 folded into the clamp, 11 residual adds, nothing else in float
    assert counts == {"QUANTIZE": 1, "CONV2D": 52, "ADD": 11, "GLOBAL_AVGPOOL": 1, "RESHAPE": 1, "FULLY_CONNECTED": 1, "DEQUANTIZE": 1}
    depthwise = [op for op in a.ekm_model.ops if op.type == ekm.CONV2D and op.params[10] > 1]
    assert len(depthwise) == 17 and all(op.params[10] == a.ekm_model.tensors[op.inputs[0]].dims[3] for op in depthwise)


def resnet_shaped(seed: int = 0) -> onnx.ModelProto:
    """A small ResNet-shaped CNN that also uses every other op family the lowering knows:
    residual adds, a strided projection, depthwise conv + ReLU6, squeeze-excite (GAP, Sigmoid,
    per-channel Mul), hard-swish as exporters write it (x * clip(x + 3, 0, 6) / 6), MaxPool and
    AveragePool into a Concat, nearest and bilinear Resize, Tanh, Transpose, Flatten, Gemm and
    Softmax."""
    rng = np.random.default_rng(seed)
    gr = Graph()
    const, node = gr.const, gr.node

    def conv(x, cin, cout, k=3, s=1, group=1, name="", act="Relu"):
        w = rng.normal(0, math.sqrt(2.0 / (cin // group * k * k)), (cout, cin // group, k, k))
        y = node("Conv", [x, const(name + ".w", w), const(name + ".b", rng.normal(0, 0.1, cout))], name,
                 kernel_shape=[k, k], strides=[s, s], pads=[k // 2] * 4, group=group)
        if act == "Relu":
            return node("Relu", [y], name + ".relu")
        if act == "Clip":
            return node("Clip", [y, const(name + ".lo", 0.0), const(name + ".hi", 6.0)], name + ".clip")
        return y

    x = conv("input", 3, 16, name="stem")
    y = conv(conv(x, 16, 16, name="b1a"), 16, 16, name="b1b", act=None)
    x = node("Relu", [node("Add", [x, y], "b1.add")], "b1.out")
    y = conv(conv(x, 16, 32, s=2, name="b2a"), 32, 32, name="b2b", act=None)
    x = node("Relu", [node("Add", [y, conv(x, 16, 32, k=1, s=2, name="b2.proj", act=None)], "b2.add")], "b2.out")
    d = conv(x, 32, 32, group=32, name="dw", act="Clip")
    g = conv(conv(node("GlobalAveragePool", [d], "se.gap"), 32, 8, k=1, name="se.fc1"), 8, 32, k=1, name="se.fc2", act=None)
    x = node("Mul", [d, node("Sigmoid", [g], "se.sigmoid")], "se.mul")
    h = node("Clip", [node("Add", [x, const("three", 3.0)], "hs.add"), const("zero", 0.0), const("six", 6.0)], "hs.clip")
    h = node("Div", [node("Mul", [x, h], "hs.mul"), const("six.b", 6.0)], "hs.div")
    a = node("MaxPool", [h], "pool.max", kernel_shape=[2, 2], strides=[2, 2])
    b = node("AveragePool", [h], "pool.avg", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    x = conv(node("Concat", [a, b], "cat", axis=1), 64, 32, k=1, name="mix")
    scales = const("scales", np.array([1, 1, 2, 2]))
    up = node("Resize", [x, "", scales], "up.nearest", mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    x = node("Add", [up, node("Resize", [x, "", scales], "up.linear", mode="linear")], "up.add")
    x = node("Transpose", [node("Tanh", [x], "tanh")], "transpose", perm=[0, 1, 3, 2])
    x = node("Flatten", [node("GlobalAveragePool", [conv(x, 32, 32, s=2, name="last")], "gap")], "flatten", axis=1)
    x = node("Gemm", [x, const("fc.w", rng.normal(0, 0.2, (10, 32))), const("fc.b", rng.normal(0, 0.1, 10))], "fc", transB=1)
    node("Softmax", [x], "probs", axis=1)
    return gr.model([float_io("input", [1, 3, 32, 32])], [float_io("probs", [1, 10])])


def random_feeds(n: int, seed: int, shape=(1, 3, 32, 32), name="input") -> FeedSet:
    rng = np.random.default_rng(seed)
    return FeedSet([{name: rng.normal(0, 1, shape).astype(np.float32)} for _ in range(n)], f"normal({seed})")


@pytest.fixture(scope="module")
def resnet_qdq(tmp_path_factory):
    path = tmp_path_factory.mktemp("resnet") / "resnet_shaped.onnx"
    onnx.save(resnet_shaped(), path)
    qdq, held = quantize_native(path, random_feeds(24, 1), random_feeds(32, 2))
    return qdq, held


def test_resnet_shaped_model_matches_the_qdq_reference(resnet_qdq):
    qdq, held = resnet_qdq
    a = agreement(qdq, held.feeds)
    assert a.within_1 >= 0.999 and a.top1_same == a.samples == 32
    counts = {}
    for op in a.ekm_model.ops:
        counts[op.type_name] = counts.get(op.type_name, 0) + 1
    # every op family of the contract appears (ADD/MUL with an int8 per-channel constant too),
    # with the data-movement and per-channel ops of moving_shaped(); no float island: all of it is int8
    assert set(counts) | MOVING_OPS == {name for t, name in ekm.OP_NAMES.items() if t not in ekm.FLOAT_OPS}
    # one 256-entry table each for Sigmoid, Tanh and the whole hard-swish x * clip(x + 3, 0, 6) / 6
    # (its Add, Clip, Mul, Div and the Q/DQ pairs between them are one function of x)
    assert counts["LUT"] == 3 and counts["MUL"] == 1 and counts["RESIZE"] == 2 and counts["CONCAT"] == 1


MOVING_OPS = {"PAD", "SLICE", "LUT_CHANNEL"}


def moving_shaped(seed: int = 0) -> onnx.ModelProto:
    """The ops real model families add (issue 11): an explicit zero Pad before a conv (folded into
    its padding), a reflect Pad, a negative-step Slice, a Split into a Concat (YOLO C2f), a
    per-channel PRelu, a ConvTranspose + BatchNormalization (a DBNet FPN), ReduceMean over H,W
    and over C, a float Cast."""
    rng = np.random.default_rng(seed)
    gr = Graph()
    const, node = gr.const, gr.node

    def conv(x, cin, cout, k=3, pads=1, name=""):
        w = rng.normal(0, math.sqrt(2.0 / (cin * k * k)), (cout, cin, k, k))
        return node("Conv", [x, const(name + ".w", w), const(name + ".b", rng.normal(0, 0.1, cout))], name,
                    kernel_shape=[k, k], pads=[pads] * 4)

    x = node("Pad", ["input", const("p0", [0, 0, 1, 2, 0, 0, 1, 0], np.int64)], "pad0")
    x = conv(x, 3, 16, pads=0, name="stem")
    x = node("PRelu", [x, const("slope", rng.uniform(0.05, 0.4, (16, 1, 1)))], "prelu")
    x = node("Pad", [x, const("p1", [0, 0, 1, 1, 0, 0, 2, 1], np.int64)], "pad.reflect", mode="reflect")
    a, b = node("Split", [x, const("split", [6, 10], np.int64)], "split", outs=["split.a", "split.b"], axis=1)
    b = conv(b, 10, 10, name="c2f")
    x = node("Concat", [a, b], "cat", axis=1)
    x = node("Slice", [x, const("s.start", [-1, 1], np.int64), const("s.end", [-100, 100], np.int64),
                       const("s.axes", [2, 3], np.int64), const("s.step", [-1, 2], np.int64)], "slice")
    x = node("Cast", [x], "cast", to=TensorProto.FLOAT)
    x = node("ConvTranspose", [x, const("up3.w", rng.normal(0, 0.3, (16, 16, 3, 3))), const("up3.b", rng.normal(0, 0.2, 16))], "up3",
             kernel_shape=[3, 3], strides=[1, 2], pads=[1, 1, 1, 1], output_padding=[0, 1])  # zero insertion
    up = node("ConvTranspose", [x, const("up.w", rng.normal(0, 0.3, (16, 8, 2, 2)))], "up", kernel_shape=[2, 2], strides=[2, 2])
    up = node("BatchNormalization", [up, const("bn.g", rng.uniform(0.5, 2, 8)), const("bn.b", rng.normal(0, 0.3, 8)),
                                     const("bn.m", rng.normal(0, 0.3, 8)), const("bn.v", rng.uniform(0.5, 2, 8))], "bn")
    g = node("ReduceMean", [up], "mean.hw", axes=[2, 3], keepdims=1)
    c = node("ReduceMean", [up], "mean.c", axes=[1], keepdims=1)
    y = node("Add", [node("Mul", [up, g], "scale.ch"), up], "mix")
    return gr.model([float_io("input", [1, 3, 20, 18])], [float_io(y, [1, 8, 46, 40]), float_io(c, [1, 1, 46, 40])])


def test_moving_shaped_model_matches_the_qdq_reference_and_the_c_runtime(tmp_path):
    path = tmp_path / "moving.onnx"
    onnx.save(moving_shaped(), path)
    qdq, held = quantize_native(path, random_feeds(16, 1, (1, 3, 20, 18)), random_feeds(16, 2, (1, 3, 20, 18)))
    a = agreement(qdq, held.feeds)
    counts = {}
    for op in a.ekm_model.ops:
        counts[op.type_name] = counts.get(op.type_name, 0) + 1
    # the zero Pad is the stem conv's padding; the reflect Pad, the ConvTranspose's zeros, the slice,
    # the split halves, PRelu and BN run in int8 (the quantizer leaves PRelu float, so the float chain
    # PRelu -> Pad -> Split is lowered once per Split output: each has its own QuantizeLinear)
    assert counts["PAD"] >= 2 and counts["SLICE"] >= 3 and counts["LUT_CHANNEL"] >= 2 and counts["CONV2D"] == 4, counts
    assert counts["TRANSPOSE"] == 1  # the 2x2/stride-2 ConvTranspose: 1x1 conv + depth-to-space
    pads = [op for op in a.ekm_model.ops if op.type == ekm.PAD]
    assert all(op.params[12] == 1 or any(op.params[8:12]) for op in pads)  # no zero pad left: folded
    stem = next(op for op in a.ekm_model.ops if op.type == ekm.CONV2D)
    assert stem.params[6:10] == [1, 2, 1, 0]
    assert a.within_1 >= 0.999, a
    ekrt = pytest.importorskip("edgekit._ekrt")
    model = ekrt.Model(ekm.to_bytes(a.ekm_model))
    for feed in held.feeds[:4]:
        want = ekm_reference.run(a.ekm_model, feed)
        for got, (_, name) in zip(model.run(feed), a.ekm_model.outputs):
            assert np.array_equal(got, want[name]), name


def shuffle_shaped(seed: int = 0) -> onnx.ModelProto:
    """Rank 5 and 6 between int8 tensors, as exporters write them: a ShuffleNet channel shuffle
    (Reshape to 5-D, Transpose, Reshape back), a DCR depth-to-space (6-D), an Unsqueeze to 5-D
    undone by a Squeeze, and a 4-D Reshape that mixes channels and space."""
    rng = np.random.default_rng(seed)
    gr = Graph()
    const, node = gr.const, gr.node

    def conv(x, cin, cout, name):
        w = rng.normal(0, math.sqrt(2.0 / (cin * 9)), (cout, cin, 3, 3))
        return node("Conv", [x, const(name + ".w", w), const(name + ".b", rng.normal(0, 0.1, cout))], name, kernel_shape=[3, 3], pads=[1, 1, 1, 1])

    x = conv("input", 3, 8, "c1")
    x = node("Reshape", [x, const("s5", [1, 2, 4, 6, 6], np.int64)], "shuffle.split")
    x = node("Transpose", [x], "shuffle.t", perm=[0, 2, 1, 3, 4])
    x = node("Reshape", [x, const("s4", [1, 8, 6, 6], np.int64)], "shuffle.merge")
    x = conv(x, 8, 8, "c2")
    x = node("Reshape", [x, const("s6", [1, 2, 2, 2, 6, 6], np.int64)], "d2s.split")
    x = node("Transpose", [x], "d2s.t", perm=[0, 3, 4, 1, 5, 2])
    x = node("Reshape", [x, const("s4b", [1, 2, 12, 12], np.int64)], "d2s.merge")
    x = node("Unsqueeze", [x, const("ax", [1], np.int64)], "unsq")
    x = node("Squeeze", [x, const("ax2", [1], np.int64)], "sq")
    x = conv(x, 2, 4, "c3")
    x = node("Reshape", [x, const("mix", [1, 12, 6, 8], np.int64)], "mixing")
    return gr.model([float_io("input", [1, 3, 6, 6])], [float_io(x, [1, 12, 6, 8])])


def test_rank_5_and_6_chains_become_4d_transposes(tmp_path):
    path = tmp_path / "shuffle.onnx"
    onnx.save(shuffle_shaped(), path)
    qdq, held = quantize_native(path, random_feeds(8, 1, (1, 3, 6, 6)), random_feeds(16, 2, (1, 3, 6, 6)))
    a = agreement(qdq, held.feeds)
    assert a.within_1 >= 0.999 and a.max_steps <= 1, a
    m = a.ekm_model
    assert all(len(t.dims) <= 4 for t in m.tensors)
    assert sum(op.type == ekm.TRANSPOSE for op in m.ops) >= 3  # shuffle, depth-to-space, the mixing reshape
    ekrt = pytest.importorskip("edgekit._ekrt")
    model = ekrt.Model(ekm.to_bytes(m))
    for feed in held.feeds[:4]:
        (got,) = model.run(feed)
        assert np.array_equal(got, ekm_reference.run(m, feed)[m.outputs[0][1]])


def test_transpose_axes_merges_what_stays_adjacent_and_refuses_a_non_transpose():
    from edgekit.targets.native.lower.movement import _transpose_axes

    src = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    assert _transpose_axes(src.transpose(0, 2, 1, 3).reshape(-1)) == [(5, 1), (3, 20), (4, 5), (2, 60)]
    assert _transpose_axes(src.transpose(1, 0, 2, 3).reshape(-1)) == [(20, 1), (2, 60), (3, 20)]  # (4,5) merged
    assert _transpose_axes(np.arange(24)) == [(24, 1)]
    assert _transpose_axes(src[:, ::-1].reshape(-1)) is None  # a reversal is no transpose


def test_zero_pad_before_an_average_pool_is_its_counted_padding(tmp_path):
    pads = numpy_helper.from_array(np.array([0, 0, 1, 2, 0, 0, 1, 0], np.int64), "pads")
    nodes = [helper.make_node("Pad", ["c", "pads"], ["p"], name="pad"),
             helper.make_node("AveragePool", ["p"], ["a"], name="pool", kernel_shape=[3, 3])]
    path = tmp_path / "padpool.onnx"
    onnx.save(_model_with_nodes(nodes, (pads,)), path)
    qdq, held = quantize_native(path, random_feeds(8, 1, (1, 3, 8, 8), "x"), random_feeds(16, 2, (1, 3, 8, 8), "x"))
    a = agreement(qdq, held.feeds)
    pool = next(op for op in a.ekm_model.ops if op.type == ekm.AVGPOOL)
    assert not any(op.type == ekm.PAD for op in a.ekm_model.ops)
    assert pool.params[6:11] == [1, 2, 1, 0, 1]  # the Pad's zeros, counted
    assert a.within_1 >= 0.999, a


def test_add_of_two_tensors_that_broadcast_other_than_per_channel_is_a_float_island(tmp_path):
    # [1,8,H,W] + [1,1,H,W]: the int8 ADD broadcasts only a per-channel operand; the Add runs in float
    nodes = [helper.make_node("ReduceMean", ["c"], ["m"], name="mean", axes=[1], keepdims=1),
             helper.make_node("Add", ["c", "m"], ["n"], name="the_add")]
    path = tmp_path / "bcast.onnx"
    onnx.save(_model_with_nodes(nodes), path)
    loaded = load_model(path)
    assert check_lowerable(loaded) is None
    (node,) = [n for n in coverage(loaded)["float_nodes"] if n["name"] == "the_add"]
    assert "Add node 'the_add'" in node["reason"] and "broadcast" in node["reason"]


def int8_tensor_steps(qdq: onnx.ModelProto, feeds: list[dict]) -> dict[str, np.ndarray]:
    """Per int8 tensor of the model, in graph order: |ekm_reference - Q/DQ reference| in int8 steps."""
    from edgekit.targets.native.lower import Lowerer

    lw = Lowerer(qdq, LOWERINGS)
    m = lw.run()
    qnames = [n.output[0] for n in qdq.graph.node if n.op_type == "QuantizeLinear" and n.output[0] in lw.alias]
    probe = onnx.ModelProto()
    probe.CopyFrom(qdq)
    for q in qnames:
        probe.graph.output.append(helper.make_tensor_value_info(q, TensorProto.INT8, None))
    sess = session(probe.SerializeToString(), reference=True)
    steps: dict[str, list[np.ndarray]] = {q: [] for q in qnames}
    for feed in feeds:
        trace: dict = {}
        ekm_reference.run(m, feed, trace=trace)
        for q, want in zip(qnames, sess.run(qnames, feed)):
            ref = want.transpose(0, 2, 3, 1) if want.ndim == 4 else want
            steps[q].append(np.abs(trace[lw.alias[q].index].astype(np.int32) - ref.astype(np.int32)).ravel())
    return {q: np.concatenate(d) for q, d in steps.items()}


def test_resnet_shaped_int8_tensors_equal_the_qdq_reference_layer_by_layer(resnet_qdq):
    """Every int8 tensor up to the bilinear Resize equals the reference's QuantizeLinear output exactly
    (the bilinear Resize rounds in integers where ORT rounds floats: ties may differ by 1)."""
    qdq, held = resnet_qdq
    exact = []
    for q, d in int8_tensor_steps(qdq, held.feeds[:1]).items():
        if q.startswith("up.linear"):
            break
        assert d.max() == 0, q
        exact.append(q)
    assert len(exact) >= 20


@pytest.mark.realmodels
def test_ppocr_cls_matches_the_qdq_reference():
    from realmodels import cls_dataset, cls_samples, rapidocr_model

    path = rapidocr_model("cls")
    x, labels = cls_dataset(40, seed=2)
    calib = FeedSet([{"x": s[None]} for s in cls_samples(16, seed=1)], "cls_samples(16, 1)")
    held = FeedSet([{"x": s[None]} for s in x], "cls_dataset(40, 2)", labels=labels)
    qdq, held = quantize_native(path, calib, held, shapes={"x": (1, 3, 48, 192)})
    a = agreement(qdq, held.feeds)
    assert a.within_1 >= 0.999 and a.top1_same == a.samples == 40
    names = {op.type_name for op in a.ekm_model.ops}
    # hard-swish / hard-sigmoid become tables, the classifier's Softmax runs in ekrt
    assert {"LUT", "MUL", "SOFTMAX", "GLOBAL_AVGPOOL"} <= names
    # ADD with a per-channel int8 constant (the exporter's separate conv biases) in the C runtime too
    assert any(op.type == ekm.ADD and a.ekm_model.tensors[op.inputs[1]].storage == ekm.CONST for op in a.ekm_model.ops)
    try:
        import edgekit._ekrt as ekrt
    except ImportError:
        return
    model = ekrt.Model(ekm.to_bytes(a.ekm_model))
    for feed in held.feeds[:5]:
        (got,) = model.run(feed)
        assert np.array_equal(got, ekm_reference.run(a.ekm_model, feed)[a.ekm_model.outputs[0][1]])


@pytest.mark.realmodels
def test_ppocr_det_lowers_and_runs_close_to_the_qdq_reference():
    """DBNet (PP-OCRv4 det): its FPN's ConvTranspose + BatchNormalization made ekrt refuse it."""
    from realmodels import det_samples, rapidocr_model

    path = rapidocr_model("det")
    calib = FeedSet([{"x": s[None]} for s in det_samples(4, seed=1, size=(160, 160))], "det_samples(4, 1)")
    held = FeedSet([{"x": s[None]} for s in det_samples(3, seed=2, size=(160, 160))], "det_samples(3, 2)")
    qdq, held = quantize_native(path, calib, held, shapes={"x": (1, 3, 160, 160)})
    m, report = lower(qdq)
    # each 2x2/stride-2 ConvTranspose: a 1x1 conv + one depth-to-space transpose; the BN after it: tables
    assert report.ops["TRANSPOSE"] == 2 and report.ops["LUT_CHANNEL"] == 1 and "PAD" not in report.ops
    ekrt = pytest.importorskip("edgekit._ekrt")
    model = ekrt.Model(ekm.to_bytes(m))
    sess = session(qdq.SerializeToString(), reference=True)
    for feed in held.feeds:
        (got,) = model.run(feed)
        assert np.array_equal(got, ekm_reference.run(m, feed)[m.outputs[0][1]])
        (want,) = sess.run(None, feed)
        # measured at 320x320 on 6 samples: cosine >= 0.9975, 99.7 % within 1 step: 1-step ties of the
        # TFLite-style ADD / LUT chains grow through the 89 Adds of the backbone (tests above: per layer)
        cos = float(got.ravel() @ want.ravel() / (np.linalg.norm(got) * np.linalg.norm(want)))
        assert cos >= 0.99, cos


def test_c_runtime_equals_the_reference_bit_for_bit(resnet_qdq):
    ekrt = pytest.importorskip("edgekit._ekrt", reason="the C extension is not built (pip install -e .)")
    qdq, held = resnet_qdq
    m, _ = lower(qdq)
    model = ekrt.Model(ekm.to_bytes(m))
    for feed in held.feeds[:8]:
        want = ekm_reference.run(m, feed)
        got = model.run(feed)
        for (_, name), y in zip(m.outputs, got):
            assert np.array_equal(y, want[name]), name


# -- what does not lower says where and why ------------------------------------------------------


def _model_with(op_node: onnx.NodeProto, extra_inits=()) -> onnx.ModelProto:
    return _model_with_nodes([op_node], extra_inits)


def _model_with_nodes(op_nodes: list[onnx.NodeProto], extra_inits=()) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]), *op_nodes,
             helper.make_node("Conv", [op_nodes[-1].output[0], "w2"], ["y"], name="conv2", kernel_shape=[1, 1])]
    w2 = numpy_helper.from_array(rng.normal(0, 0.3, (2, 4, 1, 1)).astype(np.float32), "w2")
    return onnx_model(nodes, [float_io("x", [1, 3, 8, 8])], [float_io("y", [1, 2, 8, 8])], [w, w2, *extra_inits])


def test_unsupported_op_is_named_by_check_lowerable_and_the_plan(tmp_path):
    # InstanceNormalization: per-channel statistics of the whole tensor, not in ekrt's op set
    scale = numpy_helper.from_array(np.ones(4, np.float32), "g")
    bias = numpy_helper.from_array(np.zeros(4, np.float32), "b")
    path = tmp_path / "norm.onnx"
    onnx.save(_model_with(helper.make_node("InstanceNormalization", ["c", "g", "b"], ["n"], name="the_norm"), (scale, bias)), path)
    loaded = load_model(path)
    reason = check_lowerable(loaded)
    assert reason is not None and "InstanceNormalization node 'the_norm'" in reason and "ekrt has no InstanceNormalization" in reason
    plan = make_plan(loaded, load_profile("local"))
    assert plan.backend != "native"
    skipped = dict(plan.skipped)
    assert "the_norm" in skipped["native"]


def test_plan_reports_ekrt_coverage_and_why_it_picked_another_backend(tmp_path, cli):
    # conv -> InstanceNormalization -> conv: the first conv runs in int8, the norm cannot, the second
    # conv is not reached; the plan falls back and says so (rpi5 lists native first)
    scale = numpy_helper.from_array(np.ones(4, np.float32), "g")
    bias = numpy_helper.from_array(np.zeros(4, np.float32), "b")
    path = tmp_path / "norm.onnx"
    onnx.save(_model_with(helper.make_node("InstanceNormalization", ["c", "g", "b"], ["n"], name="the_norm"), (scale, bias)), path)
    plan = make_plan(load_model(path), load_profile("rpi5"))
    cov = plan.to_dict()["coverage"]["native"]
    assert cov["int8"] == {"Conv": 1} and cov["float"] == {} and cov["unsupported"] == {"InstanceNormalization": 1}
    assert cov["blocked"] == 1 and cov["unsupported_nodes"][0]["name"] == "the_norm"
    assert plan.backend != "native" and "1 node(s) have no int8 lowering (InstanceNormalization x1)" in dict(plan.skipped)["native"]
    r = cli("plan", path, "--target", "rpi5")
    assert r.returncode == 0, r.stderr
    assert "coverage  native (ekrt): 1 int8 (Conv x1); 0 int8 tables; 0 float; 1 cannot run (InstanceNormalization x1)" in r.stdout
    assert "the_norm" in r.stdout and "skipped   native:" in r.stdout
    doc = json.loads(cli("plan", path, "--target", "rpi5", "--json").stdout)
    assert doc["coverage"]["native"]["unsupported"] == {"InstanceNormalization": 1}


def layernorm_island_model() -> onnx.ModelProto:
    """conv -> LayerNorm over W written out (ReduceMean, Sub, Pow, Sqrt, Div: what exporters give)
    -> Sigmoid of it times a per-channel Div of two activations -> conv. The LayerNorm and the Div of
    two tensors have no int8 lowering: a float island between two int8 convs."""
    inits = [numpy_helper.from_array(np.float32(v), k) for k, v in (("two", 2.0), ("eps", 1e-5), ("one", 1.0))]
    inits += [numpy_helper.from_array(np.linspace(0.5, 1.5, 8, dtype=np.float32), "gamma"),
              numpy_helper.from_array(np.linspace(-0.2, 0.2, 8, dtype=np.float32), "beta")]
    nodes = [
        helper.make_node("ReduceMean", ["c"], ["mu"], name="ln_mean", axes=[-1]),
        helper.make_node("Sub", ["c", "mu"], ["d"], name="ln_sub"),
        helper.make_node("Pow", ["d", "two"], ["d2"], name="ln_pow"),
        helper.make_node("ReduceMean", ["d2"], ["var"], name="ln_var", axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["ve"], name="ln_eps"),
        helper.make_node("Sqrt", ["ve"], ["sd"], name="ln_sqrt"),
        helper.make_node("Div", ["d", "sd"], ["n"], name="ln_div"),
        helper.make_node("Mul", ["n", "gamma"], ["ng"], name="ln_gamma"),
        helper.make_node("Add", ["ng", "beta"], ["ln"], name="ln_beta"),
        helper.make_node("Sigmoid", ["ln"], ["sg"], name="gate"),
        helper.make_node("Abs", ["c"], ["ac"], name="abs"),
        helper.make_node("Add", ["ac", "one"], ["den"], name="den"),
        helper.make_node("Div", ["sg", "den"], ["q"], name="ratio"),
    ]
    return _model_with_nodes(nodes, inits)


def test_layernorm_and_a_div_of_two_tensors_run_as_a_float_island(tmp_path):
    path = tmp_path / "island.onnx"
    onnx.save(layernorm_island_model(), path)
    cov = make_plan(load_model(path), load_profile("rpi5")).to_dict()["coverage"]["native"]
    assert cov["unsupported"] == {} and cov["blocked"] == 0 and cov["int8"] == {"Conv": 2}
    islands = {n["name"]: n for n in cov["float_nodes"]}
    assert {"ln_var", "ln_mean", "ln_sub", "ln_pow", "ln_div", "ln_sqrt", "ratio"} <= set(islands)
    assert "Div of two tensors" in islands["ratio"]["reason"] and "not quantized" in islands["ln_sub"]["reason"]
    assert sum(cov["float"].values()) == len(cov["float_nodes"])
    assert check_lowerable(load_model(path)) is None
    qdq, held = quantize_native(path, random_feeds(16, 1, (1, 3, 8, 8), "x"), random_feeds(8, 2, (1, 3, 8, 8), "x"))
    a = agreement(qdq, held.feeds)
    names = {op.type_name for op in a.ekm_model.ops}
    assert {"F_REDUCE", "F_BINARY", "F_UNARY", "CONV2D"} <= names
    # measured: the int8 output after the island equals the Q/DQ reference (100 % within 0 steps)
    assert a.within_1 >= 0.99 and a.top1_same == a.samples == 8
    ekrt = pytest.importorskip("edgekit._ekrt")
    model = ekrt.Model(ekm.to_bytes(a.ekm_model))
    for feed in held.feeds:
        assert np.array_equal(model.run(feed)[0], ekm_reference.run(a.ekm_model, feed)["y"])


def test_batchnorm_leakyrelu_max_chain_is_one_per_channel_table_not_a_float_island(tmp_path):
    # openWakeWord's pattern: a BatchNormalization the quantizer leaves (after a pool), LeakyRelu, and
    # a Max with a constant, quantized only at the end: a function of one int8 value per channel
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.uniform(0.5, 2, 4).astype(np.float32), n) for n in ("g", "v")]
    inits += [numpy_helper.from_array(rng.normal(0, 0.5, 4).astype(np.float32), n) for n in ("b", "m")]
    inits.append(numpy_helper.from_array(np.full((1, 1, 1, 1), -0.4, np.float32), "floor"))
    nodes = [helper.make_node("MaxPool", ["c"], ["p"], name="pool", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["p", "g", "b", "m", "v"], ["bn"], name="bn"),
             helper.make_node("LeakyRelu", ["bn"], ["lr"], name="leaky", alpha=0.2),
             helper.make_node("Max", ["lr", "floor"], ["mx"], name="floor_max")]
    path = tmp_path / "chain.onnx"
    onnx.save(_model_with_nodes(nodes, inits), path)
    cov = coverage(load_model(path))
    assert cov["float"] == {} and cov["tables"] == {"BatchNormalization": 1, "LeakyRelu": 1, "Max": 1}
    qdq, held = quantize_native(path, random_feeds(16, 1, (1, 3, 8, 8), "x"), random_feeds(8, 2, (1, 3, 8, 8), "x"))
    a = agreement(qdq, held.feeds)
    assert [op.type_name for op in a.ekm_model.ops] == ["QUANTIZE", "CONV2D", "MAXPOOL", "LUT_CHANNEL", "CONV2D", "DEQUANTIZE"]
    assert a.within_1 == 1.0 and a.max_steps == 0  # measured: the tables hold what ORT computes


def test_plan_coverage_of_a_model_ekrt_runs_whole():
    cov = make_plan(load_model(DIGITS), load_profile("rpi5")).to_dict()["coverage"]["native"]
    assert cov["unsupported"] == {} and cov["blocked"] == 0 and cov["int8"]["Conv"] == 3


def test_a_bias_the_quantizer_saturated_is_brought_within_the_accumulator_bound():
    from edgekit.targets.native.lower.ops import _fit_bias

    w = np.zeros((2, 3, 3, 1), np.int8)
    w[1, 0, 0, 0] = 127
    fitted = _fit_bias(np.array([5, -(2**31)], np.int32), w)
    assert fitted[0] == 5 and fitted[1] == -(2**31 - 1 - 256 * 127)


def test_lowerable_models_pass_check_lowerable(tmp_path):
    assert check_lowerable(load_model(DIGITS)) is None
    assert check_lowerable(load_model(MNV2)) is None
    path = tmp_path / "relu.onnx"
    onnx.save(_model_with(helper.make_node("Relu", ["c"], ["r"], name="relu")), path)
    assert check_lowerable(load_model(path)) is None


def test_lowering_error_names_the_node_for_a_float_only_qdq_graph():
    # a Conv whose output nobody quantizes cannot become an int8 op
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.float32(0.1), "s"), numpy_helper.from_array(np.int8(0), "z"),
             numpy_helper.from_array(rng.integers(-127, 128, (2, 1, 1, 1)).astype(np.int8), "wq"),
             numpy_helper.from_array(np.full(2, 0.01, np.float32), "ws"), numpy_helper.from_array(np.zeros(2, np.int8), "wz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]), helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["y"], name="lonely_conv", kernel_shape=[1, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(LoweringError, match="Conv node 'lonely_conv'.*stays float"):
        lower(model)


# -- pieces --------------------------------------------------------------------------------------


def test_every_lowering_is_one_function_per_onnx_op():
    assert {"Conv", "Gemm", "MatMul", "Add", "Mul", "Concat", "MaxPool", "AveragePool", "GlobalAveragePool",
            "Reshape", "Flatten", "Transpose", "Resize", "Softmax", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish"} <= set(LOWERINGS)
    assert {"Pad", "Slice", "Split", "PRelu", "ReduceMean", "Cast", "ConvTranspose", "BatchNormalization"} <= set(LOWERINGS)
    assert "LayerNormalization" not in LOWERINGS and "InstanceNormalization" not in LOWERINGS


@pytest.mark.parametrize("real", [1.0, 0.5, 0.75, 1e-3, 3.0e-5, 0.999999999, 123.456, 2.0**-31, 7.0])
def test_quantize_multiplier_represents_the_real(real):
    m, s = quantize_multiplier(real)
    assert 2**30 <= m < 2**31 and -31 <= s <= 30
    assert multiplier_value(m, s) == pytest.approx(real, rel=2**-30)


def test_quantize_multiplier_edges():
    assert quantize_multiplier(0.0) == (0, 0)
    assert quantize_multiplier(2.0**-40) == (0, 0)  # flushed, as TFLite does
    assert quantize_multiplier(1.0) == (2**30, 1)
    with pytest.raises(ValueError):
        quantize_multiplier(-1.0)
    with pytest.raises(ValueError):
        quantize_multiplier(2.0**31)


def test_requant_is_one_rounding_of_the_exact_product():
    rng = np.random.default_rng(0)
    acc = rng.integers(-(2**24), 2**24, 2000)
    reals = rng.uniform(1e-4, 2.0, 2000)
    pairs = [quantize_multiplier(float(r)) for r in reals]
    mult = np.array([p[0] for p in pairs])
    shift = np.array([p[1] for p in pairs])
    got = mul_by_multiplier(acc, mult, shift)
    for a, m, s, g in zip(acc.tolist(), mult.tolist(), shift.tolist(), got.tolist()):
        n = 31 - s
        assert g == (a * m + (1 << (n - 1))) >> n  # Python ints: exact, floor = arithmetic shift
    y = requant(np.array([10**9, -(10**9)]), 2**30, 1, 5)
    assert y.tolist() == [127, -128]  # saturates to the int8 range


def test_memory_plan_reuses_dead_tensors_and_never_overlaps_live_ones():
    m = ekm.EkmModel()
    x = m.add_tensor(ekm.Tensor(ekm.F32, ekm.IO, (1, 1000)))
    ts = [m.add_tensor(ekm.Tensor(ekm.I8, ekm.ARENA, (1, n), 1.0, 0)) for n in (1000, 500, 1000, 200, 1000)]
    y = m.add_tensor(ekm.Tensor(ekm.F32, ekm.IO, (1, 1000)))
    m.add_op(ekm.QUANTIZE, [x], [ts[0]])
    m.add_op(ekm.LUT, [ts[0]], [ts[1]])  # (table omitted: only lifetimes matter here)
    m.add_op(ekm.LUT, [ts[1]], [ts[2]])
    m.add_op(ekm.ADD, [ts[2], ts[1]], [ts[3]])
    m.add_op(ekm.LUT, [ts[3]], [ts[4]])
    m.add_op(ekm.DEQUANTIZE, [ts[4]], [y])
    size = plan_memory(m)
    spans = {}
    for j, op in enumerate(m.ops):
        for t in op.inputs + op.outputs:
            if m.tensors[t].storage == ekm.ARENA:
                lo, hi = spans.get(t, (j, j))
                spans[t] = (min(lo, j), max(hi, j))
    for a in spans:
        for b in spans:
            if a < b and not (spans[a][1] < spans[b][0] or spans[b][1] < spans[a][0]):
                ta, tb = m.tensors[a], m.tensors[b]
                assert ta.offset + ta.nbytes <= tb.offset or tb.offset + tb.nbytes <= ta.offset, (a, b)
    assert all(m.tensors[t].offset % 64 == 0 for t in ts)
    assert size < sum(m.tensors[t].nbytes for t in ts)  # t0's space is reused
    # the most that is live at once: t1 (512), t2 (1024) and t3 (256) while ADD runs
    assert size == 512 + 1024 + 256


def test_stored_layout_is_nhwc_for_4d_only():
    assert stored((1, 3, 8, 5)) == (1, 8, 5, 3)
    assert stored((1, 10)) == (1, 10) and stored((2, 3, 4)) == (2, 3, 4)
