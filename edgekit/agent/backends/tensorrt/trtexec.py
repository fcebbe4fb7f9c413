"""trtexec's command lines, the engine cache key and trtexec's output parsers.

Pure functions (standard library only) that the host imports too, so host and device build the
same argv and read trtexec's logs, ``--exportTimes`` and ``--exportProfile`` the same way.
"""

from __future__ import annotations

import hashlib
import json
import math
import re

from ... import version_tuple

PRECISIONS = ("fp32", "fp16", "int8")
MIN_VERSION = (8, 0)  # Q/DQ explicit quantization and the "=== Performance summary ===" report


class TrtexecOutputError(ValueError):
    """trtexec output (log, --exportTimes or --exportProfile JSON) that cannot be read."""


def decode_version_code(code: int) -> str:
    """trtexec's numeric version: ``8502`` -> ``"8.5.2"``, ``100600`` -> ``"10.6.0"``.

    TensorRT 8.x packs major*1000 + minor*100 + patch; from 10.0 on it is
    major*10000 + minor*100 + patch (``[TensorRT v101600]`` is 10.16.0).
    """
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


_BANNER_RE = re.compile(r"&&&& (RUNNING|PASSED|FAILED) TensorRT\.trtexec(?: \[TensorRT v(\d+)\])?")


def banner_version(text: str) -> str | None:
    """The TensorRT version in trtexec's ``&&&& RUNNING TensorRT.trtexec [TensorRT v8502]`` banner."""
    for match in _BANNER_RE.finditer(text):
        if match.group(2):
            return decode_version_code(int(match.group(2)))
    return None


# -- command lines ------------------------------------------------------------------------


