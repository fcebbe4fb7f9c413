"""Where a model's int8 error comes from, and what ``+gptq`` (learned weight rounding) wins back.

For catalogue models (tests/realmodels.py), with edgekit's quantization for ONNX Runtime on this
host, it scores on held-out samples (the catalogue's task metric, Q/DQ reference semantics,
against fp32):

* ``prepared``: the float model after edgekit's graph preparation (BN folding, constant folding);
* ``int8 (M)``: the int8 model ``edgekit quantize --method M`` writes (M: ``--method``, default
  ``auto``), and ``int8 (M+gptq)``: with the weights rounded by GPTQ (edgekit.quantize.rounding);
* ``..., weights only``: that model with its activation Q/DQ pairs removed (weights int8,
  activations float): what the weights' rounding alone costs.

It prints a markdown row per model, with how many layers GPTQ rounded and both quantize times.

    python benchmarks/weight_rounding.py --models oww-embedding,efficientnet-lite0 --calib 32 --eval 64
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import onnx
from onnx import helper
from quantize_vs_ort import host_scheme
from realdata import catalogue

from edgekit.modelio import load_model, with_static_inputs
from edgekit.quantize import FeedSet, quantize_model, save_model
from edgekit.quantize.prepare import prepare


def _strip_activations(m: onnx.ModelProto) -> onnx.ModelProto:
    """``m`` without its activation Q/DQ pairs (a DQ whose input a Q of a float tensor makes)."""
    weights = {i.name for i in m.graph.initializer}
    out = onnx.ModelProto()
    out.CopyFrom(m)
    made = {o: n for n in out.graph.node for o in n.output}
    rename, drop = {}, set()
    for n in out.graph.node:
        q = made.get(n.input[0])
        if n.op_type == "DequantizeLinear" and n.input[0] not in weights and q is not None and q.op_type == "QuantizeLinear":
            rename[n.output[0]] = q.input[0]
            drop.add(n.output[0])
    keep = [n for n in out.graph.node if not (n.op_type == "DequantizeLinear" and n.output[0] in drop)]
    for n in keep:
        for i, x in enumerate(n.input):
            n.input[i] = rename.get(x, x)
    for o in out.graph.output:
        if o.name in rename:
            keep.append(helper.make_node("Identity", [rename[o.name]], [o.name]))
    del out.graph.node[:]
    out.graph.node.extend(keep)
    return out


def run(name: str, n_calib: int, n_eval: int, method: str) -> str:
    model, rm = catalogue(name)
    loaded = load_model(model.locate(), {k: v for k, v in model.inputs.items() if v})
    with tempfile.TemporaryDirectory(prefix="ek-rounding-") as tmp:
        work = Path(tmp)
        src = work / "fp32.onnx"
        onnx.save_model(with_static_inputs(loaded.model, loaded.inputs), str(src))
        calib, held = model.calib(n_calib), model.eval(n_eval)
        fp32 = rm.run_outputs(src, held.feeds)
        lm = load_model(src)
        models = {"prepared": prepare(lm.model, lm.inputs)}
        seconds, layers = {}, 0
        for m in (method, f"{method}+gptq"):
            t0 = time.perf_counter()
            result = quantize_model(lm, host_scheme(), FeedSet(calib.feeds, "calib"), FeedSet(held.feeds[:1], "held-out"), method=m)
            seconds[m] = time.perf_counter() - t0
            layers = max(layers, len(result.analysis.rounded))
            models[m] = result.model
            models[m + ", weights only"] = _strip_activations(result.model)
        scores = {}
        for label, m in models.items():
            path = work / f"{len(scores)}.onnx"
            save_model(m, path)
            scores[label] = model.metric(fp32, rm.run_outputs(path, held.feeds), held)
    cells = [f"{s.value:.5g}" + (f" (top-5 {s.detail['top5_overlap']:.3f})" if "top5_overlap" in (s.detail or {}) else "") for s in scores.values()]
    times = " / ".join(f"{t:.0f}" for t in seconds.values())
    return f"| {name} | {scores['prepared'].name} | {' | '.join(cells)} | {layers} layers; {times} s |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="efficientnet-lite0")
    ap.add_argument("--calib", type=int, default=32)
    ap.add_argument("--eval", type=int, default=64)
    ap.add_argument("--method", default="auto", help="the range method both columns use (default: edgekit's default)")
    args = ap.parse_args(argv)
    m = args.method
    print(f"| model | metric | prepared (float) | int8 ({m}) | {m}, weights only | int8 ({m}+gptq) | {m}+gptq, weights only | GPTQ layers; quantize s |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        print(run(name, args.calib, args.eval, m), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
