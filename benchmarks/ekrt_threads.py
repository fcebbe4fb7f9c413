"""ekrt at one thread against all threads, with and without a busy process on one core.

For each model (examples/digits and examples/mobilenetv2, quantized with edgekit's native
scheme and lowered to .ekm): median latency through ``edgekit._ekrt`` at 1 thread, at every
usable core, and at the count ekrt picks itself (``Model(path)``: from the op sizes), in
interleaved rounds (median of per-round medians), once on the machine as it is and once with
a competing Python busy loop pinned to one core (a subprocess, bounded in time, always killed).
The goal (issue 11, item 4): all threads / 1 thread <= 1.05 with the competitor.

``--calibrate`` measures the cost model's threshold instead: single convolutions of growing
size, every one split (EKRT_WORK_PER_THREAD=0) at 2 threads against 1, with the competitor.
An op pays for a second thread once its work per thread is above the printed break-even.

    python benchmarks/ekrt_threads.py [--models digits,mobilenetv2] [--rounds 9] [--iterations 100]
    python benchmarks/ekrt_threads.py --calibrate
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from edgekit import _ekrt  # noqa: E402

BUSY_SECONDS = 600  # the competitor's own bound, should this script die without killing it
BUSY = "import os, sys, time\nos.sched_setaffinity(0, {int(sys.argv[1])})\nend = time.monotonic() + float(sys.argv[2])\nwhile time.monotonic() < end:\n    pass\n"


@contextlib.contextmanager
def competitor(on: bool):
    """A busy loop pinned to the last usable core while the block runs."""
    if not on:
        yield None
        return
    core = max(os.sched_getaffinity(0))
    proc = subprocess.Popen([sys.executable, "-c", BUSY, str(core), str(BUSY_SECONDS)])
    try:
        time.sleep(0.2)  # let it start spinning
        yield core
    finally:
        proc.kill()
        proc.wait()


def lower_example(name: str, out: Path) -> Path:
    from edgekit.modelio import load_model
    from edgekit.quantize import SCHEMES, load_feeds, quantize_model
    from edgekit.targets.native import ekm
    from edgekit.targets.native.lower import lower

    onnx_path = {"digits": "examples/digits/digits_cnn.onnx", "mobilenetv2": "examples/mobilenetv2/mobilenetv2.onnx"}[name]
    loaded = load_model(ROOT / onnx_path)
    sc = loaded.sidecar
    result = quantize_model(loaded, SCHEMES["native"], load_feeds(sc.calibration, loaded.inputs),
                            load_feeds(sc.evaluation, loaded.inputs))
    m, _ = lower(result.model)
    path = out / f"{name}.ekm"
    ekm.save(m, path)
    return path


def median_ms(models: dict[str, _ekrt.Model], xs: list[np.ndarray], rounds: int, iterations: int) -> dict[str, float]:
    per_round: dict[str, list[float]] = {k: [] for k in models}
    for _ in range(rounds):
        for key, m in models.items():
            for _ in range(max(3, iterations // 10)):
                m.run(xs)
            times = []
            for _ in range(iterations):
                t = time.perf_counter_ns()
                m.run(xs)
                times.append(time.perf_counter_ns() - t)
            per_round[key].append(statistics.median(times))
    return {k: statistics.median(v) / 1e6 for k, v in per_round.items()}


def bench(path: Path, rounds: int, iterations: int) -> list[dict]:
    cores = len(os.sched_getaffinity(0))
    models = {"1": _ekrt.Model(str(path), threads=1), "all": _ekrt.Model(str(path), threads=cores),
              "auto": _ekrt.Model(str(path))}
    rng = np.random.RandomState(0)
    xs = [rng.standard_normal(shape).astype(np.float32) for _, shape in models["1"].inputs]
    rows = []
    for busy in (False, True):
        with competitor(busy):
            ms = median_ms(models, xs, rounds, iterations)
        rows.append({"model": path.stem, "competitor": busy, "cores": cores, "auto_threads": models["auto"].threads,
                     "ms_1": ms["1"], "ms_all": ms["all"], "ms_auto": ms["auto"],
                     "all_over_1": ms["all"] / ms["1"], "auto_over_1": ms["auto"] / ms["1"]})
    return rows


def calibrate(rounds: int, iterations: int) -> None:
    from test_ekrt_core import Builder

    print("op                          MACs   1 thr ms  2 thr ms  2/1   (every op split, competitor on one core)")
    os.environ["EKRT_WORK_PER_THREAD"] = "0"
    try:
        cases = []
        for side in (8, 16, 24, 32, 48, 64):
            for kind in ("3x3", "1x1", "dw"):
                b = Builder(0)
                x = b.input((1, 32, side, side))
                if kind == "3x3":
                    y = b.conv(x, 32)
                elif kind == "1x1":
                    y = b.conv(x, 64, (1, 1), pads=(0, 0, 0, 0))
                else:
                    y = b.conv(x, 32, group=32)
                b.output(y)
                data = b.finish()
                t = b.t(y)
                w = b.t(b.m.ops[1].inputs[1])
                macs = int(np.prod(t.dims)) * int(np.prod(w.dims[1:]))
                cases.append((f"conv {kind} {side}x{side}x32", macs, data, b))
        with competitor(True):
            for name, macs, data, b in cases:
                ms = {"1": _ekrt.Model(data, threads=1), "2": _ekrt.Model(data, threads=2)}
                x = [np.random.RandomState(0).standard_normal(b.m.tensors[i].dims).astype(np.float32) for i, _ in b.m.inputs]
                r = median_ms(ms, x, rounds, iterations)
                print(f"{name:24s} {macs:9d}  {r['1']:8.4f}  {r['2']:8.4f}  {r['2'] / r['1']:.2f}")
    finally:
        del os.environ["EKRT_WORK_PER_THREAD"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="digits,mobilenetv2")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--iterations", type=int, default=100)
    p.add_argument("--calibrate", action="store_true")
    args = p.parse_args()
    print(f"ekrt {_ekrt.version}, isa {_ekrt.isa()}, {len(os.sched_getaffinity(0))} usable cores, "
          f"load average {os.getloadavg()[0]:.1f}")
    if args.calibrate:
        calibrate(args.rounds, args.iterations)
        return
    with tempfile.TemporaryDirectory(prefix="ekrt-threads-") as tmp:
        rows = []
        for name in args.models.split(","):
            rows += bench(lower_example(name, Path(tmp)), args.rounds, args.iterations)
    print("model        competitor  1 thr ms  all thr ms  all/1   auto thr  auto ms  auto/1")
    for r in rows:
        print(f"{r['model']:12s} {'yes' if r['competitor'] else 'no':10s}  {r['ms_1']:8.4f}  {r['ms_all']:10.4f}  "
              f"{r['all_over_1']:5.2f}   {r['auto_threads']:8d}  {r['ms_auto']:7.4f}  {r['auto_over_1']:5.2f}")


if __name__ == "__main__":
    main()
