"""`edgekit deploy`: the whole trip — quantize, bundle, push, bench, store, summarize."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from edgekit import validate
from edgekit.cli import common, render
from edgekit.cli.output import Output
from edgekit.devices.fleet import DEFAULT_JOBS
from edgekit.devices.lock import DEFAULT_WAIT as DEFAULT_LOCK_WAIT


@common.options("quantize", "bench", "gates", "ssh", "engine")
def deploy(
    model: Annotated[Path, typer.Argument(help="The float ONNX model (or a .tflite, which runs as it is).", show_default=False)],
    target: Annotated[str | None, typer.Option("--target", "-t", help="Target profile name or path to a profile TOML (default: the device's inventory profile, else local).")] = None,
    device: common.Devices = None,
    backend: common.Backend = None,
    no_quantize: Annotated[bool, typer.Option("--no-quantize", help="Deploy the float model only.")] = False,
    no_bench: Annotated[bool, typer.Option("--no-bench", help="Build the bundle, don't push or benchmark.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan and stop.")] = False,
    out_dir: Annotated[Path | None, typer.Option("--output", "-o", help="Bundle directory (default: edgekit-out/MODEL-TARGET).")] = None,
    jobs: common.Jobs = DEFAULT_JOBS,
    provision: Annotated[bool, typer.Option("--provision", help="Install the plan's runtime on the device first when it lacks it.")] = False,
    lock_wait: common.LockWait = DEFAULT_LOCK_WAIT,
    max_drop: Annotated[float, typer.Option("--max-drop", callback=validate.option("max_drop"), metavar="POINTS", help="The int8 gate: accuracy points int8 may lose against --labels (default 1).")] = 1.0,
    require_int8: Annotated[bool, typer.Option("--require-int8", help="Exit 5 when the int8 gate recommends float (int8 not faster on the device, or not accurate enough).")] = False,
    choose: Annotated[str, typer.Option("--choose", metavar="plan|measure", help="plan: the profile's first backend that can run the model (default); measure: bench int8 on every backend of the profile that can, and recommend the fastest that passes the gate.")] = "plan",
    remeasure: Annotated[bool, typer.Option("--remeasure", help="Bench and evaluate on the device even when this very bundle was measured there with the same settings (default: reuse that run, and say so).")] = False,
    json_out: common.Json = False,
    **opts,
) -> None:
    """Quantize MODEL, bundle it for a target, push it to the device, benchmark fp32 vs int8 there.

    Example:

        edgekit deploy examples/digits/digits_cnn.onnx --target local

    Several devices (--device repeated, or --inventory FILE) run in parallel, one row each:

        edgekit deploy model.onnx --target rpi5 --device pi1 --device pi2 --jobs 2

    Over Ansible (its inventory, key files, bastions), 10 hosts at a time, in batches of a quarter:

        edgekit deploy model.onnx --inventory hosts.ini --engine ansible --forks 10 --serial 25%
    """
    from edgekit import api
    from edgekit.deploy import open_job, run
    from edgekit.devices import resolve_devices

    o = Output()
    gates = common.gates(opts, fleet=common.is_fleet(device or [], opts["inventory"]), runs=not (no_bench or dry_run))
    inventory = opts["inventory"]
    strategy = common.engine(opts, device)
    if strategy is not None:
        from edgekit.errors import UsageError

        if dry_run or no_bench:
            raise UsageError("--dry-run and --no-bench don't reach a device: give one --device (or none)", "drop them, or use --engine ssh with one --device")
    entries = resolve_devices(device or [], inventory) if strategy is None else []
    entry = entries[0] if entries else None
    req = api.request(
        model,
        target=target or (entry.profile if entry else None) or "local",
        device=entry,
        backend=backend,
        quantize=not no_quantize,
        goal="bundle" if no_bench else "deploy",
        **common.quantize_args(opts),
        **common.bench_args(opts),
        output=out_dir,
        trust_new_host=opts["trust_new_host"],
        password=common.ssh_password(opts["password"], entry),
        inventory=inventory,
        provision=provision,
        lock_wait=lock_wait,
        max_drop=max_drop,
        require_int8=require_int8,
        choose=choose,
        remeasure=remeasure or bool(gates),  # a gated run is a new measurement, never an old one gated again
    )
    if strategy is not None:
        _deploy_ansible(o, req, inventory, strategy, target, json_out)
        return
    if common.is_fleet(entries, inventory):
        if dry_run or no_bench:
            from edgekit.errors import UsageError

            raise UsageError("--dry-run and --no-bench don't reach a device: give one --device (or none)", "drop them, or deploy to one device")
        _deploy_fleet(o, req, entries, target, jobs, json_out)
        return
    job = open_job(req)
    plan = job.plan()
    if dry_run:
        if json_out:
            o.json({"dry_run": True, "plan": plan.to_dict()})
        else:
            render.print_plan(o, plan.to_dict())
            o.info("dry run: nothing was quantized, written, pushed or benchmarked")
        return
    result = run(job, plan, o)
    report = api.check_gates(result, gates, baseline=opts["baseline"]) if gates else None
    doc = result.to_dict()
    if json_out:
        o.json({**doc, "gates": report.to_dict()} if report else doc)
    else:
        render.print_summary(o, doc)
    common.finish_gates(o, report, json_out)


def _deploy_fleet(o: Output, req, entries: list, target: str | None, jobs: int, json_out: bool) -> None:
    """Deploy to every device in parallel: the model and data loaded once, a plan, bundle and
    runs of each device's own (a plan made with its facts may differ); one row per device."""
    from edgekit.api import deploy_job
    from edgekit.deploy import open_job
    from edgekit.devices.fleet import safe_name
    from edgekit.events import DeviceEvents

    root = req.output or Path("edgekit-out")
    root.mkdir(parents=True, exist_ok=True)
    job = open_job(req)

    def one(entry):
        name = safe_name(entry.name)
        output = root / name if req.output else root / f"{req.model.stem}-{name}"
        return deploy_job(job, entry, DeviceEvents(o, entry.name), target=target or entry.profile or "local", output=output)

    render.report_fleet(
        o, common.run_fleet(o, entries, one, jobs), title=f"{req.model.name} on {len(entries)} device(s)",
        columns=_COLUMNS, row=_row, json_out=json_out, to_json=lambda r: r.to_dict(),
    )  # fmt: skip


def _deploy_ansible(o: Output, req, inventory: Path, strategy, target: str | None, json_out: bool) -> None:
    """Deploy over Ansible: bundled once here, Ansible runs each host's part; one row per host."""
    from edgekit.ansibledeploy import deploy_fleet

    fleet = deploy_fleet(req, inventory, strategy, target=target, sink=o)
    render.report_fleet(
        o, fleet, title=f"{req.model.name} on {len(fleet.outcomes)} host(s) (ansible)",
        columns=_COLUMNS, row=_row, json_out=json_out, to_json=lambda r: r.to_dict(),
    )  # fmt: skip


_COLUMNS = ["target", "backend", "fp32 p50", "int8 p50", "speed-up", "sent"]


def _row(result) -> list[str]:
    s = result.summary()
    v = s["variants"]
    fp, q = v.get("fp32") or {}, v.get("int8") or {}
    push = result.push.to_dict() if result.push else {}
    return [
        result.plan.profile, result.plan.backend,
        render.fmt_ms(fp.get("p50_ms")), render.fmt_ms(q.get("p50_ms")),
        f"{s['speedup_p50']:.2f}x" if "speedup_p50" in s else "-",
        render.fmt_bytes(push.get("bytes_sent")),
    ]  # fmt: skip
