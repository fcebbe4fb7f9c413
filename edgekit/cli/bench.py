"""`edgekit bench`: push a bundle to a device, time each variant there, store the runs.

Given a model file (.onnx or .tflite) instead of a bundle, it bundles that model as it is (no
quantization) for the target's backend, through the same pipeline as `edgekit deploy`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from edgekit.bench.record import make_record
from edgekit.bench.run import BenchConfig, bench_variant
from edgekit.bench.stats import Stats
from edgekit.bench.store import ResultsStore
from edgekit.bundle import load_bundle
from edgekit.cli import common
from edgekit.cli.deploy import PasswordOpt, TrustNewHost, print_backend_details, ssh_password
from edgekit.cli.devices import (
    DevicesOpt,
    InventoryOpt,
    JobsOpt,
    LockWaitOpt,
    is_fleet,
    report_fleet,
)
from edgekit.cli.output import Output
from edgekit.devices import connect, resolve_devices
from edgekit.devices.fleet import DEFAULT_JOBS
from edgekit.devices.lock import DEFAULT_WAIT as DEFAULT_LOCK_WAIT
from edgekit.devices.lock import device_lock
from edgekit.errors import UsageError
from edgekit.profiles import load_profile
from edgekit.transport.push import progress_reporter, push_bundle

# Short headers: the table fits 80 columns (a pipe or CI log) for typical values.
_COLUMNS = ["variant", "backend", "prec", "p50 ms", "p90", "p99", "mean", "inf/s", "RSS MB"]
MODEL_SUFFIXES = (".onnx", ".tflite")


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
    device: DevicesOpt = None,
    variants: Annotated[
        list[str] | None, typer.Option("--variant", metavar="NAME", help="Bench only this variant (repeatable). Default: all.")
    ] = None,
    warmup: Annotated[
        int | None, typer.Option("--warmup", min=0, metavar="N", help="Untimed runs first. Default: the profile's (10).")
    ] = None,
    iterations: Annotated[
        int | None, typer.Option("--iterations", min=1, metavar="N", help="Timed runs. Default: the profile's (100).")
    ] = None,
    duration: Annotated[
        float | None, typer.Option("--duration", min=0.001, metavar="SECONDS", help="Run for this many seconds instead of --iterations.")
    ] = None,
    threads: Annotated[
        int | None, typer.Option("--threads", min=1, metavar="N", help="Intra-op threads. Default: the runtime's (all cores).")
    ] = None,
    backend: common.Backend = None,
    shape: common.Shape = None,
    trust_new_host: TrustNewHost = False,
    password: PasswordOpt = False,
    inventory: InventoryOpt = None,
    jobs: JobsOpt = DEFAULT_JOBS,
    lock_wait: LockWaitOpt = DEFAULT_LOCK_WAIT,
    json_: Annotated[bool, typer.Option("--json", help="Print the stored records as one JSON list.")] = False,
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
    """
    out = Output("json" if json_ else "human")
    entries = resolve_devices(device or [], inventory)
    entry = entries[0] if entries else None
    address = entry.address if entry else None
    if bundle_dir.is_file() or bundle_dir.suffix.lower() in MODEL_SUFFIXES:
        if variants:
            raise UsageError("--variant selects variants of a bundle; a model file has one", "drop --variant, or bench a bundle directory")
        if is_fleet(entries, inventory):
            raise UsageError("a model file is benched on one device", "for several: edgekit deploy MODEL --no-quantize --device D1 --device D2")
        records, title = _bench_model(
            out, bundle_dir, target=target or (entry.profile if entry else None) or "local",
            device=entry.name if entry else None, backend=backend, shape=shape,
            warmup=warmup, iterations=iterations, duration=duration, threads=threads,
            trust_new_host=trust_new_host, password=ssh_password(password, address),
        )  # fmt: skip
        _print(out, records, title, json_)
        return
    if backend or shape:
        raise UsageError("--backend and --shape apply to a model file; a bundle was built for its backend", "pass a model file, or drop them")
    bundle = load_bundle(bundle_dir)
    manifest = bundle.manifest
    selected = list(dict.fromkeys(variants or [v.name for v in manifest.variants]))
    known = [v.name for v in manifest.variants]
    for name in selected:
        if name not in known:
            raise UsageError(f"the bundle has no variant '{name}'", f"pass one of: {', '.join(known)}")
    profile = load_profile(target or manifest.profile)
    defaults = profile.bench
    config = BenchConfig(
        warmup=defaults.warmup if warmup is None else warmup,
        iterations=defaults.iterations if iterations is None else iterations,
        duration_s=duration,
        threads=defaults.threads if threads is None else threads,
    )

    options = {"trust_new_host": trust_new_host, "password": ssh_password(password, address)}
    if is_fleet(entries, inventory):
        _bench_fleet(out, entries, bundle, selected, config, profile, jobs=jobs, lock_wait=lock_wait, json_=json_, options=options)
        return
    transport = connect(entry, profile, log=out.info, **options)
    try:
        records = _push_and_bench(out, transport, bundle, selected, config, profile, lock_wait=lock_wait, device=transport.name)
    finally:
        transport.close()

    _print(out, records, f"{manifest.model_name} on {transport.name} (target {profile.name})", json_)


