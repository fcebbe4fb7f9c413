"""Inventories: named devices with an SSH target and a profile, read from the files teams keep.

Three formats, one result (an ordered name -> ``DeviceEntry`` map):

* ``devices.toml`` (edgekit's own)::

      [devices.pi1]
      ssh = "pi@10.0.0.7:22"      # user@host[:port], an ~/.ssh/config alias, or "local"
      profile = "rpi5"
      tags = ["lab", "arm"]
      # workdir = "/data/edgekit", python = "/usr/bin/python3.11"   (override the profile's)

* Ansible INI (``[group]`` host lines with ``key=value`` variables, ``[group:vars]``,
  ``[group:children]``, host ranges such as ``pi[01:04]``);
* Ansible YAML (``all: {hosts: ..., vars: ..., children: ...}``; needs PyYAML).

From Ansible variables edgekit reads ``ansible_host``, ``ansible_user``, ``ansible_port``
(and their ``ansible_ssh_*`` spellings), ``ansible_connection=local``,
``ansible_python_interpreter``, and its own ``edgekit_profile`` / ``edgekit_workdir``.
A host's groups become its tags.
"""

from __future__ import annotations

import difflib
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.errors import InputError, UsageError
from edgekit.jsonable import FieldsDict
from edgekit.tomlkeys import unknown_key
from edgekit.transport.names import check_host, check_user
from edgekit.transport.sshconfig import parse_device

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

INVENTORY_NAME = "devices.toml"
LOCAL = "local"
_TOML_KEYS = ("ssh", "profile", "tags", "workdir", "python")
# Device names end up in result records and directory names: keep them plain.
_NAME_RE = re.compile(r"^[A-Za-z0-9\[][A-Za-z0-9._@:\[\]%+-]*$")
_RANGE_RE = re.compile(r"\[([0-9]+|[a-z]):([0-9]+|[a-z])(?::([0-9]+))?\]")


@dataclass(frozen=True)
class DeviceEntry(FieldsDict):
    """One device: its name, how to reach it, and what it is."""

    name: str
    address: str  # "local", "user@host:port", "user@host", or an ssh alias
    profile: str | None = None  # None: the command's --target (or its default) decides
    tags: tuple[str, ...] = ()
    workdir: str | None = None  # overrides the profile's [device] workdir
    python: str | None = None  # overrides the profile's [device] python
    source: str = ""  # the inventory file, or "--device"

    @property
    def is_local(self) -> bool:
        return self.address == LOCAL


@dataclass(frozen=True)
class Inventory:
    path: Path | None
    devices: dict[str, DeviceEntry] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.devices)

    def get(self, name: str) -> DeviceEntry | None:
        return self.devices.get(name)


# -- finding and reading -------------------------------------------------------------------


def default_inventory_path(cwd: Path | None = None) -> Path | None:
    """``./devices.toml``, else ``devices.toml`` in edgekit's config dir; None when neither exists."""
    from edgekit.profiles.loader import _config_dir

    cwd = Path.cwd() if cwd is None else Path(cwd)
    for candidate in (cwd / INVENTORY_NAME, _config_dir() / INVENTORY_NAME):
        if candidate.is_file():
            return candidate
    return None


