"""Options shared by several commands, declared once (no noun imports another noun)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from edgekit import validate
from edgekit.cli.output import Output

if TYPE_CHECKING:
    from edgekit.quantize.calib import Preprocess

# The calibration methods, spelled here so that `edgekit --help` and commands that never quantize
# don't import the quantizer (onnx and numpy: ~0.3 s of every start); a test keeps it equal to
# edgekit.quantize.calib.METHODS, the list that decides.
METHODS = ("minmax", "percentile", "entropy", "mse", "auto")
DEFAULT_METHOD = "auto"  # == edgekit.quantize.calib.DEFAULT_METHOD (the same test keeps them equal)
DYNAMIC = "dynamic"  # == edgekit.quantize.calib.DYNAMIC (tests/test_dynamic.py keeps them equal)

Target = Annotated[str, typer.Option("--target", "-t", help="Target profile name or path to a profile TOML.")]
Shape = Annotated[
    list[str] | None,
    typer.Option("--shape", help="Concrete shape for a dynamic input, NAME:D0,D1,... (repeatable).", metavar="NAME:DIMS"),
]
Calib = Annotated[
    Path | None,
    typer.Option("--calib", help="Calibration data: .npz/.npy of stacked samples, a folder of .npz, or a folder of images."),
]
CalibSamples = Annotated[
    int | None,
    typer.Option("--calib-samples", callback=validate.option("calib_samples"), metavar="N", help="Calibrate on at most N samples, spread evenly over the --calib data (a folder: only those files are read)."),
]
Eval = Annotated[Path | None, typer.Option("--eval", help="Held-out data for the fp32-vs-int8 report (same formats as --calib).")]
Labels = Annotated[Path | None, typer.Option("--labels", help="Class labels (.npy of ints) for the --eval samples: reports accuracy.")]
Method = Annotated[
    str,
    typer.Option(
        "--method",
        help=f"Calibration method: {', '.join(METHODS)}; add +clip (MSE weight clipping), +bias (bias correction; auto "
        "corrects the biases where that lowers the error at the outputs), +nobias (never), "
        "+cle (cross-layer equalization), +smooth[=alpha] (SmoothQuant scales into LayerNorm/MatMul constants), "
        "+gptq (weights rounded against the layers' inputs; auto keeps that rounding where it lowers the error at the outputs), "
        "+nearest (weights rounded to the nearest step), e.g. mse+clip+bias; "
        "or dynamic: int8 weights, activations quantized at run time (no calibration; onnxruntime).",
    ),
]
Exclude = Annotated[list[str] | None, typer.Option("--exclude", help="Keep this node in float (repeatable).", metavar="NODE")]
PreprocessOpt = Annotated[
    str | None,
    typer.Option("--preprocess", help="Image preprocessing, e.g. 'scale=1/255,mean=0.485/0.456/0.406,std=0.229/0.224/0.225,color=rgb'."),
]
Threshold = Annotated[
    float | None,
    typer.Option(
        "--threshold", metavar="VALUE",
        help="What the held-out fp32-vs-int8 check must reach, in the metric's unit: top1 % agreement (default 99), cosine (0.99), "
        "iou (0.9), ctc CER increase in points, at most (1), snr dB (20). Needs the metric named (--metric, or [accuracy] in the model's .edgekit.toml).",
    ),
]  # fmt: skip
Strict = Annotated[bool, typer.Option("--strict", help="An int8 model that misses the threshold is an error (exit 5, nothing written), not a warning.")]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON document to stdout.")]
Backend = Annotated[str | None, typer.Option("--backend", help="Force a backend (onnxruntime, native, openvino, tensorrt, tflite, numpy).")]

# -- devices ------------------------------------------------------------------------------------
Devices = Annotated[
    list[str] | None,
    typer.Option(
        "--device", "-d", metavar="DEVICE",
        help="Device: an inventory name, @GROUP, user@host[:port], an ~/.ssh/config alias, or local. "
        "Repeat it for several devices (run in parallel). Default: this machine.",
    ),
]  # fmt: skip
Inventory = Annotated[
    Path | None,
    typer.Option("--inventory", "-i", metavar="FILE", help="devices.toml, or an Ansible INI/YAML inventory. Default: ./devices.toml, then the config dir's."),
]
Jobs = Annotated[int, typer.Option("--jobs", "-j", callback=validate.option("jobs"), metavar="N", help="With several devices: how many to work on at once.")]
LockWait = Annotated[
    float,
    typer.Option("--lock-wait", callback=validate.option("lock_wait"), metavar="SECONDS", help="Queue this long behind another job holding the device's lock."),
]
TrustNewHost = Annotated[
    bool,
    typer.Option(
        "--trust-new-host",
        help="Accept an SSH device whose host key is not in ~/.ssh/known_hosts yet, and save its key (a changed key is always refused).",
    ),
]
Password = Annotated[
    bool,
    typer.Option("--password", help="Allow SSH password login; the password comes from $EDGEKIT_SSH_PASSWORD, else it is asked on the terminal."),
]
Warmup = Annotated[
    str | None,
    typer.Option("--warmup", metavar="N|auto", callback=validate.warmup, help="Untimed runs first, or auto (the default): until latency is stable, at most 200 runs or 2 s."),
]
Iterations = Annotated[
    int | None,
    typer.Option("--iterations", "-n", callback=validate.option("iterations"), metavar="N", help="Timed runs, exactly (default: the profile's count, run for at least its min_time, 0.5 s)."),
]
Duration = Annotated[float | None, typer.Option("--duration", callback=validate.option("duration_s"), metavar="SECONDS", help="Time for this many seconds instead of a count.")]
MinTime = Annotated[
    float | None,
    typer.Option("--min-time", callback=validate.option("min_time_s"), metavar="SECONDS", help="Run the timed runs for at least this long as well (default: the profile's, 0.5 s; with --iterations, 0; --duration replaces both)."),
]
Threads = Annotated[int | None, typer.Option("--threads", callback=validate.option("threads"), metavar="N", help="Inference threads (default: the profile's, else one or all cores, whichever a short probe on the device finds faster).")]
Rounds = Annotated[
    int | None,
    typer.Option("--rounds", callback=validate.option("rounds"), metavar="N", help="Time each variant in N agent processes, one after another (variants alternate), and merge their samples: "
                 "the spread between processes then counts as noise (default: the profile's, 1)."),
]
LAYER_MODES = ("time", "error", "off")
Layers = Annotated[
    str,
    typer.Option(
        "--layers", metavar="time|error|off",
        help="Per layer: time (the default: times from a separate profiled pass after the timed runs); error: also the fp32-vs-int8 "
        "error of every int8 tensor as the device's backends computed it, on a few held-out samples (deploy); off: neither.",
    ),
]  # fmt: skip
NoLayers = Annotated[bool, typer.Option("--no-layers", help="The same as --layers off.")]

Fail = Annotated[
    list[str] | None,
    typer.Option(
        "--fail", metavar="GATE",
        help="Exit 5 when this gate fails (repeatable): p50:+5% (vs the baseline, only when significant), p99:<20ms, "
        "accuracy:-0.5pt, drop:<1pt, rss:<64MB (1 MB = 2^20 B), energy:+10%, throughput:-5%. Metrics: p50 p90 p99 mean min max "
        "throughput accuracy drop rss energy load first; a metric not measured fails unless written METRIC?:...",
    ),
]  # fmt: skip
Baseline = Annotated[
    str | None,
    typer.Option(
        "--baseline", metavar="REF",
        help="The run relative gates compare with: a run id, branch:NAME, tag:NAME (edgekit results pin), latest, latest@BRANCH "
        "or an export file (FILE, FILE#N). Default: the latest passing run of the same model, target, device and variant "
        "on the default branch, else anywhere; never a failed one.",
    ),
]  # fmt: skip

Engine = Annotated[
    str | None,
    typer.Option("--engine", metavar="ansible|ssh", help="Who reaches the devices: ansible (Ansible reads the --inventory and runs the per-device part; needs edgekit[ansible]) or ssh (edgekit's own). Default: ansible for an Ansible inventory when ansible-runner is installed, else ssh."),
]
Limit = Annotated[str | None, typer.Option("--limit", metavar="PATTERN", help="--engine ansible: only the hosts matching this Ansible host pattern (e.g. 'lab:!pi3', 'pi*').")]
Forks = Annotated[int | None, typer.Option("--forks", metavar="N", help="--engine ansible: hosts worked on at once (Ansible's forks; default 5).")]
Serial = Annotated[str | None, typer.Option("--serial", metavar="N|N%", help="--engine ansible: deploy in batches of N hosts (or N% of them), one batch after another.")]
MaxFail = Annotated[str | None, typer.Option("--max-fail", metavar="N%", help="--engine ansible: stop when more than N% of a batch failed (Ansible's max_fail_percentage); the rest is not deployed.")]

# Option groups several commands take: name -> (annotation, default). ``options`` adds them.
GROUPS: dict[str, dict[str, tuple]] = {
    "quantize": {
        "calib": (Calib, None), "calib_samples": (CalibSamples, None), "eval_data": (Eval, None), "labels": (Labels, None), "method": (Method, DEFAULT_METHOD),
        "exclude": (Exclude, None), "shape": (Shape, None), "preprocess": (PreprocessOpt, None), "threshold": (Threshold, None), "strict": (Strict, False),
    },
    "bench": {"warmup": (Warmup, None), "iterations": (Iterations, None), "duration": (Duration, None), "min_time": (MinTime, None), "threads": (Threads, None), "rounds": (Rounds, None), "layers": (Layers, "time"), "no_layers": (NoLayers, False)},
    "gates": {"fail": (Fail, None), "baseline": (Baseline, None)},
    "ssh": {"trust_new_host": (TrustNewHost, False), "password": (Password, False), "inventory": (Inventory, None)},
    "engine": {"engine": (Engine, None), "limit": (Limit, None), "forks": (Forks, None), "serial": (Serial, None), "max_fail": (MaxFail, None)},
}  # fmt: skip


def options(*groups: str | dict) -> Callable:
    """Add the option ``groups`` (names in GROUPS, or such dicts) to a command; it takes them as keyword arguments (``**opts``),
    and ``--json`` (its ``json_out``) stays last in --help."""

    def add(command: Callable) -> Callable:
        own = inspect.signature(command, eval_str=True).parameters.values()
        params = [p.replace(kind=p.KEYWORD_ONLY) for p in own if p.kind is not p.VAR_KEYWORD]
        last = [p for p in params if p.name == "json_out"]
        params = [p for p in params if p.name != "json_out"] + [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=kind, default=default)
            for group in groups for name, (kind, default) in (GROUPS[group] if isinstance(group, str) else group).items()
        ] + last  # fmt: skip
        command.__signature__ = inspect.Signature(params, return_annotation=None)
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return add


def quantize_args(opts: dict) -> dict:
    """The "quantize" group as the API's keyword arguments."""
    return dict(
        calib=opts["calib"], calib_samples=opts["calib_samples"], eval=opts["eval_data"], labels=opts["labels"], method=check_method(opts["method"]),
        exclude=opts["exclude"], shapes=shapes(opts["shape"]), preprocess=preprocess(opts["preprocess"]), threshold=opts["threshold"], strict=opts["strict"],
    )  # fmt: skip


