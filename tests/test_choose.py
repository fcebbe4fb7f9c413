"""--choose measure: int8 on every backend of the profile that can run the model, timed and
evaluated on the device; the fastest that passes its own gate is recommended, and the reasons say why."""

from __future__ import annotations

import json

import pytest

from edgekit.bench.verdict import Verdict, choose_fastest
from tests.conftest import EXAMPLES, assert_one_line_error

DIGITS = EXAMPLES / "digits" / "digits_cnn.onnx"


def _verdict(speedup: float, ok: bool) -> Verdict:
    return Verdict("int8" if ok else "fp32", (f"{speedup}x",), speedup, (speedup * 0.9, speedup * 1.1), {"faster": ok, "accurate": True})


def test_the_fastest_variant_that_passes_wins_not_the_fastest():
    verdicts = {"int8": _verdict(1.5, True), "int8-openvino": _verdict(3.0, False), "int8-onnxruntime": _verdict(2.0, True)}
    backends = {"int8": "native", "int8-openvino": "openvino", "int8-onnxruntime": "onnxruntime"}
    v = choose_fastest(verdicts, backends)
    assert v.recommended == "int8-onnxruntime" and v.speedup == 2.0
    assert v.reasons[0] == "int8-onnxruntime on onnxruntime is the fastest int8 variant that passes (of 2)"
    assert "int8-openvino on openvino: 3.00x fp32 at p50, fails its gate" in v.reasons
    assert set(v.to_dict()["candidates"]) == set(verdicts)
    none = choose_fastest({"int8": _verdict(0.5, False), "int8-onnxruntime": _verdict(0.8, False)}, backends)
    assert none.recommended == "fp32" and none.reasons[0] == "no int8 variant passes its gate"


@pytest.mark.slow
def test_choose_measure_benches_each_backend_on_the_device(cli, tmp_path):
    dry = cli("deploy", DIGITS, "--choose", "measure", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)["plan"]
    names = [v["name"] for v in plan["variants"]]
    assert names[:2] == ["fp32", "int8"] and set(names[2:]) == {"int8-onnxruntime", "int8-openvino"}
    quantized = [s["detail"] for s in plan["steps"] if s["name"] == "quantize"]
    assert len(quantized) == 3 and "int8-openvino: QDQ int8" in " ".join(quantized)  # each backend's own scheme
    assert [s["name"] for s in plan["steps"]].count("bench") == 4

    r = cli("deploy", DIGITS, "--choose", "measure", "--iterations", "30", "--no-layers", "--json", "-o", tmp_path / "b")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [s["name"] for s in doc["executed_steps"]] == [s["name"] for s in plan["steps"]]
    s = doc["summary"]
    variants, rec = s["variants"], s["recommendation"]
    assert set(rec["candidates"]) == {"int8", "int8-onnxruntime", "int8-openvino"}
    for name in rec["candidates"]:  # each measured on the device by its own backend
        assert variants[name]["p50_ms"] > 0 and variants[name]["accuracy"] is not None
    assert "on openvino" in variants["int8-openvino"]["agreement"]["measured_on"]
    passing = {n: c["speedup_p50"] for n, c in rec["candidates"].items() if c["recommended"] == "int8"}
    if passing:
        assert rec["recommended"] == max(passing, key=passing.get)
        assert rec["reasons"][0].startswith(f"{rec['recommended']} on {variants[rec['recommended']]['backend']} is the fastest")
    else:
        assert rec["recommended"] == "fp32" and rec["reasons"][0] == "no int8 variant passes its gate"
    stored = [r for r in doc["runs"] if r["variant"].startswith("int8")]
    assert len(stored) == 3


def test_bad_choose_asks(cli):
    assert_one_line_error(cli("deploy", DIGITS, "--choose", "fastest", "--dry-run"), 2, "unknown --choose 'fastest'")
    assert_one_line_error(cli("deploy", DIGITS, "--choose", "measure", "--backend", "onnxruntime", "--dry-run"), 2, "--choose measure weighs")
