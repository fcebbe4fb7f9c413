"""`edgekit devices`: inventories, preflight checks, provisioning runtimes, the device lock."""

from __future__ import annotations

import contextlib
import inspect
from typing import Annotated

import typer

from edgekit import validate
from edgekit.cli import common
from edgekit.cli.output import Output

app = typer.Typer(
    help="Devices: list an inventory, check a device against a profile, provision a runtime, unlock.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

DeviceArg = Annotated[str, typer.Argument(metavar="DEVICE", help="An inventory name, user@host[:port], an ~/.ssh/config alias, or local.", show_default=False)]
TargetOpt = Annotated[
    str | None,
    typer.Option("--target", "-t", metavar="PROFILE", help="Target profile. Default: the device's inventory profile, else local / linux-cpu."),
]
_DEVICE = {"device": (DeviceArg, inspect.Parameter.empty), "target": (TargetOpt, None)}


def _entry_and_profile(opts: dict):
    from edgekit.devices import resolve_devices
    from edgekit.profiles import load_profile

    entry = resolve_devices([opts["device"]], opts["inventory"])[0]
    return entry, load_profile(opts["target"] or entry.profile or ("local" if entry.is_local else "linux-cpu"))


def _connect(entry, profile, opts: dict, o) -> contextlib.closing:
    """The device's transport for one command, closed on the way out of its ``with``."""
    from edgekit.devices import connect

    password = common.ssh_password(opts["password"], entry)
    transport = connect(entry, profile, trust_new_host=opts["trust_new_host"], password=password, log=o.info)
    return contextlib.closing(transport)


@app.command("list")
def list_devices(inventory: common.Inventory = None, json_out: common.Json = False) -> None:
    """List the devices of an inventory: name, SSH target, profile, tags.

    \b
    Examples:
      edgekit devices list
      edgekit devices list --inventory hosts.ini --json
    """
    from edgekit.devices.inventory import default_inventory_path, entries_table, load_inventory
    from edgekit.errors import UsageError

    path = inventory or default_inventory_path()
    if path is None:
        raise UsageError(
            "no inventory: there is no ./devices.toml nor one in edgekit's config dir",
            "pass --inventory FILE (devices.toml, Ansible INI or YAML; see docs/devices.md)",
        )
    inv = load_inventory(path)
    o = Output()
    if json_out:
        o.json({"inventory": str(inv.path), "devices": [d.to_dict() for d in inv.devices.values()]})
        return
    o.table(["device", "ssh", "profile", "tags", "overrides"], entries_table(inv.devices.values()), title=f"{len(inv)} device(s) in {inv.path}")


CheckDeviceArg = Annotated[
    str | None,
    typer.Argument(metavar="DEVICE", help="An inventory name, user@host[:port], an ~/.ssh/config alias, or local; with --engine ansible, an Ansible host pattern (default: all).", show_default=False),
]


@app.command("check")
@common.options({"device": (CheckDeviceArg, None), "target": (TargetOpt, None)}, "ssh", "engine")
def check(
    json_out: common.Json = False,
    **opts,
) -> None:
    """Probe DEVICE and check it against a profile: arch, ISA, runtimes, memory, disk.

    Prints the device's facts and one verdict per check; exits with code 4 when a check fails.
    Nothing is pushed except the small agent that reads the facts.

    \b
    Examples:
      edgekit devices check pi@10.0.0.7 --target rpi5
      edgekit devices check orin1 --json
      edgekit devices check --inventory hosts.ini --engine ansible --limit 'lab:!pi3'
    """
    from edgekit.devices.lock import describe_holder, lock_status
    from edgekit.devices.preflight import fact_rows, preflight
    from edgekit.errors import UsageError

    strategy = common.engine(opts)
    o = Output()
    if strategy is not None:
        _check_ansible(o, strategy, opts, json_out)
        return
    if opts["device"] is None:
        raise UsageError("devices check needs the DEVICE to check", "e.g. edgekit devices check pi@10.0.0.7 (or --engine ansible --inventory hosts.ini for a fleet)")
    entry, profile = _entry_and_profile(opts)
    with _connect(entry, profile, opts, o) as transport, o.progress(f"probing {entry.name}"):
        report = preflight(transport, profile, device=entry.name)
        lock = lock_status(transport)
    if json_out:
        o.json({**report.to_dict(), "lock": lock})
    else:
        o.table(["fact", "value"], fact_rows(report), title=f"{entry.name}: facts")
        rows = [[c.name, c.status.upper() if c.status != "ok" else "ok", c.detail] for c in report.checks]
        o.table(["check", "status", "detail"], rows, title=f"{entry.name} against profile {profile.name}")
        if lock.get("locked"):
            state = "stale, will be broken by the next job" if lock.get("stale") else "held"
            o.line(f"lock: {state} by {describe_holder(lock.get('holder'), lock.get('now'))}")
        if report.ok:
            o.line(f"{entry.name} is ready for {profile.name}" + (f" ({len(report.warnings)} warning(s))" if report.warnings else ""))
    report.raise_for_failures()


def _check_ansible(o: Output, strategy, opts: dict, json_out: bool) -> None:
    """devices check of every host Ansible selects: one row per host, facts and checks in --json."""
    import dataclasses

    from edgekit.ansibledeploy import check_fleet
    from edgekit.cli import render
    from edgekit.errors import UsageError

    for flag, given in (("--trust-new-host", opts["trust_new_host"]), ("--password", opts["password"])):
        if given:
            raise UsageError(f"{flag} is not supported by the ansible engine", "Ansible's own settings decide how it logs in and which host keys it trusts; or use --engine ssh")
    if opts["device"] is not None:
        if strategy.limit is not None:
            raise UsageError("give the hosts either as DEVICE or as --limit, not both", "e.g. edgekit devices check 'lab:!pi3' --engine ansible --inventory hosts.ini")
        strategy = dataclasses.replace(strategy, limit=opts["device"])
    fleet = check_fleet(opts["inventory"], strategy, target=opts["target"], sink=o)

    def row(doc: dict) -> list[str]:
        facts = (doc.get("facts") or {}).get("device") or {}
        warn = [c["name"] for c in doc["checks"] if c["status"] == "warn"]
        lock = doc.get("lock") or {}
        return [doc["profile"], str(facts.get("arch") or "-"), str(facts.get("python") or "-"), ", ".join(warn) or "-",
                ("stale" if lock.get("stale") else "held") if lock.get("locked") else "free"]  # fmt: skip

    render.report_fleet(o, fleet, title=f"{len(fleet.outcomes)} host(s) checked (ansible)", columns=["profile", "arch", "python", "warnings", "lock"],
                        row=row, json_out=json_out)  # fmt: skip


@app.command("provision")
@common.options(_DEVICE, "ssh")
def provision(
    runtime: Annotated[
        str | None,
        typer.Option("--runtime", "-r", metavar="NAME", help="onnxruntime, openvino, tflite or numpy. Default: what the profile's plan needs."),
    ] = None,
    offline: Annotated[bool, typer.Option("--offline", help="Don't let the device try the registry: download wheels here and push them.")] = False,
    lock_wait: Annotated[float, typer.Option("--lock-wait", callback=validate.option("lock_wait"), metavar="SECONDS", help="Wait this long for another job's lock on the device.")] = 0.0,
    json_out: common.Json = False,
    **opts,
) -> None:
    """Install a runtime into edgekit's own venv on DEVICE (<workdir>/venv).

    The device installs from the package registry itself when it can reach it; otherwise this
    host downloads wheels for the device's platform and Python, pushes them and the device
    installs them offline. From then on the agent runs with that venv's Python.

    \b
    Examples:
      edgekit devices provision pi@10.0.0.7 --runtime onnxruntime
      edgekit devices provision orin1 --runtime openvino --offline
    """
    from edgekit.devices.provision import RUNTIMES, provisionable
    from edgekit.devices.provision import provision as run_provision
    from edgekit.errors import UsageError
    from edgekit.targets import get_backend

    entry, profile = _entry_and_profile(opts)
    if runtime is None:
        usable = [b.name for b in profile.backends if get_backend(b.name).implemented and provisionable(b.name)]
        runtime = next((n for n in usable if "onnx" in get_backend(n).formats), usable[0] if usable else None)
        if runtime is None:
            raise UsageError(f"profile {profile.name} names no runtime edgekit can provision", f"pass --runtime ({', '.join(RUNTIMES)})")
    o = Output()
    with _connect(entry, profile, opts, o) as transport:
        result = run_provision(transport, runtime, offline=offline, device=entry.name, events=o, lock_wait=lock_wait)
    if json_out:
        o.json(result.to_dict())
        return
    key = RUNTIMES[runtime][1]
    how = {
        "present": "already installed",
        "registry": "installed from the registry by the device",
        "host": f"installed from {len(result.wheels)} wheel(s) this host downloaded ({result.bytes_sent / 1e6:.1f} MB sent)",
    }[result.source]
    o.line(f"{runtime} {result.versions.get(key) or ''} on {entry.name}: {how}".replace("  ", " "))
    o.line(f"the agent runs with {result.python}")


@app.command("unlock")
@common.options(_DEVICE, "ssh")
def unlock(
    json_out: common.Json = False,
    **opts,
) -> None:
    """Remove DEVICE's lock, whoever holds it: for a job that died (a lock also expires by itself).

    \b
    Example:
      edgekit devices unlock pi@10.0.0.7
    """
    from edgekit.devices.lock import break_lock, describe_holder

    entry, profile = _entry_and_profile(opts)
    o = Output()
    with _connect(entry, profile, opts, o) as transport:
        holder = break_lock(transport)
    if json_out:
        o.json({"device": entry.name, "removed": holder is not None, "holder": holder})
    elif holder is not None:
        o.line(f"removed the lock on {entry.name} held by {describe_holder(holder)}")
    else:
        o.line(f"{entry.name} was not locked")
