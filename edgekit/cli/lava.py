"""`edgekit lava-job`: a LAVA job definition that benches a bundle on a board of a LAVA lab."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated

import typer

from edgekit.cli import common
from edgekit.cli.output import Output


def lava_job(
    source: Annotated[Path, typer.Argument(metavar="MODEL|BUNDLE", help="A float ONNX model (bundled here for --target), or a bundle directory.", show_default=False)],
    device_type: Annotated[str, typer.Option("--device-type", help="The LAVA device type of the boards (an SSH-reachable, already booted device).", show_default=False)],
    bundle_url: Annotated[str, typer.Option("--bundle-url", help="Where the lab's boards will download the packed bundle (you upload the .tar.gz there).", show_default=False)],
    target: Annotated[str | None, typer.Option("--target", "-t", help="Target profile, when MODEL is a model file.")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="The job YAML (default: edgekit-out/MODEL-TARGET.lava.yaml); the packed bundle goes beside it as .tar.gz.")] = None,
    variant: Annotated[list[str] | None, typer.Option("--variant", help="Bench only this variant (repeatable). Default: all.")] = None,
    iterations: Annotated[int, typer.Option("--iterations", min=1, help="Timed runs per variant.")] = 100,
    threads: Annotated[int | None, typer.Option("--threads", min=1, help="Inference threads (default: the runtime's).")] = None,
    fail: Annotated[list[str] | None, typer.Option("--fail", metavar="GATE", help="Absolute latency gate the job checks on the board, e.g. p99:<20ms (repeatable).")] = None,
    tag: Annotated[list[str] | None, typer.Option("--tag", help="LAVA device tag the job needs (repeatable).")] = None,
    json_out: common.Json = False,
) -> None:
    """Write a LAVA job that benches MODEL's bundle on a LAVA board, and the .tar.gz it downloads.

    Submit it with lavacli, then bring its results into the store:

    \b
    Example:
      edgekit lava-job examples/digits/digits_cnn.onnx --target rpi4 --device-type bcm2711-rpi-4-b \\
          --bundle-url https://files.lab.example/edgekit/digits_cnn-rpi4.lava.tar.gz
      lavacli jobs submit edgekit-out/digits_cnn-rpi4.lava.yaml
      lavacli jobs logs JOB --raw > log.yaml; lavacli results JOB --yaml > results.yaml
      edgekit results import-lava log.yaml results.yaml
    """
    from edgekit.errors import InputError, UsageError

    try:
        import yaml
    except ImportError:
        raise InputError("writing a LAVA job needs PyYAML, which is not installed", "pip install pyyaml (or edgekit[yaml])") from None
    from edgekit.fsutil import check_output_path, write_bytes_atomic
    from edgekit.lava import LavaJob, job_definition, pack, read_manifest

    o = Output()
    if not bundle_url.strip() or any(c.isspace() for c in bundle_url):
        raise UsageError(f"--bundle-url {bundle_url!r} is not a URL", "give the http(s) URL the lab's boards download the .tar.gz from")
    if not source.exists():
        raise InputError(f"no such model or bundle: {source}", "give a .onnx model with --target, or a bundle directory from `edgekit deploy --no-bench`")
    if source.is_dir():
        if target is not None:
            raise UsageError("--target is for a model file; a bundle was made for its target already", "drop --target")
        bundle_dir = source
    else:
        bundle_dir = _bundle(o, source, target)
    manifest = read_manifest(bundle_dir)
    yaml_path = output or Path("edgekit-out") / f"{manifest.get('model_name', 'model')}-{manifest.get('profile', 'target')}.lava.yaml"
    if output is None:
        yaml_path.parent.mkdir(parents=True, exist_ok=True)
    pack_path = yaml_path.with_name(yaml_path.name.removesuffix(".yaml").removesuffix(".yml") + ".tar.gz")
    check_output_path(yaml_path)
    check_output_path(pack_path)
    data = pack(bundle_dir)
    digest = hashlib.sha256(data).hexdigest()
    job = job_definition(LavaJob(bundle_dir=bundle_dir, device_type=device_type, bundle_url=bundle_url.strip(), bundle_sha256=digest,
                                 iterations=iterations, variants=tuple(variant or ()), gates=tuple(fail or ()), threads=threads,
                                 tags=tuple(tag or ())))
    write_bytes_atomic(pack_path, data)
    write_bytes_atomic(yaml_path, yaml.safe_dump(job, sort_keys=False, width=200).encode())
    doc = {"job": str(yaml_path), "pack": str(pack_path), "pack_sha256": digest, "pack_bytes": len(data), "bundle": str(bundle_dir),
           "device_type": device_type}
    if json_out:
        o.json(doc)
    else:
        o.info(f"LAVA job written to {yaml_path}; upload {pack_path} ({len(data)} bytes, sha256 {digest[:12]}) to {bundle_url.strip()}")
        o.info(f"then: lavacli jobs submit {yaml_path}")


def _bundle(o: Output, model: Path, target: str | None) -> Path:
    from edgekit import api
    from edgekit.deploy import open_job, run
    from edgekit.errors import UsageError

    if target is None:
        raise UsageError("--target is needed to bundle a model file for a LAVA board", "e.g. --target rpi4 (edgekit profiles list)")
    job = open_job(api.request(model, target=target, goal="bundle"))
    result = run(job, job.plan(), o)
    return Path(result.bundle.root)
