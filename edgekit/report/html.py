"""The HTML report: one self-contained file, to be looked at rather than read.

Charts are inline SVG drawn here in Python (edgekit/report/svg.py), not a JavaScript chart
library, because:

* size: a whole report is tens of KB; inlining a chart library alone would cost 200 KB-1 MB;
* no network: nothing is fetched (no CDN, no web fonts: the system's fonts), so the file opens
  from a CI artifact, a mail or an air-gapped lab, today and in ten years;
* deterministic: the same records give the same bytes (no clock, no random ids), so two
  reports diff cleanly;
* testable: every chart is an element of the DOM with a stable id and class, checked by
  parsing the file, with no script to run.

Every string taken from a record is escaped: a record may come from an imported file.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit import __version__
from edgekit.bench.record import validate_record
from edgekit.bench.stats import Stats
from edgekit.fsutil import atomic_path
from edgekit.layererror import node_name
from edgekit.report import svg
from edgekit.report.svg import esc, num
from edgekit.sanitize import plain

# One colour per variant, the same in every chart; known names keep theirs across reports.
_KNOWN = {"fp32": "#3b6fd4", "int8": "#e8772e", "fp16": "#2e9e6a", "bf16": "#8a5cd0"}
_PALETTE = ("#3b6fd4", "#e8772e", "#2e9e6a", "#8a5cd0", "#c8407a", "#1f9fb4", "#8c6d31", "#5f6b7a")
TOP_LAYERS = 14


@dataclass(frozen=True)
class _Run:
    record: dict
    agent: dict
    variant: str
    stats: Stats
    color: str


def write_report(
    records: list[dict], path: Path, *, title: str | None = None,
    history: list[dict] | None = None, gates: list[Any] | None = None,
    problems: list[tuple[str, str, str]] | None = None,
) -> Path:  # fmt: skip
    """Write the report of ``records`` to ``path`` atomically and return ``path``.

    ``records``: results-store records (``results show --json`` / export documents), at least
    one; several models or devices are grouped. ``history``: older records; those of the same
    model, target, device and variant are drawn as a p50 line. ``gates``: GateResult objects
    or their ``to_dict()``. ``problems``: (run, outcome, reason) of runs that could not happen (a
    device unreachable, a deploy that failed); with them ``records`` may be empty. Raises
    ResultsError for a malformed record, OutputPathError when ``path`` cannot be written (nothing
    is left behind then).
    """
    text = render_report(records, title=title, history=history, gates=gates, problems=problems)
    with atomic_path(Path(path)) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def render_report(
    records: list[dict], *, title: str | None = None,
    history: list[dict] | None = None, gates: list[Any] | None = None,
    problems: list[tuple[str, str, str]] | None = None,
) -> str:  # fmt: skip
    """The report as one HTML string (see ``write_report``)."""
    checked = _unique(validate_record(r) for r in records)
    if not checked and problems:
        title = title or "edgekit report"
        return _page(title, [f'<header><h1>{esc(title)}</h1><p class="sub">no run finished</p></header>', _problems(problems), _gates(gates) if gates else ""])
    if not checked:
        raise ValueError("a report needs at least one record")
    colors: dict[str, str] = {}
    for name in dict.fromkeys(r["agent"]["variant"] for r in checked):
        want = _KNOWN.get(name)
        if want is None or want in colors.values():  # unknown names take the known names' colours last
            free = sorted((c for c in _PALETTE if c not in colors.values()), key=lambda c: c in _KNOWN.values())
            want = free[0] if free else _PALETTE[len(colors) % len(_PALETTE)]
        colors[name] = want
    runs = [_Run(r, r["agent"], r["agent"]["variant"], Stats.of_record(r), colors[r["agent"]["variant"]]) for r in checked]
    groups: dict[tuple[str, str, str], list[_Run]] = {}
    for run in runs:
        groups.setdefault(_key(run.record), []).append(run)
    unit, scale = _unit(max(r.stats.p50 for r in runs))
    older = _unique(validate_record(r) for r in history or [])
    first = runs[0].record
    title = title or (
        f"{first['model_name']} on {first['target']}" if len(groups) == 1 else f"edgekit report: {len(groups)} model/device pairs"
    )
    body = [_header(title, runs), _problems(problems or []), _summary(groups, gates or [], unit, scale, len(groups) > 1)]
    for k, (key, group) in enumerate(groups.items()):
        sfx = "" if k == 0 else f"-{k + 1}"
        if len(groups) > 1:
            body.append(f'<h2 class="group-title" id="group{sfx or "-1"}">{esc(key[0])} on {esc(key[1])} ({esc(key[2])})</h2>')
        body += [
            _comparison(group, unit, scale, sfx),
            _distribution(group, unit, scale, sfx),
            _timeline(group, unit, scale, sfx),
            _layers(group, sfx),
            _history(group, [r for r in older if _key(r) == key], unit, scale, sfx),
            _device(group, sfx),
        ]
    return _page(title, body)


# -- sections ---------------------------------------------------------------------------------
def _header(title: str, runs: list[_Run]) -> str:
    rec = runs[0].record
    when = sorted(r.record["created"] for r in runs)[-1]
    facts = [f"{rec['target']} / {rec['device']}", f"{_when(when)} UTC"]
    vcs = rec.get("vcs") if isinstance(rec.get("vcs"), dict) else {}
    if isinstance(vcs.get("branch"), str) or isinstance(vcs.get("commit"), str):
        facts.append(f"{vcs.get('branch') or '?'} @ {str(vcs.get('commit') or '?')[:10]}")
    ids = [str(r.record["id"]) for r in runs if isinstance(r.record.get("id"), int)]
    if ids:
        facts.append("run " + ", ".join(ids))
    links = "".join(
        f'<a href="#{a}">{t}</a>'
        for a, t in (("summary", "Summary"), ("comparison", "Variants"), ("distribution", "Distribution"),
                     ("timeline", "Timeline"), ("layers", "Layers"), ("history", "History"), ("device", "Device"))
    )  # fmt: skip
    return (
        f'<header><h1>{esc(title)}</h1><p class="sub">{" · ".join(esc(f) for f in facts)}</p>'
        f"<nav>{links}</nav></header>"
    )


def _summary(groups: dict, gates: list[Any], unit: str, scale: float, many: bool) -> str:
    out = ['<section id="summary"><h2>Summary</h2>']
    if gates:
        out.append(_gates(gates))
    for key, group in groups.items():
        if many:
            out.append(f"<h3>{esc(key[0])} on {esc(key[1])} ({esc(key[2])})</h3>")
        rec = next((r.record["recommendation"] for r in group if isinstance(r.record.get("recommendation"), dict)), None)
        if rec:
            reasons = [x for x in rec.get("reasons") or [] if isinstance(x, str)]
            out.append(
                f'<div class="verdict"><div class="verdict-head">Recommended: <b>{esc(rec.get("recommended"))}</b></div>'
                f"<ul>{''.join(f'<li>{esc(x)}</li>' for x in reasons)}</ul></div>"
            )
        else:
            best = min(group, key=lambda r: r.stats.p50)
            out.append(f'<div class="verdict neutral">Fastest at p50: <b>{esc(best.variant)}</b> ({esc(best.agent["backend"])})</div>')
        base = _baseline(group)
        tiles = []
        for r in group:
            extra = []
            if base and r is not base:
                extra.append(f"{base.stats.p50 / r.stats.p50:.2f}× {esc(base.variant)}")
            acc = _accuracy(group).get(r.variant)
            if acc is not None:
                extra.append(f"accuracy {acc * 100:.2f}%")
            tiles.append(
                f'<div class="tile" style="--c:{r.color}"><div class="tile-head">{esc(r.variant)} '
                f'<span class="muted">{esc(r.agent["backend"])}</span></div>'
                f'<div class="big">{num(r.stats.p50 * scale)} <small>{unit} p50</small></div>'
                f'<div class="muted">p99 {num(r.stats.p99 * scale)} {unit} · {num(r.stats.throughput)} inf/s · n={r.stats.n}</div>'
                + (f'<div class="muted">{" · ".join(extra)}</div>' if extra else "")
                + "</div>"
            )
        out.append(f'<div class="tiles">{"".join(tiles)}</div>')
    out.append("</section>")
    return "".join(out)


def _problems(problems: list[tuple[str, str, str]]) -> str:
    """The runs that could not happen, each with its reason (device text, made plain)."""
    if not problems:
        return ""
    items = "".join(
        f'<li class="gate error"><span class="badge">{esc(outcome)}</span><span class="muted">{esc(plain(run))}</span> {esc(plain(reason))}</li>'
        for run, outcome, reason in problems
    )
    return f'<div class="gates"><div class="gates-head fail">{len(problems)} run(s) did not finish</div><ul>{items}</ul></div>'


_GATE_BADGE = {"pass": "pass", "fail": "FAIL", "inconclusive": "inconclusive", "none": "no baseline"}


def _gates(gates: list[Any]) -> str:
    items, count = [], dict.fromkeys(_GATE_BADGE, 0)
    for g in gates:
        d = g.to_dict() if hasattr(g, "to_dict") else g if isinstance(g, dict) else {"line": str(g)}
        status = d.get("status")
        passed = d.get("passed")
        state = status if status in ("pass", "fail", "inconclusive") else "pass" if passed is True else "fail" if passed is False else "none"
        count[state] += 1
        where = " · ".join(str(d[k]) for k in ("model", "target", "device", "variant") if isinstance(d.get(k), str))
        items.append(
            f'<li class="gate {state}"><span class="badge">{_GATE_BADGE[state]}</span>'
            + (f'<span class="muted">{esc(plain(where))}</span> ' if where else "")
            + f"{esc(plain(d.get('line') or _gate_text(d)))}</li>"
        )
    head = f"{count['pass']} of {len(gates)} gates pass"
    head += (f", {count['fail']} FAIL" if count["fail"] else "") + (f", {count['inconclusive']} inconclusive" if count["inconclusive"] else "")
    head += f", {count['none']} without a baseline yet" if count["none"] else ""
    return f'<div class="gates"><div class="gates-head {"fail" if count["fail"] else "pass"}">{head}</div><ul>{"".join(items)}</ul></div>'


def _gate_text(d: dict) -> str:
    gate = d.get("gate")
    return str(gate.get("text") if isinstance(gate, dict) else gate)


def _comparison(group: list[_Run], unit: str, scale: float, sfx: str) -> str:
    base = _baseline(group)
    bars = []
    for r in group:
        note = f"p50 {num(r.stats.p50 * scale)} · p99 {num(r.stats.p99 * scale)} {unit}"
        if base and r is not base:
            note += f" · {base.stats.p50 / r.stats.p50:.2f}× {base.variant}"
        bars.append(svg.Bar(r.variant, f"{r.agent['backend']} {r.agent['precision']}", r.stats.p50 * scale,
                            r.stats.p99 * scale, r.color, note, f"{r.variant}: {note}"))  # fmt: skip
    chart = svg.bars(f"chart-compare{sfx}", bars, unit=unit, label="p50 latency per variant, whiskers to p99",
                     axis=f"latency ({unit}): bar p50, whisker p99")  # fmt: skip
    rows = []
    for r in group:
        a, st = r.agent, r.stats
        energy = a.get("energy") if isinstance(a.get("energy"), dict) else {}
        cells = [
            f'<span class="swatch" style="--c:{r.color}"></span>{esc(r.variant)}',
            esc(a["backend"] + (f" {a['backend_version']}" if isinstance(a.get("backend_version"), str) else "")),
            esc(a["precision"]), str(st.n), *(num(getattr(st, f) * scale) for f in ("p50", "p90", "p99", "mean")),
            num(st.throughput), _ns(a.get("load_ns")), _mib(a.get("peak_rss_bytes")), _opt(energy.get("mj_per_inference")),
        ]  # fmt: skip
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    heads = ["variant", "backend", "precision", "n", f"p50 {unit}", f"p90 {unit}", f"p99 {unit}", f"mean {unit}",
             "inf/s", "load ms", "peak RSS MiB", "mJ/inf"]  # fmt: skip
    table = f'<table class="runs"><tr>{"".join(f"<th>{h}</th>" for h in heads)}</tr>{"".join(rows)}</table>'
    return (
        f'<section id="comparison{sfx}"><h2>Variants and backends</h2>{chart}{_agreement(group)}'
        f'<div class="scroll">{table}</div></section>'
    )


def _agreement(group: list[_Run]) -> str:
    out = []
    for r in group:
        agr = r.record.get("agreement")
        if not isinstance(agr, dict):
            continue
        fp, q, drop = (_f(agr.get(k)) for k in ("accuracy_fp32", "accuracy_int8", "accuracy_drop"))
        lines = []
        if fp is not None and q is not None:
            lines.append(
                f"<p>Accuracy on {esc(agr.get('samples', '?'))} labelled held-out samples: float <b>{fp * 100:.2f}%</b>, "
                f"{esc(r.variant)} <b>{q * 100:.2f}%</b>" + (f" (drop {drop * 100:+.2f} points)" if drop is not None else "") + ".</p>"
            )
        rows = []
        for o in agr.get("outputs") or []:
            if isinstance(o, dict):
                cells = [esc(o.get("name")), _opt(o.get("cosine"), ".5f"), _opt(o.get("snr_db"), ".1f"),
                         _opt(o.get("max_abs_err"), ".4g"), _pct(o.get("top1"))]  # fmt: skip
                rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
        if rows:
            lines.append(
                '<table class="agreement"><tr><th>output</th><th>cosine</th><th>SNR dB</th><th>max abs err</th>'
                f'<th>top-1 agreement</th></tr>{"".join(rows)}</table>'
            )
        where = "estimated" if agr.get("estimate") else "measured"
        lines.append(f'<p class="caption">{esc(r.variant)} vs float, {where} on {esc(agr.get("measured_on", "?"))}; data {esc(agr.get("source", "?"))}.</p>')
        out.append(f'<div class="agreement-block"><h3>Agreement: {esc(r.variant)} vs float</h3>{"".join(lines)}</div>')
    return "".join(out)


def _distribution(group: list[_Run], unit: str, scale: float, sfx: str) -> str:
    every = [s * scale / 1e6 for r in group for s in r.agent["samples_ns"]]
    log = svg.use_log(every)
    charts = []
    for r in group:
        values = [s * scale / 1e6 for s in r.agent["samples_ns"]]
        chart = svg.histogram(
            f"chart-latency-{_slug(r.variant)}{sfx}", values, domain=(min(every), max(every)), log=log, color=r.color,
            unit=unit, markers=[(r.stats.p50 * scale, "p50"), (r.stats.p99 * scale, "p99")],
            label=f"latency distribution of {r.variant}",
        )  # fmt: skip
        caption = (f"{r.stats.n} timed samples · min {num(r.stats.min * scale)} · p50 {num(r.stats.p50 * scale)} · "
                   f"p99 {num(r.stats.p99 * scale)} · max {num(r.stats.max * scale)} {unit}")  # fmt: skip
        charts.append(_figure(r, chart, caption))
    note = "Same axis for every variant" + (": log scale, so a long tail stays readable." if log else ".")
    return f'<section id="distribution{sfx}"><h2>Latency distribution</h2><p class="caption">{note}</p>{"".join(charts)}</section>'


def _timeline(group: list[_Run], unit: str, scale: float, sfx: str) -> str:
    charts = []
    for r in group:
        warm = r.agent.get("warmup_samples_ns") or []  # validate_record: positive integers or null
        start, end, alert, notes = _state(r.agent)
        chart = svg.timeline(
            f"chart-timeline-{_slug(r.variant)}{sfx}", [s * scale / 1e6 for s in warm],
            [s * scale / 1e6 for s in r.agent["samples_ns"]], color=r.color, unit=unit, p50=r.stats.p50 * scale,
            label=f"latency per iteration of {r.variant}", start_note=start, end_note=end, alert=alert,
        )  # fmt: skip
        config = r.agent["config"]
        mode = f" ({config['warmup_mode']})" if isinstance(config.get("warmup_mode"), str) else ""
        head = f"{len(warm)} warm-up{mode}, then {r.stats.n} timed iterations" if warm else f"{r.stats.n} timed iterations (warm-up samples not recorded)"
        charts.append(_figure(r, chart, " · ".join([head, *notes])))
    return f'<section id="timeline{sfx}"><h2>Per-iteration timeline</h2>{"".join(charts)}</section>'


def _state(agent: dict) -> tuple[str, str, str, list[str]]:
    """(start note, end note, throttling alert, caption lines) from the optional device_state."""
    ds = agent.get("device_state") if isinstance(agent.get("device_state"), dict) else {}
    before, after = (ds.get(k) if isinstance(ds.get(k), dict) else {} for k in ("before", "after"))
    t0, t1 = _f(before.get("temp_c")), _f(after.get("temp_c"))
    start = f"{t0:.1f} °C at start" if t0 is not None else ""
    end = f"{t1:.1f} °C at end" if t1 is not None else ""
    notes, alert = [], ""
    gov = [g for g in (before.get("governor"), after.get("governor")) if isinstance(g, str)]
    if gov:
        notes.append("governor " + " → ".join(dict.fromkeys(gov)))
    freq0, freq1 = (s.get("freq_mhz") if isinstance(s.get("freq_mhz"), dict) else {} for s in (before, after))
    fmax = after.get("freq_max_mhz") if isinstance(after.get("freq_max_mhz"), dict) else {}
    clocks, slow = [], []
    for cpu in list(freq1)[:8]:
        a, b, m = _f(freq0.get(cpu)), _f(freq1.get(cpu)), _f(fmax.get(cpu))
        if b is not None:
            clocks.append(f"{cpu} {'' if a is None else f'{a:.0f} → '}{b:.0f}" + (f"/{m:.0f}" if m else ""))
            if m and b < 0.9 * m:
                slow.append(cpu)
    if clocks:
        notes.append("MHz " + ", ".join(clocks))
    zones0, zones1 = (s.get("thermal") if isinstance(s.get("thermal"), dict) else {} for s in (before, after))
    zones = [f"{z} {_opt(zones0.get(z), '.1f')} → {_opt(t, '.1f')} °C" for z, t in list(zones1.items())[:6] if _f(t) is not None]
    if zones:
        notes.append("thermal " + ", ".join(zones))
    th0, th1 = (s.get("throttled") if isinstance(s.get("throttled"), dict) else {} for s in (before, after))
    if th1.get("now") or th0.get("now") or (th1.get("ever") and not th0.get("ever")):
        detail = th1.get("detail") or th0.get("detail") or ""
        alert = f"THROTTLED ({th1.get('source') or th0.get('source') or 'device'}{': ' + str(detail) if detail else ''})"
    elif th1.get("ever"):
        notes.append(f"throttled earlier since boot ({th1.get('source')}), not during this run")
    elif th1:
        notes.append(f"not throttled ({th1.get('source')})")
    if slow and not alert:
        alert = f"clock below 90% of max at end: {', '.join(slow)}"
    energy = agent.get("energy") if isinstance(agent.get("energy"), dict) else {}
    if _f(energy.get("mj_per_inference")) is not None:
        notes.append(f"energy {_opt(energy['mj_per_inference'])} mJ per inference ({energy.get('source')})")
    return start, end, alert, notes


def _layers(group: list[_Run], sfx: str) -> str:
    charts = []
    for r in group:
        timed = [x for x in r.agent.get("layers") or [] if isinstance(x, dict) and (_f(x.get("ns")) or 0) > 0]
        if not timed:
            continue
        quant = r.record.get("quantization") if isinstance(r.record.get("quantization"), dict) else {}
        device = r.record.get("layer_error") if isinstance(r.record.get("layer_error"), dict) else {}
        if device.get("layers"):  # --layers error: measured on the device, per region of nodes
            snr, noise = {}, {}
            for row in device["layers"]:
                if not isinstance(row, dict):
                    continue
                for node in row.get("nodes") or []:
                    snr[str(node)] = _f(row.get("snr_db"))
                    noise[str(node)] = max(_f(row.get("added_nsr")) or 0.0, 0.0)  # the noise this layer adds
            timed = [{**x, "name": node_name(str(x.get("name")), snr)} for x in timed]
        else:
            snr = {q.get("name"): _f(q.get("snr_db")) for q in quant.get("layers") or [] if isinstance(q, dict)}
            noise = {name: 10 ** (-db / 10) for name, db in snr.items() if db is not None}  # noise/signal power
        total_noise = sum(noise.values()) or 1.0
        total = sum(float(x["ns"]) for x in timed)
        timed.sort(key=lambda x: -float(x["ns"]))
        rows, joined, wide = [], 0, []
        for x in timed[:TOP_LAYERS]:
            name = str(x.get("name"))
            hit = name in snr and snr[name] is not None
            joined += hit
            spread = layer_spread(x)
            if spread is not None and spread > WIDE_SPREAD:
                wide.append(f"{name} ({spread * 100:.0f}%)")
            shown = f"{name} ⚠ spread {spread * 100:.0f}%" if spread is not None and spread > WIDE_SPREAD else name
            rows.append(svg.LayerRow(shown, str(x.get("op") or ""), float(x["ns"]) / total, float(x["ns"]),
                                     noise[name] / total_noise if hit else None, snr[name] if hit else None))  # fmt: skip
        rest = timed[TOP_LAYERS:]
        if rest:
            ns = sum(float(x["ns"]) for x in rest)
            rows.append(svg.LayerRow(f"{len(rest)} other layers", "", ns / total, ns, None, None))
        top = rows[0]
        sentence = f"{top.name} costs {top.time_share * 100:.0f}% of the time"
        if top.error_share is not None:
            sentence += f" and adds {top.error_share * 100:.0f}% of the int8 error (SNR {top.snr_db:.1f} dB at its output)"
        if device.get("layers"):
            worst = ", ".join(str(w) for w in (device.get("worst") or [])[:3])
            how = (f"the error is the int8 tensor against the fp32 one as the device computed them ({device.get('samples')} held-out samples on "
                   f"{device.get('measured_on')}), each layer's share of the noise it adds; {joined} of the {min(len(timed), TOP_LAYERS)} layers shown joined by name; "
                   f"most added error: {worst}")  # fmt: skip
        elif snr:
            how = f"{joined} of the {min(len(timed), TOP_LAYERS)} layers shown have the quantizer's error measured (joined by name)"
        else:
            how = "no per-layer quantization error in this record"
        caption = f"{sentence}. {num(total / 1e3)} µs per inference over {len(timed)} timed layers (each its median over the profiled runs); {how}."
        if wide:
            caption += (f" Marked ⚠: {len(wide)} layer(s) whose time varied widely between the profiled runs (interquartile range over "
                        f"{WIDE_SPREAD * 100:.0f}% of the median; another process, a frequency change): {', '.join(wide)}; rank them with care.")
        chart = svg.layers(f"chart-layers-{_slug(r.variant)}{sfx}", rows, color=r.color, label=f"per-layer time of {r.variant}")
        charts.append(_figure(r, chart, caption))
    if not charts:
        charts.append('<p class="caption">No backend reported a per-layer profile for these runs.</p>')
    return f'<section id="layers{sfx}"><h2>Per-layer time and error</h2>{"".join(charts)}</section>'


WIDE_SPREAD = 0.5  # a layer's interquartile range over this share of its median: its time is not to be ranked on


def layer_spread(layer: dict) -> float | None:
    """A layer's interquartile range over the profiled runs, relative to its median (None: not reported)."""
    lo, hi, mid = _f(layer.get("ns_p25")), _f(layer.get("ns_p75")), _f(layer.get("ns"))
    return None if lo is None or hi is None or not mid else (hi - lo) / mid