def build_flags(
    trt_version: str,
    precision: str,
    *,
    dla_core: int | None = None,
    allow_gpu_fallback: bool = True,
    workspace_mb: int | None = None,
    shapes: str | None = None,
) -> list:
    """The trtexec flags that decide what engine is built (no paths): they go into the cache key.

    * int8 (a QDQ model): TensorRT >= 10 builds it strongly typed (``--stronglyTyped``: the Q/DQ
      nodes decide the precision, and NVIDIA says not to add precision flags); 8.x needs ``--int8``
      to honour the Q/DQ nodes, plus ``--fp16`` so the layers left in float may run in fp16.
    * fp16: ``--fp16``. fp32: ``--noTF32``, so Ampere (Orin) does not round fp32 math to TF32.
    * ``--memPoolSize=workspace:N`` from TensorRT 8.4 (it replaced ``--workspace=N``, gone in 10).
    * DLA: ``--useDLACore=N`` (+ ``--allowGPUFallback`` for the layers DLA cannot run).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    version = version_tuple(trt_version)
    if version[:2] < MIN_VERSION:
        raise ValueError(f"TensorRT {trt_version} is older than {MIN_VERSION[0]}.{MIN_VERSION[1]}")
    if precision == "int8":
        flags = ["--stronglyTyped"] if version >= (10,) else ["--int8", "--fp16"]
    elif precision == "fp16":
        flags = ["--fp16"]
    else:
        flags = ["--noTF32"]
    if dla_core is not None:
        if precision == "fp32":
            raise ValueError("DLA runs fp16 and int8 layers only; build fp32 on the GPU")
        if int(dla_core) < 0:
            raise ValueError(f"dla_core must be >= 0, got {dla_core!r}")
        flags.append(f"--useDLACore={int(dla_core)}")
        if allow_gpu_fallback:
            flags.append("--allowGPUFallback")
    if workspace_mb is not None:
        if int(workspace_mb) < 1:
            raise ValueError(f"workspace_mb must be >= 1, got {workspace_mb!r}")
        if version >= (8, 4):
            flags.append(f"--memPoolSize=workspace:{int(workspace_mb)}")
        else:
            flags.append(f"--workspace={int(workspace_mb)}")
    if shapes:
        flags.append("--shapes=" + shapes)
    return flags


def trtexec_build_argv(
    onnx_path: str,
    engine_path: str,
    flags: list,
    *,
    trt_version: str,
    timing_cache: str | None = None,
    trtexec: str = "trtexec",
) -> list:
    """argv that builds ``engine_path`` from ``onnx_path`` with ``flags`` (what :func:`build_flags`
    decided, the same list that keys the engine cache) and exits without timing it.

    ``--skipInference`` from TensorRT 8.6 on; before that the same switch was ``--buildOnly``.
    A timing cache (``--timingCacheFile``) makes later builds on the device faster.
    """
    argv = [trtexec, "--onnx=" + onnx_path, "--saveEngine=" + engine_path] + flags
    if timing_cache:
        argv.append("--timingCacheFile=" + timing_cache)
    argv.append("--skipInference" if version_tuple(trt_version) >= (8, 6) else "--buildOnly")
    return argv


def trtexec_bench_argv(
    engine_path: str,
    *,
    warmup_ms: int,
    iterations: int,
    duration_s: float | None,
    export_times: str,
    min_time_s: float = 0.0,
    export_profile: str | None = None,
    dla_core: int | None = None,
    shapes: str | None = None,
    load_inputs: str | None = None,
    trtexec: str = "trtexec",
) -> list:
    """argv that times a built engine and writes per-iteration times (and per-layer times).

    trtexec warms up by time (``--warmUp`` ms) and runs at least ``--iterations`` and at least
    ``--duration`` seconds: a fixed count is ``--iterations=N --duration=0``, a time budget is
    ``--iterations=1 --duration=S``, a count with a minimum time (``min_time_s``) is
    ``--iterations=N --duration=S`` (whole seconds, rounded up). With ``export_profile`` the per-layer profile runs as a second
    pass (``--separateProfileRun``): an attached profiler would slow the timed loop, and trtexec
    then leaves the performance summary out.
    """
    if warmup_ms < 0:
        raise ValueError(f"warmup_ms must be >= 0, got {warmup_ms!r}")
    argv = [trtexec, "--loadEngine=" + engine_path, f"--warmUp={int(warmup_ms)}"]
    if duration_s is None:
        if iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {iterations!r}")
        argv += [f"--iterations={int(iterations)}", f"--duration={int(math.ceil(min_time_s)) if min_time_s > 0 else 0}"]
    else:
        if not duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {duration_s!r}")
        argv += ["--iterations=1", f"--duration={int(math.ceil(duration_s))}"]
    argv.append("--exportTimes=" + export_times)
    if export_profile:
        argv += ["--exportProfile=" + export_profile, "--dumpProfile", "--separateProfileRun"]
    if dla_core is not None:
        argv.append(f"--useDLACore={int(dla_core)}")
    if shapes:
        argv.append("--shapes=" + shapes)
    if load_inputs:
        argv.append("--loadInputs=" + load_inputs)
    return argv


def tensor_name(name: str) -> str:
    # trtexec splits specs on ':' and ','; such names go in single quotes (trtexec --help).
    return f"'{name}'" if (":" in name or "," in name) else name


def shapes_spec(inputs: list) -> str:
    """``--shapes`` value for the variant's inputs: ``x:1x3x64x64,y:1x4`` (dynamic dims -> 1)."""
    parts = []
    for tensor in inputs:
        dims = [d if d > 0 else 1 for d in tensor["shape"]]
        spelled = "x".join(str(d) for d in dims) if dims else "scalar"
        parts.append(f"{tensor_name(tensor['name'])}:{spelled}")
    return ",".join(parts)


# -- engine cache -------------------------------------------------------------------------


