"""`edgekit bench`: push a bundle to a device, time each variant there, store the runs.

Given a model file (.onnx or .tflite) instead of a bundle, it bundles that model as it is (no
quantization) for the target's backend, through the same pipeline as `edgekit deploy`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from edgekit.cli import common, render
from edgekit.cli.output import Output
from edgekit.devices.fleet import DEFAULT_JOBS
from edgekit.devices.lock import DEFAULT_WAIT as DEFAULT_LOCK_WAIT


@common.options("bench", "gates", "ssh", "engine")
def bench(
    bundle_dir: Annotated[
        Path,
        typer.Argument(
            metavar="BUNDLE_DIR|MODEL",
            help="A bundle directory (holds manifest.json), or a model file (.onnx, .tflite) to bench as it is.",
            show_default=False,
        ),
    ],
    target: Annotated[
        str | None, typer.Option("--target", metavar="PROFILE", help="Target profile (name or TOML path). Default: the bundle's profile.")
    ] = None,
    device: common.Devices = None,
    variants: Annotated[
        list[str] | None, typer.Option("--variant", metavar="NAME", help="Bench only this variant (repeatable). Default: all.")
    ] = None,
    backend: common.Backend = None,
    shape: common.Shape = None,
    jobs: common.Jobs = DEFAULT_JOBS,
    lock_wait: common.LockWait = DEFAULT_LOCK_WAIT,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the stored records as one JSON list (with --fail: {\"runs\": [...], \"gates\": [...]}).")
    ] = False,
    **opts,
) -> None:
    """Benchmark a bundle's variants on a device and store each run.

    Pushes the bundle (only files the device lacks), runs the edgekit agent there once per
    variant, and prints latency statistics computed from the raw samples.

    Given a MODEL file, bundles it as it is (float ONNX, or a .tflite at its own precision) for
    the target's backend (or --backend) and benches that.

    \b
    Examples:
      edgekit bench out/resnet18.rpi5
      edgekit bench out/resnet18.rpi5 --variant int8 --iterations 500 --threads 4
      edgekit bench out/mobilenet --duration 10 --json > runs.json
      edgekit bench face_detection_short_range.tflite --target local
      edgekit bench examples/digits/digits_cnn.onnx --backend openvino
      edgekit bench out/mobilenet --inventory devices.toml --jobs 4   (every device, in parallel)
      edgekit bench out/mobilenet --inventory hosts.ini --engine ansible --limit 'lab:!pi3' --forks 10
    """
    from edgekit import api
    from edgekit.devices import resolve_devices
    from edgekit.errors import UsageError

    inventory = opts["inventory"]
    out = Output()
    gates = common.gates(opts, fleet=common.is_fleet(device or [], inventory))
    strategy = common.engine(opts, device)
    if strategy is not None:
        if bundle_dir.is_file() or bundle_dir.suffix.lower() in api.MODEL_SUFFIXES:
            raise UsageError("a model file is benched on one device", "for a fleet: edgekit deploy MODEL --no-quantize --inventory FILE --engine ansible")
        _bench_ansible(out, bundle_dir, inventory, strategy, target, variants, dict(**common.bench_args(opts), lock_wait=lock_wait,
                       trust_new_host=opts["trust_new_host"], password="" if opts["password"] else None), json_out=json_out)  # fmt: skip
        return
    entries = resolve_devices(device or [], inventory)
    entry = entries[0] if entries else None
    options = dict(
        device=entry, **common.bench_args(opts), backend=backend, shapes=common.shapes(shape),
        trust_new_host=opts["trust_new_host"], password=common.ssh_password(opts["password"], entry), lock_wait=lock_wait,
    )  # fmt: skip
    model_file = bundle_dir.is_file() or bundle_dir.suffix.lower() in api.MODEL_SUFFIXES
    if gates and options["threads"] is None and opts["baseline"] is None and not common.is_fleet(entries, inventory):
        options["threads"] = _gate_threads(out, bundle_dir, model_file, target, entry, variants)
    if model_file:
        if variants:
            raise UsageError("--variant selects variants of a bundle; a model file has one", "drop --variant, or bench a bundle directory")
        if common.is_fleet(entries, inventory):
            raise UsageError("a model file is benched on one device", "for several: edgekit deploy MODEL --no-quantize --device D1 --device D2")
        from edgekit.transport.local import default_root

        target = target or (entry.profile if entry else None) or "local"
        # Beside the local device's files, not in the working directory: bench leaves no output.
        output = default_root().parent / "bench-bundles" / f"{bundle_dir.stem}-{Path(target).stem}"
        output.parent.mkdir(parents=True, exist_ok=True)
        result = api.bench(bundle_dir, events=out, target=target, output=output, **options)
        out.info(f"bundle: {result.bundle.root} (bench it again with: edgekit bench {result.bundle.root})")
        p = result.plan
        _print(out, result, f"{p.model} on {p.device} (target {p.profile}, backend {p.backend})", json_out, gates, opts["baseline"])
        return
    if common.is_fleet(entries, inventory):
        _bench_fleet(out, bundle_dir, entries, target, variants, options, jobs=jobs, json_out=json_out)
        return
    result = api.bench(bundle_dir, variants=variants, events=out, target=target, **options)
    _print(out, result, f"{result.plan.model} on {result.plan.device} (target {result.plan.profile})", json_out, gates, opts["baseline"])


def _gate_threads(out: Output, bundle_dir: Path, model_file: bool, target: str | None, entry, variants) -> int | None:
    """``--fail`` without ``--threads``: the thread count of the run the gate will compare against
    (a gate compares runs of one count only; left to the agent's probe, a busy 2-core device timed
    one run at 1 thread and the next at 2, and the gate then had no baseline), or None (the probe's
    choice) when there is no such run yet or the bundle cannot be read (the bench says why)."""
    from edgekit.bench.compare import gated_threads
    from edgekit.bench.store import ResultsStore
    from edgekit.bundle import load_bundle
    from edgekit.errors import EdgekitError
    from edgekit.profiles import load_profile

    try:
        if model_file:
            model, profile = bundle_dir.stem, target or (entry.profile if entry else None) or "local"
        else:
            manifest = load_bundle(bundle_dir).manifest
            model, profile = manifest.model_name, target or manifest.profile
        name = load_profile(profile).name
    except EdgekitError:
        return None
    with ResultsStore() as store:
        last = gated_threads(store, model, name, entry.name if entry else "local", variants or None)
    if last is None:
        return None
    threads = last["agent"]["config"]["threads"]
    out.info(f"timing at {threads} thread(s), as run {last['id']} (the gate's baseline) was: --threads to choose")
    return threads


def _bench_fleet(out: Output, bundle_dir: Path, entries, target, variants, options: dict, *, jobs: int, json_out: bool) -> None:
    """The same bundle on every device in parallel; the records of each are stored under its name."""
    from edgekit import api
    from edgekit.bundle import load_bundle
    from edgekit.events import DeviceEvents
    from edgekit.profiles import load_profile

    bundle = load_bundle(bundle_dir)
    profile = load_profile(target or bundle.manifest.profile)
    req = api.request(bundle_dir, **{**options, "device": None})
    selected = api.select_variants(bundle, variants)

    def one(entry):
        return api.bench_bundle(bundle, entry, profile, req, selected, DeviceEvents(out, entry.name))

    _report(out, common.run_fleet(out, entries, one, jobs), f"{bundle.manifest.model_name} on {len(entries)} device(s) (target {profile.name})",
            selected, json_out)  # fmt: skip


def _bench_ansible(out: Output, bundle_dir: Path, inventory: Path, strategy, target, variants, options: dict, *, json_out: bool) -> None:
    """The bundle on every host Ansible selects; each host's records stored under its name."""
    from edgekit import api
    from edgekit.ansibledeploy import bench_fleet, check_options
    from edgekit.bundle import load_bundle

    req = api.request(bundle_dir, **options)
    check_options(req)  # what Ansible does not run, before anything is read
    bundle = load_bundle(bundle_dir)
    selected = api.select_variants(bundle, variants)
    _report(out, bench_fleet(bundle, req, selected, inventory, strategy, target=target, sink=out),
            f"{bundle.manifest.model_name} on the hosts of {inventory.name} (ansible)", selected, json_out)


