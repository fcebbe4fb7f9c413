"""The host's side of the agent: run it on a device (pushing it first when the device lacks
this version) and read its one JSON document: a benchmark of one variant, or device facts."""

from __future__ import annotations

import json
import posixpath
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.agent import MAX_SAMPLES, provision_hint
from edgekit.agent import SCHEMA as AGENT_SCHEMA
from edgekit.errors import AgentError
from edgekit.jsonable import strict_loads
from edgekit.transport.agentzip import agent_server, ask_server, push_agent
from edgekit.transport.base import MAX_ANSWER_BYTES, CommandResult, Transport

__all__ = ["BenchConfig", "bench_args", "bench_variant", "eval_args", "device_facts", "device_name", "eval_variant", "parse_agent_output", "push_agent", "run_agent"]

_OUT_OF_STEP = "the agent on the device is out of step with this edgekit; bench again to push the current one"


@dataclass(frozen=True)
class BenchConfig:
    warmup: int | str = "auto"  # untimed runs, or "auto": until latency is stable (bounded; the agent's rule)
    iterations: int = 100
    duration_s: float | None = None  # when set, run for this long instead of `iterations`
    min_time_s: float = 0.0  # > 0: at least `iterations` and at least this long
    threads: int | None = None  # None: the runtime's default (all cores)
    profile: bool = True  # per-layer times, from a separate pass after the timed loop
    rounds: int = 1  # agent processes, each timing the window above; the host merges them (bench.rounds)

    def agent_args(self) -> list[str]:
        args = ["--warmup", str(self.warmup), "--iterations", str(self.iterations)]
        if self.duration_s is not None:
            args += ["--duration", repr(float(self.duration_s))]
        elif self.min_time_s > 0:
            args += ["--min-time", repr(float(self.min_time_s))]
        if self.threads is not None:
            args += ["--threads", str(self.threads)]
        if self.profile:
            args.append("--profile")
        return args


def bench_variant(
    transport: Transport, remote_bundle_dir: str, variant: str, config: BenchConfig, timeout: float = 900, *, probe_threads: bool = True
) -> dict:
    """Time ``variant`` of the bundle at ``remote_bundle_dir`` on the device; the agent's document.

    Pushes the agent first if the device lacks this version of it. Not ``probe_threads``: without
    ``config.threads``, the runtime's default threads, not probed against one. Raises AgentError with
    the agent's own message and hint when it reports a failure, or when its output is not
    a bench document.
    """
    args = bench_args(remote_bundle_dir, variant, config, probe_threads=probe_threads)
    if config.duration_s is not None or config.min_time_s > 0:
        timeout = max(timeout, (config.duration_s or config.min_time_s) + 300)  # loading and warmup come on top
    return of_variant(run_agent(transport, args, timeout=timeout), variant, "benchmarked")


def bench_args(remote_bundle_dir: str, variant: str, config: BenchConfig, *, probe_threads: bool = True) -> list[str]:
    """The agent's arguments that time ``variant`` (what ``bench_variant`` runs; Ansible's engine runs the same)."""
    return ["bench", remote_bundle_dir, "--variant", variant, *config.agent_args(), *([] if probe_threads else ["--no-thread-probe"])]


def eval_args(remote_bundle_dir: str, variant: str, samples: str, *, threads: int | None = None, model: str | None = None) -> tuple[list[str], str]:
    """The agent's arguments that evaluate ``variant`` on the bundle's ``samples``, and the device
    path its outputs land at (what ``eval_variant`` runs, then fetches)."""
    # beside the bundles, not in one: a bundle holds exactly the files its manifest lists
    twin = ".layers" if model else ""
    remote_out = f"{posixpath.dirname(posixpath.dirname(remote_bundle_dir))}/eval/{posixpath.basename(remote_bundle_dir)}.{variant}{twin}.npz"
    args = ["eval", remote_bundle_dir, "--variant", variant, "--samples", samples, "--output", remote_out]
    if threads is not None:
        args += ["--threads", str(threads)]
    if model:
        args += ["--model", model]
    return args, remote_out


def eval_variant(
    transport: Transport, remote_bundle_dir: str, variant: str, samples: str, local_out: Path, *, threads: int | None = None, timeout: float = 3600,
    model: str | None = None,
) -> dict:
    """Run the bundle's held-out ``samples`` through ``variant`` on the device and fetch the
    outputs it computed to ``local_out`` (.npz keyed by output name); the agent's document.
    ``model``: the bundle file the variant's backend runs instead (its twin with intermediate
    tensors exposed; outputs keyed output0, output1... in the twin's order)."""
    args, remote_out = eval_args(remote_bundle_dir, variant, samples, threads=threads, model=model)
    doc = of_variant(run_agent(transport, args, timeout=timeout, kind="edgekit.eval"), variant, "evaluated")
    transport.get(remote_out, local_out)
    return doc


