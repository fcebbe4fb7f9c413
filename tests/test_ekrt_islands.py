"""Real models that ekrt runs only with float islands (issue 11, item 1), through the C runtime,
against the Q/DQ reference (ORT with graph optimizations off on the same QDQ model)."""

from __future__ import annotations

import numpy as np
import pytest
from realmodels import real_model_data, run_outputs

from edgekit.quantize import SCHEMES, FeedSet, quantize_model
from edgekit.targets.native import ekm, ekm_reference
from edgekit.targets.native.lower import coverage, lower

ekrt = pytest.importorskip("edgekit._ekrt", reason="the C extension is not built")


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _lowered(name: str):
    """The catalogue model ``name``: its ekrt coverage, its QDQ model (native scheme, 16 real
    calibration samples), that model lowered, and 8 held-out samples; a skip when its data is missing."""
    loaded, calib, held = real_model_data(name)
    # minmax, as measured below (auto's ranges move float-vs-integer rounding ties: oww cosine 0.9997)
    qdq = quantize_model(loaded, SCHEMES["native"], FeedSet(calib.feeds, "calib"), FeedSet(held.feeds, "held"), method="minmax").model
    em, report = lower(qdq)
    return coverage(loaded), qdq, em, report, held


def _check_against_reference(qdq, em, held, feed_check=None) -> None:
    """ekrt's output equals the golden interpreter's bit for bit and the Q/DQ reference's in cosine."""
    model = ekrt.Model(ekm.to_bytes(em))
    want = run_outputs(qdq.SerializeToString(), held.feeds)
    (name,) = [n for _, n in em.outputs]
    for feed, (w,) in zip(held.feeds, want):
        if feed_check is not None:
            feed_check(feed)
        (got,) = model.run(feed)
        assert _cos(got, w) >= 0.9999
        np.testing.assert_array_equal(got, ekm_reference.run(em, feed)[name])


@pytest.mark.realmodels
def test_oww_embedding_keeps_its_batchnorm_leakyrelu_max_in_int8_tables():
    """openWakeWord's embedding CNN: its first BatchNormalization -> LeakyRelu -> Max(x, -0.4) is a
    function of one value per channel, so it is one LUT_CHANNEL (int8), not a float island (the
    math allows int8). Before: 19 Max nodes "cannot run", 45 not reached. Measured (calib 16,
    eval 8): ekrt's embeddings equal the Q/DQ reference's (cosine 1.000000, max abs diff 0)."""
    cov, qdq, em, report, held = _lowered("oww-embedding")
    assert cov["unsupported"] == {} and cov["blocked"] == 0 and cov["float"] == {}
    assert {"BatchNormalization", "LeakyRelu", "Max"} <= set(cov["tables"])
    assert report.ops["LUT_CHANNEL"] >= 1 and report.ops["CONV2D"] >= 19
    assert not any(op.type in ekm.FLOAT_OPS for op in em.ops)
    _check_against_reference(qdq, em, held)


@pytest.mark.realmodels
def test_magika_runs_in_ekrt_from_its_int32_bytes_input():
    """magika's int32 'bytes' input is one-hot encoded (Reshape, Expand, Equal, Cast: a float
    island read straight from the graph input, as float32) into an int8 MatMul over its 2048 rows;
    its LayerNorms and the final softmax run in float too. Measured (calib 16, eval 8): ekrt's
    logits equal the Q/DQ reference's (cosine 1.000000, max abs diff 8e-7), 2 s."""
    cov, qdq, em, report, held = _lowered("magika")
    assert cov["unsupported"] == {} and cov["blocked"] == 0 and {"Equal", "Expand", "ReduceSum"} <= set(cov["float"])
    assert report.ops["FULLY_CONNECTED"] >= 1  # the one-hot x embedding MatMul stays int8

    def int32_bytes(feed):
        assert feed["bytes"].dtype == np.int32

    _check_against_reference(qdq, em, held, int32_bytes)
