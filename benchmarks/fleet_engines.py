"""A fleet deploy through each engine: edgekit's own (``--engine ssh``) and Ansible (``--engine ansible``).

Starts N real OpenSSH sshd processes on 127.0.0.1 (``tests/lab/sshd.py``: each its own port, host
key and device directory), writes one Ansible INI inventory naming them, and deploys the digits
example through the real CLI to all of them, first with empty device stores and an empty results
store (quantize once, push, bench and evaluate on each device), then again unchanged (nothing to
push, the identical earlier runs reused). Both engines read the same inventory; the ssh engine
finds the key and known_hosts in ~/.ssh (a temp HOME), Ansible in the inventory's variables.
Concurrency: ``--jobs 10`` and ``--forks 10``. For each it prints the wall time of the command,
this host's CPU (user+sys of the CLI and everything it started: ``resource.getrusage`` of
children, plus this process's own), both per device, and the bytes pushed. The device side
(sshd, the agents) runs on this machine too but is not counted in the host's CPU.

    python benchmarks/fleet_engines.py [--devices 10,25,50] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.lab, when run as a script from anywhere
DIGITS = ROOT / "examples" / "digits" / "digits_cnn.onnx"
BENCH = ["-n", "20", "--warmup", "2", "--layers", "off", "--threads", "1"]


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def deploy(engine: str, inventory: Path, env: dict, out: Path) -> tuple[float, float, list[dict]]:
    """(wall s, host CPU s, the per-device JSON list) of one fleet deploy."""
    conc = ["--jobs", "10"] if engine == "ssh" else ["--forks", "10"]
    argv = [sys.executable, "-m", "edgekit", "deploy", str(DIGITS), "--inventory", str(inventory), "--engine", engine, *conc, *BENCH, "-o", str(out), "--json"]
    cpu0, t0 = _cpu(), time.perf_counter()
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=3600)
    wall, cpu = time.perf_counter() - t0, _cpu() - cpu0
    if r.returncode != 0:
        raise SystemExit(f"{engine} deploy failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    return wall, cpu, json.loads(r.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", default="10,25,50", help="fleet sizes, comma-separated")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = parser.parse_args()
    from tests.lab import sshd as lab

    sizes = [int(n) for n in args.devices.split(",")]
    base = Path(tempfile.mkdtemp(prefix="edgekit-fleet-bench-"))
    key = base / "client_key"
    lab.keygen(key, "edgekit-bench")
    servers: list[lab.Sshd] = []
    rows = []
    try:
        for _ in range(max(sizes)):
            servers.append(lab.Sshd(base / f"d{len(servers):02d}", client_key=key).start())
        home = base / "home"
        (home / ".ssh").mkdir(parents=True)
        known = "".join(s.known_hosts_line() for s in servers)
        (home / ".ssh" / "known_hosts").write_text(known)
        (home / ".ssh" / "config").write_text(f"Host *\n    IdentityFile {key}\n    IdentitiesOnly yes\n")
        (base / "known_hosts").write_text(known)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "SSH_AUTH_SOCK")}
        env.update(HOME=str(home), CI="1", EDGEKIT_CACHE_DIR=str(base / "cache"), EDGEKIT_CONFIG_DIR=str(base / "config"))
        for n in sizes:
            inv = base / f"fleet{n}.ini"
            inv.write_text("[fleet]\n" + "".join(
                f"d{i:02d} ansible_host=127.0.0.1 ansible_port={s.port} ansible_user={s.user} ansible_ssh_private_key_file={key}\n"
                for i, s in enumerate(servers[:n])
            ) + f"[fleet:vars]\nansible_ssh_common_args='-o UserKnownHostsFile={base / 'known_hosts'}'\n")  # fmt: skip
            for engine in ("ssh", "ansible"):
                for s in servers:
                    shutil.rmtree(s.home / ".edgekit", ignore_errors=True)
                run_env = {**env, "EDGEKIT_DATA_DIR": str(base / f"data-{engine}-{n}")}
                first = deploy(engine, inv, run_env, base / "out")
                again = deploy(engine, inv, run_env, base / "out")
                ok = [d for d in first[2] if d["status"] == "ok"]
                if len(ok) != n:
                    raise SystemExit(f"{engine}: {n - len(ok)} of {n} devices failed: {[d['error'] for d in first[2] if d['status'] != 'ok'][:3]}")
                sent = [sum(d["result"]["push"]["bytes_sent"] for d in run[2]) for run in (first, again)]
                rows.append({"engine": engine, "devices": n, "first_s": first[0], "first_cpu_s": first[1], "again_s": again[0], "again_cpu_s": again[1],
                             "first_bytes": sent[0], "again_bytes": sent[1]})  # fmt: skip
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(base, ignore_errors=True)
    header = ["engine", "devices", "first deploy: wall", "per device", "host CPU per device", "pushed", "unchanged redeploy: wall", "host CPU per device", "pushed"]
    lines = []
    for r in rows:
        n = r["devices"]
        lines.append([r["engine"], str(n), f"{r['first_s']:.0f} s", f"{r['first_s'] / n:.2f} s", f"{r['first_cpu_s'] / n:.2f} s",
                      f"{r['first_bytes'] / 1e6:.1f} MB", f"{r['again_s']:.0f} s", f"{r['again_cpu_s'] / n:.2f} s", f"{r['again_bytes']} B"])  # fmt: skip
    print(f"# {platform.machine()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}; loopback sshd devices on this machine")
    if args.markdown:
        print("| " + " | ".join(header) + " |\n|" + " --- |" * len(header))
        for line in lines:
            print("| " + " | ".join(line) + " |")
    else:
        for line in [header, *lines]:
            print("  ".join(f"{c:>12}" for c in line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
