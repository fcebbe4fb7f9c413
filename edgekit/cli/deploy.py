"""`edgekit deploy`: the whole trip — quantize, bundle, push, bench, store, summarize."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from edgekit.cli import common
from edgekit.cli.devices import (
    DevicesOpt,
    InventoryOpt,
    JobsOpt,
    LockWaitOpt,
    is_fleet,
    report_fleet,
)
from edgekit.cli.output import Output
from edgekit.devices.fleet import DEFAULT_JOBS
from edgekit.devices.lock import DEFAULT_WAIT as DEFAULT_LOCK_WAIT


def register(app: typer.Typer) -> None:
    app.command("deploy")(deploy)


TrustNewHost = Annotated[
    bool,
    typer.Option(
        "--trust-new-host",
        help="Accept an SSH device whose host key is not in ~/.ssh/known_hosts yet, and save its key (a changed key is always refused).",
    ),
]
PasswordOpt = Annotated[
    bool,
    typer.Option("--password", help="Allow SSH password login; the password comes from $EDGEKIT_SSH_PASSWORD, else it is asked on the terminal."),
]


def ssh_password(enabled: bool, device: str | None) -> str | None:
    """The SSH password when --password was given: $EDGEKIT_SSH_PASSWORD, else asked on the TTY."""
    import getpass
    import os
    import sys

    from edgekit.errors import UsageError

    if not enabled:
        return None
    if device is None or device == "local":
        raise UsageError("--password is for SSH devices", "drop --password, or pass --device user@host")
    password = os.environ.get("EDGEKIT_SSH_PASSWORD")
    if password:
        return password
    if not sys.stdin.isatty():
        raise UsageError(
            "--password needs the password, and there is no terminal to ask on",
            "set EDGEKIT_SSH_PASSWORD for this command, or better, install an SSH key on the device (ssh-copy-id)",
        )
    return getpass.getpass(f"SSH password for {device}: ")


def deploy(
    model: Annotated[Path, typer.Argument(help="The float ONNX model (or a .tflite, which runs as it is).", show_default=False)],
    target: Annotated[str | None, typer.Option("--target", "-t", help="Target profile name or path to a profile TOML (default: the device's inventory profile, else local).")] = None,
    device: DevicesOpt = None,
    backend: common.Backend = None,
    no_quantize: Annotated[bool, typer.Option("--no-quantize", help="Deploy the float model only.")] = False,
    no_bench: Annotated[bool, typer.Option("--no-bench", help="Build the bundle, don't push or benchmark.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan and stop.")] = False,
    calib: common.Calib = None,
    eval_data: common.Eval = None,
    labels: common.Labels = None,
    method: common.Method = "minmax",
    exclude: common.Exclude = None,
    shape: common.Shape = None,
    preprocess: common.PreprocessOpt = None,
    warmup: Annotated[int | None, typer.Option("--warmup", min=0, help="Warm-up runs (default: the profile's).")] = None,
    iterations: Annotated[int | None, typer.Option("--iterations", "-n", min=1, help="Timed runs (default: the profile's).")] = None,
    duration: Annotated[float | None, typer.Option("--duration", min=0.01, help="Time for this many seconds instead of a count.")] = None,
    threads: Annotated[int | None, typer.Option("--threads", min=1, help="Inference threads (default: all cores).")] = None,
    out_dir: Annotated[Path | None, typer.Option("--output", "-o", help="Bundle directory (default: edgekit-out/MODEL-TARGET).")] = None,
    trust_new_host: TrustNewHost = False,
    password: PasswordOpt = False,
    inventory: InventoryOpt = None,
    jobs: JobsOpt = DEFAULT_JOBS,
    provision: Annotated[bool, typer.Option("--provision", help="Install the plan's runtime on the device first when it lacks it.")] = False,
    lock_wait: LockWaitOpt = DEFAULT_LOCK_WAIT,
    json_out: common.Json = False,
) -> None:
    """Quantize MODEL, bundle it for a target, push it to the device, benchmark fp32 vs int8 there.

    Example:

        edgekit deploy examples/digits/digits_cnn.onnx --target local

    Several devices (--device repeated, or --inventory FILE) run in parallel, one row each:

        edgekit deploy model.onnx --target rpi5 --device pi1 --device pi2 --jobs 2
    """
    from edgekit.cli.plan import print_plan
    from edgekit.deploy import DeployRequest, prepare_deploy
    from edgekit.deploy import deploy as run_deploy
    from edgekit.devices import resolve_devices
    from edgekit.modelio import parse_shape_overrides

    o = common.output(json_out)
    entries = resolve_devices(device or [], inventory)
    entry = entries[0] if entries else None
    req = DeployRequest(
        model=model,
        target=target or (entry.profile if entry else None) or "local",
        device=entry.name if entry else None,
        backend=backend,
        quantize=not no_quantize,
        bench=not no_bench,
        calib=calib,
        eval=eval_data,
        labels=labels,
        method=common.check_method(method),
        exclude=tuple(exclude or ()),
        shapes=parse_shape_overrides(shape),
        preprocess=common.preprocess(preprocess),
        warmup=warmup,
        iterations=iterations,
        duration_s=duration,
        threads=threads,
        output=out_dir,
        trust_new_host=trust_new_host,
        password=ssh_password(password, entry.address if entry else None),
        inventory=inventory,
        provision=provision,
        lock_wait=lock_wait,
    )
    if is_fleet(entries, inventory):
        _deploy_fleet(o, req, entries, target, jobs, json_out, dry_run=dry_run, no_bench=no_bench)
        return
    prep = prepare_deploy(req)
    if dry_run:
        if json_out:
            o.json({"dry_run": True, "plan": prep.plan.to_dict()})
        else:
            print_plan(o, prep.plan.to_dict())
            o.info("dry run: nothing was quantized, written, pushed or benchmarked")
        return
    if no_bench:
        for note in prep.plan.notes:
            o.info(f"note: {note}")
    result = run_deploy(req, o, prep)
    doc = result.to_dict()
    if json_out:
        o.json(doc)
        return
    print_summary(o, doc)


def _deploy_fleet(o: Output, base, entries: list, target: str | None, jobs: int, json_out: bool, *, dry_run: bool, no_bench: bool) -> None:
    """Deploy to every device in parallel (a plan, bundle and runs of its own each); one row per device."""
    import dataclasses

    from edgekit.deploy import deploy as run_deploy
    from edgekit.deploy import prepare_deploy
    from edgekit.devices.fleet import DeviceEvents, run_fleet, safe_name
    from edgekit.errors import UsageError

    if dry_run or no_bench:
        raise UsageError("--dry-run and --no-bench don't reach a device: give one --device (or none)", "drop them, or deploy to one device")
    if not entries:
        raise UsageError("no devices to deploy to", "give --device NAME (repeatable) or an --inventory that lists devices")
    root = base.output or Path("edgekit-out")
    root.mkdir(parents=True, exist_ok=True)

    def one(entry):
        # Each device gets its own bundle directory: a plan made with its facts may differ.
        name = safe_name(entry.name)
        req = dataclasses.replace(
            base,
            target=target or entry.profile or "local",
            device=entry.name,
            output=root / name if base.output else root / f"{base.model.stem}-{name}",
        )
        return run_deploy(req, DeviceEvents(o, entry.name), prepare_deploy(req))

    def done(outcome) -> None:
        o.info(f"[{outcome.device}] {'done' if outcome.succeeded else 'FAILED: ' + (outcome.error or '')}")

    fleet = run_fleet(entries, one, jobs=jobs, name=lambda e: e.name, on_done=done)

    def row(result) -> list[str]:
        s = result.summary()
        v = s["variants"]
        fp, q = v.get("fp32") or {}, v.get("int8") or {}
        push = result.push.to_dict() if result.push else {}
        return [
            result.plan.profile, result.plan.backend,
            common.fmt_ms(fp.get("p50_ms")), common.fmt_ms(q.get("p50_ms")),
            f"{s['speedup_p50']:.2f}x" if "speedup_p50" in s else "-",
            common.fmt_bytes(push.get("bytes_sent")),
        ]  # fmt: skip

    report_fleet(
        o, fleet, title=f"{base.model.name} on {len(entries)} device(s)",
        columns=["target", "backend", "fp32 p50", "int8 p50", "speed-up", "sent"],
        row=row, json_out=json_out, to_json=lambda r: r.to_dict(),
    )  # fmt: skip


def print_summary(o: Output, doc: dict) -> None:
    from edgekit.deploy import speed_sentence

    s = doc["summary"]
    variants = s["variants"]
    fp = variants.get("fp32", {})
    agreement = s.get("agreement")
    top1 = None
    if agreement:
        top1 = next((x["top1"] for x in agreement["outputs"] if x["top1"] is not None), None)
    rows = []
    for name, v in variants.items():
        speed = "-"
        if v.get("p50_ms") and fp.get("p50_ms"):
            speed = f"{fp['p50_ms'] / v['p50_ms']:.2f}x"
        agree = "-"
        if name != "fp32" and agreement:
            first = agreement["outputs"][0]
            agree = f"cos {first['cosine']:.4f}" + (f", top-1 {top1 * 100:.1f}%" if top1 is not None else "")
        rows.append(
            [
                name,
                v["backend"],
                common.fmt_ms(v.get("p50_ms")),
                common.fmt_ms(v.get("p99_ms")),
                speed,
                common.fmt_bytes(v.get("size_bytes")),
                common.fmt_pct(v.get("accuracy")),
                agree,
            ]
        )
    title = f"{doc['model']} on {doc['target']} ({doc['device']}), backend {doc['backend']}"
    o.table(["variant", "backend", "p50 ms", "p99 ms", "speed-up", "size", "accuracy", "agreement vs fp32"], rows, title=title)
    if agreement:
        o.line(
            f"agreement measured on {agreement['samples']} held-out samples ({agreement['source']})"
            + (
                f"; accuracy drop {s['accuracy_drop'] * 100:+.2f} points"
                if s.get("accuracy_drop") is not None
                else ""
            )
        )
    sentence = speed_sentence(s, len(doc["plan"]["float_nodes"]))
    if sentence:
        o.line(sentence)
    print_backend_details(o, doc["runs"])
    if doc["runs"]:
        ids = ", ".join(str(r["id"]) for r in doc["runs"])
        o.info(f"results stored as run(s) {ids}: edgekit results show ID")
    o.info(f"bundle: {doc['bundle']['path']}")


TOP_LAYERS = 5


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
        layers = [x for x in run.get("layers") or [] if x.get("ns")]
        if layers:
            total = sum(x["ns"] for x in layers)
            top = sorted(layers, key=lambda x: -x["ns"])[:TOP_LAYERS]
            o.table(
                ["layer", "op", "kernel", "us", "share"],
                [[x["name"], x["op"], x.get("exec_type", ""), f"{x['ns'] / 1e3:.1f}", f"{x['ns'] / total * 100:.0f}%"] for x in top],
                title=f"{run['variant']}: slowest {len(top)} of {len(layers)} timed layers",
            )
