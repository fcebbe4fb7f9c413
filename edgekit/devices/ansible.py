"""Ansible as the fleet engine: the playbooks edgekit generates, run through ansible-runner, and
what came back from each host.

Ansible reads the inventory itself (every variable it knows works: ``ansible_ssh_private_key_file``,
``ansible_ssh_common_args`` with a ProxyJump, ``become``...), connects (its own OpenSSH client,
the account's known_hosts: host keys are checked as ``ssh`` checks them), and runs the per-device
part of a command, ``forks`` hosts at a time, in ``serial`` batches, stopping after
``max_fail_percentage``. Two plays, each one ``ansible_runner.run``:

* ``probe``: where edgekit lives on the host (its workdir, ``~`` expanded there; edgekit's venv
  when one was provisioned), the agent zipapp put there under its content-addressed name, then the
  agent's ``facts`` (and, for ``devices check``, the lock's status);
* ``deploy``: the store protocol (``agent.pyz store ROOT plan`` -> only the missing objects,
  packed here into one tar, copied and unpacked into the store -> ``commit`` with ``verify``,
  which hashes every object on the device first, then the atomic ``current`` switch), the device lock (``lock acquire``; refreshed by the agent as each measurement starts, checked after
  the last one, released in an ``always:`` block), then each variant's bench (and eval, whose
  outputs come back with ``fetch``) with the arguments a direct deploy passes.

Every command is an argv list (the ``command`` module, no shell). Each host's registered results
come back as ansible-runner events and are sorted per host here; an unreachable or failed host
is a result with its reason, never the end of the run.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from edgekit.errors import InputError, UsageError

ENGINES = ("ansible", "ssh")
PROBE, DEPLOY = "probe", "deploy"
LOCK_POLL_S = 2  # seconds between two tries of a busy device's lock

# Run on the host with its Python: edgekit's directory (the workdir, ``~`` expanded in the
# session's $HOME, as the ssh engine expands it), the agent's directory made, and the Python
# the agent runs with (edgekit's venv there when one was provisioned, else the one configured).
_WHERE = """\
import json, os, sys
w, py = sys.argv[1], sys.argv[2]
if not (w.startswith("/") or w == "~" or w.startswith("~/")):
    print(json.dumps({"error": "the workdir %r is neither absolute nor under ~" % w}))
    sys.exit(1)
root = os.path.normpath(os.path.expanduser(w))
os.makedirs(os.path.join(root, "agent"), exist_ok=True)
venv = os.path.join(root, "venv", "bin", "python")
print(json.dumps({"root": root, "python": venv if os.access(venv, os.X_OK) else py, "venv": os.access(venv, os.X_OK)}))
"""


# Run here (delegated to localhost): the objects named (sha256 -> file) packed into one tar, each
# member named by its sha256.
PACK = """\
import json, sys, tarfile
out, files, missing = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3:]
with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
    for sha in missing:
        tar.add(files[sha], arcname=sha, recursive=False)
"""

# Run on the device: each member (a sha256 name, nothing else) written beside its final name and
# renamed into the store; the tar removed. The store's next "plan" hashes every one of them.
UNPACK = """\
import os, re, sys, tarfile
tar_path, objects = sys.argv[1], sys.argv[2]
try:
    with tarfile.open(tar_path) as tar:
        for member in tar:
            if not (member.isfile() and re.fullmatch("[0-9a-f]{64}", member.name)):
                sys.exit("not an object: %r" % member.name)
            tmp = os.path.join(objects, ".%s.incoming" % member.name)
            with tar.extractfile(member) as src, open(tmp, "wb") as dst:
                while True:
                    block = src.read(1 << 20)
                    if not block:
                        break
                    dst.write(block)
                dst.flush()
                os.fsync(dst.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, os.path.join(objects, member.name))
finally:
    os.unlink(tar_path)
