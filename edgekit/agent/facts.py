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
import shutil
import socket

from . import installed_versions, normalize_dist
from .backends.tensorrt.probe import _command, find_trtexec, tensorrt_version

# The ISA features edgekit dispatches on, one name each, as Linux's /proc/cpuinfo spells them
# ("asimddp" is the ARM dot product; "neondot" is only the suffix of the C kernels using it).
# Profiles, plans and the host's probe read these tables; the agent defines them (stdlib only).
ARM_ISA = ("neon", "asimddp", "i8mm", "fp16")
X86_ISA = ("sse4_2", "avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")
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

_CPUS = "sys/devices/system/cpu"
_THERMAL = "sys/class/thermal"
# vcgencmd get_throttled bits 0-3 ("now"); the same conditions since boot are bits 16-19.
PI_THROTTLE_BITS = ("under-voltage", "arm frequency capped", "throttled", "soft temperature limit")
# A core under the performance governor that runs this far below its hardware maximum is capped.
CAPPED_BELOW = 0.95


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
    installed = installed_versions()
    return {key: next((installed[d] for d in map(normalize_dist, dists) if d in installed), None) for key, dists in _RUNTIMES.items()}


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


def sysfs(*parts: str) -> str:
    """``parts`` under ``EDGEKIT_SYSFS_ROOT`` (tests point it at a fake tree), else under "/"."""
    return os.path.join(os.environ.get("EDGEKIT_SYSFS_ROOT") or "/", *parts)


def device_state() -> dict:
    """Clocks, heat and throttling right now; each field null where the device does not expose it.

    ``governor`` and ``temp_c`` are cpu0's governor and thermal_zone0 (as older records have them);
    ``freq_mhz``/``freq_max_mhz`` every CPU's scaling_cur_freq/scaling_max_freq; ``thermal`` every
    zone by its type; ``throttled`` what the device says about throttling (see ``throttle_state``).
    """
    cpus = _numbered(sysfs(_CPUS), "cpu")
    governor = _read(sysfs(_CPUS, "cpu0", "cpufreq", "scaling_governor"))
    governor = governor.strip() if governor else None
    freq = _cpu_mhz(cpus, "scaling_cur_freq")
    thermal, temp_c = thermal_zones()
    return {
        "governor": governor,
        "temp_c": temp_c,
        "freq_mhz": freq,
        "freq_max_mhz": _cpu_mhz(cpus, "scaling_max_freq"),
        "thermal": thermal,
        "throttled": throttle_state(governor, freq, _cpu_mhz(cpus, "cpuinfo_max_freq")),
    }


def _numbered(directory: str, prefix: str) -> list:
    """``prefix0``, ``prefix1``, ... in ``directory``, in numeric order."""
    names = [n for n in _listdir(directory) if re.match(re.escape(prefix) + r"\d+$", n)]
    return sorted(names, key=lambda n: int(n[len(prefix) :]))


def _cpu_mhz(cpus: list, name: str):
    """``{"cpu0": MHz, ...}`` from cpufreq's ``name`` (kHz) for every CPU that has it, else None."""
    found = {}
    for cpu in cpus:
        value = _number(sysfs(_CPUS, cpu, "cpufreq", name))
        if value is not None:
            found[cpu] = round(value / 1000.0, 1)
    return found or None


def thermal_zones() -> tuple:
    """``({zone type: Celsius}, thermal_zone0's Celsius)``; None for what is not readable.

    A zone whose sensor fails to read (EIO, ENODATA: common on ACPI zones) is left out.
    Two zones of one type are told apart by their directory name.
    """
    zones = {}
    zone0 = None
    for name in _numbered(sysfs(_THERMAL), "thermal_zone"):
        milli = _number(sysfs(_THERMAL, name, "temp"))
        if milli is None:
            continue
        celsius = round(milli / 1000.0, 1)
        kind = (_read(sysfs(_THERMAL, name, "type")) or "").strip() or name
        zones[kind if kind not in zones else f"{kind} ({name})"] = celsius
        if name == "thermal_zone0":
            zone0 = celsius
    return zones or None, zone0


def parse_throttled(text: str):
    """``vcgencmd get_throttled`` output (``throttled=0x50005``) -> the record's throttled dict."""
    match = re.search(r"throttled=(0x[0-9a-fA-F]+|\d+)", text or "")
    if not match:
        return None
    mask = int(match.group(1), 0)
    now = [n for i, n in enumerate(PI_THROTTLE_BITS) if mask >> i & 1]
    ever = [n for i, n in enumerate(PI_THROTTLE_BITS) if mask >> (16 + i) & 1]
    detail = "now: " + (", ".join(now) or "none") + "; since boot: " + (", ".join(ever) or "none")
    return {"source": "vcgencmd", "now": bool(now), "ever": bool(ever or now), "detail": detail}


