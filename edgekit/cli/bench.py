"""`edgekit bench`: push a bundle to a device, time each variant there, store the runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from edgekit.bench.record import make_record
from edgekit.bench.run import BenchConfig, bench_variant
from edgekit.bench.stats import Stats
from edgekit.bench.store import ResultsStore
from edgekit.bundle import load_bundle
from edgekit.cli.output import Output
from edgekit.errors import UsageError
from edgekit.profiles import load_profile
from edgekit.transport import open_transport
from edgekit.transport.push import push_bundle

# Short headers: the table fits 80 columns (a pipe or CI log) for typical values.
_COLUMNS = ["variant", "backend", "prec", "p50 ms", "p90", "p99", "mean", "inf/s", "RSS MB"]


def bench(
    bundle_dir: Annotated[Path, typer.Argument(metavar="BUNDLE_DIR", help="A bundle directory (holds manifest.json).", show_default=False)],
    target: Annotated[
        str | None, typer.Option("--target", metavar="PROFILE", help="Target profile (name or TOML path). Default: the bundle's profile.")
    ] = None,
    device: Annotated[
        str | None, typer.Option("--device", metavar="DEVICE", help="The device to run on. Default: local (this machine).")
    ] = None,
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
    json_: Annotated[bool, typer.Option("--json", help="Print the stored records as one JSON list.")] = False,
) -> None:
    """Benchmark a bundle's variants on a device and store each run.

    Pushes the bundle (only files the device lacks), runs the edgekit agent there once per
    variant, and prints latency statistics computed from the raw samples.

    \b
    Examples:
      edgekit bench out/resnet18.rpi5
      edgekit bench out/resnet18.rpi5 --variant int8 --iterations 500 --threads 4
      edgekit bench out/mobilenet --duration 10 --json > runs.json
    """
    out = Output("json" if json_ else "human")
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

    transport = open_transport(device, profile)
    try:
        with out.progress(f"pushing bundle {manifest.bundle_hash[:12]} to {transport.name}"):
            pushed = push_bundle(transport, bundle)
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
                record = make_record(doc, model_name=manifest.model_name, target=profile.name, device=transport.name)
                records.append({"id": store.add(record), **record})
    finally:
        transport.close()

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
    out.table(_COLUMNS, rows, title=f"{manifest.model_name} on {transport.name} (target {profile.name})")


def _ms(value: float) -> str:
    return f"{value:.3f}" if value < 10 else f"{value:.2f}" if value < 1000 else f"{value:.0f}"


def _rate(value: float) -> str:
    return f"{value:.1f}" if value < 1000 else f"{value:.0f}"


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