"""


# -- choosing the engine ------------------------------------------------------------------------


def available() -> bool:
    """ansible-runner importable and ansible-playbook found (the extra ``edgekit[ansible]``)."""
    return importlib.util.find_spec("ansible_runner") is not None and _playbook_bin() is not None


def _playbook_bin() -> str | None:
    beside = Path(sys.executable).parent / "ansible-playbook"  # a venv's, when it is not on PATH
    return shutil.which("ansible-playbook") or (str(beside) if beside.exists() else None)


def is_ansible_inventory(path: Path | None) -> bool:
    """An Ansible INI or YAML inventory (edgekit's own is a .toml)."""
    return path is not None and Path(path).suffix.lower() != ".toml"


def choose_engine(engine: str | None, inventory: Path | None) -> str:
    """``engine`` checked, or the default: ansible for an Ansible inventory when ansible-runner is
    installed, else ssh."""
    if engine is None:
        return "ansible" if is_ansible_inventory(inventory) and available() else "ssh"
    if engine not in ENGINES:
        raise UsageError(f"unknown --engine '{engine}'", f"choose one of: {', '.join(ENGINES)}")
    if engine == "ansible":
        if not is_ansible_inventory(inventory):
            raise UsageError(
                "--engine ansible runs over an Ansible inventory, and none was given" if inventory is None
                else f"--engine ansible runs over an Ansible inventory, and {inventory} is edgekit's own devices.toml",
                "pass --inventory hosts.ini (or hosts.yml), or use --engine ssh",
            )  # fmt: skip
        if not available():
            raise UsageError(
                "--engine ansible needs ansible-core and ansible-runner, which are not installed here",
                "pip install 'edgekit[ansible]' (into edgekit's environment), or use --engine ssh",
            )
    return engine


@dataclass(frozen=True)
class Strategy:
    """How Ansible goes through the hosts: --limit, --forks, --serial, --max-fail."""

    limit: str | None = None
    forks: int = 5
    serial: str | None = None  # "N" or "N%"
    max_fail: int | None = None  # percent

    @classmethod
    def parse(cls, limit: str | None, forks: int | None, serial: str | None, max_fail: str | None) -> Strategy:
        if limit is not None and not limit.strip():
            raise UsageError("--limit is empty", "give an Ansible host pattern, e.g. --limit 'lab:!pi3' or --limit 'pi*'")
        if forks is not None and forks < 1:
            raise UsageError(f"--forks must be at least 1, got {forks}", "e.g. --forks 10")
        if serial is not None and not re.fullmatch(r"[1-9][0-9]*%?", serial.strip()) or serial is not None and serial.endswith("%") and int(serial[:-1]) > 100:
            raise UsageError(f"--serial takes N hosts or N% of them (1-100%), got {serial!r}", "e.g. --serial 10 or --serial 25%")
        pct = None
        if max_fail is not None:
            m = re.fullmatch(r"([0-9]+)%?", max_fail.strip())
            if not m or int(m.group(1)) > 100:
                raise UsageError(f"--max-fail takes a percentage 0-100, got {max_fail!r}", "e.g. --max-fail 20% (a batch with more failed hosts stops the run)")
            pct = int(m.group(1))
        return cls(limit.strip() if limit else None, forks or 5, serial.strip() if serial else None, pct)


def check_ssh_only(engine: str, **given: Any) -> None:
    """The Ansible-only options are refused with the ssh engine (a --limit that silently did nothing
    would run on every device)."""
    if engine == "ssh":
        named = [name for name, value in given.items() if value is not None]
        if named:
            raise UsageError(
                f"{', '.join(named)} {'is' if len(named) == 1 else 'are'} Ansible's, and this command runs on the ssh engine",
                "add --engine ansible (with an Ansible --inventory), or drop " + ", ".join(named),
            )


# -- what came back --------------------------------------------------------------------------


@dataclass
class HostRun:
    """One host's part of a play: each task's result in order, or why it stopped."""

    name: str
    results: list[tuple[str, dict]] = field(default_factory=list)  # (task name, Ansible's result)
    failed: tuple[str, dict] | None = None  # the task that failed, and its result
    unreachable: str | None = None  # Ansible's message when it could not connect
    first: float | None = None  # when Ansible started on it, and last heard of it (event times)
    last_seen: float | None = None

    @property
    def seconds(self) -> float:
        return (self.last_seen - self.first) if self.first is not None and self.last_seen is not None else 0.0

    def last(self, task: str) -> dict | None:
        return next((res for name, res in reversed(self.results) if name == task), None)

    def every(self, task: str) -> list[dict]:
        return [res for name, res in self.results if name == task]

    @property
    def ok(self) -> bool:
        return self.failed is None and self.unreachable is None


@dataclass
class PlayRun:
    hosts: dict[str, HostRun]  # in the order Ansible first touched them
    rc: int
    status: str
    log: str  # the tail of ansible-playbook's output (why a run ended before any host)


def _task(name: str, module: str, args: Any, **more: Any) -> dict:
    return {"name": name, module: args, **more}


def _agent(ek: str, *args: str) -> str:
    """A Jinja list expression: the agent's python and zipapp (``-S``: stdlib only), then ``args``."""
    return "{{ [" + f"{ek}.python, '-S', {ek}.agent" + "".join(f", {a}" for a in args) + "] }}"


def probe_play(with_lock: bool) -> list[dict]:
    """The probe play: where, the agent, facts (and the lock's status)."""
    profile = "(edgekit.target or edgekit_profile | default(edgekit.default_target))"
    python = (
        "(ansible_python_interpreter if ansible_python_interpreter is defined and ansible_python_interpreter is string"
        " and not ansible_python_interpreter.startswith('auto') else edgekit.profiles[ek_profile].python)"
    )
    tasks = [
        _task("edgekit: profile", "ansible.builtin.set_fact", {
            "ek_profile": "{{ " + profile + " }}",
        }),
        _task("edgekit: unknown profile", "ansible.builtin.fail", {
            "msg": "{{ 'edgekit_profile ' ~ ek_profile ~ ' is not a profile edgekit knows (edgekit profiles list)' }}",
        }, when="ek_profile not in edgekit.profiles"),
        _task("edgekit: where", "ansible.builtin.command", {
            "argv": "{{ [" + python + ", '-c', edgekit.where, edgekit_workdir | default(edgekit.profiles[ek_profile].workdir), " + python + "] }}",
        }, register="ek_where", changed_when=False),
        _task("edgekit: settings", "ansible.builtin.set_fact", {
            "ek": {
                "profile": "{{ ek_profile }}",
                "root": "{{ (ek_where.stdout | from_json).root }}",
                "python": "{{ (ek_where.stdout | from_json).python }}",
                "venv": "{{ (ek_where.stdout | from_json).venv }}",
                "agent": "{{ (ek_where.stdout | from_json).root ~ '/agent/' ~ edgekit.agent_name }}",
            },
        }),
        _task("edgekit: agent", "ansible.builtin.copy", {"src": "{{ edgekit.agent_local }}", "dest": "{{ ek.agent }}", "mode": "0644"}),
        _task("edgekit: facts", "ansible.builtin.command", {
            "argv": "{{ [ek.python, ek.agent, 'facts'] + ([] if edgekit.profiles[ek.profile].openvino else ['--no-openvino']) }}",
        }, changed_when=False),
    ]
    if with_lock:
        tasks.append(_task("edgekit: lock status", "ansible.builtin.command", {"argv": _agent("ek", "'lock'", "'status'", "ek.root ~ '/lock'")}, changed_when=False))
    return [{"name": "edgekit probe", "hosts": "all", "gather_facts": False, "tasks": tasks}]


def deploy_play(strategy: Strategy, measurements: int) -> list[dict]:
    """The deploy play; ``measurements``: the most bench/eval steps a host has (each host runs its
    own ``ek_host.steps``; the tasks are written out per step, not included in a loop: an
    ``include_tasks`` per host and step costs Ansible more than the step's own commands)."""
    store = "(ek_bundle.request | to_json)"
    lockdir = "ek.root ~ '/lock'"
    answer = "(ek_{0}.stdout | from_json)"

    def store_step(mode: str, reg: str, extra: str = "") -> dict:
        return _task(f"edgekit: store {reg}", "ansible.builtin.command", {"argv": _agent("ek", "'store'", "ek.root", f"'{mode}'", store)},
                     register=f"ek_{reg}", changed_when=False,
                     failed_when=f"ek_{reg}.rc != 0 or 'error' in {answer.format(reg)}" + extra)  # fmt: skip

    measure = []
    for j in range(measurements):
        step, when = f"ek_host.steps[{j}]", f"ek_host.steps | length > {j}"
        measure += [
            # the agent pushes the lock's expiry ahead first, and refuses to run when the lock is no longer this run's
            _task("edgekit: run", "ansible.builtin.command", {
                "argv": "{{ [ek.python, ek.agent, '--lock', ek.root ~ '/lock', ek_host.lock.token, '--lock-ttl', edgekit.ttl | string] + " + step + ".args }}",
            }, register="ek_run", changed_when=False, timeout="{{ " + step + ".timeout }}", when=when),
            _task("edgekit: fetch", "ansible.builtin.fetch", {"src": "{{ " + step + ".out }}", "dest": "{{ " + step + ".local }}", "flat": True},
                  when=f"{when} and {step}.out | length > 0"),
        ]  # fmt: skip
    tasks = [
        store_step("plan", "plan"),
        # the missing objects, packed here into one tar (one transfer, not one per file), unpacked there
        _task("edgekit: pack", "ansible.builtin.command", {
            "argv": "{{ [edgekit.python, '-S', '-c', edgekit.pack, edgekit.tmp ~ '/' ~ inventory_hostname ~ '.tar', ek_bundle.objects | to_json] + "
                    + answer.format("plan") + ".missing }}",
        }, delegate_to="localhost", become=False, changed_when=False, when=answer.format("plan") + ".missing | length > 0"),
        _task("edgekit: push", "ansible.builtin.copy", {"src": "{{ edgekit.tmp ~ '/' ~ inventory_hostname ~ '.tar' }}", "dest": "{{ ek.root ~ '/objects/.incoming-' ~ ek_host.lock.token ~ '.tar' }}", "mode": "0600"},
              when=answer.format("plan") + ".missing | length > 0"),
        _task("edgekit: unpack", "ansible.builtin.command", {
            "argv": "{{ [ek.python, '-S', '-c', edgekit.unpack, ek.root ~ '/objects/.incoming-' ~ ek_host.lock.token ~ '.tar', ek.root ~ '/objects'] }}",
        }, changed_when=False, when=answer.format("plan") + ".missing | length > 0"),
        # commit with verify: every object, the ones just sent included, is hashed on the device
        # first; one whose bytes are wrong is removed and reported missing, and the push fails here
        store_step("commit", "commit"),
        {
            "name": "edgekit: measure under the device lock",
            "block": [
                _task("edgekit: lock acquire", "ansible.builtin.command", {
                    "argv": _agent("ek", "'lock'", "'acquire'", lockdir, "(ek_host.lock | to_json)", "(edgekit.ttl | string)"),
                }, register="ek_lock", changed_when=False, failed_when="ek_lock.rc != 0 or not (" + answer.format("lock") + ".acquired | default(false))",
                   until="ek_lock.rc == 0 and (" + answer.format("lock") + ".acquired | default(false))",
                   retries="{{ edgekit.lock_retries }}", delay=LOCK_POLL_S),  # fmt: skip
                *measure,
                _lock_refresh("edgekit: lock check"),
            ],
            "always": [
                _task("edgekit: lock release", "ansible.builtin.command", {"argv": _agent("ek", "'lock'", "'release'", lockdir, "ek_host.lock.token")},
                      changed_when=False, failed_when=False,
                      when="ek_lock is defined and ek_lock.rc is defined and ek_lock.rc == 0 and (" + answer.format("lock") + ".acquired | default(false))"),
            ],  # fmt: skip
        },
    ]
    play: dict[str, Any] = {
        "name": "edgekit deploy",
        "hosts": "all",
        "gather_facts": False,
        "vars": {"ek_host": "{{ edgekit.hosts[inventory_hostname] }}", "ek_bundle": "{{ edgekit.bundles[ek_host.bundle] }}", "ek": "{{ ek_host.where }}"},
        "tasks": tasks,
    }
    if strategy.serial:
        play["serial"] = strategy.serial
    if strategy.max_fail is not None:
        play["max_fail_percentage"] = strategy.max_fail
    return [play]


def _lock_refresh(name: str, **more: Any) -> dict:
    """Push the lock's expiry ahead; fails when the lock is no longer this run's (another job broke it)."""
    return _task(name, "ansible.builtin.command", {
        "argv": _agent("ek", "'lock'", "'refresh'", "ek.root ~ '/lock'", "ek_host.lock.token", "(edgekit.ttl | string)"),
    }, register="ek_refresh", changed_when=False, failed_when="ek_refresh.rc != 0 or not ((ek_refresh.stdout | from_json).done | default(false))", **more)  # fmt: skip


# -- running ---------------------------------------------------------------------------------


def run_play(
    plays: list[dict],
    inventory: Path,
    *,
    extravars: dict,
    limit: str | None,
    forks: int,
    on_event: Callable[[dict], None] | None = None,
) -> PlayRun:
    """Run ``plays`` over ``inventory`` with ansible-runner (a temp private data dir); each host's results."""
    import ansible_runner

    hosts: dict[str, HostRun] = {}

    def handle(event: dict) -> bool:
        data = event.get("event_data") or {}
        host, task, kind = data.get("host"), str(data.get("task") or ""), event.get("event")
        if host and kind in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable", "runner_on_skipped", "runner_on_start"):
            run = hosts.setdefault(host, HostRun(host))
            with contextlib.suppress(TypeError, ValueError):
                at = datetime.fromisoformat(str(event.get("created"))).timestamp()
                run.first = at if run.first is None else run.first
                run.last_seen = at
            res = data.get("res") or {}
            if kind == "runner_on_ok":
                run.results.append((task, res))
            elif kind == "runner_on_failed" and not data.get("ignore_errors"):
                run.failed = (task, res)
            elif kind == "runner_on_unreachable":
                run.unreachable = str(res.get("msg") or "unreachable")
        if on_event is not None:
            on_event(event)
        return False  # nothing kept in memory by the runner beyond what is sorted here

    with tempfile.TemporaryDirectory(prefix="edgekit-ansible-") as tmp:
        project = Path(tmp) / "project"
        project.mkdir()
        (project / "edgekit.yml").write_text(json.dumps(plays, indent=1))  # JSON is YAML
        env = {
            "ANSIBLE_RETRY_FILES_ENABLED": "False",
            "ANSIBLE_NOCOLOR": "1",
            # the interpreter for Ansible's own modules: found quietly unless the inventory names one
            "ANSIBLE_PYTHON_INTERPRETER": os.environ.get("ANSIBLE_PYTHON_INTERPRETER", "auto_silent"),
            # one ssh command per module instead of put + chmod + exec (a play here runs ~30 modules a
            # host); a sudoers ``requiretty`` breaks it with become: set ANSIBLE_PIPELINING=False then
            "ANSIBLE_PIPELINING": os.environ.get("ANSIBLE_PIPELINING", "True"),
        }
        playbook_bin = _playbook_bin()
        if playbook_bin and not shutil.which("ansible-playbook"):
            env["PATH"] = f"{Path(playbook_bin).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        r = ansible_runner.run(
            private_data_dir=tmp, playbook="edgekit.yml", inventory=str(Path(inventory).resolve()), limit=limit, forks=forks,
            extravars=extravars, envvars=env, event_handler=handle, quiet=True, suppress_env_files=True,
        )  # fmt: skip
        log = ""
        if r.rc != 0 and not hosts:
            try:
                log = " ".join(" ".join(r.stdout.read().split()).split())[-2000:]
            except (OSError, ValueError):
                log = ""
    return PlayRun(hosts, int(r.rc or 0), str(r.status), log)


