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

With ``--compare-with DIR`` the rounds also time the push of another edgekit checkout (a git
worktree of an older commit, say) in a child process, so before and after come from one run.

It prints medians, throughput (bundle bytes / wall time), the ratio push/scp of throughput
(above 1: push is faster) and the median of the per-round ratios. Nothing is asserted; this is
a measurement, not a test.

    python benchmarks/push_vs_scp.py                      # 200 MB, 5 rounds
    python benchmarks/push_vs_scp.py --size-mb 50 --repeats 7
    git worktree add /tmp/ek-before HEAD~3 && python benchmarks/push_vs_scp.py --compare-with /tmp/ek-before
    python benchmarks/push_vs_scp.py --json > push_vs_scp.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
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

SCHEMA = 2
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


# The other checkout's push, in a process of its own (its edgekit, this Python): one JSON line
# per round on stdin ({"config", "known", "bundle", "workdir"}), its seconds on stdout.
_CHILD = """
import json, shutil, sys, time
sys.path.insert(0, sys.argv[1])
from paramiko import SSHConfig
from edgekit.bundle import load_bundle
from edgekit.transport.push import push_bundle
from edgekit.transport.ssh import SshTransport
for line in sys.stdin:
    job = json.loads(line)
    bundle = load_bundle(job["bundle"], verify=False)
    config = SSHConfig.from_text(job["config"])
    start, cpu = time.perf_counter(), time.process_time()
    dev = SshTransport("bench", workdir=job["workdir"], python=sys.executable, ssh_config=config)
    sent = push_bundle(dev, bundle).bytes_sent
    cold, cpu = time.perf_counter() - start, time.process_time() - cpu
    start = time.perf_counter()
    again = push_bundle(dev, bundle).bytes_sent
    warm = time.perf_counter() - start
    dev.close()
    shutil.rmtree(job["workdir"])
    print(json.dumps({"cold": cold, "warm": warm, "cpu": cpu, "sent": sent, "again": again}), flush=True)
"""