def _report(out: Output, fleet, title: str, selected: list[str], json_out: bool) -> None:
    """A fleet bench's table (each selected variant's p50, the run ids) or JSON (each host's records)."""

    def row(result) -> list[str]:
        p50 = {r["agent"]["variant"]: r["stats"]["p50"] for r in result.records}
        return [render.fmt_latency(p50[name]) if name in p50 else "-" for name in selected] + [", ".join(map(str, result.run_ids))]

    render.report_fleet(
        out, fleet, title=title, columns=[f"{name} p50 ms" for name in selected] + ["runs"], row=row, json_out=json_out,
        to_json=lambda r: [{"id": rid, **rec} for rid, rec in zip(r.run_ids, r.records)],
    )  # fmt: skip


def _print(out: Output, result, title: str, json_out: bool, gates: list, baseline: str | None) -> None:
    from edgekit import api

    out.info(f"stored as run(s) {', '.join(map(str, result.run_ids))} (see: edgekit results show ID)")
    report = api.check_gates(result, gates, baseline=baseline) if gates else None
    if json_out:
        runs = [{"id": rid, **rec} for rid, rec in zip(result.run_ids, result.records)]
        out.json({"runs": runs, "gates": report.to_dict()} if report else runs)
    else:
        render.print_runs(out, result.to_dict(), title)
    common.finish_gates(out, report, json_out)
