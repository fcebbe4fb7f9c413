"""`edgekit results`: list, show, export, import, compare and pin stored benchmark runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from edgekit.bench.record import measurement_warnings, round_p50s_ns
from edgekit.bench.stats import STAT_FIELDS
from edgekit.bench.store import ResultsStore
from edgekit.cli import common
from edgekit.cli.output import Output
from edgekit.errors import ResultsError, UsageError
from edgekit.fsutil import atomic_path, check_output_path
from edgekit.jsonable import strict_loads

app = typer.Typer(
    name="results",
    help="Stored benchmark runs: list, show, export, import, compare, pin.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@app.command("list")
def list_(
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="Show at most N runs.")] = 50,
    model: Annotated[str | None, typer.Option("--model", help="Only runs of this model name.")] = None,
    target: Annotated[str | None, typer.Option("--target", help="Only runs on this target profile.")] = None,
    device: Annotated[str | None, typer.Option("--device", help="Only runs on this device.")] = None,
    variant: Annotated[str | None, typer.Option("--variant", help="Only this variant (int8, fp16...).")] = None,
    branch: Annotated[str | None, typer.Option("--branch", help="Only runs made on this branch (CI's, or the checkout's).")] = None,
    json_: common.Json = False,
) -> None:
    """List stored benchmark runs, newest first.

    \b
    Examples:
      edgekit results list
      edgekit results list --target rpi5 --model resnet18 -n 5 --json
      edgekit results list --branch main
    """
    out = Output()
    filters = {"model": model, "target": target, "device": device, "variant": variant, "branch": branch}
    with ResultsStore() as store:
        rows = store.list(limit=limit, **filters)
        _warn_damage(out, store)
    if not rows:
        given = ", ".join(f"--{k} {v}" for k, v in filters.items() if v is not None)
        out.info(
            f"no results match {given}; see all runs with: edgekit results list"
            if given
            else "no results yet; run `edgekit deploy MODEL --target TARGET` (or `edgekit bench`) to record one"
        )
    if json_:
        out.json(rows)
        return
    if rows:
        out.table(
            ["id", "created (UTC)", "model", "target", "device", "variant", "backend",
             "p50 ms", "p99 ms", "n", "bundle"],
            [
                [r["id"], _when(r["created"])[:16], r["model_name"], r["target"], r["device"],
                 r["variant"], r["backend"], _ms(r["p50"]), _ms(r["p99"]), r["n"],
                 (r["bundle_hash"] or "")[:8]]
                for r in rows
            ],
        )  # fmt: skip


@app.command("show")
def show(
    run_id: Annotated[
        int, typer.Argument(metavar="ID", help="Run id, as printed by `edgekit results list`.")
    ],
    json_: common.Json = False,
    samples: Annotated[bool, typer.Option("--samples", help="With --json: include the raw per-iteration samples (left out by default).")] = False,
) -> None:
    """Show one run: latency statistics, device, configuration, backend, bundle and gate outcome.

    \b
    Examples:
      edgekit results show 12
      edgekit results show 12 --json > run12.json
      edgekit results show 12 --json --samples > run12-full.json
    """
    out = Output()
    with ResultsStore() as store:
        record = store.get(run_id)
        _warn_damage(out, store)
    if json_:
        if not samples:  # tens of thousands of numbers nobody reads in a terminal: counted, not printed
            agent = dict(record["agent"])
            for key in ("samples_ns", "warmup_samples_ns"):
                if isinstance(agent.get(key), list):
                    agent[key + "_count"] = len(agent.pop(key))
            record = {**record, "agent": agent}
        out.json(record)
        return
    agent, stats = record["agent"], record["stats"]
    config = agent["config"]
    out.table(
        [*(f"{f} ms" for f in STAT_FIELDS), "throughput /s"],
        [[*(_ms(stats[f]) for f in STAT_FIELDS), f"{stats['throughput']:.1f}"]],
        title=f"run {record['id']}: {stats['n']} samples, batch {config['batch']}",
    )
    for warning in measurement_warnings(agent):
        out.warn(warning)
    lock = record.get("lock")
    if isinstance(lock, dict) and lock.get("broke"):  # measured right after breaking a dead job's lock
        ended = lock.get("ended") or []
        out.line(f"lock: broke the stale lock of {lock['broke']}" + (f" ({lock['why']})" if lock.get("why") else "")
                 + (f"; ended {len(ended)} of its processes first" if ended else ""))
    out.line()
    backend = agent["backend"] + (
        f" {agent['backend_version']}" if agent.get("backend_version") else ""
    )
    run_rows = [
        ("run uuid", record["run_uuid"]),
        ("gates", record.get("outcome") or "not gated"),
        ("created (UTC)", _when(record["created"])),
        ("model", record["model_name"] + (f" ({agent['model']})" if agent.get("model") else "")),
        ("model sha256", agent.get("model_sha256")),
        ("target", record["target"]),
        ("device", record["device"]),
        ("variant", agent["variant"]),
        ("backend", backend),
        ("precision", agent["precision"]),
        ("bundle hash", agent.get("bundle_hash")),
        ("load time", _ns_ms(agent.get("load_ns"))),
        ("first inference", _ns_ms(agent.get("first_inference_ns"))),
        ("peak RSS", _bytes(agent.get("peak_rss_bytes"))),
        ("agent version", agent.get("agent_version")),
        *((key, _text(value)) for key, value in record.items() if key not in _RECORD_KEYS),
    ]
    out.table(["run", ""], _present(run_rows))
    out.line()
    out.table(["config", ""], _present((key, _text(value)) for key, value in config.items()))
    out.line()
    out.table(["device", ""], _present(_device_rows(agent)))


@app.command("export")
def export(
    ids: Annotated[
        list[int] | None, typer.Argument(metavar="ID", help="Run ids to export (default: all).")
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="Write the document to this file (atomically) instead of stdout."
        ),
    ] = None,
) -> None:
    """Export runs (raw samples included) as one JSON document for `edgekit results import`.

    \b
    Examples:
      edgekit results export -o lab-results.json
      edgekit results export 3 4 7 > three-runs.json
    """
    out = Output()
    if output is not None:
        check_output_path(output)
    with ResultsStore() as store:
        document = store.export(ids or None)
        _warn_damage(out, store)
    if store.skipped:
        out.warn(f"{len(store.skipped)} damaged run(s) could not be read and are not in the export: ids {', '.join(map(str, store.skipped))}")
    if output is None:
        out.json(document)
        return
    with atomic_path(output) as tmp:
        tmp.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    out.info(f"exported {_runs(len(document['records']))} to {output}")


@app.command("import")
def import_(
    file: Annotated[
        str,
        typer.Argument(
            metavar="FILE", help="A file from `edgekit results export`, or - for stdin."
        ),
    ],
    json_: common.Json = False,
) -> None:
    """Import runs from an export file; runs already in the store are skipped.

    All or nothing: if any record is malformed, nothing is imported.

    \b
    Examples:
      edgekit results import lab-results.json
      ssh pi@10.0.0.7 edgekit results export | edgekit results import -
    """
    _import(_read_json(file), json_)


@app.command("import-lava")
def import_lava(
    files: Annotated[
        list[Path],
        typer.Argument(metavar="FILE...", help="The job's log (lavacli jobs logs JOB --raw) and, to check against, its results (lavacli results JOB --yaml).", show_default=False),
    ],
    json_: common.Json = False,
) -> None:
    """Import the runs of a finished LAVA job written by `edgekit lava-job`.

    The raw samples travel in the job's log; LAVA's results file, when given, is checked
    against them. Importing the same job again skips its runs.

    \b
    Example:
      lavacli jobs logs 4211 --raw > log.yaml; lavacli results 4211 --yaml > results.yaml
      edgekit results import-lava log.yaml results.yaml
    """
    from edgekit.lava import import_documents

    _import(import_documents(list(files)), json_)


def _import(document: Any, json_: bool) -> None:
    """Add an export document's runs to the store (runs already there are skipped) and say how many."""
    out = Output()
    with ResultsStore() as store:
        imported, skipped = store.import_(document)
    if json_:
        out.json({"imported": imported, "skipped": skipped})
    else:
        out.line(f"imported {_runs(imported)}, skipped {skipped} already in the store")