def device_facts(transport: Transport, timeout: float = 120, *, openvino: bool = True) -> dict:
    """The device's facts (arch, CPU, ISA, memory, OS, runtimes) from the agent's ``facts``;
    ``openvino``: also the devices OpenVINO sees (``probe.openvino_devices``; it imports OpenVINO)."""
    return run_agent(transport, ["facts"] if openvino else ["facts", "--no-openvino"], timeout=timeout, kind="edgekit.facts")


def run_agent(transport: Transport, args: list[str], *, timeout: float, kind: str = "edgekit.bench") -> dict[str, Any]:
    """Run ``agent.pyz ARGS`` on the device (pushed first if missing); its ``kind`` document.

    Through the connection's agent server where there is one (``agentzip.agent_server``), else
    as a command of its own."""
    args = [*getattr(transport, "lock_args", ()), *args]  # under the device lock: the work joins its job
    server = agent_server(transport)
    result = ask_server(transport, server, args, timeout=timeout) if server is not None else None
    if result is None:  # no server, or it ended (killed, or never started): say why the usual way
        result = transport.run([transport.python, push_agent(transport), *args], timeout=timeout, check=False)
    return parse_agent_output(result, kind=kind, device=device_name(transport))


def device_name(transport: Transport) -> str:
    """The name the user gave the device (``edgekit.devices.connect`` records it), else the transport's."""
    return getattr(transport, "device_name", None) or transport.name


def parse_agent_output(result: CommandResult, kind: str = "edgekit.bench", device: str = "DEVICE") -> dict[str, Any]:
    """The agent's ``kind`` document from a finished agent command, or AgentError saying why not
    (a runtime missing on the device: the provision hint, naming ``device``)."""
    if result.returncode < 0:
        try:
            signame = signal.Signals(-result.returncode).name
        except ValueError:
            signame = f"signal {-result.returncode}"
        raise AgentError(
            f"the agent was killed by {signame} on the device" + _tail(result),
            "the backend runtime crashed (a SIGILL or SIGSEGV usually means a build for another CPU); "
            "run the command by hand on the device: " + result.command,
        )
    if len(result.stdout) > MAX_ANSWER_BYTES:
        raise AgentError(
            f"the agent's reply is {len(result.stdout) / 2**20:.0f} MiB; edgekit reads at most {MAX_ANSWER_BYTES >> 20} MiB",
            "a bench reply holds at most 1 000 000 samples: the agent on the device is not edgekit's, or broken; push it again",
        )
    text = result.stdout.decode("utf-8", errors="replace").strip()
    try:
        doc = strict_loads(text)
    except json.JSONDecodeError:
        raise AgentError(
            f"the agent printed no JSON document (exit code {result.returncode}){_tail(result)}",
            f"check the device's Python ({result.argv[0]}) is 3.7 or newer; run by hand: {result.command}",
        ) from None
    except ValueError as exc:
        raise AgentError(f"the agent's reply is not a document edgekit reads: {exc}", _OUT_OF_STEP) from None
    if not isinstance(doc, dict):
        raise AgentError("the agent printed JSON that is not an object", _OUT_OF_STEP)
    if doc.get("kind") == "edgekit.error":
        runtime = doc.get("missing_runtime")
        hint = provision_hint(str(runtime), device) if runtime else str(doc.get("hint") or "")
        raise AgentError(str(doc.get("error") or "the agent failed"), hint, str(doc.get("reason") or ""))
    if doc.get("kind") != kind or doc.get("schema") != AGENT_SCHEMA:
        raise AgentError(
            f"the agent printed a {doc.get('kind')!r} document of schema {doc.get('schema')!r}; "
            f"expected {kind!r} schema {AGENT_SCHEMA}",
            _OUT_OF_STEP,
        )
    if result.returncode != 0:
        raise AgentError(
            f"the agent exited with code {result.returncode} after a bench document{_tail(result)}",
            f"run it by hand on the device: {result.command}",
        )
    if kind != "edgekit.bench":
        return doc
    samples = doc.get("samples_ns")
    if isinstance(samples, list) and len(samples) > MAX_SAMPLES:
        raise AgentError(f"the agent's document has {len(samples)} samples; an agent sends at most {MAX_SAMPLES}", _OUT_OF_STEP)
    if not isinstance(samples, list) or not samples or not all(type(s) is int and 0 < s < 2**63 for s in samples):
        raise AgentError(
            "the agent's document has no usable samples_ns (a non-empty list of positive integers)",
            _OUT_OF_STEP,
        )
    return doc


def of_variant(doc: dict[str, Any], variant: str, did: str) -> dict[str, Any]:
    """``doc``, when it is about ``variant`` (an agent out of step may answer for another)."""
    if doc.get("variant") != variant:
        raise AgentError(f"the agent {did} variant {doc.get('variant')!r}, not '{variant}'", _OUT_OF_STEP)
    return doc


def _tail(result: CommandResult) -> str:
    tail = result.stderr_tail(3)
    return f": {tail}" if tail else ""
