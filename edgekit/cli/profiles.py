"""`edgekit profiles list|show|validate`: the target profiles edgekit knows about."""

from __future__ import annotations

from pathlib import Path

import typer

from edgekit.cli import common
from edgekit.cli.output import Output
from edgekit.errors import ProfileError
from edgekit.profiles import (
    Profile,
    list_profiles,
    load_profile,
    profile_dirs,
    resolve,
    validate_file,
)

app = typer.Typer(
    name="profiles",
    help="Target profiles: the device classes edgekit can plan for (built-in, ./profiles/, "
    "the user config dir, or a TOML file path).",
    no_args_is_help=True,
    rich_markup_mode=None,
)


def _resolved(profile: Profile) -> Profile:
    """Probe profiles show this machine's facts; a host we cannot probe shows none."""
    try:
        return resolve(profile)
    except ProfileError:
        return profile


def _cpu_summary(profile: Profile) -> str:
    cpu = profile.cpu
    if not cpu.arch:
        return "(probed when used)"
    text = " ".join(part for part in (cpu.arch, cpu.core) if part)
    return f"{text} (probed)" if profile.probe else text


def _backends_summary(profile: Profile) -> str:
    return "\n".join(f"{b.name} {'/'.join(b.precisions)}" for b in profile.backends)


@app.command("list")
def list_command(json_: common.Json = False) -> None:
    """List every visible profile; a user profile shadows a built-in of the same name.

    \b
    Examples:
      edgekit profiles list
      edgekit profiles list --json | jq -r '.profiles[].name'
    """
    out = Output()
    profiles = [_resolved(p) for p in list_profiles()]
    if json_:
        out.json({"profiles": [p.to_dict() for p in profiles], "search_path": [str(d) for d in profile_dirs()]})
        return
    rows = [
        (p.name, _cpu_summary(p), p.accelerator or "-", _backends_summary(p), p.source)
        for p in profiles
    ]
    out.table(["name", "cpu", "accelerator", "backends (in order)", "source"], rows)


@app.command("show")
def show_command(
    target: str = typer.Argument(..., metavar="NAME|PATH", help="Profile name or path to a .toml file."),
    json_: common.Json = False,
) -> None:
    """Show one profile in full; probe profiles (local, linux-cpu) show this machine's facts.

    \b
    Examples:
      edgekit profiles show rpi5
      edgekit profiles show ./profiles/my-board.toml --json
    """
    out = Output()
    profile = resolve(load_profile(target))
    if json_:
        out.json(profile.to_dict())
        return
    cpu, bench = profile.cpu, profile.bench
    fields = [
        ("name", profile.name),
        ("description", profile.description),
        ("source", profile.source),
        ("arch", cpu.arch + (" (probed)" if profile.probe else "")),
        ("core", cpu.core or "-"),
        ("isa", " ".join(cpu.isa) or "-"),
        ("cores", cpu.cores if cpu.cores is not None else "-"),
        ("accelerator", profile.accelerator or "-"),
        ("workdir", profile.workdir),
        ("python", profile.python),
        ("bench", f"warmup {bench.warmup}, iterations {bench.iterations} for at least {bench.min_time_s:g} s, "
                  f"threads {bench.threads if bench.threads is not None else 'all cores'}"),
    ]
    out.table(["field", "value"], fields, title=f"profile {profile.name}")
    out.line()
    rows = []
    for i, b in enumerate(profile.backends, start=1):
        bounds = (f">={b.min_version}" if b.min_version else "", f"<={b.max_version}" if b.max_version else "")
        versions = " ".join(v for v in bounds if v) or "-"
        rows.append((i, b.name, b.device or "-", ", ".join(b.precisions), versions, b.dla_cores or "-"))
    out.table(["#", "backend", "device", "precisions", "versions", "dla cores"], rows,
              title="backends, in order of preference")
    notes = [(i, b) for i, b in enumerate(profile.backends, start=1) if b.notes]
    if notes:
        out.line()
        for i, b in notes:
            out.line(f"{i}. {b.name}: {b.notes}")


@app.command("validate")
def validate_command(
    file: Path = typer.Argument(..., metavar="FILE", help="The profile TOML file to check."),
    json_: common.Json = False,
) -> None:
    """Check a profile file: prints "ok: FILE (name)" or the first problem (exit code 3).

    \b
    Examples:
      edgekit profiles validate profiles/my-board.toml
      edgekit profiles validate my-board.toml --json
    """
    out = Output()
    profile = validate_file(file)
    if json_:
        out.json({"ok": True, "file": str(file), "name": profile.name, "profile": profile.to_dict()})
        return
    out.line(f"ok: {file} ({profile.name})")