def no_hosts_error(play: PlayRun, inventory: Path, limit: str | None) -> InputError | UsageError:
    """Why a play touched no host: a --limit matching none, or an inventory Ansible refused."""
    tail = play.log
    if limit is not None:
        return UsageError(
            f"--limit {limit!r} matches no host in {inventory}" + (f" (ansible: {_ansible_error(tail)})" if _ansible_error(tail) else ""),
            f"see the inventory's hosts with: ansible-inventory -i {inventory} --graph",
        )
    return InputError(
        f"Ansible found no host to run on in {inventory}" + (f": {_ansible_error(tail)}" if _ansible_error(tail) else ""),
        f"check the inventory with: ansible-inventory -i {inventory} --graph",
    )


def _ansible_error(log: str) -> str:
    m = re.search(r"(ERROR!?|\[ERROR\]:?)\s*(.{0,300})", log)
    return m.group(2).strip() if m else ""


def agent_result(res: dict) -> Any:
    """A ``command`` module's result as the ``CommandResult`` edgekit's parsers read."""
    from edgekit.transport.base import CommandResult

    argv = tuple(str(a) for a in (res.get("cmd") or ()))
    rc = res.get("rc")
    return CommandResult(argv, int(rc) if isinstance(rc, int) else 1, str(res.get("stdout") or "").encode(), str(res.get("stderr") or "").encode(), 0.0)


