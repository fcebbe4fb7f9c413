"""Where the ekrt runner comes from: the one built with the package (setup.py) while it matches
the sources, else a build on first use that the user sees (a step with an estimate, per-file
progress, the time it took), cached so the next deploy reuses it; and which compiler goes first."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess

import pytest

from edgekit.events import Events
from edgekit.targets.native import build, sources


class Recorder(Events):
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.advanced = 0

    def info(self, message: str) -> None:
        self.lines.append(message)

    @contextlib.contextmanager
    def progress(self, description: str, total: int | None = None):
        self.lines.append(f"{description} ... [{total}]")
        rec = self

        class P:
            def advance(self, n: int = 1) -> None:
                rec.advanced += n

            def update(self, description: str) -> None:
                rec.lines.append(description)

        yield P()


def test_the_packaged_runner_is_used_while_it_matches_the_sources(monkeypatch, tmp_path):
    arch = build.host_arch()
    runner = build.packaged_runner(arch)
    if runner is None:
        pytest.skip("no runner was built with the package here (no static libc at build time)")
    info = json.loads(subprocess.run([str(runner), "info", "--json"], capture_output=True, text=True,
                                     timeout=60, env={"EKRT_ISA": "scalar"}).stdout)
    assert info["arch"] == arch and info["isa"] == "scalar" and "scalar" in info["built_isas"]
    monkeypatch.setenv("EDGEKIT_CACHE_DIR", str(tmp_path))
    rec = Recorder()
    assert build.build_runner(arch, events=rec) == runner
    assert rec.lines == []  # nothing to build, nothing said
    # an edited checkout: the sources' hash moves on, the packaged runner no longer counts
    monkeypatch.setattr(sources, "content_hash", lambda csrc=None: "0" * 24)
    assert build.packaged_runner(arch) is None


def test_a_first_use_build_is_a_visible_step_and_then_cached(monkeypatch, tmp_path):
    arch = build.host_arch()
    compilers = build.find_compilers(arch)
    if not compilers:
        pytest.skip(build.why_not_buildable(arch) or "no compiler")
    monkeypatch.setenv("EDGEKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "_shared_root", lambda: tmp_path / "shared")  # not the user cache's copy
    rec = Recorder()
    runner = build.build_runner(arch, compiler=compilers[0], events=rec)
    assert runner.is_file() and str(runner).startswith(str(tmp_path / "cache"))
    n = len(sources.c_sources(arch, "runner").sources)
    assert re.fullmatch(rf"building ekrt runner for {arch} with \S+ \(once, ~\d+ s, estimated\) \.\.\. \[{n + 1}\]", rec.lines[0]), rec.lines
    assert rec.advanced == n + 1  # every file compiled, then the link
    assert re.fullmatch(rf"built ekrt runner for {arch} in \d+\.\d s \(cached: .+\)", rec.lines[-1]), rec.lines
    again = Recorder()
    assert build.build_runner(arch, compiler=compilers[0], events=again) == runner
    assert again.lines == [] and again.advanced == 0


def test_this_machines_cc_goes_before_zig_and_zig_before_a_cross_gcc():
    host = build.find_compilers(build.host_arch())
    if not any(c.kind == "system" for c in host):
        pytest.skip("no system C compiler")
    assert host[0].kind == "system"  # zig's first link for a target builds its libc: minutes
    other = "aarch64" if build.host_arch() != "aarch64" else "x86_64"
    kinds = [c.kind for c in build.find_compilers(other)]
    if "zig" in kinds:
        assert kinds[0] == "zig"  # a fifth of glibc-static's size on the device


def test_the_estimate_says_more_for_zig_and_more_files():
    cc = build.Compiler(("cc",), "system", "gcc")
    zig = build.Compiler(("python", "-m", "ziglang", "cc"), "zig", "zig")
    assert build.estimate_s(zig, 40) > build.estimate_s(cc, 40) > build.estimate_s(cc, 4) >= 1


def test_an_arch_without_a_compiler_is_refused_before_any_step(monkeypatch):
    rec = Recorder()
    with pytest.raises(build.BuildError, match="riscv64"):
        build.build_runner("riscv64", events=rec)
    assert rec.lines == []
