"""What ``edgekit --version`` reports: edgekit, its C runtime ekrt, and the runtimes on this host.

Runtime versions come from package metadata (and, for TensorRT, its libraries): nothing is
imported to find them, so the command answers in well under a second.
"""

from __future__ import annotations

import platform
import sys

from edgekit import __version__

# the runtimes a deploy can use on this host, in the order they are printed (device-facts keys)
RUNTIMES = ("onnxruntime", "openvino", "ai_edge_litert", "tflite_runtime", "tensorrt")


def ekrt_info() -> dict:
    """The C extension's version, the ISAs compiled into it and the one its dispatch picks here,
    and whether this arch's static device runner came with the package."""
    from edgekit.targets.native.build import host_arch, packaged_runner

    arch = host_arch()
    runner = packaged_runner(arch)
    try:
        from edgekit import _ekrt
    except ImportError as exc:
        return {"version": None, "error": f"the C extension is not built: {exc}", "arch": arch,
                "runner": str(runner) if runner else None}
    return {
        "version": _ekrt.version,
        "arch": arch,
        "isa": _ekrt.isa(),
        "built_isas": [isa for isa in _ekrt.built_isas().split(",") if isa],
        "features": list(_ekrt.features()),
        "runner": str(runner) if runner else None,
    }


def runtime_versions() -> dict[str, str | None]:
    """Each runtime's installed version on this host, None where it is not installed."""
    from edgekit.agent.backends.tensorrt.probe import tensorrt_version
    from edgekit.agent.facts import runtime_versions as installed

    found = installed()
    found["tensorrt"] = tensorrt_version(ask_trtexec=False)[0]
    return {name: found.get(name) for name in RUNTIMES}


def versions() -> dict:
    """The document ``edgekit version --json`` prints."""
    return {
        "edgekit": __version__,
        "python": f"{platform.python_version()} ({sys.executable})",
        "ekrt": ekrt_info(),
        "runtimes": runtime_versions(),
    }


def version_lines(doc: dict) -> list[str]:
    """The plain-text form: one line per component."""
    ekrt = doc["ekrt"]
    if ekrt["version"] is None:
        ekrt_line = f"{'ekrt':<16} not available ({ekrt['error']})"
    else:
        built = ", ".join(ekrt["built_isas"])
        ekrt_line = f"{'ekrt':<16} {ekrt['version']} ({ekrt['arch']}; kernels: {built}; running: {ekrt['isa']})"
    runner = ekrt["runner"] or "not prebuilt: the first native deploy on this arch builds it"
    lines = [f"{'edgekit':<16} {doc['edgekit']}", f"{'python':<16} {doc['python']}", ekrt_line, f"{'ekrt-runner':<16} {runner}"]
    for name, version in doc["runtimes"].items():
        lines.append(f"{name:<16} {version or '-'}")
    return lines


__all__ = ["RUNTIMES", "ekrt_info", "runtime_versions", "version_lines", "versions"]