def load_inventory(path: Path | str) -> Inventory:
    """Read an inventory file; the format comes from its suffix (.toml, .yml/.yaml, else INI)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise InputError(
            f"inventory file not found: {path}",
            "give a devices.toml, an Ansible INI or YAML inventory (see docs/devices.md)",
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read inventory {path}: {exc}", "check the file's permissions and encoding") from None
    suffix = path.suffix.lower()
    if suffix == ".toml":
        return Inventory(path, _read_toml(text, str(path)))
    groups = _yaml_groups(text, str(path)) if suffix in (".yml", ".yaml") else _ini_groups(text, str(path))
    return Inventory(path, _from_groups(groups, str(path)))


def resolve_devices(names: Sequence[str], inventory: Path | str | None = None, *, cwd: Path | None = None) -> list[DeviceEntry]:
    """The devices a command runs on, in order, without duplicates.

    ``names`` are inventory names, ``@GROUP`` (every device tagged GROUP), or, when not in the
    inventory, SSH targets (``user@host[:port]``, an ~/.ssh/config alias) or ``local``.
    With ``inventory`` and no names: every device in it. Without ``inventory`` the default
    one (./devices.toml, then the config dir's) is consulted when it exists.
    """
    explicit = inventory is not None
    path = inventory if explicit else default_inventory_path(cwd)
    inv = load_inventory(path) if path is not None else Inventory(None)
    if not names:
        if explicit:
            if not len(inv):
                raise InputError(f"inventory {inv.path} lists no devices", "add a device (see docs/devices.md)")
            return list(inv.devices.values())
        return []
    chosen: dict[str, DeviceEntry] = {}
    for name in names:
        for entry in _resolve_one(name, inv, explicit):
            chosen.setdefault(entry.name, entry)
    return list(chosen.values())


def _resolve_one(name: str, inv: Inventory, explicit: bool) -> list[DeviceEntry]:
    name = name.strip()
    if not name:
        raise UsageError("empty --device name", "give an inventory name, user@host[:port], or local")
    if name.startswith("@"):
        found = [d for d in inv.devices.values() if name[1:] in d.tags]
        if not found:
            groups = sorted({t for d in inv.devices.values() for t in d.tags})
            where = f"inventory {inv.path}" if inv.path else "the inventory (none found)"
            raise UsageError(
                f"no device in {where} is in group '{name[1:]}'",
                f"groups there: {', '.join(groups)}" if groups else "tag devices with tags = [...] or Ansible groups",
            )
        return found
    entry = inv.get(name)
    if entry is not None:
        return [entry]
    if explicit and "@" not in name and name != LOCAL:
        close = difflib.get_close_matches(name, list(inv.devices), n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        raise UsageError(
            f"no device '{name}' in inventory {inv.path}",
            hint + "`edgekit devices list --inventory FILE` shows its devices; an SSH target not in it is written user@host",
        )
    if name != LOCAL:
        parse_device(check_name(name, "--device"))
    return [DeviceEntry(name=name, address=name, source="--device")]


def check_name(name: str, where: str) -> str:
    """``name`` when it is a usable device name / SSH target; else a usage error (on the
    command line) or an input error (in an inventory file)."""
    error = UsageError if where == "--device" else InputError
    if not _NAME_RE.match(name):
        raise error(
            f"{where}: device name {name!r} has characters edgekit does not allow",
            "use letters, digits and . _ - @ : [ ] % + (a name is also used in result records and directory names)",
        )
    user, at, host = name.rpartition("@")
    if at and (not user or not host or "@" in user):
        raise error(f"{where}: {name!r} is not a device: expected user@host[:port]", "e.g. pi@10.0.0.7 or pi@raspberrypi.local:2222")
    return name


def format_address(host: str, user: str | None = None, port: int | str | None = None) -> str:
    """``user@host:port`` with an IPv6 host in brackets; parts left out when not given."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    text = f"{user}@{host}" if user else host
    return f"{text}:{port}" if port not in (None, "") else text


# -- devices.toml --------------------------------------------------------------------------


def _read_toml(text: str, source: str) -> dict[str, DeviceEntry]:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{source}: invalid TOML: {exc}", "fix the syntax (see docs/devices.md for an example)") from None
    bad = unknown_key(doc, ("devices",))
    if bad:
        raise InputError(f"{source}: unknown top-level key '{bad[0]}'", f"an inventory has one table, [devices.NAME]; {bad[2]}")
    table = doc.get("devices", {})
    if not isinstance(table, dict):
        raise InputError(f"{source}: 'devices' must be a table of [devices.NAME] tables", "see docs/devices.md")
    devices: dict[str, DeviceEntry] = {}
    for name, entry in table.items():
        where = f"{source}: devices.{name}"
        check_name(name, source)
        if not isinstance(entry, dict):
            raise InputError(f"{where} must be a table", f'write it as [devices.{name}] with ssh = "user@host"')
        bad = unknown_key(entry, _TOML_KEYS)
        if bad:
            raise InputError(f"{where}: {bad[1]}", bad[2])
        for key in ("ssh", "profile", "workdir", "python"):
            if key in entry and (not isinstance(entry[key], str) or not entry[key].strip()):
                raise InputError(f"{where}.{key} must be a non-empty string", _TOML_HINTS[key])
        tags = entry.get("tags", [])
        if not isinstance(tags, list) or not all(isinstance(t, str) and t for t in tags):
            raise InputError(f"{where}.tags must be an array of strings", 'e.g. tags = ["lab", "arm"]')
        address = entry.get("ssh", name).strip()
        if address != LOCAL:
            parse_device(address, f"{where}.ssh", InputError)
        devices[name] = DeviceEntry(
            name=name,
            address=address,
            profile=entry.get("profile"),
            tags=tuple(dict.fromkeys(tags)),
            workdir=entry.get("workdir"),
            python=entry.get("python"),
            source=source,
        )
    return devices


_TOML_HINTS = {
    "ssh": 'e.g. ssh = "pi@10.0.0.7:22", an alias from ~/.ssh/config, or "local"',
    "profile": 'a target profile name, e.g. profile = "rpi5" (edgekit profiles list)',
    "workdir": 'a directory on the device, e.g. workdir = "~/.edgekit"',
    "python": 'the device\'s interpreter, e.g. python = "/usr/bin/python3"',
}


# -- Ansible: groups of hosts with variables ---------------------------------------------


@dataclass
class _Group:
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)  # host -> its own vars
    vars: dict[str, Any] = field(default_factory=dict)
    children: list[str] = field(default_factory=list)