def _history(group: list[_Run], older: list[dict], unit: str, scale: float, sfx: str) -> str:
    series, first, last = [], None, None
    for r in group:
        mine = sorted(
            [h for h in older if h["agent"]["variant"] == r.variant and h["run_uuid"] != r.record["run_uuid"]] + [r.record],
            key=lambda h: h["created"],
        )
        points = []
        for h in mine:
            st = Stats.of_record(h)
            vcs = h.get("vcs") if isinstance(h.get("vcs"), dict) else {}
            tag = " ".join(str(v)[:10] for v in (vcs.get("branch"), vcs.get("commit")) if isinstance(v, str))
            tip = f"{_when(h['created'])} UTC" + (f" · run {h['id']}" if "id" in h else "") + (f" · {tag}" if tag else "")
            tip += f" · p50 {num(st.p50 * scale)} {unit}, p99 {num(st.p99 * scale)} {unit}"
            points.append((st.p50 * scale, st.p99 * scale, tip, h is r.record))
        first = min(first or mine[0]["created"], mine[0]["created"])
        last = max(last or mine[-1]["created"], mine[-1]["created"])
        series.append(svg.Series(r.variant, r.color, points))
    if max(len(s.points) for s in series) < 2:
        inner = '<p class="caption">No earlier runs of this model on this device and target yet: the history starts here.</p>'
    else:
        chart = svg.history(f"chart-history{sfx}", series, unit=unit, label="p50 over the last runs",
                            first=_when(first)[:10], last=_when(last)[:10])  # fmt: skip
        counts = ", ".join(f"{s.name}: {len(s.points)} runs" for s in series)
        inner = f'{chart}<p class="caption">{esc(counts)}; solid p50, dotted p99; ringed: this report\'s runs.</p>'
    return f'<section id="history{sfx}"><h2>History</h2>{inner}</section>'


