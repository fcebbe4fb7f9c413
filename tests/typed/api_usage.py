"""Typed use of edgekit.api, as a user's script would write it: tests/test_api_types.py runs a type
checker on it and wants no error (api_misuse.py holds the calls it must flag)."""

from __future__ import annotations

from pathlib import Path

from edgekit import api
from edgekit.deploy import DeployResult
from edgekit.plan import Plan
from edgekit.quantize import QuantizeResult

DIGITS = Path("examples/digits/digits_cnn.onnx")


def usage() -> None:
    plan: Plan = api.plan(DIGITS, target="rpi5", iterations=50, warmup="auto", max_drop=0.5)
    print(plan.backend, [s.name for s in plan.steps])
    q: QuantizeResult = api.quantize(
        "examples/mobilenetv2/mobilenetv2.onnx", "m.int8.onnx", calib="examples/mobilenetv2/calib.npz", max_drop=1, metric="top1",
        shapes={"input": (1, 3, 64, 64)}, exclude=["conv1"],
    )
    print(q.agreement.accuracy_int8)
    r: DeployResult = api.deploy(DIGITS, target="local", iterations=200, warmup=10, duration_s=None, threads=2, rounds=3, max_drop=1.0, choose="measure")
    print(r.summary().get("speedup_p50"))
    b = api.bench("edgekit-out/digits_cnn-local", variants=["int8"], iterations=500, min_time_s=1.5, lock_wait=30)
    report = api.check_gates(b, ["p50:+5%"], baseline="latest@main")
    print(report.error())
    with api.results() as store:
        print(store.list(limit=1))
