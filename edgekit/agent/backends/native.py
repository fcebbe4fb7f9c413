"""ekrt, edgekit's own int8 runtime: the bundle's static ``ekrt`` runner times the ``.ekm`` itself.

The runner sits in the bundle (``bin/ekrt``, built on the host for this device's arch) and
needs no Python; the agent only starts it: ``ekrt bench MODEL.ekm --json --warmup W|auto
--iterations N [--threads T] [--profile] --inputs X.npy ...`` prints the bench document's timing
fields (docs/ekrt.md), which this module hands to the agent's runner through ``Session.bench``.
The runner warms up by the agent's rule and, with ``--profile``, times each op in its own pass
after the timed loop (so profiling never slows the timed samples).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile

from .. import AgentFailure, bundle_file

DEFAULT_RUNNER = "bin/ekrt"
TIMEOUT_S = 3600

_REPUSH = "push the bundle again (edgekit deploy builds the runner for the device's arch)"


# the runner may probe one thread against this runtime's default (runner.PROBE_*)
PROBE_THREADS = True


def _run_json(argv: list, timeout: float = TIMEOUT_S) -> dict:
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=timeout)
    except OSError as exc:
        raise AgentFailure(f"cannot start {argv[0]}: {exc.strerror}", _REPUSH) from None
    except subprocess.TimeoutExpired:
        raise AgentFailure(f"ekrt did not finish in {timeout:.0f} s: {' '.join(argv[1:3])}", "bench fewer iterations") from None
    err = proc.stderr.decode("utf-8", "replace").strip()
    if proc.returncode < 0:
        sig = -proc.returncode
        why = "an instruction this CPU lacks (the runner's dispatch picked a wrong kernel)" if sig == 4 else "a crash in the runtime"
        raise AgentFailure(f"ekrt was killed by signal {sig}: {why}", "report it with `ekrt info --json` from the device: " + (err.splitlines()[-1] if err else ""))
    try:
        doc = json.loads(proc.stdout.decode("utf-8"))
    except ValueError:
        doc = None
    if proc.returncode != 0:
        # with --json the runner's reason (the loader's exact words) is an edgekit.error document on stdout
        if isinstance(doc, dict) and doc.get("kind") == "edgekit.error" and doc.get("error"):
            raise AgentFailure(f"ekrt failed: {doc['error']}", str(doc.get("hint") or "check the bundle (edgekit deploy rebuilds it)"))
        last = err.splitlines()[-1] if err else f"exit code {proc.returncode}"
        raise AgentFailure(f"ekrt failed: {last}", "check the bundle (edgekit deploy rebuilds it) and the runner's message")
    if not isinstance(doc, dict):
        raise AgentFailure("ekrt printed something that is not a JSON object", "update edgekit on the host: runner and agent come from the same version")
    return doc


class Session:
    def __init__(self, runner: str, model_path: str, threads, workdir: str, version: str, info: dict) -> None:
        self.runner = runner
        self.model_path = model_path
        self.threads = threads
        self.workdir = workdir
        self.version = version
        self.info = info
        self._inputs_dir = None

    def _common(self) -> list:
        argv = [self.model_path, "--json"]
        if self.threads:
            argv += ["--threads", str(int(self.threads))]
        return argv

    def _input_files(self, inputs: list) -> list:
        """The variant's inputs (its inputs.npz, else the agent's seeded random data) as .npy files."""
        if self._inputs_dir is None:
            import numpy

            from ..runner import make_inputs

            rel = os.path.relpath(self.model_path, self.workdir).replace(os.sep, "/")
            feeds = make_inputs(self.workdir, {"model": rel, "inputs": inputs})
            self._inputs_dir = tempfile.mkdtemp(prefix="ekrt-inputs-")
            for k, tensor in enumerate(inputs):
                numpy.save(os.path.join(self._inputs_dir, f"{k}.npy"), numpy.ascontiguousarray(feeds[tensor["name"]], dtype=numpy.float32))
        return [os.path.join(self._inputs_dir, f"{k}.npy") for k in range(len(inputs))]

    def bench(self, warmup, iterations: int, duration_s, inputs: list, profile: bool = False, min_time_s: float = 0.0):
        files = self._input_files(inputs)
        feed = ["--inputs"] + files if files else []
        loop = ["--duration", repr(float(duration_s))] if duration_s is not None else ["--iterations", str(int(iterations))]
        loop += ["--min-time", repr(float(min_time_s))] if min_time_s else []
        loop += ["--profile"] if profile else []
        try:
            doc = _run_json([self.runner, "bench"] + self._common() + ["--warmup", str(warmup)] + loop + feed,
                            timeout=TIMEOUT_S + (duration_s or min_time_s or 0))
        finally:
            shutil.rmtree(self._inputs_dir, ignore_errors=True)
            self._inputs_dir = None
        samples = doc.get("samples_ns")
        if not isinstance(samples, list) or not all(isinstance(s, int) for s in samples):
            raise AgentFailure("ekrt's bench document has no samples_ns list", "update edgekit on the host")
        info = dict(self.info)
        if doc.get("load_ns") is not None:
            info["runner_load_ns"] = doc["load_ns"]  # ekrt's own load (parse, check, pack weights)
        # the runner's, not the agent's; the agent's runner takes the warm-up and window fields out
        for key in ("first_inference_ns", "peak_rss_bytes", "warmup_samples_ns", "timed_window_ns"):
            if doc.get(key) is not None:
                info[key] = doc[key]
        config = doc.get("config") if isinstance(doc.get("config"), dict) else {}
        for key in ("warmup", "warmup_mode"):
            if config.get(key) is not None:
                info[key] = config[key]
        if isinstance(doc.get("backend_info"), dict) and doc["backend_info"].get("threads") is not None:
            info["threads"] = doc["backend_info"]["threads"]
        return samples, _named(doc.get("layers"), self.model_path) if profile else None, info

    def run_all(self, stacked: dict):
        """Every sample stacked along the first axis of ``stacked``'s arrays through one runner
        process (a process per sample cost ~2.7 ms each: 1 s of a 360-sample evaluation)."""
        import numpy

        tmp = tempfile.mkdtemp(prefix="ekrt-run-")
        try:
            files = []
            for k, value in enumerate(stacked.values()):
                files.append(os.path.join(tmp, f"in{k}.npy"))
                numpy.save(files[-1], numpy.ascontiguousarray(value, dtype=numpy.float32))
            argv = [self.runner, "run"] + self._common() + ["--save", tmp, "--inputs"] + files
            doc = _run_json(argv)
            return [numpy.load(os.path.join(tmp, f"output{i}.npy")) for i in range(len(doc.get("outputs") or []))]
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    run = run_all  # one inference through ``ekrt run --save``: for evaluation, not timing


def _runner_path(workdir: str, options: dict) -> str:
    rel = options.get("runner") or DEFAULT_RUNNER
    path = bundle_file(workdir, rel, "options.runner")  # never a file outside the bundle: it is chmod'ed and run
    if not os.path.isfile(path):
        raise AgentFailure(f"the bundle on the device has no ekrt runner at {rel}", _REPUSH)
    mode = os.stat(path).st_mode
    if not mode & stat.S_IXUSR:  # pushes copy bytes, not modes
        try:
            os.chmod(path, mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        except OSError as exc:
            raise AgentFailure(f"cannot make {rel} executable: {exc.strerror}", "check the permissions of edgekit's directory on the device") from None
    return path


def load(model_path: str, threads, options: dict | None = None, workdir: str | None = None) -> Session:
    options = dict(options or {})
    workdir = workdir or os.path.dirname(model_path)
    runner = _runner_path(workdir, options)
    info_doc = _run_json([runner, "info", model_path, "--json"], timeout=120)
    version = str(info_doc.get("version") or "unknown")
    info = {"runner": os.path.relpath(runner, workdir).replace(os.sep, "/")}
    for key in ("isa", "features", "built_isas", "forced_isa", "kernels"):
        if key in info_doc:
            info[key] = info_doc[key]
    model = info_doc.get("model") or {}
    if isinstance(model, dict) and "memory_bytes" in model:
        info["memory_bytes"] = model["memory_bytes"]
    return Session(runner, model_path, threads, workdir, version, info)


LAYER_NAMES_FILE = "layers.json"  # written next to the .ekm by the host's compile step


def _named(layers, model_path: str):
    """The runner names op j ``KIND#j``; the host's list beside the model gives the ONNX node it
    came from, so per-layer times join with the quantizer's per-node error. Without it: as is."""
    path = os.path.join(os.path.dirname(model_path), LAYER_NAMES_FILE)
    if not isinstance(layers, list) or not os.path.isfile(path):
        return layers
    try:
        with open(path, encoding="utf-8") as fh:
            names = json.load(fh)
    except (OSError, ValueError):
        return layers
    for layer in layers:
        _, sep, index = str(layer.get("name", "")).rpartition("#")
        if sep and index.isdigit() and int(index) < len(names) and isinstance(names[int(index)], str):
            layer["name"] = names[int(index)]
    return layers