def throttle_state(governor, freq, hw_max):
    """Throttling as the device tells it: the Raspberry Pi firmware (``vcgencmd get_throttled``),
    a Jetson's power mode (``nvpmodel -q``) with its clocks, else cpufreq: under the performance
    governor a core below its hardware maximum is "frequency capped". None when nothing can say."""
    if shutil.which("vcgencmd"):
        found = parse_throttled(_command(["vcgencmd", "get_throttled"], timeout=5))
        if found:
            return found
    capped = _capped(freq, hw_max) if governor == "performance" else None
    if shutil.which("nvpmodel"):
        mode = re.search(r"NV Power Mode:\s*(\S+)", _command(["nvpmodel", "-q"], timeout=5) or "")
        detail = "power mode " + (mode.group(1) if mode else "unknown")
        if capped is not None:
            detail += "; " + (capped or "at maximum frequency")
        return {"source": "jetson", "now": bool(capped), "ever": bool(capped), "detail": detail}
    if capped is None:
        return None
    # cpufreq keeps no history: "ever" is what is seen now
    return {"source": "cpufreq", "now": bool(capped), "ever": bool(capped), "detail": capped or "at maximum frequency"}


def _capped(freq, hw_max):
    """"frequency capped: cpu0 1200/1800 MHz" for cores below CAPPED_BELOW of their maximum,
    "" when none is, None when the frequencies are not readable."""
    if not freq or not hw_max:
        return None
    low = [f"{cpu} {freq[cpu]:g}/{hw_max[cpu]:g} MHz" for cpu in freq if cpu in hw_max and freq[cpu] < CAPPED_BELOW * hw_max[cpu]]
    return "frequency capped: " + ", ".join(low) if low else ""


def _number(path: str):
    text = _read(path)
    try:
        return int(text.strip()) if text else None
    except ValueError:
        return None


def _listdir(path: str) -> list:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


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


def _meminfo_bytes(key: str) -> int | None:
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith(key + ":"):
            fields = line.split()
            if len(fields) >= 2 and fields[1].isdigit():
                return int(fields[1]) * 1024
    return None


def _memory_bytes() -> int | None:
    total = _meminfo_bytes("MemTotal")
    if total is not None:
        return total
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


def probe_facts(openvino: bool = True) -> dict:
    """What preflight and provisioning need beyond ``device_facts``: disk, memory, libc, Python.
    ``openvino``: list OpenVINO's devices (importing it costs a fraction of a second; a plan
    without OpenVINO need not pay that)."""
    probe = {
        "workdir": workdir_disk(os.getcwd()),
        "memory_available_bytes": _meminfo_bytes("MemAvailable"),
        "libc": libc(),
        "python": python_env(),
        "tflite_packages": tflite_packages(),
    }
    if openvino:
        probe["openvino_devices"] = openvino_devices()
    return probe


def workdir_disk(path: str) -> dict:
    """Free and total bytes of the filesystem holding ``path`` (the agent runs in edgekit's workdir),
    and whether this user may write there (a read-only remount, another owner)."""
    writable = os.access(path, os.W_OK)
    try:
        st = os.statvfs(path)
    except (OSError, AttributeError):
        return {"path": path, "free_bytes": None, "total_bytes": None, "writable": writable}
    return {"path": path, "free_bytes": st.f_bavail * st.f_frsize, "total_bytes": st.f_blocks * st.f_frsize, "writable": writable}


def libc() -> dict:
    """``{"name": "glibc"|"musl"|None, "version": "2.36"|None}``: decides which wheels fit."""
    name, version = platform.libc_ver()
    if name:
        return {"name": name, "version": version or None}
    import glob

    return {"name": "musl" if glob.glob("/lib/ld-musl-*.so.1") else None, "version": None}


def python_env() -> dict:
    """The interpreter running the agent, and whether it can make a venv and run pip."""
    import importlib.util
    import sys
    import sysconfig

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
    in_venv = sys.prefix != getattr(sys, "base_prefix", sys.prefix)
    return {
        "executable": sys.executable,
        "prefix": sys.prefix,
        "in_venv": in_venv,
        # PEP 668 (Debian 12, Raspberry Pi OS Bookworm): pip refuses to install into this Python
        "externally_managed": not in_venv and os.path.isfile(os.path.join(sysconfig.get_path("stdlib") or "", "EXTERNALLY-MANAGED")),
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
