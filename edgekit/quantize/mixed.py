"""Accuracy-driven mixed precision (``quantize --max-drop``): the int8 nodes that cost the held-out
metric most go back to float until the metric holds, or the quantizer refuses.

Greedy by sensitivity, then pruned. Every int8 node (a ``sensitivity.Unit``) is ranked by what
the per-layer table calls its gain when kept float; the most harmful prefix of that order, grown
in doubling batches and then bisected, is the smallest that holds; pruning then tries each kept
node back in int8, least gain first. Every figure runs with Q/DQ reference semantics on one
``sensitivity.Switchboard`` session, so a variant measured is exactly the model that ships.

A metric is higher-is-better, in points of percent of the float model's own score (``snr``: in
dB). ``--max-drop X`` holds when the int8 score is at most X below the float model's; for
``snr``, when the noise power is at most X % of the signal's (SNR >= 10 log10(100 / X) dB),
since float's own SNR is infinite.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from edgekit.errors import InputError, UsageError
from edgekit.events import Events
from edgekit.quantize import cache as qcache
from edgekit.quantize import qmath, sensitivity
from edgekit.quantize.calib import FeedSet, spread
from edgekit.quantize.report import session
from edgekit.quantize.rewrite import Analysis

METRICS = ("top1", "cosine", "snr", "iou", "ctc")
RANK_SAMPLES = 2  # search samples the ranking runs on (one inference per block each)
RANK_BLOCKS = 24  # more candidates than this are ranked in this many blocks of neighbours
SEARCH_SAMPLES = 32  # calibration samples the search scores each candidate on (spread over the set)
MAX_FLOAT_SHARE = 0.5  # refuse rather than keep more than this share of the int8 nodes in float
PRUNE_TRIES = 8  # kept nodes tried back in int8 (least harmful first), one pass over the search samples each
LATENCY_ROUNDS = 15

Outputs = list[np.ndarray]  # one array per model output, the held-out samples stacked on axis 0


@dataclass(frozen=True)
class Metric:
    name: str
    score: Callable[[Outputs, Outputs], float]  # (float's outputs, int8's) -> higher is better
    unit: str = "points"
    why: str = ""  # how the default was picked

    def goal(self, reference: float, max_drop: float) -> float:
        """The lowest score that holds, given float's own ``reference`` score."""
        if self.name == "snr":
            return math.inf if max_drop <= 0 else 10 * math.log10(100 / max_drop)
        return reference - max_drop - 1e-9


def class_output(outs: Outputs) -> int | None:
    """The index of the first class-vector output ([N, classes]), None without one."""
    return next((i for i, a in enumerate(outs) if a.ndim == 2 and a.shape[1] > 1), None)


def _top1(labels: np.ndarray | None) -> Callable[[Outputs, Outputs], float]:
    def score(ref: Outputs, q: Outputs) -> float:
        i = class_output(ref)
        if i is None:
            raise UsageError("--metric top1 needs a class-vector output ([N, classes]); this model has none", "use --metric cosine (or iou, ctc, a module.py:fn)")
        if labels is not None and len(labels) == len(q[i]):
            return 100 * float(np.mean(q[i].argmax(axis=1) == labels))
        return 100 * float(np.mean(ref[i].argmax(axis=1) == q[i].argmax(axis=1)))

    return score


def _worst(ref: Outputs, q: Outputs, per_sample: Callable[[np.ndarray, np.ndarray], Sequence[float] | np.ndarray]) -> float:
    """100 x the lowest, over the outputs, of the mean of ``per_sample`` (one figure per sample of
    the [samples, values] arrays it gets)."""
    worst = math.inf
    for r, x in zip(ref, q):
        n = max(1, len(r)) if r.ndim else 1
        figures = per_sample(r.reshape(n, -1).astype(np.float64), x.reshape(n, -1).astype(np.float64))
        worst = min(worst, float(np.mean(figures)))
    return 100 * worst


def _cosine(ref: Outputs, q: Outputs) -> float:
    return _worst(ref, q, lambda r, x: [qmath.cosine(a, b) for a, b in zip(r, x)])