def engine_key(model_sha256: str, trt_version: str, gpu_or_soc: str, flags: list) -> str:
    """Name of the cached engine: any change in model, TensorRT version, GPU/SoC or flags changes it.

    Flags are compared as a set (their order on the command line does not change the engine).
    """
    for name, value in (("model_sha256", model_sha256), ("trt_version", trt_version), ("gpu_or_soc", gpu_or_soc)):
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    if not re.fullmatch(r"[0-9a-f]{64}", model_sha256):
        raise ValueError(f"model_sha256 must be 64 lowercase hex digits, got {model_sha256!r}")
    doc = {
        "model": model_sha256,
        "tensorrt": ".".join(str(p) for p in version_tuple(trt_version)),
        "device": gpu_or_soc.strip(),
        "flags": sorted(str(f) for f in flags),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]


def gpu_identity(board: str | None = None, l4t: str | None = None, gpu_name: str | None = None) -> str:
    """What an engine is tied to besides TensorRT: the Jetson board and L4T release, or the GPU."""
    parts = [p.strip() for p in (board, l4t, gpu_name) if p and p.strip()]
    return " / ".join(parts) if parts else "unknown GPU"


# -- parsers ------------------------------------------------------------------------------

_PREFIX_RE = re.compile(r"^\s*(?:\[[^\]]*\]\s*)?\[([IWEVF])\]\s?")
_STAT_RE = re.compile(r"(min|max|mean|median|percentile\((\d+(?:\.\d+)?)%\))\s*=?\s*([-+0-9.eE]+|inf|nan)\s*ms")
_SUMMARY_KEYS = {
    "Latency": "latency_ms",
    "End-to-End Host Latency": "end_to_end_ms",
    "Enqueue Time": "enqueue_ms",
    "H2D Latency": "h2d_ms",
    "GPU Compute Time": "gpu_compute_ms",
    "D2H Latency": "d2h_ms",
}


def _strip(line: str) -> tuple:
    """``[08/20/2023-11:13:58] [I] Engine built in 46.6611 sec.`` -> ``("I", "Engine built ...")``."""
    match = _PREFIX_RE.match(line)
    if not match:
        return "", line.strip()
    return match.group(1), line[match.end():].strip()


def _stats(text: str) -> dict:
    out = {}
    for match in _STAT_RE.finditer(text):
        key = match.group(1)
        if key.startswith("percentile"):
            key = "p" + match.group(2).replace(".", "_")
        out[key] = float(match.group(3))
    return out


def _number(pattern: str, text: str):
    match = re.search(pattern, text)
    return float(match.group(1)) if match else None


