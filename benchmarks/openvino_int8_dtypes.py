"""Which QDQ int8 models OpenVINO's CPU plugin compiles on this CPU, by activation type, and how fast.

The same model (the MobileNetV2 example at 64x64) quantized four ways: edgekit's `openvino` scheme
(uint8 activations), edgekit's `onnxruntime` scheme (asymmetric int8 activations, per-channel
symmetric int8 weights), and ONNX Runtime's `quantize_static` S8S8 and U8S8. Each model is compiled
and run by OpenVINO in a process of its own (latency hint) at 1 thread and at every core; a model
the plugin refuses says so with its message.

    python benchmarks/openvino_int8_dtypes.py [--dir DIR] [--markdown]
    python benchmarks/openvino_int8_dtypes.py --dir DIR --no-prepare   # models made elsewhere
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "examples" / "mobilenetv2" / "mobilenetv2.onnx"
CALIB = REPO / "examples" / "mobilenetv2" / "calib.npz"
MODELS = {
    "edgekit-openvino-u8": "edgekit `openvino` scheme (uint8 activations)",
    "edgekit-s8": "edgekit `onnxruntime` scheme (int8 activations)",
    "ort-s8s8": "ORT quantize_static S8S8",
    "ort-u8s8": "ORT quantize_static U8S8",
}


def prepare(d: Path) -> None:
    import numpy as np
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    edgekit = [sys.executable, "-m", "edgekit", "quantize", str(MODEL)]
    subprocess.run([*edgekit, "--target", "x86-openvino", "-o", str(d / "edgekit-openvino-u8.onnx")], check=True, capture_output=True)
    subprocess.run([*edgekit, "--target", "local", "--backend", "onnxruntime", "-o", str(d / "edgekit-s8.onnx")], check=True, capture_output=True)
    x = np.load(CALIB)["input"]
    m = onnx.load(MODEL)
    for vi in (*m.graph.input, *m.graph.output):  # ORT calibrates at a fixed shape
        dims = vi.type.tensor_type.shape.dim
        for k, value in enumerate([1, 3, 64, 64] if vi in m.graph.input else [1] + [dd.dim_value for dd in dims[1:]]):
            dims[k].ClearField("dim_param")
            dims[k].dim_value = value
    onnx.save(m, d / "fixed.onnx")

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter([{"input": x[i : i + 1]} for i in range(16)])

        def get_next(self):
            return next(self.it, None)

    for act, tag in ((QuantType.QInt8, "s8s8"), (QuantType.QUInt8, "u8s8")):
        quantize_static(str(d / "fixed.onnx"), str(d / f"ort-{tag}.onnx"), Reader(), quant_format=QuantFormat.QDQ,
                        activation_type=act, weight_type=QuantType.QInt8, per_channel=True)
    np.savez(d / "feed.npz", input=x[:1])


def one(d: Path, model: str, threads: int) -> dict:
    import numpy as np
    import openvino as ov

    core = ov.Core()
    x = np.load(d / "feed.npz")["input"]
    try:
        cm = core.compile_model(str(d / f"{model}.onnx"), "CPU", {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads})
    except Exception as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        why = next((ln for ln in lines if "suitable" in ln or "Check" in ln), lines[-1] if lines else "?")
        return {"model": model, "threads": threads, "compiled": False, "error": why[:160]}
    req = cm.create_infer_request()
    for _ in range(20):
        req.infer({0: x})
    lat = []
    end = time.perf_counter() + 1.0
    while time.perf_counter() < end:
        req.infer({0: x})
        lat.append(req.latency)  # ms, the request's own
    lat.sort()
    kernels: dict[str, int] = {}  # what the plugin really runs each convolution with
    for op in cm.get_runtime_model().get_ops():
        info = op.get_rt_info()
        if "Convolution" in info["layerType"].astype(str):
            kind = info["primitiveType"].astype(str)
            kernels[kind] = kernels.get(kind, 0) + 1
    return {"model": model, "threads": threads, "compiled": True, "p50_ms": lat[len(lat) // 2], "n": len(lat), "conv_kernels": kernels}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=None, help="where the models are (made there unless --no-prepare)")
    ap.add_argument("--no-prepare", action="store_true")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--worker", nargs=3, metavar=("DIR", "MODEL", "THREADS"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(one(Path(a.worker[0]), a.worker[1], int(a.worker[2]))))
        return 0
    d = a.dir or Path(tempfile.mkdtemp(prefix="ov-dtypes-"))
    d.mkdir(parents=True, exist_ok=True)
    if not a.no_prepare:
        prepare(d)
    cores = len(os.sched_getaffinity(0))
    rows = []
    for threads in sorted({1, cores}):
        for model in MODELS:
            p = subprocess.run([sys.executable, __file__, "--worker", str(d), model, str(threads)], capture_output=True, text=True, timeout=300)
            try:
                r = json.loads(p.stdout.strip().splitlines()[-1])
            except (IndexError, ValueError):
                tail = (p.stderr or "").strip().splitlines()
                r = {"model": model, "threads": threads, "compiled": False, "error": (tail[-1] if tail else f"exit {p.returncode}")[:160]}
            rows.append(r)
            if not a.markdown:
                print(json.dumps(r), flush=True)
    import openvino

    print(f"OpenVINO {openvino.__version__}, {cores} usable cores\n")
    print("| model | threads | compiles | p50 ms | convolution kernels |")
    print("|---|---|---|---|---|")
    for r in rows:
        ok = "yes" if r["compiled"] else f"no: `{r.get('error', '')}`"
        p50 = f"{r['p50_ms']:.3f}" if r.get("compiled") else "-"
        kernels = ", ".join(f"{k} {n}" for k, n in sorted((r.get("conv_kernels") or {}).items())) or "-"
        print(f"| {MODELS[r['model']]} | {r['threads']} | {ok} | {p50} | {kernels} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