def _push_here(config, bundle, workdir: str, total: int) -> tuple[float, float, str]:
    """A cold push into an empty device directory (connection included), then the same again."""
    start, cpu = time.perf_counter(), time.process_time()
    dev = SshTransport("bench", workdir=workdir, python=sys.executable, ssh_config=config)
    result = push_bundle(dev, bundle)
    cold, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert result.bytes_sent == total, (result.bytes_sent, total)
    start = time.perf_counter()
    again = push_bundle(dev, bundle)
    warm = time.perf_counter() - start
    assert again.bytes_sent == 0
    cipher = dev._transport.local_cipher
    dev.close()
    shutil.rmtree(workdir)
    return cold, warm, cpu, cipher


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _device_cpu(server) -> float:
    """CPU seconds of the sshd's finished connections (sshd, sftp-server, the store, hashers):
    the daemon's reaped children, from /proc/PID/stat (cutime + cstime)."""
    fields = Path(f"/proc/{server.daemon_pid()}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def _settled(server, timeout: float = 10.0) -> None:
    """Wait (bounded) until the connections just closed have exited, so their CPU is counted."""
    deadline = time.monotonic() + timeout
    while server.connection_pids() and time.monotonic() < deadline:
        time.sleep(0.01)


def _measure(server, work: Path, bundle, files: list[Path], total: int, repeats: int, other: Path | None) -> dict[str, list[float]]:
    """Seconds per round: scp of the bundle's files, a first push and a push of the same bundle
    again (and the same two for the ``other`` checkout); the order of the contenders rotates."""
    from paramiko import SSHConfig

    known = work / "known_hosts"
    known.write_text(server.known_hosts_line())
    config_text = server.ssh_config("bench") + f"    UserKnownHostsFile {known}\n"
    config = SSHConfig.from_text(config_text)
    scp_opts = [*server.ssh_argv(), "-P", str(server.port), "-q"]
    remote = f"{server.user}@127.0.0.1"
    names = ["scp", "push_cold", "push_warm"] + (["before_cold", "before_warm"] if other else [])
    times: dict[str, list[float]] = {k: [] for k in names}
    cpu: dict[str, list[float]] = {k: [] for k in ("scp", "push_cold", "before_cold") if k in times}
    device: dict[str, list[float]] = {k: [] for k in cpu}
    child = None
    if other is not None:
        child = subprocess.Popen([sys.executable, "-c", _CHILD, str(other)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def scp(i: int) -> None:
        dest = server.home / f"scp-{i}"
        dest.mkdir()
        _settled(server)
        dev_cpu = _device_cpu(server)
        start, used = time.perf_counter(), _children_cpu()
        subprocess.run(["scp", *scp_opts, *map(str, files), f"{remote}:{dest}/"], check=True)
        times["scp"].append(time.perf_counter() - start)
        cpu["scp"].append(_children_cpu() - used)
        _settled(server)
        device["scp"].append(_device_cpu(server) - dev_cpu)
        shutil.rmtree(dest)

    def push(i: int) -> None:
        _settled(server)
        dev_cpu = _device_cpu(server)
        cold, warm, used, cipher = _push_here(config, bundle, str(server.home / f"push-{i}"), total)
        _settled(server)
        device["push_cold"].append(_device_cpu(server) - dev_cpu)  # the unchanged push's too (small)
        cpu["push_cold"].append(used)
        times["push_cold"].append(cold)
        times["push_warm"].append(warm)
        times.setdefault("cipher", []).append(cipher)  # type: ignore[arg-type]

    def before(i: int) -> None:
        _settled(server)
        dev_cpu = _device_cpu(server)
        job = {"config": config_text, "bundle": str(bundle.root), "workdir": str(server.home / f"before-{i}")}
        child.stdin.write(json.dumps(job) + "\n")
        child.stdin.flush()
        got = json.loads(child.stdout.readline())
        assert got["sent"] == total and got["again"] == 0, got
        times["before_cold"].append(got["cold"])
        cpu["before_cold"].append(got["cpu"])
        _settled(server)
        device["before_cold"].append(_device_cpu(server) - dev_cpu)
        times["before_warm"].append(got["warm"])

    contenders = [scp, push] + ([before] if other else [])
    try:
        for i in range(repeats):
            for run in contenders[i % len(contenders) :] + contenders[: i % len(contenders)]:
                run(i)
            line = ", ".join(f"{k} {v[-1]:.3f}s" for k, v in times.items() if k != "cipher")
            print(f"round {i + 1}/{repeats}: {line}", file=sys.stderr)
    finally:
        if child is not None:
            child.stdin.close()
            child.wait(timeout=60)
    return times, cpu, device


def _scp_cipher() -> str:
    """The cipher scp offers first (OpenSSH's own order; the lab's sshd accepts it)."""
    out = subprocess.run(["ssh", "-G", "127.0.0.1"], capture_output=True, text=True).stdout
    line = next((x for x in out.splitlines() if x.startswith("ciphers ")), "ciphers ?")
    return line.split()[1].split(",")[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=200, help="size of the random file in the bundle (default 200)")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved rounds; medians are shown (default 5)")
    ap.add_argument("--compare-with", type=Path, metavar="DIR", help="also time the push of the edgekit checkout in DIR, same rounds")
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout instead of the table")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.size_mb < 1:
        print("error: --repeats and --size-mb must be >= 1", file=sys.stderr)
        return 2
    if args.compare_with is not None and not (args.compare_with / "edgekit" / "transport" / "push.py").is_file():
        print(f"error: {args.compare_with} is not an edgekit checkout (no edgekit/transport/push.py)", file=sys.stderr)
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
                times, cpu, device = _measure(server, work, bundle, files, total, args.repeats, args.compare_with)
        except LabUnavailable as exc:
            print(f"error: cannot start the loopback sshd: {exc}", file=sys.stderr)
            return 1

    ciphers = sorted(set(times.pop("cipher", [])))
    med = {k: statistics.median(v) for k, v in times.items()}
    colds = [k for k in ("push_cold", "before_cold") if k in times]
    ratio = {k: med["scp"] / med[k] for k in colds}
    per_round = {k: statistics.median(a / b for a, b in zip(times["scp"], times[k])) for k in colds}
    doc = {
        "schema": SCHEMA,
        "benchmark": "push_vs_scp",
        "environment": {
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "scp": subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip(),
            "scp_cipher": _scp_cipher(),
            "push_cipher": ciphers,
            "paramiko": __import__("paramiko").__version__,
            "repeats": args.repeats,
            "compare_with": str(args.compare_with) if args.compare_with else None,
        },
        "bundle": {"files": len(files), "bytes": total},
        "seconds": {k: {"median": med[k], "runs": v} for k, v in times.items()},
        # CPU seconds of the sending side on this host: scp's ssh client, the pushing Python process
        "client_cpu_s": {k: {"median": statistics.median(v), "runs": v} for k, v in cpu.items()},
        # CPU seconds on the device side: sshd, sftp-server, the store, the hashers (the push's
        # figure includes its unchanged push, a few hundredths)
        "device_cpu_s": {k: {"median": statistics.median(v), "runs": v} for k, v in device.items()},
        "throughput_mb_s": {k: total / med[k] / 1e6 for k in ("scp", *colds)},
        "ratio_push_vs_scp": ratio["push_cold"],
        "ratio_median_of_rounds": per_round,
    }
    if "before_cold" in ratio:
        doc["ratio_before_vs_scp"] = ratio["before_cold"]
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    label = {"scp": "scp (OpenSSH)", "push_cold": "edgekit push, cold", "push_warm": "edgekit push, unchanged",
             "before_cold": "before: push, cold", "before_warm": "before: push, unchanged"}  # fmt: skip
    print(f"bundle: {len(files)} files, {total / 1e6:.1f} MB; {args.repeats} interleaved rounds on loopback, medians")
    print(f"ciphers: scp {doc['environment']['scp_cipher']}, push {', '.join(ciphers)}")
    print(f"{'':28}{'seconds':>10}{'MB/s':>10}{'x scp':>8}{'rounds':>8}{'host CPU s':>12}{'device CPU s':>14}")
    for k in times:
        rate = f"{total / med[k] / 1e6:>10.1f}" if not k.endswith("_warm") else f"{'-':>10}"
        rel = f"{ratio[k]:>8.2f}{per_round[k]:>8.2f}" if k in ratio else f"{'':>16}" * (k in cpu)
        used = f"{statistics.median(cpu[k]):>12.2f}{statistics.median(device[k]):>14.2f}" if k in cpu else ""
        print(f"{label[k]:28}{med[k]:>10.3f}{rate}{rel}{used}")
    print(f"push throughput / scp throughput: {ratio['push_cold']:.2f}x (goal >= 0.9x; push also verifies sha256 and fsyncs on the device)")
    if "before_cold" in ratio:
        print(f"before ({args.compare_with}): {ratio['before_cold']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
