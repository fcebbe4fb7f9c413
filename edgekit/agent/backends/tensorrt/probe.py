"""Which TensorRT is on this device, and where its trtexec is (standard library only).

TensorRT is a system library on a Jetson (JetPack's apt packages), not a pip package, so its
version comes from the Python binding's metadata, the libnvinfer SONAME, dpkg, or trtexec.
"""

from __future__ import annotations

import os
import re

from ... import installed_versions, normalize_dist
from .trtexec import banner_version

TRTEXEC_JETPACK = "/usr/src/tensorrt/bin/trtexec"  # where JetPack installs trtexec (not on PATH)
_NVINFER_DIRS = ("/usr/lib/aarch64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")
_TRT_DISTS = ("tensorrt", "tensorrt-cu12", "tensorrt-cu11")


def find_trtexec():
    """trtexec on PATH, else JetPack's /usr/src/tensorrt/bin/trtexec; None when neither exists."""
    import shutil

    found = shutil.which("trtexec")
    if found:
        return found
    if os.path.isfile(TRTEXEC_JETPACK) and os.access(TRTEXEC_JETPACK, os.X_OK):
        return TRTEXEC_JETPACK
    return None


def tensorrt_version(ask_trtexec: bool = True) -> tuple:
    """``(version, source)``: the first of Python metadata, libnvinfer SONAME, dpkg, trtexec's banner."""
    installed = installed_versions()
    for dist in _TRT_DISTS:
        if normalize_dist(dist) in installed:
            return installed[normalize_dist(dist)], "python:" + dist
    names = []
    for directory in _NVINFER_DIRS:
        try:
            names.extend(os.listdir(directory))
        except OSError:
            continue
    version = nvinfer_soname_version(names)
    if version:
        return version, "libnvinfer"
    # dpkg-query only when dpkg's database lists a libnvinfer package: a listdir, where spawning
    # dpkg-query on every device (every facts call) costs tens of ms for nothing
    version = parse_dpkg_nvinfer(_command(["dpkg-query", "-W", "--showformat=${Package} ${Version}\\n", "libnvinfer*"]) or "") if _dpkg_lists_nvinfer() else None
    if version:
        return version, "dpkg"
    trtexec = find_trtexec() if ask_trtexec else None
    if trtexec:
        version = banner_version(_command([trtexec, "--help"], any_rc=True) or "")
        if version:
            return version, "trtexec"
    return None, None


def _dpkg_lists_nvinfer() -> bool:
    try:
        return any(name.startswith("libnvinfer") for name in os.listdir(DPKG_INFO))
    except OSError:
        return False  # no dpkg database: dpkg-query would know nothing either


DPKG_INFO = "/var/lib/dpkg/info"


def nvinfer_soname_version(names) -> str | None:
    """``["libnvinfer.so.8.5.2", "libnvinfer.so.8"]`` -> ``"8.5.2"`` (the most specific one)."""
    best = None
    for name in names:
        match = re.fullmatch(r"libnvinfer\.so\.(\d+(?:\.\d+)*)", name)
        if match and (best is None or match.group(1).count(".") > best.count(".")):
            best = match.group(1)
    return best


def parse_dpkg_nvinfer(text: str) -> str | None:
    """The libnvinfer version from ``dpkg-query -W -f='${Package} ${Version}\\n' 'libnvinfer*'``.

    ``libnvinfer8 8.5.2-1+cuda11.4`` -> ``"8.5.2"``: the core library package, upstream part only.
    """
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and re.fullmatch(r"libnvinfer\d+", fields[0]):
            match = re.match(r"(?:\d+:)?(\d+(?:\.\d+)*)", fields[1])
            if match:
                return match.group(1)
    return None


def _command(argv, timeout: float = 20, any_rc: bool = False):
    """stdout of ``argv``, or None when it cannot run or fails (a fact, not a requirement)."""
    import subprocess

    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.decode("utf-8", "replace") if proc.returncode == 0 or any_rc else None
