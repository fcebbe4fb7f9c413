"""--max-drop that finishes and never plans what cannot run: the search is judged on held-out
samples it did not search on (both figures reported), and only nodes the planned backend can
run in float are candidates (ekrt has no float Conv or Gemm)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgekit import api
from edgekit.errors import GateError
from edgekit.quantize import FeedSet
from edgekit.targets import get_backend
from tests.conftest import EXAMPLES
from tests.test_mixed import feeds, quantized, tiny  # noqa: F401  (the outlier model and its fixture)

DIGITS = EXAMPLES / "digits" / "digits_cnn.onnx"


def test_the_search_is_judged_on_held_out_samples_it_never_saw(tiny):  # noqa: F811
    _, result = quantized(tiny, max_drop=0.5, metric="cosine")
    mp = result.mixed_precision
    # searched on the 32 calibration samples, judged on the 16 held-out ones
    assert (mp["samples"], mp["searched_on"], mp["judged"]["samples"]) == (32, "calibration samples", 16)
    assert mp["holds"] and [x["name"] for x in mp["float_layers"]] == ["mm1"]
    assert mp["judged"]["before"] < mp["judged"]["goal"] <= mp["judged"]["after"] and not mp["judged"].get("missed")


def test_a_choice_that_misses_on_unseen_samples_is_refused_with_both_figures(tiny, tmp_path):  # noqa: F811
    from edgekit.modelio import load_model
    from edgekit.quantize import SCHEMES, quantize_model

    # half of the held-out data is 30x larger than anything calibrated: every layer clips there, so
    # keeping mm1 float (what the calibration samples it searched on need) is not enough on it
    held = feeds(8, 2) + [{"x": f["x"] * 30} for f in feeds(8, 3)]
    loaded = load_model(tiny / "outlier.onnx")
    result = quantize_model(loaded, SCHEMES["onnxruntime"], FeedSet(feeds(32, 1), "cal"), FeedSet(held, "held"), max_drop=0.5, metric="cosine")
    mp = result.mixed_precision
    assert mp["after"] >= mp["goal"]  # the samples it searched on hold...
    assert mp["judged"]["missed"] and mp["judged"]["after"] < mp["judged"]["goal"]  # ...the held-out ones it never saw do not
    assert not mp["holds"] and mp["float_layers"] == [] and mp["sensitivity"]["layers"]
    np.savez(tmp_path / "held.npz", x=np.concatenate([f["x"] for f in held]))
    with pytest.raises(GateError, match="held-out samples it did not search on score") as err:
        api.quantize(tiny / "outlier.onnx", tmp_path / "q.onnx", calib=tiny / "cal.npz", eval=tmp_path / "held.npz", max_drop=0.5, metric="cosine")
    assert not (tmp_path / "q.onnx").exists() and err.value.exit_code == 5


def test_only_nodes_the_backend_runs_in_float_are_candidates(tiny):  # noqa: F811
    _, result = quantized(tiny, max_drop=0.5, metric="cosine", runs_float=lambda op: "no float MatMul here" if op == "MatMul" else None)
    mp = result.mixed_precision
    assert not mp["holds"] and mp["float_layers"] == [] and mp["tried_float_layers"] == 0
    assert mp["not_candidates"] == {"nodes": 4, "why": ["no float MatMul here"]}
    native = get_backend("native")
    assert native.runs_float("Gemm") == "ekrt has no float Gemm" and native.runs_float("Conv") and native.runs_float("MatMul") is None
    assert get_backend("onnxruntime").runs_float("Gemm") is None


def test_ci_on_digits_calibrated_x40_fails_the_accuracy_gate_instead_of_dying(cli, tmp_path):
    # Before: the search kept the final Gemm float for ekrt, which has no float Gemm, and the run
    # died on the plan it had made ("Gemm node 'fc': ... ekrt has no Gemm", exit 3).
    with np.load(EXAMPLES / "digits" / "calib.npz") as d:
        np.savez(tmp_path / "calib40.npz", **{k: d[k] * 40 for k in d.files})
    (tmp_path / "edgekit.toml").write_text(
        "[defaults]\niterations = 20\nwarmup = 2\n"
        f'[[models]]\npath = "{DIGITS}"\ncalib = "calib40.npz"\neval = "{EXAMPLES / "digits" / "heldout.npz"}"\n'
        f'labels = "{EXAMPLES / "digits" / "heldout_labels.npy"}"\nmax_drop = 1\nstrict = false\ngates = ["accuracy:-0.5pt", "drop:<1pt"]\n'
    )
    r = cli("ci", "--json")
    assert "has no Gemm" not in r.stderr + r.stdout, r.stderr
    assert r.returncode == 5, (r.returncode, r.stderr[-2000:])
    doc = json.loads(r.stdout)
    assert [x["status"] for x in doc["runs"]] == ["failed"], doc["runs"]
