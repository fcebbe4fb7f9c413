"""Fuzz the .ekm loader (csrc/fuzz/fuzz_ekm.c) with libFuzzer + ASan + UBSan for a bounded time.

Seeds: valid .ekm files (every op, single-op models) plus tests/fuzz-regressions/. A crash,
leak, sanitizer report or timeout fails the test, and the input that caused it is copied into
tests/fuzz-regressions/ so tests/test_ekrt_core.py replays it from then on (commit it with the
fix). EDGEKIT_FUZZ_SECONDS sets the time (default 60; 0 skips). Needs clang with libFuzzer
(Debian: apt-get install clang).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from edgekit.targets.native import ekm, sources
from tests.test_ekrt_core import OP_CASES, REGRESSIONS, _one_op, every_op_model

SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer", "-g", "-O1"]


def _seconds() -> int:
    try:
        return int(os.environ.get("EDGEKIT_FUZZ_SECONDS", "60"))
    except ValueError:
        return 60


def _build(tmp: Path) -> Path:
    clang = shutil.which("clang")
    if not clang:
        pytest.skip("clang is not installed (apt-get install clang): the libFuzzer harness needs it")
    probe = tmp / "probe.c"
    probe.write_text("#include <stdint.h>\n#include <stddef.h>\nint LLVMFuzzerTestOneInput(const uint8_t* d, size_t n) { (void)d; (void)n; return 0; }\n")
    r = subprocess.run([clang, "-fsanitize=fuzzer,address", str(probe), "-o", str(tmp / "probe")], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"clang cannot link libFuzzer here: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else '?'}")

    def supported(isa, flags):
        return subprocess.run([clang, *flags, "-c", str(probe), "-o", str(tmp / "probe.o")], capture_output=True).returncode == 0

    ss = sources.c_sources(platform.machine(), "fuzz", supported=supported)
    common = [*ss.cflags, *(f"-I{d}" for d in ss.include_dirs), *(f"-D{d}=1" for d in ss.defines), *SANITIZE]
    objects = []
    for i, src in enumerate(ss.sources):
        obj = tmp / f"{i:03d}-{src.path.stem}.o"
        instrument = "-fsanitize=fuzzer" if src.path.parent.name == "fuzz" else "-fsanitize=fuzzer-no-link"
        r = subprocess.run([clang, *common, *src.flags, instrument, "-c", str(src.path), "-o", str(obj)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{src.path.name}: {r.stderr}"
        objects.append(str(obj))
    exe = tmp / "fuzz_ekm"
    r = subprocess.run([clang, *SANITIZE, "-fsanitize=fuzzer", *objects, "-o", str(exe), *(f"-l{lib}" for lib in ss.libraries)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return exe


def _seed_corpus(corpus: Path) -> int:
    corpus.mkdir()
    blobs = [every_op_model(size=8, channels=4, seed=s).finish() for s in range(3)]
    blobs += [_one_op(OP_CASES[name]).finish() for name in sorted(OP_CASES)]
    if REGRESSIONS.is_dir():
        blobs += [p.read_bytes() for p in sorted(REGRESSIONS.iterdir()) if p.is_file() and p.suffix != ".md"]
    for blob in blobs:
        (corpus / hashlib.sha1(blob).hexdigest()).write_bytes(blob)
    return len(blobs)


def test_fuzz_the_loader(tmp_path, capsys, record_property):
    seconds = _seconds()
    if seconds <= 0:
        pytest.skip("EDGEKIT_FUZZ_SECONDS=0")
    exe = _build(tmp_path)
    corpus = tmp_path / "corpus"
    n_seeds = _seed_corpus(corpus)
    assert n_seeds > 20
    # every seed is a valid model: the harness loads and runs them (a smoke test of the harness)
    assert ekm.from_bytes((corpus / sorted(os.listdir(corpus))[0]).read_bytes())
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=1:allocator_may_return_null=1",
           "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}
    r = subprocess.run(
        [str(exe), f"-max_total_time={seconds}", "-timeout=20", "-rss_limit_mb=3072", "-malloc_limit_mb=2048",
         "-max_len=65536", "-print_final_stats=1", f"-artifact_prefix={artifacts}/", str(corpus)],
        capture_output=True, text=True, timeout=seconds + 600, env=env)
    found = sorted(p for p in artifacts.iterdir() if p.is_file())
    if found or r.returncode != 0:
        REGRESSIONS.mkdir(exist_ok=True)
        saved = []
        for p in found:
            dest = REGRESSIONS / f"{p.name.split('-')[0]}-{hashlib.sha1(p.read_bytes()).hexdigest()[:16]}"
            shutil.copyfile(p, dest)
            saved.append(dest.name)
        tail = "\n".join(r.stderr.strip().splitlines()[-40:])
        pytest.fail(f"the fuzzer found {len(found)} failing input(s), saved to tests/fuzz-regressions/ "
                    f"({', '.join(saved) or 'none'}), exit {r.returncode}:\n{tail}")
    stats = {k: v.strip() for k, _, v in (ln.partition(": ") for ln in r.stderr.splitlines() if ln.startswith("stat::"))}
    execs = int(stats.get("stat::number_of_executed_units") or 0)
    # the number the README quotes: shown on the terminal and kept in the JUnit report
    record_property("fuzz_executions", execs)
    with capsys.disabled():
        print(f"\nlibFuzzer: {execs} executions of the .ekm loader in {seconds} s "
              f"({stats.get('stat::average_exec_per_sec', '?')}/s) from {n_seeds} seeds, no failure")
    assert execs > 1000, r.stderr[-2000:]