def _snr(ref: Outputs, q: Outputs) -> float:
    return min(float(qmath.snr_db(r.astype(np.float64), x.astype(np.float64))) for r, x in zip(ref, q))


def _iou(ref: Outputs, q: Outputs) -> float:
    """Mask IoU of the outputs thresholded at 0.5 (a text detector's probability map)."""

    def iou(r: np.ndarray, x: np.ndarray) -> np.ndarray:
        a, b = r > 0.5, x > 0.5
        union = (a | b).sum(axis=1)
        return np.where(union == 0, 1.0, (a & b).sum(axis=1) / np.maximum(union, 1))

    return _worst(ref, q, iou)


def ctc_greedy(probs: np.ndarray) -> list[list[int]]:
    """Greedy CTC decode of [N, T, C] scores: argmax per step, repeats merged, blank (0) dropped."""
    out = []
    for best in probs.argmax(axis=-1):
        keep = np.ones(len(best), bool)
        keep[1:] = best[1:] != best[:-1]
        out.append([int(t) for t in best[keep] if t != 0])
    return out


def edit_distance(a: Sequence[int], b: Sequence[int]) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def _ctc(ref: Outputs, q: Outputs) -> float:
    """100 - character error rate (%) of int8's greedy CTC decodes against float's."""
    i = next((k for k, a in enumerate(ref) if a.ndim == 3), None)
    if i is None:
        raise UsageError("--metric ctc needs a [N, time, classes] output; this model has none", "use --metric cosine (or top1, iou, a module.py:fn)")
    want, got = ctc_greedy(ref[i]), ctc_greedy(q[i])
    edits = sum(edit_distance(w, g) for w, g in zip(want, got))
    return 100 - 100 * edits / max(1, sum(len(w) for w in want))


def _custom(spec: str) -> Callable[[Outputs, Outputs], float]:
    path, _, name = spec.rpartition(":")
    file = Path(path)
    if not file.is_file():
        raise InputError(f"--metric {spec}: no such file {path}", "give path/to/module.py:function")
    loader = importlib.util.spec_from_file_location(f"edgekit_metric_{file.stem}", file)
    module = importlib.util.module_from_spec(loader)
    try:
        loader.loader.exec_module(module)
    except Exception as exc:
        raise InputError(f"--metric {spec}: importing {path} failed: {type(exc).__name__}: {exc}", "run the module with python to see the error") from exc
    fn = getattr(module, name, None)
    if not callable(fn):
        raise InputError(f"--metric {spec}: {path} has no function {name}", "define fn(ref_outputs, q_outputs) -> float (higher is better)")

    def score(ref: Outputs, q: Outputs) -> float:
        try:
            value = float(fn(ref, q))
        except Exception as exc:
            raise InputError(f"--metric {spec} raised {type(exc).__name__}: {exc}", "it gets two lists of arrays (one per output, samples on axis 0) and returns a float") from exc
        if not math.isfinite(value):
            raise InputError(f"--metric {spec} returned {value}", "return a finite float, higher is better")
        return value

    return score


def check_metric(spec: str | None) -> None:
    """A metric name the CLI can reject before any work: one of METRICS, 'auto', or module.py:fn."""
    if spec is None or spec == "auto" or spec in METRICS:
        return
    path, colon, name = spec.rpartition(":")
    if not colon or not path.endswith(".py") or not name.isidentifier():
        raise UsageError(f"unknown metric '{spec}'", f"choose one of: {', '.join(METRICS)}, or path/module.py:function")


def metric_for(spec: str | None, ref: Outputs, labels: np.ndarray | None) -> Metric:
    """The metric ``spec`` names; None or 'auto': top1 for a class-vector output, else cosine."""
    check_metric(spec)
    if spec is None or spec == "auto":
        if class_output(ref) is not None:
            return Metric("top1", _top1(labels), why="default for a class-vector output" + (", against the labels" if labels is not None else ""))
        return Metric("cosine", _cosine, why="default for outputs that are not class vectors")
    builtin = {"top1": _top1(labels), "cosine": _cosine, "snr": _snr, "iou": _iou, "ctc": _ctc}
    if spec in builtin:
        return Metric(spec, builtin[spec], unit="dB" if spec == "snr" else "points")
    return Metric(spec, _custom(spec))