def bench_args(opts: dict) -> dict:
    """The "bench" group as the API's keyword arguments."""
    from edgekit.errors import UsageError

    mode = "off" if opts["no_layers"] else opts["layers"]
    if mode not in LAYER_MODES:
        raise UsageError(f"unknown --layers '{mode}'", f"choose one of: {', '.join(LAYER_MODES)}")
    if opts["no_layers"] and opts["layers"] != "time":
        raise UsageError(f"--no-layers and --layers {opts['layers']} contradict each other", "drop one of them")
    return dict(
        warmup=opts["warmup"], iterations=opts["iterations"], duration_s=opts["duration"], min_time_s=opts["min_time"], threads=opts["threads"],
        rounds=opts["rounds"], layers=mode != "off", layer_error=mode == "error",
    )  # fmt: skip


def gates(opts: dict, *, fleet: bool, runs: bool = True) -> list:
    """The "gates" group's --fail gates, parsed before any work (a typo costs no benchmark run)."""
    from edgekit.bench.compare import check_ref
    from edgekit.bench.gates import parse_gates
    from edgekit.errors import UsageError

    parsed = parse_gates(opts["fail"])
    if opts["baseline"] is not None and not parsed:
        raise UsageError("--baseline is what --fail gates compare with, and no --fail was given", "add --fail GATE, e.g. --fail p50:+5%")
    if parsed and fleet:
        raise UsageError("--fail gates one device's run", "gate each device on its own, or use edgekit ci")
    if parsed and not runs:
        raise UsageError("--fail gates a benchmark run, and --no-bench/--dry-run make none", "drop --no-bench/--dry-run, or drop --fail")
    if opts["baseline"] is not None:
        check_ref(opts["baseline"])
    return parsed