def _device(group: list[_Run], sfx: str) -> str:
    device = group[0].agent["device"]
    rows: list[tuple[str, str]] = []
    for key, value in device.items():
        if key == "memory_bytes":
            rows.append(("memory", _gib(value)))
        elif isinstance(value, dict):
            found = ", ".join(f"{k} {v}" for k, v in value.items() if v is not None and not isinstance(v, (dict, list)))
            if found:
                rows.append((key, found))
        elif isinstance(value, list):
            rows.append((key, " ".join(map(str, value))))
        elif value is not None:
            rows.append((key, str(value)))
    rec = group[0].record
    rows += [("target profile", rec["target"]), ("device name", rec["device"])]
    bundle = group[0].agent.get("bundle_hash")
    if isinstance(bundle, str):
        rows.append(("bundle", bundle[:16]))
    cells = "".join(f"<tr><th>{esc(k.replace('_', ' '))}</th><td>{esc(v)}</td></tr>" for k, v in rows)
    return f'<section id="device{sfx}"><h2>Device</h2><table class="facts">{cells}</table></section>'


# -- helpers ----------------------------------------------------------------------------------
def _figure(r: _Run, chart: str, caption: str) -> str:
    return (
        f'<figure><figcaption><span class="swatch" style="--c:{r.color}"></span><b>{esc(r.variant)}</b> '
        f'<span class="muted">{esc(r.agent["backend"])}</span></figcaption>{chart}<p class="caption">{esc(caption)}</p></figure>'
    )