def _stack(runs: list[list[np.ndarray]]) -> Outputs:
    return [np.concatenate([np.reshape(r[i], (1, -1)) if np.ndim(r[i]) == 0 else r[i] for r in runs]) for i in range(len(runs[0]))]


def decide(
    float_model: onnx.ModelProto,
    qmodel: onnx.ModelProto,
    analysis: Analysis,
    heldout: FeedSet,
    local: dict[str, float | None],
    *,
    max_drop: float,
    metric: str | None = None,
    events: Events | None = None,
    runs_float: Callable[[str], str | None] | None = None,
    search_on: FeedSet | None = None,
) -> tuple[onnx.ModelProto, dict]:
    """The mixed model and its decision (``mixed_precision`` of the quantize result), for
    ``qmodel`` rewritten from the prepared ``float_model``; ``max_drop`` in the metric's points.

    The search runs on ``search_on`` (the calibration samples: up to SEARCH_SAMPLES of them,
    spread over the set) and its result is judged on ``heldout``, which it never saw; it holds
    only when both do. Without ``search_on`` the held-out samples are split: the search runs on
    the first half (rounded up), the judge on the rest.
    ``runs_float(op_type)``: why the planned backend cannot run such a node in float (None: it
    can); only the nodes it can run are candidates, so the search never makes a plan that cannot
    run. When nothing holds within MAX_FLOAT_SHARE of the candidates, the int8 model unchanged
    and ``holds: False`` (with the sensitivity table, most harmful first): the caller refuses
    or falls back."""
    t0 = time.perf_counter()
    found = sensitivity.units(float_model, analysis)
    board = sensitivity.Switchboard(qmodel, float_model, found)
    everything = {u.name for u in found}
    labels = heldout.labels if heldout.labels is not None and len(heldout.labels) == len(heldout.feeds) else None
    if search_on is not None and search_on.feeds:
        feeds, search_labels = spread(search_on.feeds, SEARCH_SAMPLES), None
        judge_feeds, judge_labels = list(heldout.feeds), labels
    else:
        split = len(heldout.feeds) - len(heldout.feeds) // 2 if len(heldout.feeds) >= 2 else len(heldout.feeds)
        feeds, search_labels = list(heldout.feeds[:split]), None if labels is None else labels[:split]
        judge_feeds, judge_labels = list(heldout.feeds[split:]), None if labels is None else labels[split:]
    ref = _stack(board.run(everything, feeds))
    m = metric_for(metric, ref, search_labels)
    reference = m.score(ref, ref)
    goal = m.goal(reference, max_drop)
    judge_ref = _stack(board.run(everything, judge_feeds)) if judge_feeds else []
    judge = metric_for(metric, judge_ref, judge_labels) if judge_feeds else None
    judge_goal = judge.goal(judge.score(judge_ref, judge_ref), max_drop) if judge else None
    scores: dict[frozenset, float] = {}

    def value(keep: Sequence[str]) -> float:
        key = frozenset(keep)
        if key not in scores:
            scores[key] = m.score(ref, _stack(board.run(key, feeds)))
        return scores[key]

    def judged(keep: Sequence[str]) -> float | None:
        return judge.score(judge_ref, _stack(board.run(frozenset(keep), judge_feeds))) if judge else None

    before = value(())
    node_macs = sensitivity.macs(float_model)
    total = sum(node_macs.values())
    doc = {
        "metric": m.name, "metric_why": m.why, "unit": m.unit, "max_drop": max_drop, "samples": len(feeds),
        "searched_on": "calibration samples" if search_on is not None and search_on.feeds else "the first half of the held-out samples",
        "reference": _r(reference), "goal": _r(goal), "before": _r(before),
    }  # fmt: skip
    cannot = {u.name: why for u in found if runs_float is not None and (why := runs_float(u.op))}
    if cannot:
        doc["not_candidates"] = {"nodes": len(cannot), "why": sorted(set(cannot.values()))}
    keep: list[str] | None = []
    sens = None
    order: list[str] = []
    bound = 0
    if before < goal:
        candidates = [u for u in found if u.name not in cannot]
        sens = rank(float_model, qmodel, found, candidates, board, feeds, local, events=events)
        order = [x["name"] for x in sens.layers if x["name"] not in cannot]
        bound = max(1, int(len(order) * MAX_FLOAT_SHARE)) if order else 0

        def holds(keep: list[str]) -> bool:
            return value(keep) >= goal

        keep = search(order, holds, bound) if order else None
        doc["found_by"] = "ranking" if keep is not None else None
        if keep is None and order:  # candidates are in graph order
            keep, end = search_graph([u.name for u in candidates], holds, bound)
            doc["found_by"] = f"graph order, from the {end}" if keep is not None else None
        doc.update(holds=keep is not None, tried_float_layers=bound, rank_samples=sens.samples)
    else:
        doc["holds"] = True
    if keep is None:
        doc["after"] = _r(value(order[:bound]))
        doc["sensitivity"] = sens.to_dict()
        keep = []
    else:
        doc["after"] = _r(value(keep))
    if judge is not None:
        # the search saw only its half: the other half says whether its answer holds on data it never saw
        after_judged = judged(keep if doc["holds"] else order[:bound])
        doc["judged"] = {"samples": len(judge_feeds), "goal": _r(judge_goal), "before": _r(judged([])), "after": _r(after_judged)}
        if doc["holds"] and after_judged < judge_goal:
            doc["holds"] = False
            doc["judged"]["missed"] = True
            doc.setdefault("tried_float_layers", len(keep))
            doc.setdefault("rank_samples", sens.samples if sens else 0)
            if sens is None:  # all int8 held where it searched: rank now, so the refusal can say which nodes cost most
                sens = rank(float_model, qmodel, found, [u for u in found if u.name not in cannot], board, feeds, local, events=events)
            doc["sensitivity"] = sens.to_dict()
            keep = []
    else:
        doc["judged"] = None  # one held-out sample: nothing left to judge on
    by_name = {x["name"]: x for x in sens.layers} if sens else {}
    doc["float_layers"] = [
        {"name": k, "op": by_name[k]["op"], "gain_db": by_name[k]["output_snr_db_gain_float"], "macs_share": by_name[k]["macs_share"]} for k in keep
    ]
    float_macs = sum(node_macs.get(k, 0) for k in keep)
    int8_macs = sum(node_macs.get(u.name, 0) for u in found)
    doc["int8_mac_share"] = round((int8_macs - float_macs) / total, 4) if total else None
    doc["int8_mac_share_all_int8"] = round(int8_macs / total, 4) if total else None
    doc["evaluations"] = len(scores)
    mixed = sensitivity.keep_float(qmodel, float_model, [u for u in found if u.name in set(keep)]) if keep else qmodel
    doc["seconds"] = round(time.perf_counter() - t0, 3)
    return mixed, doc


