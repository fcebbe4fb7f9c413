"""Rendering shared by the CLI's nouns: the sentences and tables users read (the library returns data)."""

from __future__ import annotations

import os
from typing import Any

from edgekit.cli.output import Output

TOP_LAYERS = 5
# Short headers: the bench table fits 80 columns (a pipe or CI log) for typical values.
RUN_COLUMNS = ["variant", "backend", "prec", "p50 ms", "p90", "p99", "mean", "inf/s", "RSS MB"]


def fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.2f}%"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB"):
        if n < 1024:
            return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def print_plan(o: Output, doc: dict) -> None:
    o.line(f"model     {doc['model']}  ({doc['model_path']})")
    o.line("inputs    " + ", ".join(f"{i['name']} {i['dtype']}{i['shape']}" for i in doc["inputs"]))
    o.line(f"target    {doc['profile']}: {doc['profile_description']}")
    o.line(f"device    {doc['device']}")
    o.line(f"backend   {doc['backend']}")
    o.line(f"precision {doc['precision']}")
    if doc["scheme"]:
        s = doc["scheme"]
        o.line(
            f"scheme    {s['name']}: activations {s['activation_dtype']} "
            f"{'symmetric' if s['activation_symmetric'] else 'asymmetric'}, weights int8 symmetric "
            f"{'per-channel' if s['per_channel'] else 'per-tensor'}; {_ranges(doc['method'], doc['calibration'])}"
        )
        if _weights_line(s):
            o.line(f"weights   {_weights_line(s)}")
        n = doc["nodes"]
        o.line(
            f"nodes     {n.get('int8', 0)} int8, {n.get('fused', 0)} fused, {n.get('passthrough', 0)} pass-through, {n.get('float', 0)} float"
        )
    for b in doc["skipped_backends"]:
        o.line(f"skipped   {b['backend']}: {b['reason']}")
    for backend, cov in doc.get("coverage", {}).items():
        print_coverage(o, backend, cov)
    for note in doc["notes"]:
        o.line(f"note      {note}")
    if doc["float_nodes"]:
        o.table(["node", "op", "stays float because"], [[f["name"], f["op"], f["reason"]] for f in doc["float_nodes"]])
    rows = []
    for i, s in enumerate(doc["steps"]):
        rows.append([i + 1, s["name"], s["detail"]])
        rows += [["", f"  {d['name']}", d["detail"]] for d in s.get("device_steps", ())]  # done by the agent first
    o.table(["#", "step", "detail"], rows)


def _op_counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{op} x{n}" for op, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def print_coverage(o: Output, backend: str, cov: dict, rows: int = 12) -> None:
    """One backend's nodes by how it runs them (int8 ops, int8 tables, float, cannot), and the
    nodes it cannot run, first ones first."""
    if cov.get("error"):
        o.line(f"coverage  {backend}: cannot lower the model: {cov['error']}")
        return
    kinds = [("int8", cov["int8"]), ("int8 tables", cov["tables"]), ("float", cov["float"]), ("cannot run", cov["unsupported"])]
    o.line(f"coverage  {backend} ({cov.get('runtime', backend)}): " + "; ".join(
        f"{sum(c.values())} {kind}" + (f" ({_op_counts(c)})" if c else "") for kind, c in kinds)
        + (f"; {cov['blocked']} more not reached (their inputs cannot be lowered)" if cov.get("blocked") else ""))
    for nodes, why in ((cov.get("float_nodes") or [], f"{backend} runs it in float because"), (cov["unsupported_nodes"], f"{backend} cannot run it because")):
        if nodes:
            table = [[n["name"], n["op"], n["reason"]] for n in nodes[:rows]]
            if len(nodes) > rows:
                table.append(["...", "", f"{len(nodes) - rows} more (--json lists all)"])
            o.table(["node", "op", why], table)


def speed_sentence(summary: dict, float_nodes: int = 0) -> str | None:
    """The plain-language verdict on int8 vs fp32 speed on this device."""
    if "speedup_p50" not in summary:
        return None
    s = summary["speedup_p50"]
    if summary["int8_faster"]:
        return f"int8 is {s:.2f}x faster than fp32 at p50 on this device."
    why = []
    fp_p50 = summary["variants"]["fp32"]["p50_ms"]
    if fp_p50 is not None and fp_p50 < 0.1:
        why.append(f"the model runs in {fp_p50 * 1000:.0f} us, where per-call overhead outweighs the arithmetic")
    if float_nodes:
        why.append(f"{float_nodes} node(s) stay float, and each int8/float boundary costs a Q/DQ conversion")
    if not why:
        why.append("this runtime's int8 kernels are not faster than its fp32 ones on this CPU")
    return f"int8 is NOT faster than fp32 on this device ({s:.2f}x fp32's speed at p50): " + "; ".join(why) + "."