@app.command("pin")
def pin(
    run_id: Annotated[int, typer.Argument(metavar="RUN", help="Run id, as printed by `edgekit results list`.")],
    name: Annotated[str, typer.Option("--name", metavar="NAME", help="The name to compare with: --baseline tag:NAME.")],
    json_: common.Json = False,
) -> None:
    """Pin a run as a named, blessed baseline (a name pinned before moves to this run).

    \b
    Examples:
      edgekit results pin 42 --name golden
      edgekit ci --baseline tag:golden
      edgekit bench model.onnx --gate p50:+5% --baseline tag:golden
    """
    import re

    out = Output()
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,99}", name):
        raise UsageError(f"bad pin name {name!r}", "use letters, digits, '.', '_', '-', '/' (at most 100), e.g. --name golden")
    with ResultsStore() as store:
        record = store.get(run_id)
        if record.get("outcome") == "fail":
            out.warn(f"run {run_id}'s gates failed; it is pinned because you named it")
        store.pin(run_id, name)
        pins = store.pins()
    if json_:
        out.json({"name": name, "run_id": run_id, "pins": pins})
        return
    out.info(f"pinned run {run_id} {_describe(record)} as {name}: compare with --baseline tag:{name}")


@app.command("pins")
def pins(json_: common.Json = False) -> None:
    """List the pinned baselines (name -> run).

    \b
    Example:
      edgekit results pins
    """
    out = Output()
    with ResultsStore() as store:
        found = store.pins()
    if json_:
        out.json(found)
        return
    if not found:
        out.info("no pinned baselines; pin one with: edgekit results pin RUN --name NAME")
        return
    out.table(["name", "run"], [[k, v] for k, v in found.items()])