def rank(
    float_model: onnx.ModelProto,
    qmodel: onnx.ModelProto,
    found: Sequence[sensitivity.Unit],
    candidates: Sequence[sensitivity.Unit],
    board: sensitivity.Switchboard,
    feeds: Sequence[dict],
    local: dict[str, float | None],
    *,
    events: Events | None = None,
) -> sensitivity.Sensitivity:
    """The candidates, most harmful first, measured once and cached. Up to RANK_BLOCKS of them one
    by one (the output SNR gained when each alone is kept float); more in RANK_BLOCKS blocks of
    neighbours in graph order, each block's gain measured, the blocks most harmful first and within
    a block the worst local error first: one inference per block instead of per node (a 245-node
    detector: 24 runs instead of 245). The ranking is cached by the int8 model, the samples and
    the candidates, so a second search (another --max-drop, another metric) starts from it."""
    t0 = time.perf_counter()
    rank_feeds = list(feeds[:RANK_SAMPLES])
    key = _ranking_key(qmodel, rank_feeds, [u.name for u in candidates])
    cached = qcache.load_ranking(key)
    if cached is not None:
        return sensitivity.Sensitivity(cached["layers"], cached["samples"], cached["output_snr_db"], time.perf_counter() - t0, [*cached["notes"], "ranking reused from the cache"])
    node_macs = sensitivity.macs(float_model)
    total = sum(node_macs.values())
    size = max(1, math.ceil(len(candidates) / RANK_BLOCKS))
    blocks = [list(candidates[i : i + size]) for i in range(0, len(candidates), size)]
    everything = {u.name for u in found}
    ref = board.outputs(everything, rank_feeds)
    whole = sensitivity._score(ref, board.outputs((), rank_feeds))[0]
    scored = []
    what = f"ranking {len(candidates)} int8 nodes by what they cost the outputs" + (f" ({len(blocks)} blocks of {size})" if size > 1 else "")
    with (events or Events()).progress(what, total=len(blocks)) as prog:
        for b, block in enumerate(blocks):
            float_snr = sensitivity._score(ref, board.outputs({u.name for u in block}, rank_feeds))[0]
            gain = float_snr - whole if math.isfinite(whole) else 0.0
            scored.append((gain, b))
            prog.advance()
    layers = []
    for gain, b in sorted(scored, key=lambda x: (-x[0], x[1])):
        for u in sorted(blocks[b], key=lambda u: math.inf if local.get(u.name) is None else local[u.name]):
            layers.append({
                "name": u.name, "op": u.op, "snr_db": local.get(u.name), "block": b, "block_size": len(blocks[b]),
                "macs_share": round(node_macs[u.name] / total, 4) if total and u.name in node_macs else None,
                "output_snr_db_gain_float": sensitivity._finite(gain) if len(blocks[b]) == 1 else None,
                "block_gain_db": sensitivity._finite(gain),
            })  # fmt: skip
    notes = [f"{len(candidates)} candidates ranked in {len(blocks)} blocks of up to {size} neighbours (block gain kept float, then local error)"] if size > 1 else []
    sens = sensitivity.Sensitivity(layers, len(rank_feeds), None if not math.isfinite(whole) else sensitivity._finite(whole), time.perf_counter() - t0, notes)
    qcache.save_ranking(key, {"layers": layers, "samples": sens.samples, "output_snr_db": sens.output_snr_db, "notes": notes})
    return sens