def print_summary(o: Output, doc: dict) -> None:
    """A deploy's result: one row per variant, the agreement, the verdict, where things went."""
    s = doc["summary"]
    variants = s["variants"]
    fp = variants.get("fp32", {})
    agreement = s.get("agreement")
    rows = []
    for name, v in variants.items():
        speed = "-"
        if v.get("p50_ms") and fp.get("p50_ms"):
            speed = f"{fp['p50_ms'] / v['p50_ms']:.2f}x"
        agree = "-"
        own = v.get("agreement") or agreement  # --choose measure: each int8 variant has its own
        if name != "fp32" and own:
            first = own["outputs"][0]
            top1 = next((x["top1"] for x in own["outputs"] if x["top1"] is not None), None)
            agree = f"cos {first['cosine']:.4f}" + (f", top-1 {top1 * 100:.1f}%" if top1 is not None else "")
        rows.append([
            name, v["backend"], fmt_ms(v.get("p50_ms")), fmt_ms(v.get("p99_ms")), speed,
            fmt_bytes(v.get("size_bytes")), fmt_pct(v.get("accuracy")), agree,
        ])  # fmt: skip
    title = f"{doc['model']} on {doc['target']} ({doc['device']}), backend {doc['backend']}"
    o.table(["variant", "backend", "p50 ms", "p99 ms", "speed-up", "size", "accuracy", "agreement vs fp32"], rows, title=title)
    if agreement:
        drop = s.get("accuracy_drop")
        where = f"measured on {agreement['measured_on']}" if not agreement.get("estimate", True) else f"ESTIMATED on {agreement['measured_on']}"
        o.line(
            f"agreement {where}, {agreement['samples']} held-out samples ({agreement['source']})"
            + (f"; accuracy drop {drop * 100:+.2f} points" if drop is not None else "")
        )
    rec = s.get("recommendation")
    if rec:
        o.line(f"recommended: {rec['recommended']} ({'; '.join(rec['reasons'])})")
    else:
        sentence = speed_sentence(s, len(doc["plan"]["float_nodes"]))
        if sentence:
            o.line(sentence)
    print_backend_details(o, doc["runs"])
    if doc.get("layer_error"):
        print_layer_error(o, doc["layer_error"])
    reused = [r for r in doc["runs"] if r.get("reused")]
    if reused:
        o.line(
            f"measurements reused: run(s) {', '.join(str(r['id']) for r in reused)}, measured {min(r['measured'] for r in reused)[:16].replace('T', ' ')} UTC "
            "on this device with this very bundle and settings (--remeasure to measure again)"
        )
    elif doc["runs"]:
        o.info(f"results stored as run(s) {', '.join(str(r['id']) for r in doc['runs'])}: edgekit results show ID")
    if doc["bundle"]:
        o.info(f"bundle: {doc['bundle']['path']}")


def print_runs(o: Output, doc: dict, title: str) -> None:
    """A bench's stored runs: one row per variant, then what the backend told."""
    rows = []
    for r in doc["runs"]:
        st, rss = r["stats"], r.get("peak_rss_bytes")
        rows.append([
            r["variant"], r["backend"], r["precision"], fmt_latency(st["p50"]), fmt_latency(st["p90"]), fmt_latency(st["p99"]), fmt_latency(st["mean"]),
            _rate(st["throughput"]), "" if rss is None else f"{rss / 2**20:.1f}",
        ])  # fmt: skip
    o.table(RUN_COLUMNS, rows, title=title)
    print_backend_details(o, doc["runs"])


def print_backend_details(o: Output, runs: list[dict]) -> None:
    """Load times, the devices that really ran, and the slowest layers, where the backend told them."""
    for run in runs:
        info = run.get("backend_info") or {}
        if info.get("first_load_ns") is not None:
            text = f"{run['variant']}: first load {info['first_load_ns'] / 1e6:.1f} ms"
            if info.get("cached_load_ns"):
                text += f", cached load {info['cached_load_ns'] / 1e6:.1f} ms ({info['first_load_ns'] / info['cached_load_ns']:.1f}x faster)"
            if info.get("execution_devices"):
                text += f"; executed on {', '.join(info['execution_devices'])}"
            o.line(text)
        if info.get("fallback"):
            o.warn(f"{run['variant']}: asked for {info.get('device')}, but {', '.join(info['execution_devices'])} ran it (fallback)")
        for warning in run.get("warnings") or []:
            o.warn(f"{run['variant']}: {warning}")
        layers = [x for x in run.get("layers") or [] if x.get("ns")]
        if layers:
            total = sum(x["ns"] for x in layers)
            top = sorted(layers, key=lambda x: -x["ns"])[:TOP_LAYERS]
            kernel = any(x.get("exec_type") for x in top)  # only OpenVINO names the kernel it picked
            o.table(
                ["layer", "op", *(["kernel"] if kernel else []), "us", "share"],
                [[x["name"], x["op"], *([x.get("exec_type", "")] if kernel else []), f"{x['ns'] / 1e3:.1f}", f"{x['ns'] / total * 100:.0f}%"] for x in top],
                title=f"{run['variant']}: slowest {len(top)} of {len(layers)} layers, from a separate profiled pass (its overhead included: compare shares)",
            )