def failure_reason(run: HostRun) -> tuple[str, str]:
    """(error, hint) of a host that failed or was unreachable, in edgekit's words where it can."""
    if run.unreachable is not None:
        msg = run.unreachable.removeprefix("Task failed: ")
        return (f"{run.name}: Ansible could not reach it: {msg}",
                f"check its ansible_host/ansible_port/ansible_user and host key: ansible {run.name} -i INVENTORY -m ping")  # fmt: skip
    assert run.failed is not None
    task, res = run.failed
    text = str(res.get("stdout") or "").strip()
    doc: dict = {}
    try:
        last = json.loads(text.splitlines()[-1]) if text else {}
        doc = last if isinstance(last, dict) else {}
    except ValueError:
        pass
    stderr = " | ".join(str(res.get("stderr") or "").strip().splitlines()[-3:])
    if task == "edgekit: lock acquire" and doc:
        from edgekit.devices.lock import describe_holder

        return (f"{run.name} is locked by {describe_holder(doc.get('holder'), doc.get('now'))}",
                "wait for that job to finish or queue behind it with --lock-wait SECONDS; or remove it: edgekit devices unlock DEVICE")  # fmt: skip
    if task == "edgekit: unknown profile":
        return f"{run.name}: {res.get('msg')}", "set edgekit_profile to a name from `edgekit profiles list`, or pass --target"
    if task == "edgekit: lock check":
        return (f"lost the lock on {run.name}; results measured since are not stored",
                "another job broke it (this run could not refresh it for longer than its TTL); run again")  # fmt: skip
    if task.startswith("edgekit: store") and doc.get("error"):
        return f"{run.name}: {doc['error']}", str(doc.get("hint") or "check the device's edgekit directory")
    if task in ("edgekit: facts", "edgekit: run"):
        from edgekit.agentclient import parse_agent_output
        from edgekit.errors import EdgekitError

        kind = "edgekit.facts" if task == "edgekit: facts" else ("edgekit.eval" if "eval" in (res.get("cmd") or []) else "edgekit.bench")
        try:
            parse_agent_output(agent_result(res), kind=kind, device=run.name)
        except EdgekitError as exc:
            return f"{run.name}: {exc.message}", exc.hint
    if doc.get("error"):
        return f"{run.name}: {doc['error']}", str(doc.get("hint") or "check the host's edgekit settings (edgekit_workdir, ansible_python_interpreter)")
    msg = str(res.get("msg") or "").strip()
    detail = "; ".join(x for x in (msg if msg and msg != "non-zero return code" else "", stderr) if x) or f"exit code {res.get('rc')}"
    return f"{run.name}: {task.removeprefix('edgekit: ')} failed: {detail}", "run it again with the Ansible output: ANSIBLE_STDOUT_CALLBACK=default, or check the host by hand"