@app.command("compare")
def compare(
    a: Annotated[str, typer.Argument(metavar="A", help="The baseline: a run id, an export file (FILE or FILE#N), or latest@BRANCH.")],
    b: Annotated[str, typer.Argument(metavar="B", help="The run to judge against A, named the same ways.")],
    fail: common.Fail = None,
    allow_model_change: Annotated[
        bool, typer.Option("--allow-model-change", help="Compare runs of different model files (a changed model vs the main branch's); device, backend and variant must still match.")
    ] = False,
    model: Annotated[str | None, typer.Option("--model", help="Pick runs of this model name (for FILE and latest@BRANCH).")] = None,
    target: Annotated[str | None, typer.Option("--target", help="Pick runs on this target profile.")] = None,
    device: Annotated[str | None, typer.Option("--device", help="Pick runs on this device.")] = None,
    variant: Annotated[str | None, typer.Option("--variant", help="Pick runs of this variant (int8, fp32...).")] = None,
    json_: common.Json = False,
) -> None:
    """Compare run B with run A: per metric, the change and whether it stands out of the noise.

    A latency change counts ("faster"/"slower") when the 95% bootstrap CI of the ratio excludes
    no change and the change exceeds 5%, the runs' own drift and what the device's own change of
    speed between them explains (a reference loop timed through each run); else "no change", or
    "inconclusive" when that speed moved more than 20%. A --fail gate is pass, fail or inconclusive.
    Runs of different models, devices, backends, variants or batch sizes are refused.

    \b
    Examples:
      edgekit results compare 7 12
      edgekit results compare latest@main latest@my-branch --variant int8 --fail p50:+5%
      edgekit results compare baseline.json 12 --fail p99:<20ms --json
    """
    from edgekit.bench.compare import comparable, resolve
    from edgekit.bench.compare import compare as compare_runs
    from edgekit.bench.gates import GateReport, check_gates, parse_gates
    from edgekit.errors import InputError

    out = Output()
    gates = parse_gates(fail)
    filters = {"model": model, "target": target, "device": device, "variant": variant}
    refs = {"A": a, "B": b}
    picked: dict[str, dict] = {}
    # A ref naming one run exactly goes first: the other (newest in a file or on a branch) is picked like it.
    for side in sorted(refs, key=lambda k: not _exact(refs[k])):
        other = next(iter(picked.values()), None)
        with ResultsStore() as store:
            picked[side] = resolve(refs[side], store, like=other, **filters)
    ra, rb = picked["A"], picked["B"]
    reason = comparable(ra, rb, allow_model_change=allow_model_change)
    if reason:
        hint = (
            "to compare a changed model with its baseline, add --allow-model-change"
            if reason.startswith("different models")
            else "runs at other thread counts time the scaling, not a change: compare runs timed at one count (bench --threads N)"
            if reason.startswith("different thread counts")
            else "compare runs of the same device, backend, variant and batch (edgekit results list --model M --device D --variant V)"
        )
        raise InputError(f"will not compare {a} with {b}: {reason}", hint)
    result = compare_runs(ra, rb)
    report = GateReport(rb, ra, tuple(check_gates(gates, rb, ra))) if gates else None
    if json_:
        out.json({**result.to_dict(), "gates": report.to_dict() if report else []})
    else:
        out.table(
            ["metric", "A", "B", "change", "95% CI", "verdict"],
            [[r.metric, _value(r.metric, r.a), _value(r.metric, r.b), _change(r.metric, r.change),
              "" if r.ci is None else f"{r.ci[0] * 100:+.1f}..{r.ci[1] * 100:+.1f}%", r.verdict + (f" ({r.note})" if r.note else "")]
             for r in result.rows],
            title=f"B {_describe(rb)} vs A {_describe(ra)}",
        )  # fmt: skip
    common.finish_gates(out, report, json_)


def _exact(ref: str) -> bool:
    return ref.isdigit() or ("#" in ref and not ref.startswith("latest@"))


