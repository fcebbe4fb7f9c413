"""--max-drop's wall time against the plain quantize of the same model (issue 28 item 5: <= 3x on
ppocr-det-class models), runs interleaved (plain, max-drop, plain, ...) so a busy machine slows
both alike; the ratio of the medians is the figure.

    python benchmarks/max_drop_time.py --size 320 --calib 8 --heldout 4 --max-drop 5 --rounds 2 [--fresh-cache]

PP-OCRv4 det (DBNet) from the rapidocr-onnxruntime wheel (tests/realmodels.py), the onnxruntime
scheme (it runs every node in float, so all int8 nodes are candidates), metric mask IoU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from realmodels import det_samples, rapidocr_model  # noqa: E402

from edgekit.modelio import load_model  # noqa: E402
from edgekit.quantize import SCHEMES, FeedSet, quantize_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=320)
    ap.add_argument("--calib", type=int, default=8)
    ap.add_argument("--heldout", type=int, default=4)
    ap.add_argument("--max-drop", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--fresh-cache", action="store_true", help="an empty cache for every --max-drop run: each ranks anew")
    args = ap.parse_args()
    size = (args.size, args.size)
    loaded = load_model(rapidocr_model("det"), {"x": (1, 3, *size)})
    cal = FeedSet([{"x": s[None]} for s in det_samples(args.calib, seed=1, size=size)], "det_samples(calib, 1)")
    held = FeedSet([{"x": s[None]} for s in det_samples(args.heldout, seed=2, size=size)], "det_samples(heldout, 2)")
    times: dict[str, list[float]] = {"plain": [], "max_drop": []}
    last = None
    for r in range(args.rounds):
        for kind in ("plain", "max_drop"):
            if args.fresh_cache:
                os.environ["EDGEKIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="edgekit-max-drop-")
            t = time.perf_counter()
            result = quantize_model(loaded, SCHEMES["onnxruntime"], cal, held, **({"max_drop": args.max_drop, "metric": "iou"} if kind == "max_drop" else {}))
            times[kind].append(time.perf_counter() - t)
            note = f" (ranking {'reused from the cache' if any('reused' in n for n in (result.mixed_precision.get('sensitivity') or {}).get('notes', [])) else 'measured'})" if kind == "max_drop" else ""
            print(f"round {r + 1} {kind}: {times[kind][-1]:.1f} s{note}", flush=True)
            if kind == "max_drop":
                last = result.mixed_precision
    plain, md = statistics.median(times["plain"]), statistics.median(times["max_drop"])
    print(f"ppocr-det {args.size}x{args.size}, {args.calib} calibration / {args.heldout} held-out samples, --max-drop {args.max_drop:g} (iou):")
    print(f"  plain quantize {plain:.1f} s, with --max-drop {md:.1f} s: ratio {md / plain:.2f}x (medians of {args.rounds} interleaved rounds)")
    mp = last
    nodes = len(mp["sensitivity"]["layers"]) if mp.get("sensitivity") else None
    print(f"  searched on {mp['samples']} ({mp.get('searched_on')}): all int8 {mp['before']}, after {mp['after']} (goal {mp['goal']}), "
          f"{len(mp['float_layers'])} float ({mp.get('found_by') or 'none found'}; int8 MAC share {mp.get('int8_mac_share')}), holds {mp['holds']}, "
          f"{mp['evaluations']} evaluations, ranked {nodes or 'n/a'} nodes")
    if mp.get("judged"):
        j = mp["judged"]
        print(f"  judged on {j['samples']} held-out: all int8 {j['before']}, after {j['after']} (goal {j['goal']})")


if __name__ == "__main__":
    main()
