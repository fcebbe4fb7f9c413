"""Builds the C extension ``edgekit._ekrt`` (ekrt, docs/ekrt.md); everything else is in
pyproject.toml.

The sources and per-file flags come from ``csrc/sources.toml`` through
``edgekit/targets/native/sources.py`` (loaded by path: building must not import edgekit).
Each kernel file is compiled with its ISA's flags only; an ISA whose flags this compiler
rejects is left out (its kernels drop from the dispatch lists via ``-DEK_NO_<ISA>``), so
``pip install -e .`` works with any C11 compiler. Wheels also carry ``csrc/`` as
``edgekit/_csrc`` for the device runner's cross build.

The same objects (plus ``tools/*.c``) also link this machine's static ``ekrt`` runner into
``edgekit/_runner/<arch>/`` (with ``build.txt`` naming the sources' hash), so the first deploy
on this arch runs at once instead of compiling the runner; where the C library has no static
archive the runner is left out and the first deploy builds it (edgekit/targets/native/build.py).
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.errors import LinkError

ROOT = Path(__file__).resolve().parent
CSRC = ROOT / "csrc"


def _sources_module():
    spec = importlib.util.spec_from_file_location("_ekrt_sources", ROOT / "edgekit" / "targets" / "native" / "sources.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while the class is made
    spec.loader.exec_module(module)
    return module


RUNNER_LDFLAGS = ("-Wl,--gc-sections", "-s")  # as build.py's: drop unused sections, strip symbols


class BuildEkrt(build_ext):
    """Compile each C file with its own flags, then link them into one extension (and the runner)."""

    def _flags_supported(self, flags: tuple[str, ...]) -> bool:
        if not hasattr(self, "_probed"):
            self._probed: dict[tuple[str, ...], bool] = {}
        if flags not in self._probed:
            self._probed[flags] = self._probe(flags)
        return self._probed[flags]

    def _probe(self, flags: tuple[str, ...]) -> bool:
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "probe.c")
            with open(src, "w") as fh:
                fh.write("int ekrt_probe(void) { return 0; }\n")
            try:
                self.compiler.compile([src], output_dir=tmp, extra_postargs=list(flags))
            except Exception:  # CompileError, or a compiler that is not there at all
                return False
        return True

    def build_extension(self, ext: Extension) -> None:
        if ext.name != "edgekit._ekrt":
            return super().build_extension(ext)
        sources = _sources_module()
        arch = sources.normalize_arch(platform.machine())
        ss = sources.c_sources(arch, "extension", CSRC, supported=lambda isa, flags: self._flags_supported(flags))
        runner = sources.c_sources(arch, "runner", CSRC, supported=lambda isa, flags: self._flags_supported(flags))
        for isa, why in ss.skipped.items():
            print(f"ekrt: leaving out the {isa} kernels: {why}", file=sys.stderr)
        macros = [(d, "1") for d in ss.defines]
        include_dirs = [str(p) for p in ss.include_dirs] + list(ext.include_dirs or [])
        def compile_one(src) -> list[str]:
            return self.compiler.compile(
                [str(src.path)],
                output_dir=self.build_temp,
                macros=macros,
                include_dirs=include_dirs,
                extra_postargs=list(ss.cflags) + list(src.flags),
                debug=self.debug,
                depends=ext.depends,
            )

        # one compiler process per file, in parallel; the runtime and kernels once for both
        # the extension and the runner (same sources, same flags)
        every = list(dict.fromkeys([*ss.sources, *runner.sources]))
        with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
            object_of = dict(zip(every, pool.map(compile_one, every)))
        objects = [obj for src in ss.sources for obj in object_of[src]]
        ext_path = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(ext_path), exist_ok=True)
        self.compiler.link_shared_object(
            objects,
            ext_path,
            libraries=self.get_libraries(ext) + list(ss.libraries),
            library_dirs=ext.library_dirs,
            runtime_library_dirs=ext.runtime_library_dirs,
            export_symbols=self.get_export_symbols(ext),
            debug=self.debug,
            build_temp=self.build_temp,
            target_lang="c",
        )
        self._link_runner(sources, runner, [obj for src in runner.sources for obj in object_of[src]],
                          Path(ext_path).parent / "_runner" / arch)

    def copy_extensions_to_source(self) -> None:
        """An in-place build (``--inplace``, ``pip install -e``) also puts the runner beside the
        package's sources."""
        super().copy_extensions_to_source()
        built = Path(self.build_lib) / "edgekit" / "_runner"
        if built.is_dir():
            dest = Path(self.get_finalized_command("build_py").get_package_dir("edgekit")) / "_runner"
            shutil.copytree(built, dest, dirs_exist_ok=True)

    def _link_runner(self, sources, ss, objects: list[str], out_dir: Path) -> None:
        """Link the static ``ekrt`` runner for this machine, or say why not (not an error)."""
        staged = Path(self.build_temp) / "ekrt"
        try:
            self.compiler.link_executable(
                objects, str(staged),
                libraries=list(ss.libraries),
                extra_postargs=[*ss.ldflags, *RUNNER_LDFLAGS],
                target_lang="c",
            )
        except LinkError as exc:
            print(f"ekrt: no prebuilt runner ({exc}); the first deploy on {ss.arch} builds it", file=sys.stderr)
            shutil.rmtree(out_dir, ignore_errors=True)
            return
        out_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(staged, out_dir / "ekrt")
        (out_dir / "build.txt").write_text(
            f"arch {ss.arch}\ncompiler {' '.join(self.compiler.compiler[:1])} (setup.py, with the extension)\n"
            f"isas {' '.join(ss.isas)}\nsources {sources.content_hash(CSRC)}\n"
            + "".join(f"left out {isa}: {why}\n" for isa, why in ss.skipped.items())
        )


class BuildPyWithCsrc(build_py):
    """Wheels carry csrc/ as edgekit/_csrc (the cross build of the device runner reads it)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the repository's csrc/
        dest = Path(self.build_lib) / "edgekit" / "_csrc"
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(
            CSRC, dest, ignore=shutil.ignore_patterns("*.o", "*.so", "*.a", "build*", "corpus*", "__pycache__")
        )


def _depends() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in CSRC.rglob("*") if p.suffix in (".h", ".inc", ".c", ".toml"))


setup(
    ext_modules=[Extension("edgekit._ekrt", sources=["csrc/python/module.c"], depends=_depends())],
    cmdclass={"build_ext": BuildEkrt, "build_py": BuildPyWithCsrc},
)