def parse_trtexec_log(text: str, require_summary: bool = True) -> dict:
    """What a trtexec run printed, as data.

    Keys: ``tensorrt_version``, ``device``, ``compute_capability``, ``passed`` (the ``&&&&``
    verdict, None when cut off), ``engine_build_s``, ``engine_deserialize_s``,
    ``warmup_queries``, ``timed_queries``, ``throughput_qps``, ``latency_ms`` /
    ``end_to_end_ms`` / ``enqueue_ms`` / ``h2d_ms`` / ``gpu_compute_ms`` / ``d2h_ms`` (each
    ``{min, max, mean, median, p90, p95, p99}`` as trtexec printed them), ``host_walltime_s``,
    ``gpu_compute_total_s`` and ``errors`` (the ``[E]`` lines). Absent facts are None.

    With ``require_summary`` a log without the ``=== Performance summary ===`` section raises
    TrtexecOutputError saying why (failed, truncated, or profiled in the timed run).
    """
    if not isinstance(text, str):
        raise TrtexecOutputError(f"a trtexec log must be text, got {type(text).__name__}")
    doc = {
        "tensorrt_version": banner_version(text),
        "device": None,
        "compute_capability": None,
        "passed": None,
        "engine_build_s": None,
        "engine_deserialize_s": None,
        "warmup_queries": None,
        "timed_queries": None,
        "throughput_qps": None,
        "host_walltime_s": None,
        "gpu_compute_total_s": None,
        "errors": [],
    }
    for key in _SUMMARY_KEYS.values():
        doc[key] = None
    in_summary = False
    summary_seen = False
    for raw in text.splitlines():
        banner = _BANNER_RE.search(raw)
        if banner and banner.group(1) != "RUNNING":
            doc["passed"] = banner.group(1) == "PASSED"
            continue
        level, line = _strip(raw)
        if level == "E":
            doc["errors"].append(line)
        if line.startswith("=== "):
            in_summary = line.startswith("=== Performance summary ===")
            summary_seen = summary_seen or in_summary
            continue
        if line.startswith("TensorRT version:"):
            value = line.split(":", 1)[1].strip()
            # 8.0 printed the packed number ("8001"), later releases a dotted version
            doc["tensorrt_version"] = decode_version_code(int(value)) if value.isdigit() else value
        elif line.startswith("Selected Device:"):
            doc["device"] = line.split(":", 1)[1].strip()
        elif line.startswith("Compute Capability:"):
            doc["compute_capability"] = line.split(":", 1)[1].strip()
        elif line.startswith("Engine built in"):
            doc["engine_build_s"] = _number(r"Engine built in ([0-9.eE+-]+) sec", line)
        elif line.startswith("Engine deserialized in"):
            doc["engine_deserialize_s"] = _number(r"Engine deserialized in ([0-9.eE+-]+) sec", line)
        elif line.startswith("Warmup completed"):
            count = _number(r"Warmup completed (\d+) queries", line)
            doc["warmup_queries"] = None if count is None else int(count)
        elif line.startswith("Timing trace has"):
            count = _number(r"Timing trace has (\d+) queries", line)
            doc["timed_queries"] = None if count is None else int(count)
        elif in_summary:
            name, sep, rest = line.partition(":")
            if not sep:
                continue
            if name == "Throughput":
                doc["throughput_qps"] = _number(r"([0-9.eE+-]+|inf)\s*qps", rest)
            elif name in _SUMMARY_KEYS:
                doc[_SUMMARY_KEYS[name]] = _stats(rest) or None
            elif name == "Total Host Walltime":
                doc["host_walltime_s"] = _number(r"([0-9.eE+-]+)\s*s", rest)
            elif name == "Total GPU Compute Time":
                doc["gpu_compute_total_s"] = _number(r"([0-9.eE+-]+)\s*s", rest)
    if require_summary:
        _check_summary(text, doc, summary_seen)
    return doc


def _check_summary(text: str, doc: dict, summary_seen: bool) -> None:
    if not text.strip():
        raise TrtexecOutputError("trtexec printed nothing")
    if doc["passed"] is False:
        raise TrtexecOutputError(f"trtexec failed: {root_error(doc['errors'])}")
    if not summary_seen:
        if "e2e network timing is not reported" in text:
            raise TrtexecOutputError(
                "trtexec left out the performance summary because the profiler was attached to the "
                "timed run (add --separateProfileRun)"
            )
        if re.search(r"^\s*(?:\[[^\]]*\]\s*)?\[I\] Host Latency\s*$", text, re.M):
            raise TrtexecOutputError("this is a TensorRT 7 trtexec report; edgekit reads TensorRT 8.0 and newer")
        raise TrtexecOutputError(
            "trtexec's log has no '=== Performance summary ===' section (the run stopped early or "
            "the log is cut off)"
        )
    if not doc["latency_ms"] or "median" not in doc["latency_ms"]:
        raise TrtexecOutputError("trtexec's performance summary has no readable 'Latency:' line")


def root_error(errors: list) -> str:
    """The [E] line that says what went wrong: trtexec prints the cause first, then its fallout."""
    return errors[0] if errors else "no [E] line in its log"


def _load_json(doc, what: str):
    if isinstance(doc, (bytes, bytearray)):
        doc = doc.decode("utf-8", "replace")
    if isinstance(doc, str):
        try:
            return json.loads(doc)
        except ValueError as exc:
            raise TrtexecOutputError(f"{what} is not valid JSON (cut off?): {exc}") from None
    return doc