def _describe(record: dict) -> str:
    agent, vcs = record["agent"], record.get("vcs") or {}
    name = f"run {record['id']}" if record.get("id") is not None else f"run {record['run_uuid'][:8]}"
    on = f", branch {vcs['branch']}" if vcs.get("branch") else ""
    return f"({name}: {record['model_name']} {agent['variant']} on {record['device']}, {agent['backend']}{on})"


def _value(metric: str, value: float | None) -> str:
    if value is None:
        return "-"
    if metric == "rss":
        return f"{value / 2**20:.1f} MB"
    if metric == "energy":
        return f"{value:.4g} mJ"
    if metric == "accuracy":
        return f"{value:.2f}%"
    if metric == "throughput":
        return f"{value:.1f}/s"
    return f"{_ms(value)} ms"


def _change(metric: str, change: float | None) -> str:
    if change is None:
        return "-"
    return f"{change:+.2f} pt" if metric == "accuracy" else f"{change * 100:+.1f}%"


_RECORD_KEYS = {
    "id",
    "schema",
    "run_uuid",
    "created",
    "model_name",
    "target",
    "device",
    "stats",
    "agent",
}
_HINT_EXPORT = "give a file written by `edgekit results export`"


def _warn_damage(out: Output, store: ResultsStore) -> None:
    if store.damage is not None:
        out.warn(f"the results store {store.path} is damaged ({store.damage}): what can be read is shown; save it with edgekit results export -o rescued.json")


def _read_json(file: str) -> Any:
    name = "stdin" if file == "-" else file
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ResultsError(f"no such file: {file}", _HINT_EXPORT) from None
    except UnicodeDecodeError:
        raise ResultsError(f"{name} is not JSON (not UTF-8 text)", _HINT_EXPORT) from None
    except OSError as exc:
        raise ResultsError(f"cannot read {name}: {exc.strerror}", _HINT_EXPORT) from None
    try:
        return strict_loads(text)
    except json.JSONDecodeError as exc:
        raise ResultsError(
            f"{name} is not JSON: {exc.msg} (line {exc.lineno})", _HINT_EXPORT
        ) from None
    except ValueError as exc:
        raise ResultsError(f"{name} is not an export: {exc}", _HINT_EXPORT) from None


def _device_rows(agent: dict) -> list[tuple[str, Any]]:
    device = agent["device"]
    rows: list[tuple[str, Any]] = []
    for key, value in device.items():
        if key == "memory_bytes":
            rows.append(("memory", _bytes(value)))
        elif key == "isa" and isinstance(value, list):
            rows.append(("isa", " ".join(map(str, value))))
        elif key == "runtimes" and isinstance(value, dict):
            found = (f"{k} {v}" for k, v in value.items() if v is not None)
            rows.append(("runtimes", ", ".join(found)))
        else:
            rows.append((key.replace("_", " "), _text(value)))
    probe = agent.get("speed_probe")
    if isinstance(probe, dict) and probe.get("ns"):
        rows.append((f"speed loop ({probe.get('loop')})", f"{probe['ns'] / 1000:.2f} us (median of {probe.get('bursts')} bursts through the window)"))
    busy = agent.get("contention")
    if isinstance(busy, dict):
        judged = {True: "contended", False: "not contended", None: "too short to judge"}[busy.get("contended")]
        where = "the timed window" if busy.get("span") != "runner" else "the runtime's process"
        rows.append(("other work", f"{busy['other_cpu']:.2f} cores through {where} ({busy['window_s']:.2g} s): {judged}, limit {busy['limit']:g}"))
    p50s = round_p50s_ns(agent)
    if len(p50s) > 1:
        rows.append(("rounds", f"{len(p50s)} agent processes, p50 {' / '.join(f'{ns / 1e6:.4g}' for ns in p50s)} ms"))
    state = agent.get("device_state") or {}
    before, after = state.get("before") or {}, state.get("after") or {}
    for key, label, unit in (("governor", "governor", ""), ("temp_c", "temperature", " C")):
        if before.get(key) is not None or after.get(key) is not None:
            rows.append(
                (
                    f"{label} before -> after",
                    f"{_text(before.get(key))}{unit} -> {_text(after.get(key))}{unit}",
                )
            )
    return rows


def _present(rows: Any) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in rows if v not in (None, "")]


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _ms(value: float | None) -> str:
    """Milliseconds with about four significant digits: 12.35, 0.04512."""
    if value is None:
        return "-"
    return f"{value:.3f}" if value >= 1 else f"{value:.4g}"


def _ns_ms(value: int | None) -> str | None:
    return None if value is None else f"{_ms(value / 1e6)} ms"


def _bytes(value: int | None) -> str | None:
    if value is None:
        return None
    return f"{value / 2**20:.1f} MiB" if value < 2**30 else f"{value / 2**30:.2f} GiB"


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def _when(created: str) -> str:
    return created[:19].replace("T", " ")
