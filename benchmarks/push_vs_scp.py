"""edgekit's push against OpenSSH's ``scp``: the same files, the same sshd, the same machine.

By default the script starts its own sshd on 127.0.0.1 (``tests/lab/sshd.py``: a real OpenSSH
server with a key pair of its own; installed with apt-get when missing and root) and builds one
bundle from a file of random bytes (``--size-mb``, default 50) plus the example models. Then,
in ``--repeats`` interleaved rounds (so a slow patch of the machine hits both alike):

* **scp**: a fresh ``scp`` process copies the bundle's files into an empty directory
  (its own connection and authentication included, as a user would run it);
* **push (cold)**: a fresh ``SshTransport`` (connection and authentication included) pushes
  the bundle into an empty device directory: content check, upload of every file to a temp
  name, sha256 verified on the device, rename, bundle directory, ``current`` switch;
* **push (warm)**: the same bundle pushed again on the same connection: nothing to send.

It prints medians, throughput (bundle bytes / wall time) and the ratio push/scp of throughput
(above 1: push is faster). Nothing is asserted; this is a measurement, not a test.

    python benchmarks/push_vs_scp.py
    python benchmarks/push_vs_scp.py --size-mb 200 --repeats 7
    python benchmarks/push_vs_scp.py --json > push_vs_scp.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.lab, when run as a script from anywhere

from edgekit.bundle import TensorSpec, Variant, write_bundle  # noqa: E402
from edgekit.transport.push import push_bundle  # noqa: E402
from edgekit.transport.ssh import SshTransport  # noqa: E402

SCHEMA = 1
EXAMPLE_FILES = ("examples/digits/digits_cnn.onnx", "examples/mobilenetv2/mobilenetv2.onnx")


def make_bundle(work: Path, size_mb: int):
    files = {}
    big = work / "random.bin"
    with open(big, "wb") as fh:
        for _ in range(size_mb):
            fh.write(os.urandom(1 << 20))
    files["blob/random.bin"] = big
    for rel in EXAMPLE_FILES:
        p = ROOT / rel
        if p.is_file():
            files[f"examples/{p.name}"] = p
    model = next(k for k in files if k.endswith(".onnx")) if any(k.endswith(".onnx") for k in files) else "blob/random.bin"
    variant = Variant("fp32", "onnxruntime", "fp32", model, (TensorSpec("x", (1,), "float32"),), ())
    return write_bundle(
        work / "bundle", files=files, model_name="bench", model_sha256="0" * 64, profile="linux-cpu",
        backend="onnxruntime", precision="fp32", variants=[variant], plan={},
    )  # fmt: skip


def bundle_files(bundle) -> list[Path]:
    return [bundle.path(f.path) for f in bundle.manifest.files] + [bundle.root / "manifest.json"]


def _measure(server, work: Path, bundle, files: list[Path], total: int, repeats: int) -> dict[str, list[float]]:
    """Seconds per round: scp of the bundle's files, a first push, and a push of the same bundle again."""
    from paramiko import SSHConfig

    known = work / "known_hosts"
    known.write_text(server.known_hosts_line())
    config = SSHConfig.from_text(server.ssh_config("bench") + f"    UserKnownHostsFile {known}\n")
    scp_opts = [*server.ssh_argv(), "-P", str(server.port), "-q"]
    remote = f"{server.user}@127.0.0.1"
    times: dict[str, list[float]] = {"scp": [], "push_cold": [], "push_warm": []}
    for i in range(repeats):
        dest = server.home / f"scp-{i}"
        dest.mkdir()
        start = time.perf_counter()
        subprocess.run(["scp", *scp_opts, *map(str, files), f"{remote}:{dest}/"], check=True)
        times["scp"].append(time.perf_counter() - start)
        shutil.rmtree(dest)

        workdir = str(server.home / f"push-{i}")
        start = time.perf_counter()
        dev = SshTransport("bench", workdir=workdir, python=sys.executable, ssh_config=config)
        result = push_bundle(dev, bundle)
        times["push_cold"].append(time.perf_counter() - start)
        assert result.bytes_sent == total, (result.bytes_sent, total)
        start = time.perf_counter()
        again = push_bundle(dev, bundle)
        times["push_warm"].append(time.perf_counter() - start)
        assert again.bytes_sent == 0
        dev.close()
        shutil.rmtree(workdir)
        print(f"round {i + 1}/{repeats}: scp {times['scp'][-1]:.3f}s, push {times['push_cold'][-1]:.3f}s, "
              f"again {times['push_warm'][-1]:.3f}s", file=sys.stderr)  # fmt: skip
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=50, help="size of the random file in the bundle (default 50)")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved rounds; medians are shown (default 5)")
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout instead of the table")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.size_mb < 1:
        print("error: --repeats and --size-mb must be >= 1", file=sys.stderr)
        return 2
    if shutil.which("scp") is None:
        print("error: scp is not installed (apt-get install openssh-client)", file=sys.stderr)
        return 2

    from tests.lab.sshd import LabUnavailable, Sshd

    with tempfile.TemporaryDirectory(prefix="edgekit-push-bench-") as tmp:
        work = Path(tmp)
        print(f"building a bundle with {args.size_mb} MB of random bytes + the example models ...", file=sys.stderr)
        bundle = make_bundle(work, args.size_mb)
        files = bundle_files(bundle)
        total = sum(p.stat().st_size for p in files)
        try:
            with Sshd(work / "sshd") as server:
                times = _measure(server, work, bundle, files, total, args.repeats)
        except LabUnavailable as exc:
            print(f"error: cannot start the loopback sshd: {exc}", file=sys.stderr)
            return 1

    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["scp"] / med["push_cold"]
    doc = {
        "schema": SCHEMA,
        "benchmark": "push_vs_scp",
        "environment": {
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "scp": subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip(),
            "paramiko": __import__("paramiko").__version__,
            "repeats": args.repeats,
        },
        "bundle": {"files": len(files), "bytes": total},
        "seconds": {k: {"median": med[k], "runs": v} for k, v in times.items()},
        "throughput_mb_s": {k: total / med[k] / 1e6 for k in ("scp", "push_cold")},
        "ratio_push_vs_scp": ratio,
    }
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"bundle: {len(files)} files, {total / 1e6:.1f} MB; {args.repeats} interleaved rounds on loopback, medians")
    print(f"{'':28}{'seconds':>10}{'MB/s':>10}")
    print(f"{'scp (OpenSSH)':28}{med['scp']:>10.3f}{total / med['scp'] / 1e6:>10.1f}")
    print(f"{'edgekit push, cold':28}{med['push_cold']:>10.3f}{total / med['push_cold'] / 1e6:>10.1f}")
    print(f"{'edgekit push, unchanged':28}{med['push_warm']:>10.3f}{'-':>10}")
    print(f"push throughput / scp throughput: {ratio:.2f}x (goal >= 0.9x; push also verifies sha256 on the device)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