def _ranking_key(qmodel: onnx.ModelProto, feeds: Sequence[dict], candidates: Sequence[str]) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"code": qcache.code_digest(), "blocks": RANK_BLOCKS, "candidates": sorted(candidates)}).encode())
    h.update(qmodel.SerializeToString(deterministic=True))
    for feed in feeds:
        for name in sorted(feed):
            h.update(f"{name}:{feed[name].dtype.str}:{feed[name].shape}".encode())
            h.update(np.ascontiguousarray(feed[name]).tobytes())
    return h.hexdigest()


def check_dynamic(
    float_model: onnx.ModelProto, dyn_model: onnx.ModelProto, heldout: FeedSet, *, max_drop: float, metric: str | None = None
) -> dict:
    """Does the ``--method dynamic`` model (quantize.dynamic) hold the held-out ``metric`` within
    ``max_drop`` of ``float_model``'s? Its decision, shaped as ``decide``'s: it keeps no layer in
    float (the dynamic model is the one answer), so ``holds`` is the whole verdict."""
    t0 = time.perf_counter()

    def outs(model: onnx.ModelProto) -> Outputs:
        sess = session(model.SerializeToString(), reference=True)
        return _stack([sess.run(None, feed) for feed in heldout.feeds])

    ref = outs(float_model)
    m = metric_for(metric, ref, heldout.labels)
    reference = m.score(ref, ref)
    goal = m.goal(reference, max_drop)
    before = m.score(ref, outs(dyn_model))
    return {
        "metric": m.name, "metric_why": m.why, "unit": m.unit, "max_drop": max_drop, "samples": len(heldout.feeds), "method": "dynamic",
        "reference": _r(reference), "goal": _r(goal), "before": _r(before), "after": _r(before), "holds": before >= goal,
        "float_layers": [], "tried_float_layers": 0, "rank_samples": 0, "sensitivity": {"layers": []}, "evaluations": 1,
        "seconds": round(time.perf_counter() - t0, 3),
    }  # fmt: skip