def _unique(records: Iterable[dict]) -> list[dict]:
    seen: dict[str, dict] = {}
    for r in records:
        seen.setdefault(r["run_uuid"], r)
    return list(seen.values())


def _key(record: dict) -> tuple[str, str, str]:
    return record["model_name"], record["target"], record["device"]


def _baseline(group: list[_Run]) -> _Run | None:
    """The float variant the others are compared with: fp32 by name, else the first float one."""
    floats = [r for r in group if r.variant == "fp32"] or [r for r in group if r.agent["precision"] in ("fp32", "float32")]
    return floats[0] if floats and len(group) > 1 else None


def _accuracy(group: list[_Run]) -> dict[str, float]:
    """Accuracy on labels per variant, from the agreement reports (float's is in each of them)."""
    out: dict[str, float] = {}
    base = _baseline(group)
    for r in group:
        agr = r.record.get("agreement") if isinstance(r.record.get("agreement"), dict) else {}
        if _f(agr.get("accuracy_int8")) is not None:
            out[r.variant] = float(agr["accuracy_int8"])
        if base and _f(agr.get("accuracy_fp32")) is not None:
            out.setdefault(base.variant, float(agr["accuracy_fp32"]))
    return out


def _unit(ms: float) -> tuple[str, float]:
    """One unit for the whole report, picked so typical latencies read as 1-1000."""
    if ms < 1:
        return "µs", 1000.0
    return ("ms", 1.0) if ms < 1000 else ("s", 0.001)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-") or "x"