def _push_and_bench(out, transport, bundle, selected: list[str], config: BenchConfig, profile, *, lock_wait: float, device: str) -> list[dict]:
    """Under the device's lock: push the bundle, bench each selected variant, store the records."""
    manifest = bundle.manifest
    with device_lock(transport, wait=lock_wait, on_wait=out.info):
        with out.progress(f"pushing bundle {manifest.bundle_hash[:12]} to {transport.name}") as bar:
            pushed = push_bundle(transport, bundle, progress=progress_reporter(bar))
        if pushed.files_sent:
            out.info(
                f"pushed {pushed.files_sent} file(s), {pushed.bytes_sent / 1e6:.2f} MB "
                f"({pushed.files_skipped} already there) in {pushed.duration_s:.1f}s"
            )
        else:
            out.info(f"bundle already on {transport.name}: nothing to push")
        records = []
        with ResultsStore() as store:
            for name in selected:
                how = f"{config.duration_s:g}s" if config.duration_s is not None else f"{config.iterations} iterations"
                with out.progress(f"benchmarking {name} on {transport.name} ({how})"):
                    doc = bench_variant(transport, pushed.remote_dir, name, config)
                record = make_record(doc, model_name=manifest.model_name, target=profile.name, device=device)
                records.append({"id": store.add(record), **record})
    return records


def _bench_fleet(out, entries, bundle, selected, config, profile, *, jobs: int, lock_wait: float, json_: bool, options: dict) -> None:
    """The same bundle on every device in parallel; the records of each are stored under its name."""
    from edgekit.devices.fleet import DeviceEvents, run_fleet

    def one(entry) -> list[dict]:
        events = DeviceEvents(out, entry.name)
        transport = connect(entry, profile, log=events.info, **options)
        try:
            return _push_and_bench(events, transport, bundle, selected, config, profile, lock_wait=lock_wait, device=entry.name)
        finally:
            transport.close()

    def done(outcome) -> None:
        out.info(f"[{outcome.device}] {'done' if outcome.succeeded else 'FAILED: ' + (outcome.error or '')}")

    fleet = run_fleet(entries, one, jobs=jobs, name=lambda e: e.name, on_done=done)

    def row(records: list[dict]) -> list[str]:
        cells = []
        for name in selected:
            rec = next((r for r in records if r["agent"]["variant"] == name), None)
            st = Stats.from_samples(rec["agent"]["samples_ns"], rec["agent"]["config"]["batch"]) if rec else None
            cells.append(_ms(st.p50) if st else "-")
        cells.append(", ".join(str(r["id"]) for r in records))
        return cells

    report_fleet(
        out, fleet, title=f"{bundle.manifest.model_name} on {len(entries)} device(s) (target {profile.name})",
        columns=[f"{name} p50 ms" for name in selected] + ["runs"], row=row, json_out=json_,
    )  # fmt: skip


def _bench_model(
    out: Output, model: Path, *, target: str, device, backend, shape, warmup, iterations, duration, threads,
    trust_new_host: bool = False, password: str | None = None,
):  # fmt: skip
    """Bundle ``model`` as it is for the target's backend and bench it (edgekit deploy, unquantized)."""
    from edgekit.deploy import DeployRequest, deploy
    from edgekit.modelio import parse_shape_overrides
    from edgekit.transport.local import default_root

    req = DeployRequest(
        model=model,
        target=target,
        device=device,
        backend=backend,
        quantize=False,
        shapes=parse_shape_overrides(shape),
        warmup=warmup,
        iterations=iterations,
        duration_s=duration,
        threads=threads,
        trust_new_host=trust_new_host,
        password=password,
        # Beside the local device's files, not in the working directory: bench leaves no output.
        output=default_root().parent / "bench-bundles" / f"{model.stem}-{Path(target).stem}",
    )
    req.output.parent.mkdir(parents=True, exist_ok=True)
    result = deploy(req, out)  # it prints the plan's notes
    out.info(f"bundle: {result.bundle.root} (bench it again with: edgekit bench {result.bundle.root})")
    records = [{"id": rid, **rec} for rid, rec in zip(result.run_ids, result.records)]
    title = f"{result.plan.model} on {result.plan.device} (target {result.plan.profile}, backend {result.plan.backend})"
    return records, title


def _print(out: Output, records: list[dict], title: str, json_: bool) -> None:
    out.info(f"stored as run(s) {', '.join(str(r['id']) for r in records)} (see: edgekit results show ID)")
    if json_:
        out.json(records)
        return
    rows = []
    for r in records:
        agent = r["agent"]
        stats = Stats.from_samples(agent["samples_ns"], agent["config"]["batch"])
        rss = agent.get("peak_rss_bytes")
        rows.append([
            agent["variant"], agent["backend"], agent["precision"],
            _ms(stats.p50), _ms(stats.p90), _ms(stats.p99), _ms(stats.mean),
            _rate(stats.throughput), "" if rss is None else f"{rss / 2**20:.1f}",
        ])  # fmt: skip
    out.table(_COLUMNS, rows, title=title)
    print_backend_details(out, [{"variant": r["agent"]["variant"], **{k: r["agent"].get(k) for k in ("backend_info", "layers")}} for r in records])


def _ms(value: float) -> str:
    return f"{value:.3f}" if value < 10 else f"{value:.2f}" if value < 1000 else f"{value:.0f}"


def _rate(value: float) -> str:
    return f"{value:.1f}" if value < 1000 else f"{value:.0f}"


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