def finish_gates(o: Output, report, json_out: bool) -> None:
    """Print each gate's line (human mode), then raise the GateError (exit 5) if any failed."""
    if report is None:
        return
    if not json_out:
        for line in report.lines():
            o.line(line)
    err = report.error()
    if err:
        raise err


def preprocess(text: str | None) -> Preprocess | None:
    from edgekit.quantize.calib import Preprocess

    return Preprocess.parse(text) if text else None


def check_method(method: str) -> str:
    from edgekit.errors import UsageError

    if method.partition("+")[0] not in (*METHODS, DYNAMIC):
        raise UsageError(f"unknown calibration method '{method}'", f"choose one of: {', '.join(METHODS)}, or {DYNAMIC}")
    if "+" in method:  # only then is the quantizer needed to read the options
        from edgekit.quantize.calib import parse_method

        parse_method(method)
    return method


def shapes(items: list[str] | None) -> dict[str, tuple[int, ...]]:
    from edgekit.modelio import parse_shape_overrides

    return parse_shape_overrides(items)


def engine(opts: dict, devices: list[str] | None = None):
    """The "engine" group: which engine runs (``edgekit.devices.ansible.choose_engine``), and for
    ansible its strategy (None for ssh, where the Ansible-only options are refused; ``devices``,
    the --device names, are the ssh engine's and refused with ansible)."""
    from edgekit.devices import ansible
    from edgekit.errors import UsageError

    name = ansible.choose_engine(opts["engine"], opts["inventory"])
    ansible.check_ssh_only(name, **{"--limit": opts["limit"], "--forks": opts["forks"], "--serial": opts["serial"], "--max-fail": opts["max_fail"]})
    if name != "ansible":
        return None
    if devices:
        raise UsageError("--device picks devices for the ssh engine; the ansible engine runs on the inventory's hosts",
                         "choose hosts with --limit PATTERN (an Ansible host pattern), or pass --engine ssh")  # fmt: skip
    return ansible.Strategy.parse(opts["limit"], opts["forks"], opts["serial"], opts["max_fail"])