def _ms(record: dict, key: str):
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def parse_export_times(doc, skip: int = 0) -> list:
    """Per-iteration host latency (H2D + GPU compute + D2H) in ns from ``--exportTimes`` JSON.

    ``doc``: the file's text or its parsed list. trtexec writes the warm-up queries too; ``skip``
    drops that many leading records (the log's ``Warmup completed N queries``). ``latencyMs`` is
    what trtexec's summary calls Latency; every trtexec from 7.x to 10.x writes it.
    """
    records = _load_json(doc, "--exportTimes output")
    if not isinstance(records, list):
        raise TrtexecOutputError("--exportTimes output must be a JSON list of per-iteration records")
    if skip < 0 or skip >= len(records):
        raise TrtexecOutputError(
            f"--exportTimes output has {len(records)} record(s), none left after {skip} warm-up "
            f"quer{'y' if skip == 1 else 'ies'}"
        )
    samples = []
    for i, record in enumerate(records[skip:], start=skip):
        if not isinstance(record, dict):
            raise TrtexecOutputError(f"--exportTimes record {i} is not an object")
        latency = _ms(record, "latencyMs")
        if latency is None:
            raise TrtexecOutputError(f"--exportTimes record {i} has no latencyMs")
        ns = int(round(latency * 1e6))
        if ns <= 0:
            raise TrtexecOutputError(f"--exportTimes record {i} has a latency of {latency!r} ms")
        samples.append(ns)
    return samples


_ONNX_OP_RE = re.compile(r"\b([A-Z][A-Za-z]+)_\d+\b")
_QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


def layer_op(name: str) -> str:
    """Best guess at what a TensorRT engine layer does, from its (fused) name.

    ``"features.1.conv.0.0.weight + QuantizeLinear_25 + Conv_29 + PWN(Clip_33)"`` -> ``"Conv+Clip"``;
    reformatting copies -> ``"Reformat"``; TensorRT 10's renamed nodes -> ``"layer"``.
    """
    if name.startswith("Reformatting CopyNode"):
        return "Reformat"
    ops = list(dict.fromkeys(op for op in _ONNX_OP_RE.findall(name) if op not in _QDQ_OPS))
    if not ops and any(op in name for op in _QDQ_OPS):
        ops = ["QuantizeLinear"] if "QuantizeLinear" in name else ["DequantizeLinear"]
    return "+".join(ops) if ops else "layer"


def parse_export_profile(doc) -> list:
    """Per-layer times from ``--exportProfile`` JSON: ``[{name, op, ns, median_ns, percent}]``.

    The file is ``[{"count": N}, {"name", "timeMs", "averageMs", ["medianMs"], "percentage"}, ...]``;
    ``ns`` is the average time of one run of the layer, ``median_ns`` None before TensorRT 8.6.
    """
    rows = _load_json(doc, "--exportProfile output")
    if not isinstance(rows, list) or not rows or not isinstance(rows[0], dict) or "count" not in rows[0]:
        raise TrtexecOutputError("--exportProfile output must be a JSON list starting with {\"count\": N}")
    count = rows[0]["count"]
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise TrtexecOutputError(f"--exportProfile 'count' must be a positive integer, got {count!r}")
    layers = []
    for i, row in enumerate(rows[1:], start=1):
        if not isinstance(row, dict) or not isinstance(row.get("name"), str):
            raise TrtexecOutputError(f"--exportProfile entry {i} has no layer name")
        average = _ms(row, "averageMs")
        if average is None or average < 0:
            raise TrtexecOutputError(f"--exportProfile entry {i} ({row['name']}) has no averageMs")
        median = _ms(row, "medianMs")
        layers.append({
            "name": row["name"],
            "op": layer_op(row["name"]),
            "ns": int(round(average * 1e6)),
            "median_ns": None if median is None else int(round(median * 1e6)),
            "percent": _ms(row, "percentage"),
        })
    return layers


def warmup_ms_for(warmup: int) -> int:
    """trtexec warms up for a time, not a count: 20 ms per requested warm-up run, at least 200 ms."""
    return 0 if warmup <= 0 else max(200, 20 * int(warmup))