def search(order: Sequence[str], holds: Callable[[list[str]], bool], bound: int) -> list[str] | None:
    """The nodes to keep float: of ``order`` (most harmful first), the shortest prefix that
    ``holds``, found in doubling batches then bisected, pruned by trying each back in int8
    (least harmful first); None when even the first ``bound`` do not hold, which is asked first:
    a refusal costs one evaluation, not a doubling run up to the bound."""
    if not holds(list(order[:bound])):
        return None
    lo, n, hi = 0, 1, None
    while hi is None:
        n = min(n, bound)
        if holds(list(order[:n])):
            hi = n
        elif n == bound:
            return None
        else:
            lo, n = n, n * 2
    while hi - lo > 1:  # the prefix of lo nodes fails, of hi holds
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if holds(list(order[:mid])) else (mid, hi)
    keep = list(order[:hi])
    for name in list(reversed(keep))[:PRUNE_TRIES]:
        trial = [k for k in keep if k != name]
        if trial and holds(trial):
            keep = trial
    return keep


def search_graph(graph: Sequence[str], holds: Callable[[list[str]], bool], bound: int) -> tuple[list[str] | None, str | None]:
    """When no prefix of the ranking holds: the shortest run of candidates in graph order that
    holds, from the input (an early layer's error grows through everything after it) and then
    from the outputs, each asked at the bound first and then bisected (as ``polygraphy debug
    precision`` does); no pruning, so the float part stays one contiguous run. Returns the nodes
    and which end they start from ("input", "outputs"), or (None, None).

    Why: a ranking measures each block's gain alone, and errors that only matter together (the
    first 40 of PP-OCRv4 det's 250 units float reach the IoU goal, the ranking's first 125 do
    not) are invisible to it."""
    for end, seq in (("input", list(graph)), ("outputs", list(reversed(graph)))):
        if not seq or not holds(seq[:bound]):
            continue
        lo, hi = 0, min(bound, len(seq))
        while hi - lo > 1:  # the first lo fail, the first hi hold
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if holds(seq[:mid]) else (mid, hi)
        return seq[:hi], end
    return None, None


def _r(x: float) -> float | None:
    return round(x, 4) if math.isfinite(x) else None


def host_latency(models: dict[str, bytes], feed: dict[str, np.ndarray]) -> dict:
    """Median latency (ms) of each model on this host, ONNX Runtime on 1 thread with its usual
    optimizations, runs interleaved so a busy machine slows all alike: an estimate on the host,
    not the target's backend."""
    sessions = {name: session(blob, reference=False, threads=1) for name, blob in models.items()}
    times: dict[str, list[float]] = {n: [] for n in sessions}
    for r in range(LATENCY_ROUNDS + 2):
        for name, sess in sessions.items():
            t = time.perf_counter()
            sess.run(None, feed)
            if r >= 2:  # two warm-up rounds
                times[name].append(time.perf_counter() - t)
    out = {f"{n}_ms": round(float(np.median(t)) * 1e3, 3) for n, t in times.items()}
    return {**out, "rounds": LATENCY_ROUNDS, "measured_on": "host estimate: ONNX Runtime CPU, 1 thread (not the target's backend)"}


__all__ = ["METRICS", "Metric", "check_dynamic", "check_metric", "ctc_greedy", "decide", "edit_distance", "host_latency", "metric_for", "search", "search_graph"]