def is_fleet(entries: list, inventory: Path | None) -> bool:
    """Several devices, or an inventory: the per-device table (a JSON list) instead of one result."""
    return inventory is not None or len(entries) > 1


def run_fleet(o: Output, entries: list, one, jobs: int):
    """``one(entry)`` on every device, ``jobs`` at once, a line each as it finishes."""
    from edgekit.devices.fleet import run_fleet as run

    def done(outcome) -> None:
        o.info(f"[{outcome.device}] {'done' if outcome.succeeded else 'FAILED: ' + (outcome.error or '')}")

    return run(entries, one, jobs=jobs, name=lambda e: e.name, on_done=done)


def ssh_password(enabled: bool, entry) -> str | None:
    """The SSH password when --password was given: $EDGEKIT_SSH_PASSWORD, else asked on the TTY."""
    import getpass
    import os
    import sys

    from edgekit.errors import UsageError

    if not enabled:
        return None
    if entry is None or entry.is_local:
        raise UsageError("--password is for SSH devices", "drop --password, or pass --device user@host")
    password = os.environ.get("EDGEKIT_SSH_PASSWORD")
    if password:
        return password
    if not sys.stdin.isatty():
        raise UsageError(
            "--password needs the password, and there is no terminal to ask on",
            "set EDGEKIT_SSH_PASSWORD for this command, or better, install an SSH key on the device (ssh-copy-id)",
        )
    return getpass.getpass(f"SSH password for {entry.address}: ")
