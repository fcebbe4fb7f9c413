"""Build the static ``ekrt`` runner for a device arch from the packaged C sources.

The sources and per-file flags come from ``csrc/sources.toml`` (``sources.c_sources``). For this
machine's arch the runner usually ships with the package: ``setup.py`` links it from the
extension's objects into ``edgekit/_runner/<arch>/`` (``packaged_runner``; used while its
recorded source hash matches the sources). Otherwise it is built on first use, as a visible step,
by the first compiler that works of: for this machine's arch the system ``cc`` (glibc's static
libs; ~20 s on 2 cores), then ``aarch64-linux-gnu-gcc`` / ``arm-linux-gnueabihf-gcc`` for their
arch, and the ``ziglang`` package (``python -m ziglang cc -target <arch>-linux-musl``: needs
nothing but pip, but zig's first link for a target also builds its C library: ~2.5 min of the
~3 min of a cold zig build on a 2-core VM). zig comes before a cross gcc (a fifth of the size),
after the host's own ``cc`` (no C library to build first).
The result is cached under ``<edgekit cache>/ekrt-runner/<hash>/ekrt``, the hash taken over the
sources, the flags, the compiler and the target, so a second deploy reuses it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from edgekit.errors import EdgekitError
from edgekit.events import Events
from edgekit.fsutil import cache_dir
from edgekit.targets.native import sources

RUNNER_NAME = "ekrt"
ZIG_TARGETS = {"x86_64": "x86_64-linux-musl", "aarch64": "aarch64-linux-musl", "armv7l": "arm-linux-musleabihf"}
GNU_PREFIX = {"x86_64": "x86_64-linux-gnu-", "aarch64": "aarch64-linux-gnu-", "armv7l": "arm-linux-gnueabihf-"}
# Size matters on a device: drop unused sections, strip symbols.
SIZE_FLAGS = ("-ffunction-sections", "-fdata-sections")
SIZE_LDFLAGS = ("-Wl,--gc-sections", "-s")
COMPILE_TIMEOUT_S = 600
# an estimate of a cold build, said before it starts: CPU-seconds per compiled file measured on a
# 2-core Xeon VM (gcc -O3: ~1 s a file), plus zig's one-time C library build for a target
SECONDS_PER_FILE = 1.0
ZIG_LIBC_CPU_S = 150.0
RECIPE = 1  # bump when this module changes how a runner is built (it is part of the cache key)


class BuildError(EdgekitError):
    """The runner could not be built (no compiler for the arch, or the sources don't compile)."""


@dataclass(frozen=True)
class Compiler:
    argv: tuple[str, ...]  # the command that compiles and links, without flags
    kind: str  # "system" | "zig"
    identity: str  # version text: part of the cache key

    @property
    def name(self) -> str:
        return " ".join(self.argv if self.kind == "system" else self.argv[1:])


def host_arch() -> str:
    return sources.normalize_arch(platform.machine())


def cache_root() -> Path:
    """Where runners are built into: ``$EDGEKIT_CACHE_DIR/ekrt-runner`` (else the user cache's)."""
    return cache_dir("ekrt-runner")


def _shared_root() -> Path:
    """The user cache's runners, also searched (and filled) when EDGEKIT_CACHE_DIR points
    elsewhere: a runner is named by the hash of everything that went into it, so any copy with
    that name is the same build (a test suite with a cache dir per test builds it once)."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("edgekit")) / "ekrt-runner"


def _version(argv: list[str]) -> str | None:
    try:
        r = subprocess.run([*argv, "--version"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (r.stdout or r.stderr).strip().splitlines()[0] if r.returncode == 0 and (r.stdout or r.stderr) else None


def find_compilers(arch: str) -> list[Compiler]:
    """The compilers that can build for ``arch``, best first (nothing is compiled to find out).

    For this machine's arch, its own ``cc`` comes first: zig's first link for a target builds
    zig's C library (minutes on a small machine), the system's is already there. For another
    arch zig (musl) comes first when the ``ziglang`` package is installed: its static runner is
    a fifth of glibc's (aarch64: ~170 KB against ~800 KB) and has no glibc-static caveats (NSS,
    dlopen). Then the system's cross compiler for the arch, linking glibc statically.
    A compiler that cannot link statically (no libc.a) fails its build, and the next is tried."""
    arch = sources.normalize_arch(arch)
    zig: list[Compiler] = []
    if arch in ZIG_TARGETS and importlib.util.find_spec("ziglang") is not None:
        argv = (sys.executable, "-m", "ziglang", "cc", "-target", ZIG_TARGETS[arch])
        zig.append(Compiler(argv, "zig", f"ziglang {_zig_version()} {ZIG_TARGETS[arch]}"))
    system: list[Compiler] = []
    names = [f"{GNU_PREFIX[arch]}gcc"] if arch in GNU_PREFIX else []
    if arch == host_arch():
        names = [os.environ.get("CC", "cc"), *names]
    seen: set[str] = set()
    for name in names:
        path = shutil.which(name)
        if path and os.path.realpath(path) not in seen:
            seen.add(os.path.realpath(path))
            version = _version([path])
            if version:
                system.append(Compiler((path,), "system", version))
    return [*system, *zig] if arch == host_arch() else [*zig, *system]


def _zig_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("ziglang")
    except metadata.PackageNotFoundError:  # pragma: no cover - find_spec said it is there
        return "?"


def why_not_buildable(arch: str) -> str | None:
    """None when a runner for ``arch`` can be built (or is cached), else why not."""
    arch = sources.normalize_arch(arch)
    try:
        sources.csrc_dir()
    except FileNotFoundError:
        return None if packaged_runner(arch) else "ekrt's C sources are not installed with edgekit"
    if arch not in ZIG_TARGETS:
        return f"ekrt is not built for {arch}"
    if not find_compilers(arch):
        return (f"no C compiler for {arch}: install {GNU_PREFIX[arch]}gcc, or the ziglang package "
                "(pip install ziglang), which cross-compiles from pip alone")
    return None


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise BuildError(f"the compiler took over {COMPILE_TIMEOUT_S} s: {' '.join(argv[:6])} ...", "run it by hand to see why") from None


def _flags(compiler: Compiler, flags: tuple[str, ...]) -> tuple[str, ...]:
    """zig's clang driver reads ``-march`` as a CPU name: ``-march=armv8.2-a+dotprod`` becomes
    ``-mcpu=generic+dotprod`` (the baseline CPU plus the features)."""
    if compiler.kind != "zig":
        return flags
    return tuple("-mcpu=generic+" + f.split("+", 1)[1] if f.startswith("-march=armv8") and "+" in f else f
                 for f in flags)


def _flags_ok(compiler: Compiler, flags: tuple[str, ...], tmp: Path) -> bool:
    probe = tmp / "probe.c"
    probe.write_text("int ekrt_probe(void) { return 0; }\n")
    r = _run([*compiler.argv, *_flags(compiler, flags), "-c", str(probe), "-o", str(tmp / "probe.o")], tmp)
    return r.returncode == 0


def _key(compiler: Compiler, ss: sources.SourceSet, extra: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    h.update(f"{RECIPE}\0{ss.arch}\0{compiler.identity}\0{' '.join(compiler.argv[1:] if compiler.kind == 'zig' else ())}\0".encode())
    h.update(repr((ss.cflags, ss.defines, ss.ldflags, ss.libraries, extra)).encode())
    csrc = sources.csrc_dir()
    files = sorted({s.path for s in ss.sources} | {p for d in ss.include_dirs for p in Path(d).rglob("*.h")}
                   | set(csrc.glob("kernels/**/*.inc")) | set(csrc.glob("kernels/**/*.h")) | set(csrc.glob("*/*.h")))
    for f in files:
        h.update(str(Path(f).relative_to(csrc)).encode() + b"\0" + Path(f).read_bytes() + b"\0")
    for s in ss.sources:
        h.update(f"{s.path.name}:{' '.join(s.flags)}\0".encode())
    return h.hexdigest()[:24]


def packaged_runner(arch: str) -> Path | None:
    """The runner ``setup.py`` built with the package for ``arch``, if it is there and was built
    from the sources edgekit has now (an edited checkout's C makes it stale: None)."""
    root = Path(__file__).resolve().parents[2] / "_runner" / sources.normalize_arch(arch)
    runner, about = root / RUNNER_NAME, root / "build.txt"
    if not (runner.is_file() and about.is_file() and os.access(runner, os.X_OK)):
        return None
    recorded = dict(line.split(" ", 1) for line in about.read_text().splitlines() if " " in line)
    try:
        return runner if recorded.get("sources") == sources.content_hash() else None
    except FileNotFoundError:  # no sources to compare with: what was installed is what there is
        return runner


def build_runner(arch: str | None = None, *, compiler: Compiler | None = None, events: Events | None = None) -> Path:
    """The static ``ekrt`` runner for ``arch`` (this machine's when None): the one installed with
    the package, else from the build cache, else built now (a step ``events`` shows)."""
    arch = sources.normalize_arch(arch or host_arch())
    if compiler is None and (packaged := packaged_runner(arch)) is not None:
        return packaged
    reason = why_not_buildable(arch)
    if reason and compiler is None:
        raise BuildError(f"cannot build the ekrt runner: {reason}", "install a cross compiler for the device, or deploy with another backend")
    candidates = [compiler] if compiler else find_compilers(arch)
    errors = []
    for cc in candidates:
        try:
            return _build_with(cc, arch, events or Events())
        except BuildError as exc:
            errors.append(f"{cc.name}: {exc.message}")
    raise BuildError("cannot build the ekrt runner for " + arch + ": " + "; ".join(errors),
                     "see the compiler's message; the ziglang package (pip install ziglang) is the fallback compiler")


def estimate_s(cc: Compiler, n_files: int) -> int:
    """A rough duration of a cold build (an estimate, printed as one)."""
    cpu_s = n_files * SECONDS_PER_FILE + (ZIG_LIBC_CPU_S if cc.kind == "zig" else 0.0)
    return max(1, round(cpu_s / max(1, min(os.cpu_count() or 1, n_files)) + 2))


def _build_with(cc: Compiler, arch: str, events: Events) -> Path:
    # The key is taken before probing which ISA flags the compiler takes: that is a function of
    # the compiler (in the key) and the flags (in the key), so a cached build needs no probe.
    key = _key(cc, sources.c_sources(arch, "runner"), SIZE_FLAGS)
    with tempfile.TemporaryDirectory(prefix="ekrt-build-") as tmpdir:
        tmp = Path(tmpdir)
        out_dir = cache_root() / key
        runner = out_dir / RUNNER_NAME
        if runner.is_file():
            return runner
        shared = _shared_root() / key
        if shared != out_dir and (shared / RUNNER_NAME).is_file():
            _install(shared / RUNNER_NAME, out_dir, (shared / "build.txt").read_text() if (shared / "build.txt").is_file() else "")
            return runner
        started = time.monotonic()
        ss = sources.c_sources(arch, "runner", supported=lambda isa, flags: _flags_ok(cc, flags, tmp))
        common = [*ss.cflags, *SIZE_FLAGS, *(f"-I{d}" for d in ss.include_dirs), *(f"-D{d}=1" for d in ss.defines)]
        objects = [str(tmp / f"{i:03d}-{src.path.stem}.o") for i, src in enumerate(ss.sources)]
        what = f"building ekrt runner for {arch} with {'zig' if cc.kind == 'zig' else Path(cc.argv[0]).name}"
        with events.progress(f"{what} (once, ~{estimate_s(cc, len(ss.sources))} s, estimated)",
                             total=len(ss.sources) + 1) as prog:

            def compile_one(i: int) -> None:
                src = ss.sources[i]
                r = _run([*cc.argv, *common, *_flags(cc, src.flags), "-c", str(src.path), "-o", objects[i]], tmp)
                if r.returncode != 0:
                    raise BuildError(f"{src.path.name} does not compile: {_first_error(r.stderr)}", "report it with the compiler's output")
                prog.advance()

            with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
                list(pool.map(compile_one, range(len(ss.sources))))
            exe = tmp / RUNNER_NAME
            prog.update(f"{what}: linking")
            if cc.kind == "zig":
                events.info(f"linking with zig (its first link for {ZIG_TARGETS[arch]} also builds its C library: minutes) ...")
            r = _run([*cc.argv, *objects, "-o", str(exe), *ss.ldflags, *SIZE_LDFLAGS, *(f"-l{lib}" for lib in ss.libraries)], tmp)
            if r.returncode != 0:
                raise BuildError(f"linking the runner failed: {_first_error(r.stderr)}", "a static build needs the C library's static archive (libc.a)")
            prog.advance()
        events.info(f"built ekrt runner for {arch} in {time.monotonic() - started:.1f} s (cached: {out_dir})")
        about = (f"arch {arch}\ncompiler {cc.name} ({cc.identity})\nisas {' '.join(ss.isas)}\n"
                 + "".join(f"left out {isa}: {why}\n" for isa, why in ss.skipped.items()))
        _install(exe, out_dir, about)
        if shared != out_dir:
            try:
                _install(exe, shared, about)
            except OSError:  # a read-only home: the build is still in out_dir
                pass
        return runner


def _install(exe: Path, out_dir: Path, about: str) -> None:
    """Copy ``exe`` to ``out_dir/ekrt`` atomically (concurrent builds of one key are harmless)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    staged = out_dir / f".{RUNNER_NAME}.{os.getpid()}.{id(exe)}.tmp"
    shutil.copyfile(exe, staged)
    staged.chmod(0o755)
    (out_dir / "build.txt").write_text(about)
    os.replace(staged, out_dir / RUNNER_NAME)


def _first_error(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    lines = [ln for ln in lines if "error" in ln.lower() and "collect2" not in ln] or lines or ["(no output)"]
    return lines[0].strip()[:300]


__all__ = ["BuildError", "Compiler", "build_runner", "cache_root", "estimate_s", "find_compilers", "host_arch",
           "packaged_runner", "why_not_buildable"]