MAX_RANGE_HOSTS = 4096  # one host pattern expands to at most this many hosts (a fleet, not a typo's billions)


def _range_size(match: re.Match) -> int:
    start, end, step = match.group(1), match.group(2), int(match.group(3) or 1)
    if start.isdigit() != end.isdigit() or step < 1:
        return 0
    lo, hi = (int(start), int(end)) if start.isdigit() else (ord(start), ord(end))
    return len(range(lo, hi + 1, step))


def expand_hosts(pattern: str, source: str = "") -> list[str]:
    """Ansible host ranges: ``pi[01:03]`` -> pi01 pi02 pi03, ``db-[a:c]``, ``n[0:10:5]``."""
    match = _RANGE_RE.search(pattern)
    if not match:
        return [pattern]
    total = 1
    for m in _RANGE_RE.finditer(pattern):  # counted before anything is made: pi[0:99999999] is refused, not built
        total *= max(1, _range_size(m))
        if total > MAX_RANGE_HOSTS:
            raise InputError(
                f"{source}: host range '{pattern}' names more than {MAX_RANGE_HOSTS} hosts",
                f"split it into ranges of at most {MAX_RANGE_HOSTS} hosts, or check the bounds for a typo",
            )
    start, end, step = match.group(1), match.group(2), int(match.group(3) or 1)
    head, tail = pattern[: match.start()], pattern[match.end() :]
    if start.isdigit() != end.isdigit() or step < 1:
        raise InputError(f"{source}: bad host range in '{pattern}'", "ranges look like [01:10], [a:f] or [0:20:5]")
    if start.isdigit():
        width = len(start) if start.startswith("0") and len(start) > 1 else 0
        values = [str(i).zfill(width) for i in range(int(start), int(end) + 1, step)]
    else:
        values = [chr(c) for c in range(ord(start), ord(end) + 1, step)]
    if not values:
        raise InputError(f"{source}: empty host range in '{pattern}'", "the range's start must not exceed its end")
    return [h for v in values for h in expand_hosts(head + v + tail, source)]


