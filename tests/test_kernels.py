"""ekrt's SIMD kernels vs the scalar reference, bit for bit, on every ISA path we can run here.

``csrc/tests/test_kernels.c`` (its tables generated from the kernel lists) is built from the
one source description (``csrc/sources.toml``) and run:

* natively, with gcc and clang (``-Wall -Wextra -Werror``): scalar, avx2, avx512vnni on this
  x86 host, each PASS or SKIP exactly as the CPU's flags say;
* under ``qemu-x86_64`` with ``-cpu Nehalem`` (no AVX: every SIMD kernel skipped, not run) and
  ``-cpu max`` (AVX2 without AVX-512), and with ``--run-all`` (a kernel the CPU lacks dies with
  SIGILL: the skip is what keeps it alive);
* cross-built for aarch64 (static) under ``qemu-aarch64 -cpu cortex-a72`` (baseline NEON ran,
  neondot skipped, SIGILL if forced) and ``-cpu cortex-a76`` (neondot ran);
* with ASan + UBSan (the test allocates every input to its exact size);
* and the benchmark (``csrc/bench/bench_kernels.c``) builds and reports every kernel.

Tools a fresh machine needs: a C compiler (gcc; clang optional), ``gcc-aarch64-linux-gnu`` +
``libc6-dev-arm64-cross`` (or the ``ziglang`` package) and ``qemu-user-static``. Each test
that lacks one skips and says which.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from edgekit.targets.native import sources

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"
WARN = ("-Wall", "-Wextra", "-Werror")
LINE = re.compile(r"^(PASS|FAIL|SKIP) (\S+) (\S+) isa=(\w+)")
HOST = sources.normalize_arch(platform.machine())
RUN_TIMEOUT_S = 300


# ---- the lists and the build -------------------------------------------------------------


def kernel_lists() -> dict[str, tuple[str, str]]:
    """Every kernel named in the family lists: function -> (family, isa). (An ISA word's
    ``| EK_ISA_W7`` / ``| EK_ISA_WN``, a bound on the weights and no CPU feature, is not part of its ISA.)"""
    out: dict[str, tuple[str, str]] = {}
    for inc in sorted((CSRC / "kernels").glob("*/*.inc")):
        for isa, fn in re.findall(
            r"^EK_KERNEL\(\s*EK_ISA_(\w+)\s*(?:\|\s*EK_ISA_W[7N]\s*)?,\s*(\w+)", inc.read_text(), re.M
        ):
            out[fn] = (inc.stem, isa.lower())
    return out


def _run(argv: list[str], timeout: float = RUN_TIMEOUT_S, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)


def _flags_ok(cc: list[str], flags: tuple[str, ...], tmp: Path) -> bool:
    probe = tmp / "probe.c"
    probe.write_text("int probe(void) { return 0; }\n")
    return _run([*cc, *flags, "-c", str(probe), "-o", str(tmp / "probe.o")]).returncode == 0


def build(
    cc: list[str],
    arch: str,
    out: Path,
    main: str = "tests/test_kernels.c",
    extra: tuple[str, ...] = (),
    ldflags: tuple[str, ...] = (),
) -> tuple[Path, sources.SourceSet, list[Path]]:
    """Compile the kernel files (each with its ISA's flags) + ``main``; returns (exe, source set, objects)."""
    out.mkdir(parents=True, exist_ok=True)
    ss = sources.c_sources(
        arch, "runner", CSRC, supported=lambda isa, flags: _flags_ok(cc, flags, out)
    )
    kernels = [s for s in ss.sources if (CSRC / "kernels") in s.path.parents]
    assert kernels, "no kernel files in csrc/sources.toml's kernel globs"
    common = [
        *ss.cflags,
        *WARN,
        *extra,
        *(f"-I{d}" for d in ss.include_dirs),
        *(f"-D{d}=1" for d in ss.defines),
    ]
    objects = [out / f"{src.path.stem}.o" for src in kernels]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        runs = pool.map(
            lambda so: _run([*cc, *common, *so[0].flags, "-c", str(so[0].path), "-o", str(so[1])]),
            zip(kernels, objects),
        )
        for src, r in zip(kernels, runs):
            assert r.returncode == 0, f"{src.path.name} ({' '.join(cc)}):\n{r.stderr}"
    exe = out / Path(main).stem
    r = _run([*cc, *common, str(CSRC / main), *map(str, objects), "-o", str(exe), *ldflags, "-lm"])
    assert r.returncode == 0, f"{main} ({' '.join(cc)}):\n{r.stderr}"
    return exe, ss, objects


def parse(stdout: str) -> tuple[set[str], dict[str, str]]:
    """(kernel ISAs the CPU features the binary saw allow, kernel function -> PASS/FAIL/SKIP)."""
    features: set[str] | None = None
    status: dict[str, str] = {}
    for line in stdout.splitlines():
        if line.startswith("cpu features:"):
            isa_of = {f: isa for isa, f in sources.ISA_FEATURE.items()}
            features = {isa_of[f] for f in line.split(":", 1)[1].split()}
        m = LINE.match(line)
        if m:
            status[m.group(3)] = m.group(1)
    assert features is not None, f"no 'cpu features' line in:\n{stdout}"
    return features, status


def expected_kernels(ss: sources.SourceSet) -> dict[str, str]:
    """The listed kernels this build compiled: function -> isa."""
    return {fn: isa for fn, (_, isa) in kernel_lists().items() if isa in ss.isas}


def check_run(
    r: subprocess.CompletedProcess, ss: sources.SourceSet
) -> tuple[set[str], dict[str, str]]:
    """Nothing failed; every compiled kernel reported; PASS exactly where the CPU has the ISA."""
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    features, status = parse(r.stdout)
    assert not [k for k, v in status.items() if v == "FAIL"], r.stdout
    want = expected_kernels(ss)
    assert set(status) == set(want), f"reported {sorted(status)}, listed {sorted(want)}"
    for fn, isa in want.items():
        runs = isa == "scalar" or isa in features
        assert status[fn] == ("PASS" if runs else "SKIP"), (
            f"{fn} ({isa}) with features {features}: {status[fn]}"
        )
    return features, status


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    m = re.search(r"^(flags|Features)\s*:(.*)$", text, re.M)
    return set(m.group(2).split()) if m else set()


def host_isas() -> set[str]:
    f = cpu_flags()
    isas = set()
    if HOST == "x86_64":
        if "avx2" in f:
            isas.add("avx2")
        if {"avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= f:
            isas.add("avx512vnni")
        if {"avx2", "avx512f", "avx512bw", "avx512vbmi"} <= f:
            isas.add("avx512vbmi")
        # AMX also needs the kernel's grant (Linux 5.16+, which lists amx_* only when it can)
        if "avx512vnni" in isas and {"amx_tile", "amx_int8"} <= f:
            isas.add("amx")
    elif HOST == "aarch64":
        if "asimd" in f:
            isas.add("neon")
        if "asimddp" in f:
            isas.add("neondot")
    return isas


def native_compilers() -> list[tuple[str, list[str]]]:
    out = []
    for name in ("gcc", "clang"):
        path = shutil.which(name)
        if path:
            out.append((name, [path]))
    return out


# ---- native ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def native_builds(tmp_path_factory) -> dict[str, tuple[Path, sources.SourceSet]]:
    ccs = native_compilers()
    if not ccs:
        pytest.skip("no C compiler (gcc or clang) on PATH")
    builds = {}
    for name, cc in ccs:
        exe, ss, _ = build(cc, HOST, tmp_path_factory.mktemp(f"native-{name}"))
        builds[name] = (exe, ss)
    return builds


@pytest.mark.parametrize("compiler", ["gcc", "clang"])
def test_native_every_isa_the_cpu_has_matches_scalar(native_builds, compiler):
    if compiler not in native_builds:
        pytest.skip(f"{compiler} is not installed")
    exe, ss = native_builds[compiler]
    r = _run([str(exe)])
    features, status = check_run(r, ss)
    # the binary's own CPU detection agrees with the kernel's view of /proc/cpuinfo
    assert features == host_isas(), f"test_kernels saw {features}, /proc/cpuinfo says {host_isas()}"
    if HOST == "x86_64":
        for isa in ("avx2", "avx512vnni"):
            if isa in ss.isas and isa in features:
                assert any(
                    status[fn] == "PASS" for fn, i in expected_kernels(ss).items() if i == isa
                )
    # the cases exercise rounding, not only the clamps
    m = re.search(
        r"INFO qs8-gemm reference outputs: (\d+), strictly inside \[qmin, qmax\]: ([\d.]+)%",
        r.stdout,
    )
    assert m and int(m.group(1)) > 100_000 and float(m.group(2)) > 20.0, r.stdout
    # LUT: lengths 0..100 and > 4096 under several tables; CVT: edge values and ties, and
    # both exercise rounding / more than the saturated ends
    for family, least in (("x8-lut", 20_000), ("f32-qs8-cvt", 100_000)):
        m = re.search(
            rf"INFO {family} reference outputs: (\d+), strictly inside \[qmin, qmax\]: ([\d.]+)%",
            r.stdout,
        )
        assert m and int(m.group(1)) > least and float(m.group(2)) > 20.0, r.stdout


def test_elementwise_families_have_a_simd_kernel_per_isa():
    """LUT and QUANTIZE were scalar loops in ops.c; each now has a kernel on every SIMD ISA."""
    isas_of: dict[str, set[str]] = {}
    for family, isa in kernel_lists().values():
        isas_of.setdefault(family, set()).add(isa)
    for family in ("x8-lut", "f32-qs8-cvt"):
        assert {"scalar", "avx2", "neon"} <= isas_of[family], (family, isas_of.get(family))


@pytest.mark.parametrize("isa", ["scalar", "avx2"])
def test_runtime_dispatches_lut_and_quantize_kernels(isa):
    if isa != "scalar" and isa not in host_isas():
        pytest.skip(f"the CPU lacks {isa}")
    code = "import json, edgekit._ekrt as e; print(json.dumps(e.kernels()))"
    r = _run([sys.executable, "-c", code], env={**os.environ, "EKRT_ISA": isa})
    assert r.returncode == 0, r.stderr
    chosen = json.loads(r.stdout)
    assert chosen["x8-lut"].startswith(f"ek_x8_lut_ukernel__{isa}_"), chosen
    assert chosen["f32-qs8-cvt"].startswith(f"ek_f32_qs8_cvt_ukernel__{isa}_"), chosen


def test_native_different_seeds(native_builds):
    exe, ss = next(iter(native_builds.values()))
    for seed in ("1", "77", "123456789"):
        check_run(_run([str(exe), "--seed", seed]), ss)


def test_native_with_asan_and_ubsan(tmp_path):
    gcc = shutil.which("gcc") or shutil.which("clang")
    if not gcc:
        pytest.skip("no C compiler")
    san = ("-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-g")
    probe = tmp_path / "p.c"
    probe.write_text("int main(void) { return 0; }\n")
    if _run([gcc, *san, str(probe), "-o", str(tmp_path / "p")]).returncode != 0:
        pytest.skip("the compiler cannot link ASan/UBSan here")
    exe, ss, _ = build([gcc], HOST, tmp_path / "asan", extra=san, ldflags=san)
    env = dict(
        os.environ,
        ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
        UBSAN_OPTIONS="print_stacktrace=1",
    )
    check_run(_run([str(exe), "--quick"], env=env), ss)


# ---- x86 under qemu: the skip paths ------------------------------------------------------


def _qemu(arch: str) -> str | None:
    return shutil.which(f"qemu-{arch}-static") or shutil.which(f"qemu-{arch}")


@pytest.fixture(scope="module")
def x86_static(tmp_path_factory):
    if HOST != "x86_64":
        pytest.skip("x86_64 host only")
    if not _qemu("x86_64"):
        pytest.skip("qemu-x86_64 is not installed (apt-get install qemu-user-static)")
    gcc = shutil.which("gcc")
    if not gcc:
        pytest.skip("no gcc")
    exe, ss, _ = build([gcc], "x86_64", tmp_path_factory.mktemp("x86-static"), ldflags=("-static",))
    return exe, ss


def test_x86_without_avx_runs_scalar_only(x86_static):
    exe, ss = x86_static
    features, status = check_run(
        _run([_qemu("x86_64"), "-cpu", "Nehalem", str(exe), "--quick"]), ss
    )
    assert features == set()
    assert {fn for fn, s in status.items() if s == "PASS"} == {
        fn for fn, isa in expected_kernels(ss).items() if isa == "scalar"
    }


def test_x86_emulated_avx2_without_avx512(x86_static):
    exe, ss = x86_static
    features, status = check_run(_run([_qemu("x86_64"), "-cpu", "max", str(exe), "--quick"]), ss)
    if "avx2" not in features:
        pytest.skip(f"this qemu's -cpu max has no AVX2 (features: {features})")
    assert "avx512vnni" not in features or all(
        status[fn] == "PASS" for fn, i in expected_kernels(ss).items() if i == "avx512vnni"
    )
    assert all(status[fn] == "PASS" for fn, i in expected_kernels(ss).items() if i == "avx2")


def test_x86_forcing_a_missing_isa_dies_with_sigill(x86_static):
    exe, _ = x86_static
    r = _run([_qemu("x86_64"), "-cpu", "Nehalem", str(exe), "--quick", "--run-all"])
    assert r.returncode in (-signal.SIGILL, 128 + signal.SIGILL), (r.returncode, r.stdout[-2000:])


# ---- aarch64 under qemu ------------------------------------------------------------------


def aarch64_compilers() -> dict[str, tuple[list[str], str]]:
    """The aarch64 cross compilers here, by name: (command, its objdump). Both are tested: the
    device runner is built with zig (clang) first, gcc where zig is missing, and the two compile
    the kernels' intrinsics and inline assembly differently."""
    found = {}
    gnu = shutil.which("aarch64-linux-gnu-gcc")
    if gnu:
        found["gcc"] = ([gnu], "aarch64-linux-gnu-objdump")
    try:
        import ziglang  # noqa: F401
    except ImportError:
        return found
    # binutils' objdump reads any aarch64 object; llvm-objdump shows SDOT only with the feature on
    objdump = "aarch64-linux-gnu-objdump" if shutil.which("aarch64-linux-gnu-objdump") else "llvm-objdump --mattr=+dotprod"
    found["zig"] = ([sys.executable, "-m", "ziglang", "cc", "-target", "aarch64-linux-musl"], objdump)
    return found


@pytest.fixture(scope="module", params=["gcc", "zig"])
def aarch64_build(request, tmp_path_factory):
    if not _qemu("aarch64"):
        pytest.skip("qemu-aarch64 is not installed (apt-get install qemu-user-static)")
    found = aarch64_compilers()
    if request.param not in found:
        pytest.skip(
            f"no {request.param} aarch64 cross compiler (apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross, "
            "or pip install ziglang)"
        )
    cc, objdump = found[request.param]
    exe, ss, objects = build(
        cc, "aarch64", tmp_path_factory.mktemp(f"aarch64-{request.param}"), ldflags=("-static",)
    )
    assert {"neon", "neondot"} <= set(ss.isas), f"the cross compiler left out {ss.skipped}"
    return exe, ss, objects, objdump


def test_aarch64_cortex_a72_runs_neon_and_skips_neondot(aarch64_build):
    exe, ss, _, _ = aarch64_build
    features, status = check_run(_run([_qemu("aarch64"), "-cpu", "cortex-a72", str(exe)]), ss)
    assert features == {"neon"}
    kernels = expected_kernels(ss)
    assert all(status[fn] == "PASS" for fn, i in kernels.items() if i == "neon")
    assert [fn for fn, i in kernels.items() if i == "neondot"]
    assert all(status[fn] == "SKIP" for fn, i in kernels.items() if i == "neondot")


def test_aarch64_cortex_a76_runs_neondot(aarch64_build):
    exe, ss, _, _ = aarch64_build
    features, status = check_run(_run([_qemu("aarch64"), "-cpu", "cortex-a76", str(exe)]), ss)
    assert features == {"neon", "neondot"}
    assert all(
        status[fn] == "PASS" for fn, i in expected_kernels(ss).items() if i in ("neon", "neondot")
    )


def test_aarch64_sdot_only_in_neondot_code(aarch64_build):
    """Forced on a core without dotprod the SDOT kernel dies (so it really uses SDOT), and no
    SDOT leaked into the baseline objects."""
    exe, _, objects, objdump = aarch64_build
    r = _run([_qemu("aarch64"), "-cpu", "cortex-a72", str(exe), "--quick", "--run-all"])
    assert r.returncode in (-signal.SIGILL, 128 + signal.SIGILL), (r.returncode, r.stdout[-2000:])
    tool, *options = objdump.split()
    if not shutil.which(tool):
        return
    for obj in objects:
        text = _run([tool, *options, "-d", str(obj)]).stdout
        has_sdot = re.search(r"\bsdot\b", text) is not None
        assert has_sdot == ("neondot" in obj.stem.split("-")), (
            f"{obj.name}: sdot present = {has_sdot}"
        )


# ---- the benchmark -----------------------------------------------------------------------


def test_bench_reports_every_kernel(tmp_path):
    gcc = shutil.which("gcc") or shutil.which("clang")
    if not gcc:
        pytest.skip("no C compiler")
    exe, ss, _ = build([gcc], HOST, tmp_path, main="bench/bench_kernels.c")
    r = _run([str(exe), "--quick", "--json"])
    assert r.returncode == 0, r.stderr
    results = json.loads(r.stdout)["results"]
    runnable = {
        fn for fn, isa in expected_kernels(ss).items() if isa == "scalar" or isa in host_isas()
    }
    assert {x["kernel"] for x in results} == runnable
    for x in results:
        assert (x.get("GOPS") or x.get("Gelem/s")) > 0, x
    gemm = {
        x["kernel"]: x["GOPS"]
        for x in results
        if x["family"] == "qs8-gemm" and x["shape"] == "784x128x1152"
    }
    scalar = gemm.pop("ek_qs8_gemm_ukernel_1x4c1__scalar")
    for fn, gops in gemm.items():  # every SIMD gemm beats the reference by a wide margin
        assert gops > 2 * scalar, (fn, gops, scalar)
