"""Facts about the device the agent runs on: CPU, ISA, memory, OS, runtimes, clocks, heat.

Everything is read from files and the standard library; nothing here imports a runtime
(versions come from installed package metadata). A fact that cannot be read is null.
The CPU names and ISA feature names match the host's profile vocabulary
(``edgekit.profiles``), so a device's facts can be checked against its profile.
"""

from __future__ import annotations

import os
import platform
import re
import socket

from .backends.tensorrt.probe import find_trtexec, tensorrt_version

# The ISA features edgekit dispatches on, one name each, as Linux's /proc/cpuinfo spells them
# ("asimddp" is the ARM dot product; "neondot" is only the suffix of the C kernels using it).
# Profiles, plans and the host's probe read these tables; the agent defines them (stdlib only).
ARM_ISA = ("neon", "asimddp", "i8mm", "fp16")
X86_ISA = ("sse4_2", "avx2", "avx512f", "avx512_vnni", "avx_vnni")
ISA_ORDER = ARM_ISA + X86_ISA
# /proc/cpuinfo flag -> feature name
ARM_FLAGS = {"asimd": "neon", "neon": "neon", "asimddp": "asimddp", "i8mm": "i8mm", "asimdhp": "fp16"}
X86_FLAGS = {f: f for f in X86_ISA}

# (CPU implementer, CPU part) -> core name, from the Linux kernel's arm64 cputype.h.
ARM_PARTS = {
    ("0x41", "0xc07"): "cortex-a7",
    ("0x41", "0xc09"): "cortex-a9",
    ("0x41", "0xc0f"): "cortex-a15",
    ("0x41", "0xd03"): "cortex-a53",
    ("0x41", "0xd04"): "cortex-a35",
    ("0x41", "0xd05"): "cortex-a55",
    ("0x41", "0xd07"): "cortex-a57",
    ("0x41", "0xd08"): "cortex-a72",
    ("0x41", "0xd09"): "cortex-a73",
    ("0x41", "0xd0a"): "cortex-a75",
    ("0x41", "0xd0b"): "cortex-a76",
    ("0x41", "0xd0c"): "neoverse-n1",
    ("0x41", "0xd0d"): "cortex-a77",
    ("0x41", "0xd0e"): "cortex-a76ae",
    ("0x41", "0xd40"): "neoverse-v1",
    ("0x41", "0xd41"): "cortex-a78",
    ("0x41", "0xd42"): "cortex-a78ae",
    ("0x41", "0xd44"): "cortex-x1",
    ("0x41", "0xd46"): "cortex-a510",
    ("0x41", "0xd47"): "cortex-a710",
    ("0x41", "0xd48"): "cortex-x2",
    ("0x41", "0xd49"): "neoverse-n2",
    ("0x41", "0xd4b"): "cortex-a78c",
    ("0x41", "0xd4d"): "cortex-a715",
    ("0x41", "0xd4e"): "cortex-x3",
    ("0x41", "0xd4f"): "neoverse-v2",
    ("0x41", "0xd80"): "cortex-a520",
    ("0x41", "0xd81"): "cortex-a720",
    ("0x41", "0xd82"): "cortex-x4",
    ("0x4e", "0x004"): "nvidia-carmel",
}

# runtime key in the document -> distribution names that provide it (first installed wins)
_RUNTIMES = {
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino", "onnxruntime-directml"),
    "openvino": ("openvino",),
    "tflite_runtime": ("tflite-runtime",),
    "ai_edge_litert": ("ai-edge-litert",),
    "numpy": ("numpy",),
}

_GOVERNOR = "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"
_THERMAL = "/sys/class/thermal/thermal_zone0/temp"


def parse_cpuinfo(text: str, machine: str) -> tuple[str | None, list[str]]:
    """``(cpu_model, isa)`` from the text of /proc/cpuinfo on a machine of ``machine``.

    On ARM the model is the core name from implementer + part (big.LITTLE parts joined
    with "+", in the kernel's order); elsewhere the "model name" line, else "Hardware".
    """
    flags = set()
    parts = []
    model_name = hardware = implementer = None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip().lower(), value.strip()
        if key in ("flags", "features"):
            flags.update(value.split())
        elif key == "model name" and model_name is None:
            model_name = value
        elif key == "hardware" and hardware is None:
            hardware = value
        elif key == "cpu implementer":
            implementer = value.lower()
        elif key == "cpu part" and implementer is not None:
            ident = (implementer, value.lower())
            name = ARM_PARTS.get(ident, f"{ident[0]}:{ident[1]}")
            if name not in parts:
                parts.append(name)
    machine = machine.lower()
    arm = machine.startswith(("arm", "aarch64")) or bool(parts)
    if arm:
        isa = {ARM_FLAGS[f] for f in flags if f in ARM_FLAGS}
        if machine in ("aarch64", "arm64"):
            isa.add("neon")  # Advanced SIMD is mandatory in AArch64
        model = "+".join(parts) if parts else (model_name or hardware)
    else:
        isa = {X86_FLAGS[f] for f in flags if f in X86_FLAGS}
        model = model_name or hardware
    return model, [f for f in ISA_ORDER if f in isa]


def runtime_versions() -> dict:
    """Installed runtime versions from package metadata (no runtime is imported)."""
    try:
        from importlib import metadata
    except ImportError:  # Python 3.7
        return {key: None for key in _RUNTIMES}
    versions = {}
    for key, dists in _RUNTIMES.items():
        versions[key] = None
        for dist in dists:
            try:
                versions[key] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
    return versions