def _ini_groups(text: str, source: str) -> dict[str, _Group]:
    groups: dict[str, _Group] = {"all": _Group(), "ungrouped": _Group()}
    section, kind = "ungrouped", "hosts"
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        where = f"{source}:{lineno}"
        if line.startswith("["):
            if not line.endswith("]") or len(line) < 3:
                raise InputError(f"{where}: bad section header {line!r}", "write [group], [group:vars] or [group:children]")
            section, _, kind = line[1:-1].strip().partition(":")
            kind = kind or "hosts"
            if kind not in ("hosts", "vars", "children"):
                raise InputError(f"{where}: unknown section kind ':{kind}'", "write [group], [group:vars] or [group:children]")
            groups.setdefault(section, _Group())
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError as exc:
            raise InputError(f"{where}: {exc}", "check the quotes on this line") from None
        group = groups[section]
        if kind == "vars":
            key, sep, value = line.partition("=")
            if not sep or not key.strip():
                raise InputError(f"{where}: expected key=value in [{section}:vars]", "e.g. edgekit_profile=rpi4")
            group.vars[key.strip()] = _ini_value(value.strip())
        elif kind == "children":
            groups.setdefault(words[0], _Group())
            group.children.append(words[0])
        else:
            host, assignments = words[0], words[1:]
            if "=" in host:
                raise InputError(f"{where}: a host line starts with the host's name, not {host!r}", "e.g. pi1 ansible_host=10.0.0.7")
            hostvars: dict[str, Any] = {}
            for word in assignments:
                key, sep, value = word.partition("=")
                if not sep or not key:
                    raise InputError(f"{where}: expected key=value after the host name, got {word!r}", "e.g. pi1 ansible_host=10.0.0.7 ansible_user=pi")
                hostvars[key] = _ini_value(value)
            for name in expand_hosts(host, where):
                group.hosts.setdefault(name, {}).update(hostvars)
    return groups


def _ini_value(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


MAX_YAML_DEPTH = 64


def _no_alias_cycle(doc: Any, source: str) -> None:
    """YAML anchors may point back into themselves (``a: &x {b: *x}``): a value that contains
    itself would recurse for ever when read or printed. Refused, as is absurd nesting."""
    on_path: set[int] = set()
    stack: list[tuple[Any, int, bool]] = [(doc, 0, True)]
    while stack:  # iterative: a deep document must not hit Python's recursion limit here either
        value, depth, entering = stack.pop()
        if not entering:
            on_path.discard(id(value))
            continue
        if not isinstance(value, (dict, list)):
            continue
        if id(value) in on_path:
            raise InputError(f"{source}: a YAML alias refers to a mapping or list that contains it (an alias cycle)", "replace the alias (*name) with the values it stands for")
        if depth > MAX_YAML_DEPTH:
            raise InputError(f"{source}: nested more than {MAX_YAML_DEPTH} levels deep", "an inventory is groups, hosts and variables: flatten it")
        on_path.add(id(value))
        stack.append((value, depth, False))
        for child in value.values() if isinstance(value, dict) else value:
            stack.append((child, depth + 1, True))


def _yaml_groups(text: str, source: str) -> dict[str, _Group]:
    try:
        import yaml
    except ImportError:
        raise InputError(
            f"{source} is a YAML inventory, and reading YAML needs PyYAML, which is not installed",
            "pip install pyyaml (into edgekit's environment), or use an INI or devices.toml inventory",
        ) from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"{source}: invalid YAML: {' '.join(str(exc).split())}", "fix the syntax") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise InputError(f"{source}: the top level must be a mapping of groups (all: ...)", "see docs/devices.md")
    _no_alias_cycle(doc, source)
    groups: dict[str, _Group] = {"all": _Group(), "ungrouped": _Group()}

    def visit(name: str, body: Any, where: str) -> None:
        group = groups.setdefault(str(name), _Group())
        if body is None:
            return
        if not isinstance(body, dict):
            raise InputError(f"{where} must be a mapping with hosts/vars/children", "see docs/devices.md")
        bad = sorted(set(body) - {"hosts", "vars", "children"})
        if bad:
            raise InputError(f"{where}: unknown key '{bad[0]}'", "a group has hosts, vars and children")
        hosts = body.get("hosts") or {}
        if not isinstance(hosts, dict):
            raise InputError(f"{where}.hosts must be a mapping of host names", "e.g. hosts: {pi1: {ansible_host: 10.0.0.7}}")
        for host, hostvars in hosts.items():
            if hostvars is not None and not isinstance(hostvars, dict):
                raise InputError(f"{where}.hosts.{host} must be a mapping of variables", "e.g. pi1: {ansible_host: 10.0.0.7}")
            for h in expand_hosts(str(host), where):
                group.hosts.setdefault(h, {}).update(hostvars or {})
        gvars = body.get("vars") or {}
        if not isinstance(gvars, dict):
            raise InputError(f"{where}.vars must be a mapping", "e.g. vars: {edgekit_profile: rpi4}")
        group.vars.update(gvars)
        children = body.get("children") or {}
        if not isinstance(children, dict):
            raise InputError(f"{where}.children must be a mapping of groups", "e.g. children: {pis: {hosts: ...}}")
        for child, child_body in children.items():
            group.children.append(str(child))
            visit(str(child), child_body, f"{where}.children.{child}")

    for name, body in doc.items():
        visit(str(name), body, f"{source}: {name}")
    return groups