def print_layer_error(o: Output, le: dict) -> None:
    """--layers error: the layers that add the most int8 error, measured on the device, beside their times."""
    from edgekit.layererror import worst

    v = le["variants"]
    names = list(v)
    rows = []
    for r in worst(le["layers"]):
        t = r.get("time_ns") or {}
        rows.append([
            r["tensor"], r["op"], "inf" if r["snr_db"] is None else f"{r['snr_db']:.1f}", f"{r['cosine']:.4f}", f"{min(r['added_nsr'], 9.99) * 100:.2f}%",
            *("-" if t.get(n) is None else f"{t[n] / 1e3:.1f}" for n in names),
        ])  # fmt: skip
    where = ", ".join(f"{n} on {v[n]['backend']}" for n in names)
    o.table(
        ["layer (tensor)", "op", "SNR dB", "cosine", "adds", *(f"{n} us" for n in names)], rows,
        title=f"per-layer int8 error measured on {le['measured_on']} ({where}; {le['samples']} held-out samples): "
        f"the {len(rows)} of {len(le['layers'])} layers that add the most noise (as a share of the signal's power)",
    )  # fmt: skip
    if le["worst"]:
        o.line(f"worst layer: {le['worst'][0]} (the int8 error grows most there; the layers after it inherit it)")
    for n in names:
        diff = v[n].get("outputs_max_abs_diff_vs_plain")
        if diff:
            o.warn(f"{n} on {v[n]['backend']}: with its tensors exposed the model's outputs differ from the plain run's by up to {diff:.4g} "
                   "(the backend computes an exposed graph differently, e.g. ONNX Runtime does not fuse a Q/DQ group whose tensor is an output)")


def _ranges(method: str, calibration: str) -> str:
    """How the activation ranges come about, for a scheme line."""
    from edgekit.quantize.calib import is_dynamic  # here: the CLI starts without the quantizer

    return "activations quantized at run time (--method dynamic: nothing calibrated)" if is_dynamic(method) else f"{method} calibration on {calibration}"


def _weights_line(scheme: dict) -> str | None:
    """What a scheme does to the weights beyond 8-bit symmetric, and why (its last note); None
    for plain 8-bit weights."""
    notes = scheme.get("notes") or []
    if scheme.get("weight_qmax", 127) < 127:
        depthwise = scheme.get("depthwise_weight_qmax")
        head = f"7-bit (|q| <= {scheme['weight_qmax']})" + (", depthwise 8-bit" if depthwise and depthwise > scheme["weight_qmax"] else "")
        return notes[-1] if notes and "7-bit" in notes[-1] else head
    if notes and notes[-1].startswith("8-bit weights: "):  # quantize_model fell back from 7-bit ones
        return notes[-1]
    return None


