"""Builds the C extension ``edgekit._ekrt`` (ekrt, docs/ekrt.md); everything else is in
pyproject.toml.

The sources and per-file flags come from ``csrc/sources.toml`` through
``edgekit/targets/native/sources.py`` (loaded by path: building must not import edgekit).
Each kernel file is compiled with its ISA's flags only; an ISA whose flags this compiler
rejects is left out (its kernels drop from the dispatch lists via ``-DEK_NO_<ISA>``), so
``pip install -e .`` works with any C11 compiler. Wheels also carry ``csrc/`` as
``edgekit/_csrc`` for the device runner's cross build.
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

ROOT = Path(__file__).resolve().parent
CSRC = ROOT / "csrc"


def _sources_module():
    spec = importlib.util.spec_from_file_location("_ekrt_sources", ROOT / "edgekit" / "targets" / "native" / "sources.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while the class is made
    spec.loader.exec_module(module)
    return module


class BuildEkrt(build_ext):
    """Compile each C file with its own flags, then link them into one extension."""

    def _flags_supported(self, flags: tuple[str, ...]) -> bool:
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

        # one compiler process per file, in parallel: an editable install rebuilds every time
        with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
            objects = [obj for objs in pool.map(compile_one, ss.sources) for obj in objs]
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