def device_facts() -> dict:
    machine = platform.machine()
    cpu_model, isa = parse_cpuinfo(_read("/proc/cpuinfo") or "", machine)
    trt = tensorrt_facts()
    return {
        "hostname": socket.gethostname(),
        "arch": machine,
        "cpu_model": cpu_model,
        "board": _board(),
        "cores": os.cpu_count(),
        "isa": isa,
        "memory_bytes": _memory_bytes(),
        "os": _os_name(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "runtimes": dict(runtime_versions(), tensorrt=trt["version"]),
        "tensorrt": trt,
    }


def device_state() -> dict:
    """CPU frequency governor and SoC temperature right now (null where not exposed)."""
    governor = _read(_GOVERNOR)
    temp = _read(_THERMAL)
    try:
        temp_c = round(int(temp) / 1000.0, 1) if temp else None
    except ValueError:
        temp_c = None
    return {"governor": governor.strip() if governor else None, "temp_c": temp_c}


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def _board() -> str | None:
    # Device tree boards (Raspberry Pi, Jetson) name themselves here, NUL-terminated.
    text = (_read("/proc/device-tree/model") or "").rstrip("\x00\n ")
    return text or None


def _memory_bytes() -> int | None:
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            fields = line.split()
            if len(fields) >= 2 and fields[1].isdigit():
                return int(fields[1]) * 1024
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _os_name() -> str:
    for line in (_read("/etc/os-release") or "").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip().strip('"')
    return platform.system()


# -- preflight facts ---------------------------------------------------------------------------
# Only the ``facts`` command reports these (as "probe"): they change from run to run (free
# disk) or cost an import (OpenVINO's device list), so bench documents do not carry them.

_TFLITE_DISTS = ("tflite-runtime", "ai-edge-litert", "tensorflow", "tensorflow-cpu", "tensorflow-aarch64")


def probe_facts() -> dict:
    """What preflight and provisioning need beyond ``device_facts``: disk, memory, libc, Python."""
    return {
        "workdir": workdir_disk(os.getcwd()),
        "memory_available_bytes": _memory_available_bytes(),
        "libc": libc(),
        "python": python_env(),
        "openvino_devices": openvino_devices(),
        "tflite_packages": tflite_packages(),
    }


def workdir_disk(path: str) -> dict:
    """Free and total bytes of the filesystem holding ``path`` (the agent runs in edgekit's workdir)."""
    try:
        st = os.statvfs(path)
    except (OSError, AttributeError):
        return {"path": path, "free_bytes": None, "total_bytes": None}
    return {"path": path, "free_bytes": st.f_bavail * st.f_frsize, "total_bytes": st.f_blocks * st.f_frsize}


def _memory_available_bytes():
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemAvailable:"):
            fields = line.split()
            if len(fields) >= 2 and fields[1].isdigit():
                return int(fields[1]) * 1024
    return None


def libc() -> dict:
    """``{"name": "glibc"|"musl"|None, "version": "2.36"|None}``: decides which wheels fit."""
    name, version = platform.libc_ver()
    if name:
        return {"name": name, "version": version or None}
    import glob

    if glob.glob("/lib/ld-musl-*.so.1"):
        return {"name": "musl", "version": None}
    return {"name": None, "version": None}


def python_env() -> dict:
    """The interpreter running the agent, and whether it can make a venv and run pip."""
    import importlib.util
    import sys

    def has(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            return False

    pip = None
    if has("pip"):
        try:
            from importlib import metadata

            pip = metadata.version("pip")
        except Exception:  # metadata missing or broken: pip is there, its version unknown
            pip = "unknown"
    return {
        "executable": sys.executable,
        "prefix": sys.prefix,
        "in_venv": sys.prefix != getattr(sys, "base_prefix", sys.prefix),
        "implementation": platform.python_implementation(),
        "pip": pip,
        "venv": has("venv"),
        "ensurepip": has("ensurepip"),
    }


def openvino_devices():
    """OpenVINO's available devices (e.g. ["CPU", "NPU"]); None when OpenVINO is not installed."""
    if runtime_versions().get("openvino") is None:
        return None
    try:
        import openvino

        return list(openvino.Core().available_devices)
    except Exception as exc:  # a broken install or a plugin that fails: say so, don't crash
        return ["error: " + (str(exc).strip().splitlines() or [type(exc).__name__])[0]]


def tflite_packages() -> dict:
    """Installed packages that can run a .tflite model, name -> version."""
    try:
        from importlib import metadata
    except ImportError:
        return {}
    found = {}
    for dist in _TFLITE_DISTS:
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return found


# -- TensorRT (version and trtexec: backends/tensorrt/probe.py) ------------------------------

NV_TEGRA_RELEASE = "/etc/nv_tegra_release"


def tensorrt_facts() -> dict:
    """TensorRT here: version (and where it was read), trtexec's path, the Jetson L4T release."""
    version, source = tensorrt_version()
    return {
        "version": version,
        "source": source,
        "trtexec": find_trtexec(),
        "l4t": parse_nv_tegra_release(_read(NV_TEGRA_RELEASE) or ""),
    }


def parse_nv_tegra_release(text: str) -> str | None:
    """``# R35 (release), REVISION: 4.1, GCID: ...`` (/etc/nv_tegra_release) -> ``"R35.4.1"``."""
    match = re.search(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*(\d+(?:\.\d+)*)", text)
    return f"R{match.group(1)}.{match.group(2)}" if match else None
