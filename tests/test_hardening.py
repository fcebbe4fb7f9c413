"""Issue 13 regressions through the real CLI: non-finite data, misfiled model errors, file modes."""

from __future__ import annotations

import os
import stat

import numpy as np
import onnx
import pytest

from edgekit.fsutil import atomic_path, write_bytes_atomic
from tests.builders import float_io, onnx_model
from tests.conftest import EXAMPLES, assert_one_line_error

DIGITS = EXAMPLES / "digits" / "digits_cnn.onnx"


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_calibration_data_is_refused(cli, tmp_path, bad):
    x = np.load(EXAMPLES / "digits" / "calib.npz")["input"][:20].copy()
    x[13, 0, 4, 4] = bad
    np.savez(tmp_path / "bad.npz", input=x)
    r = cli("quantize", DIGITS, "-o", "out.onnx", "--calib", "bad.npz")
    assert_one_line_error(r, 3, "bad.npz: sample 13, input 'input' has NaN or Inf values")
    assert not (tmp_path / "out.onnx").exists() and not list(tmp_path.glob(".out.onnx.*"))


def test_all_nan_evaluation_data_is_refused(cli, tmp_path):
    np.savez(tmp_path / "nan.npz", input=np.full((4, 1, 8, 8), np.nan, np.float32))
    r = cli("quantize", DIGITS, "-o", "out.onnx", "--calib", EXAMPLES / "digits" / "calib.npz", "--eval", "nan.npz")
    assert_one_line_error(r, 3, "nan.npz: sample 0, input 'input' has NaN or Inf values")
    assert not (tmp_path / "out.onnx").exists()


def test_an_unknown_opset_is_an_input_error_not_a_bug(cli, tmp_path):
    m = onnx.load(DIGITS)
    m.opset_import[0].version = 999
    onnx.save(m, tmp_path / "future.onnx")
    for args in (("quantize", "future.onnx", "-o", "out.onnx"), ("plan", "future.onnx")):
        r = cli(*args)
        assert_one_line_error(r, 3, "future.onnx uses ONNX opset 999; the newest this edgekit supports is")
        assert "re-export the model with opset" in r.stderr
    assert not (tmp_path / "out.onnx").exists()


def test_contradicting_shapes_are_an_input_error(cli, tmp_path):
    from onnx import helper, numpy_helper

    w = numpy_helper.from_array(np.ones((5, 3), np.float32), "w")
    m = onnx_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [float_io("x", [1, 4])], [float_io("y", [1, 3])], [w])
    onnx.save(m, tmp_path / "mm.onnx")
    r = cli("quantize", "mm.onnx", "-o", "out.onnx")
    assert_one_line_error(r, 3, "invalid ONNX model mm.onnx: [ShapeInferenceError]")
    assert "Incompatible dimensions" in r.stderr and not (tmp_path / "out.onnx").exists()


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077, 0o002])
def test_atomic_outputs_honour_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        write_bytes_atomic(tmp_path / "a.bin", b"x")
        with atomic_path(tmp_path / "b.bin") as tmp:
            tmp.write_bytes(b"y")
        with open(tmp_path / "plain.bin", "wb") as fh:  # what open() makes is the reference
            fh.write(b"z")
    finally:
        os.umask(old)
    want = 0o666 & ~umask
    assert stat.S_IMODE((tmp_path / "plain.bin").stat().st_mode) == want
    for name in ("a.bin", "b.bin"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == want, name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "b.bin", "plain.bin"]


def test_cli_outputs_are_readable_by_others_under_the_usual_umask(cli, tmp_path):
    r = cli("quantize", DIGITS, "-o", "out.onnx", "--calib", EXAMPLES / "digits" / "calib.npz")
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE((tmp_path / "out.onnx").stat().st_mode) == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_a_weight_int8_cannot_bridge_runs_in_float_rather_than_crashing(cli, tmp_path):
    """Issue 26: a large (finite, under the 1e30 limit) weight made ekrt's requantization multiplier
    overflow, exit 1. Now that node is not an int8 node: it runs as a float island (or the plan picks
    another backend), and the quantized model is written."""
    from onnx import helper, numpy_helper

    w = np.ones((4, 3), np.float32)
    w[1, 1] = 1e20
    m = onnx_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [float_io("x", [1, 4])], [float_io("y", [1, 3])], [numpy_helper.from_array(w, "w")])
    onnx.save(m, tmp_path / "big.onnx")
    r = cli("quantize", "big.onnx", "-o", "out.onnx")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out.onnx").stat().st_size > 0