def _from_groups(groups: dict[str, _Group], source: str) -> dict[str, DeviceEntry]:
    """Flatten Ansible groups into devices: a group's vars reach every host below it; deeper wins."""
    parents: dict[str, set[str]] = {name: set() for name in groups}
    for name, group in groups.items():
        for child in group.children:
            parents.setdefault(child, set()).add(name)
    depth: dict[str, int] = {}

    def depth_of(name: str, seen: tuple[str, ...] = ()) -> int:
        if name in seen:
            raise InputError(f"{source}: group '{name}' is its own ancestor", "remove the cycle from the :children sections")
        if name not in depth:
            ups = parents.get(name, set()) - {name}
            depth[name] = 0 if name == "all" else 1 + max((depth_of(p, (*seen, name)) for p in ups), default=0)
        return depth[name]

    def ancestors(name: str) -> set[str]:
        found: set[str] = set()
        todo = [name]
        while todo:
            for p in parents.get(todo.pop(), ()):
                if p not in found:
                    found.add(p)
                    todo.append(p)
        return found

    member: dict[str, set[str]] = {}  # host -> the groups that list it, hosts in file order
    for name, group in groups.items():
        for host in group.hosts:
            member.setdefault(host, set()).add(name)
    devices: dict[str, DeviceEntry] = {}
    for host, direct in member.items():
        every = set(direct).union(*(ancestors(g) for g in direct)) | {"all"}
        merged: dict[str, Any] = {}
        for g in sorted(every, key=lambda n: (depth_of(n), n)):
            merged.update(groups[g].vars if g in groups else {})
        for g in sorted(direct, key=lambda n: (depth_of(n), n)):
            merged.update(groups[g].hosts[host])
        tags = tuple(sorted(every - {"all", "ungrouped"}))
        devices[host] = _ansible_entry(host, merged, tags, source)
    return devices


def _ansible_entry(host: str, v: dict[str, Any], tags: tuple[str, ...], source: str) -> DeviceEntry:
    check_name(host, source)

    def get(*keys: str) -> str | None:
        for key in keys:
            if v.get(key) not in (None, ""):
                return str(v[key])
        return None

    if get("ansible_connection") == "local":
        address = LOCAL
    else:
        port = get("ansible_port", "ansible_ssh_port")
        if port is not None and not port.isdigit():
            raise InputError(f"{source}: host {host}: ansible_port must be a number, got {port!r}", "e.g. ansible_port=2222")
        where = f"{source}: host {host}"
        user = get("ansible_user", "ansible_ssh_user")
        address = format_address(
            check_host(get("ansible_host", "ansible_ssh_host") or host, f"{where}: ansible_host"),
            user and check_user(user, f"{where}: ansible_user"),
            port,
        )
        parse_device(address, where, InputError)  # and the parts read back as one address
    return DeviceEntry(
        name=host,
        address=address,
        profile=get("edgekit_profile"),
        tags=tags,
        workdir=get("edgekit_workdir"),
        python=None if get("ansible_python_interpreter") in (None, "auto", "auto_silent", "auto_legacy") else get("ansible_python_interpreter"),
        source=source,
    )


def entries_table(entries: Iterable[DeviceEntry]) -> list[list[str]]:
    """Rows for a human listing: name, address, profile, tags, overrides."""
    rows = []
    for e in entries:
        extra = ", ".join(f"{k}={val}" for k, val in (("workdir", e.workdir), ("python", e.python)) if val)
        rows.append([e.name, e.address, e.profile or "-", ",".join(e.tags) or "-", extra or "-"])
    return rows