def _f(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _opt(value: Any, fmt: str = "") -> str:
    v = _f(value)
    return "-" if v is None else format(v, fmt) if fmt else num(v)


def _shown(show: Callable[[float], str]) -> Callable[[Any], str]:
    """A cell formatter: ``show`` of a finite number, "-" for anything else."""
    return lambda value: "-" if (v := _f(value)) is None else show(v)


_pct = _shown(lambda v: f"{v * 100:.1f}%")
_ns = _shown(lambda v: num(v / 1e6))
_mib = _shown(lambda v: f"{v / 2**20:.1f}")
_gib = _shown(lambda v: f"{v / 2**30:.1f} GiB")


def _when(created: str) -> str:
    return created[:16].replace("T", " ")


def _page(title: str, body: Sequence[str]) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body><main>{''.join(body)}"
        f'<footer>edgekit {esc(__version__)} · one self-contained file: inline CSS and SVG, no scripts, nothing fetched</footer>'
        "</main></body></html>\n"
    )


_CSS = """
:root{--ink:#1f2937;--muted:#6b7280;--line:#e5e7eb;--bg:#f6f7f9;--ok:#15803d;--bad:#b91c1c}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);
 font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
main{max-width:1040px;margin:0 auto;padding:28px 24px 40px}
header h1{font-size:26px;font-weight:650;margin:0;letter-spacing:-.01em}
.sub,.muted,.caption{color:var(--muted)}
.sub{margin:2px 0 10px}
nav a{color:var(--muted);text-decoration:none;margin-right:16px;font-size:13px;border-bottom:1px dotted #c3c8d0}
section{background:#fff;border:1px solid var(--line);border-radius:12px;padding:18px 22px;margin:18px 0;
 box-shadow:0 1px 2px rgba(16,24,40,.04)}
h2{font-size:18px;font-weight:650;margin:0 0 12px}
h2.group-title{margin:34px 0 0;font-size:21px}
h3{font-size:12px;margin:18px 0 6px;color:var(--muted);text-transform:uppercase;letter-spacing:.06em}
.verdict{border-left:4px solid var(--ok);background:#f0fdf4;padding:10px 16px;border-radius:8px;margin:0 0 14px}
.verdict.neutral{border-color:#9ca3af;background:#f9fafb}
.verdict-head{font-size:17px}
.verdict ul{margin:4px 0 0;padding-left:20px}
.tiles{display:grid;grid-template-columns:repeat(auto-fill,minmax(280px,1fr));gap:12px}
.tile{border:1px solid var(--line);border-top:4px solid var(--c);border-radius:10px;padding:10px 14px;font-size:13px}
.tile-head{font-weight:600;font-size:14px}
.big{font-size:28px;font-weight:650;font-variant-numeric:tabular-nums;line-height:1.3}
.big small{font-size:13px;font-weight:400;color:var(--muted)}
.gates{margin:0 0 16px}
.gates-head{font-weight:650;margin-bottom:4px}
.gates-head.fail{color:var(--bad)}.gates-head.pass{color:var(--ok)}
.gates ul{list-style:none;margin:0;padding:0}
.gate{padding:4px 0;border-bottom:1px solid var(--line);font-variant-numeric:tabular-nums}
.badge{display:inline-block;min-width:88px;text-align:center;font-size:11px;font-weight:700;text-transform:uppercase;
 border-radius:999px;padding:1px 8px;margin-right:10px;color:#fff;background:#9ca3af}
.gate.pass .badge{background:var(--ok)}.gate.fail .badge,.gate.error .badge{background:var(--bad)}
.gate.fail,.gate.error{color:var(--bad)}.gate.inconclusive .badge{background:#b45309}
figure{margin:14px 0 18px}
figcaption{font-size:14px;margin-bottom:2px}
.caption{font-size:13px;margin:4px 0 0}
.swatch{display:inline-block;width:10px;height:10px;border-radius:3px;background:var(--c);margin-right:6px}
svg.chart{display:block;width:100%;height:auto}
svg.chart text{font:11px system-ui,-apple-system,"Segoe UI",Roboto,Arial,sans-serif;fill:#4b5563}
svg.chart text.axis-label,svg.chart text.col-head{fill:#6b7280;font-size:11.5px}
svg.chart text.marker-label,svg.chart text.bar-label{font-weight:600}
svg.chart text.marker-label,svg.chart text.state,svg.chart text.alert{paint-order:stroke;stroke:#fff;stroke-width:3px;stroke-linejoin:round}
svg.chart text.alert{font-weight:700}
.scroll{overflow-x:auto}
table{border-collapse:collapse;width:100%;font-size:13px;font-variant-numeric:tabular-nums;margin:8px 0}
th,td{text-align:left;padding:5px 10px 5px 0;border-bottom:1px solid var(--line);white-space:nowrap}
th{font-weight:600;color:var(--muted)}
table.facts th{width:200px}table.facts td{white-space:normal}
.agreement-block p{margin:4px 0}
footer{color:var(--muted);font-size:12px;text-align:center;margin-top:24px}
@media print{body{background:#fff}section{box-shadow:none;break-inside:avoid}}
"""