def print_quantize_report(o: Output, doc: dict) -> None:
    from edgekit.quantize.calib import is_dynamic

    cal = doc["calibration"]
    o.line(
        f"scheme {doc['scheme']['name']}, " + _ranges(doc["method"], f"{cal['samples']} samples from {cal['source']}")
        + (" (RANDOM: not representative)" if cal["random"] and not is_dynamic(doc["method"]) else "")
    )
    if _weights_line(doc["scheme"]):
        o.line(f"weights: {_weights_line(doc['scheme'])}")
    if doc.get("smoothed"):
        sm = doc["smoothed"]
        o.line(f"smoothed {sm['inputs']} MatMul/Gemm inputs (alpha {sm['alpha']}; {len(sm['skipped'])} candidate inputs left alone)")
    nodes = doc["nodes"]
    share = doc.get("int8_mac_share")
    o.line(
        f"nodes: {nodes.get('int8', 0)} int8, {nodes.get('fused', 0)} fused activations, "
        f"{nodes.get('passthrough', 0)} int8 pass-through, {nodes.get('float', 0)} float"
        + (f"; {fmt_pct(share)} of the MACs run int8" if share is not None else "")
    )
    agr = doc["agreement"]
    rows = [
        [out["name"], f"{out['cosine']:.5f}", "inf" if out["snr_db"] is None else f"{out['snr_db']:.1f}", f"{out['max_abs_err']:.4g}", fmt_pct(out["top1"])]
        for out in agr["outputs"]
    ]
    o.table(["output", "cosine", "SNR dB", "max abs err", "top-1 agree"], rows, title=f"fp32 vs int8 on {agr['samples']} held-out samples ({agr['source']})")
    check = doc.get("check")
    if check is not None:
        cmp = "<=" if check["metric"] == "ctc" else ">="
        verdict = "holds" if check["passed"] else "MISSED (see the warning)"
        o.line(f"check, held-out {check['metric']} ({check['why']}): {check['value']:.4g}, needs {cmp} {check['threshold']:g}: {verdict}")
    if agr.get("accuracy_fp32") is not None:
        o.line(
            f"accuracy on labels: fp32 {fmt_pct(agr['accuracy_fp32'])}, int8 {fmt_pct(agr['accuracy_int8'])} "
            f"(drop {agr['accuracy_drop'] * 100:+.2f} points)"
        )
    floats = doc.get("float_nodes", [])
    if floats:
        reasons: dict[str, list[str]] = {}
        for f in floats:
            reasons.setdefault(f"{f['op']}: {f['reason']}", []).append(f["name"])
        o.table(
            ["stays float", "nodes", "examples"],
            [[r, len(names), ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")] for r, names in reasons.items()],
        )


def print_layer_report(o: Output, doc: dict, rows: int = 20) -> None:
    """``quantize --report``: the int8 nodes, most harmful first."""
    sens, layers = doc["sensitivity"], doc["layers"]
    measured = sens["samples"] > 0

    def db(value: float | None) -> str:
        return "inf" if value is None else f"{value:.1f}"

    table = [
        [x["name"], x["op"], db(x["snr_db"])]
        + ([db(x["output_snr_db_alone"]), f"{x['output_snr_db_gain_float']:+.2f}" if x["output_snr_db_gain_float"] is not None else "inf"] if measured else [])
        + [fmt_pct(x["macs_share"])]
        for x in layers[:rows]
    ]
    head = ["node", "op", "local SNR dB"] + (["out SNR alone int8", "gain kept float dB"] if measured else []) + ["MACs"]
    where = f"{sens['samples']} held-out samples, Q/DQ reference" if measured else "local error only"
    o.table(head, table, title=f"per-layer sensitivity, most harmful first ({where}; whole int8 model: out SNR {db(sens['output_snr_db'])} dB)"
            if measured else f"per-layer sensitivity, worst local error first ({where})")
    if len(layers) > rows:
        o.line(f"... {len(layers) - rows} more int8 nodes (--json lists all)")
    for note in sens["notes"]:
        o.line(f"note: {note}")
    o.info(f"sensitivity measured in {sens['seconds']:.1f} s")


def report_fleet(o: Output, fleet: Any, *, title: str, columns: list[str], row, json_out: bool, to_json=None) -> None:
    """One row per device (or a JSON list of outcomes); then an error naming the failed devices.

    ``row(value) -> list[str]`` gives the ``columns`` of a device that succeeded.
    """
    from edgekit.devices.fleet import exit_now, workers_alive
    from edgekit.errors import DeviceError

    if json_out:
        o.json([out.to_dict(to_json) for out in fleet.outcomes])
    else:
        rows = []
        for out in fleet.outcomes:
            cells = row(out.value) if out.succeeded else ["-"] * len(columns)
            rows.append([out.device, out.status, *cells, f"{out.duration_s:.1f}s", out.error or ""])
        o.table(["device", "status", *columns, "time", "error"], rows, title=title)
        o.line(fleet.summary())
    for out in fleet.failed:
        if out.hint:
            o.info(f"[{out.device}] hint: {out.hint}")
        if out.traceback and os.environ.get("EDGEKIT_DEBUG") == "1":
            o.info(f"[{out.device}] {out.traceback}")
    if fleet.interrupted:
        busy = "; devices still busy finish their current command on their own" if workers_alive() else ""
        o.info(f"error: interrupted: {fleet.summary()}{busy}")
        exit_now(fleet.exit_code)  # worker threads may still wait on a device: don't join them
    if not fleet.ok:
        failed = ", ".join(out.device for out in fleet.failed)
        err = DeviceError(
            f"{len(fleet.failed)} of {len(fleet.outcomes)} device(s) failed: {failed}",
            "each device's error is in the table above; `edgekit devices check DEVICE` shows what a device lacks",
        )
        err.exit_code = fleet.exit_code  # the first failed device's: 4 for a device, 3 for the model...
        raise err


def fmt_latency(value: float) -> str:
    return f"{value:.3f}" if value < 10 else f"{value:.2f}" if value < 1000 else f"{value:.0f}"


def _rate(value: float) -> str:
    return f"{value:.1f}" if value < 1000 else f"{value:.0f}"
