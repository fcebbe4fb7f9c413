"""ekrt under misuse: threads racing on one ``_ekrt.Model``, and files that are not .ekm files.

The race runs in a child process so that a crash shows as a signal, not as a dead pytest, and
again against an AddressSanitizer build of the extension (clang) so that a use-after-free that
happens not to crash still fails.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from edgekit import _ekrt
from edgekit.targets.native import sources
from tests.test_ekrt_core import CSRC, every_op_model, inputs_for

# One thread runs the model over and over (the GIL released inside); the others call
# __init__, profile, set_threads, op_times and run on the same Model until each has been refused
# at least once while a run was in progress, or the deadline passes.
_RACE = r"""
import importlib.util, json, sys, threading, time
import numpy as np
if len(sys.argv) > 3:  # a given build of the extension (the ASan one)
    spec = importlib.util.spec_from_file_location("edgekit._ekrt", sys.argv[3])
    _ekrt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(_ekrt)
else:
    from edgekit import _ekrt
path, x = sys.argv[1], np.load(sys.argv[2])
m = _ekrt.Model(path)
want = m.run([x])[0]
calls = {"__init__": lambda: m.__init__(path), "profile": lambda: m.profile(True),
         "set_threads": lambda: m.set_threads(2), "op_times": m.op_times, "run": lambda: m.run([x])}
busy = {k: 0 for k in calls}
other = {k: 0 for k in calls}
stop = threading.Event()
runs = 0
bad = []

def runner():
    global runs
    while not stop.is_set():
        try:
            got = m.run([x])[0]
        except RuntimeError as e:
            if "another thread" not in str(e):
                bad.append(repr(e))
            continue
        if not np.array_equal(got, want):
            bad.append("a run returned different values")
        runs += 1

def caller(name):
    while not stop.is_set():
        try:
            calls[name]()
        except RuntimeError as e:
            msg = str(e)
            if "another thread" in msg:
                busy[name] += 1
            elif name == "__init__" and "already initialised" in msg:
                other[name] += 1
            else:
                bad.append(f"{name}: {msg}")
        time.sleep(0)

threads = [threading.Thread(target=runner)] + [threading.Thread(target=caller, args=(k,)) for k in calls]
for t in threads:
    t.start()
deadline = time.monotonic() + 60
while time.monotonic() < deadline and not bad:
    if runs >= 20 and all(busy[k] for k in calls if k != "__init__") and other["__init__"]:
        break
    time.sleep(0.01)
stop.set()
for t in threads:
    t.join()
print(json.dumps({"runs": runs, "busy": busy, "other": other, "bad": bad[:5]}))
"""


@pytest.fixture(scope="module")
def race_files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("race")
    b = every_op_model(size=48, channels=32)
    (tmp / "m.ekm").write_bytes(b.finish())
    np.save(tmp / "x.npy", inputs_for(b)[0])
    return [str(tmp / "m.ekm"), str(tmp / "x.npy")]


def _race(args: list[str], env: dict | None = None) -> dict:
    r = subprocess.run([sys.executable, "-c", _RACE, *args], capture_output=True, text=True, timeout=300,
                       env={**os.environ, **(env or {})})
    assert r.returncode == 0, f"exit {r.returncode} (a negative code is the signal that killed it)\n{r.stderr[-3000:]}"
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert not doc["bad"], doc
    assert doc["runs"] >= 20 and doc["other"]["__init__"], doc  # a second __init__ is refused
    # every other entry point was refused at least once while a run held the model
    assert all(doc["busy"][k] for k in ("profile", "set_threads", "op_times", "run")), doc
    return doc


def test_threads_racing_on_one_model_are_refused_not_crashed(race_files):
    _race(race_files)


def test_run_refuses_a_bare_array_instead_of_reading_freed_rows(tmp_path):
    # run(x) with x an ndarray (not [x]) used to read temporaries freed before use: a segfault.
    # In a child process, so a regression is a failed test, not a dead test run.
    b = every_op_model(size=8, channels=4)
    path = tmp_path / "m.ekm"
    path.write_bytes(b.finish())
    code = (
        "import numpy as np, sys; from edgekit import _ekrt\n"
        f"m = _ekrt.Model(open({str(path)!r}, 'rb').read()); x = np.zeros((1, 3, 8, 8), np.float32)\n"
        "try:\n    m.run(x)\nexcept TypeError as e:\n    print('TypeError:', e)\n"
        "print(m.run((x,))[0].shape)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    assert "TypeError: run() takes a list of arrays (one per input) or a dict by input name, not numpy.ndarray" in r.stdout


def test_init_is_one_shot():
    b = every_op_model(size=8, channels=4)
    m = _ekrt.Model(b.finish())
    with pytest.raises(RuntimeError, match="already initialised"):
        m.__init__(b.finish())
    assert m.run(inputs_for(b))[0].shape == tuple(m.outputs[0][1])
    # a failed load leaves the object unloaded, and then it may be loaded
    fresh = _ekrt.Model.__new__(_ekrt.Model)
    with pytest.raises(_ekrt.FormatError):
        fresh.__init__(b"EKM1" + bytes(200))
    with pytest.raises(RuntimeError, match="not loaded"):
        fresh.run(inputs_for(b))
    fresh.__init__(b.finish())
    assert fresh.inputs == m.inputs


def _asan_extension(tmp: Path) -> tuple[Path, str]:
    clang = shutil.which("clang")
    if not clang:
        pytest.skip("clang is not installed (apt-get install clang): the ASan build needs it")
    runtime = subprocess.run([clang, f"-print-file-name=libclang_rt.asan-{platform.machine()}.so"],
                             capture_output=True, text=True).stdout.strip()
    if not os.path.isfile(runtime):
        pytest.skip("clang's shared ASan runtime is not installed")
    probe = tmp / "probe.c"
    probe.write_text("int probe(void) { return 0; }\n")

    def supported(isa, flags):
        return subprocess.run([clang, *flags, "-c", str(probe), "-o", str(tmp / "probe.o")]).returncode == 0

    ss = sources.c_sources(platform.machine(), "extension", CSRC, supported=supported)
    common = [*ss.cflags, "-fPIC", "-fsanitize=address", "-fno-omit-frame-pointer", "-g", "-O1",
              f"-I{sysconfig.get_paths()['include']}", *(f"-I{d}" for d in ss.include_dirs),
              *(f"-D{d}=1" for d in ss.defines)]
    objects = []
    for i, src in enumerate(ss.sources):
        obj = tmp / f"{i:03d}-{src.path.stem}.o"
        r = subprocess.run([clang, *common, *src.flags, "-c", str(src.path), "-o", str(obj)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{src.path.name}: {r.stderr}"
        objects.append(str(obj))
    so = tmp / f"_ekrt{sysconfig.get_config_var('EXT_SUFFIX')}"
    r = subprocess.run([clang, "-shared", "-fsanitize=address", *objects, "-o", str(so),
                        *(f"-l{lib}" for lib in ss.libraries)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return so, runtime


def test_race_under_address_sanitizer(race_files, tmp_path):
    so, runtime = _asan_extension(tmp_path)
    _race([*race_files, str(so)], env={"LD_PRELOAD": runtime, "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1"})


# -- ekrt_load_file takes regular files of a bounded size only ------------------------------------


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "model.ekm"
    os.mkfifo(path)
    return path


def test_extension_refuses_devices_fifos_and_huge_files(fifo, tmp_path):
    for path in ("/dev/zero", fifo, tmp_path):
        with pytest.raises(OSError, match="not a regular file"):
            _ekrt.Model(str(path))
    huge = tmp_path / "huge.ekm"
    with open(huge, "wb") as f:
        f.truncate((1 << 30) + 1)  # sparse: no disk used, and the loader must not read it
    with pytest.raises(_ekrt.FormatError, match="more than the 1073741824"):
        _ekrt.Model(str(huge))


def test_runner_refuses_devices_fifos_and_huge_files(fifo, tmp_path):
    from edgekit.targets.native.build import BuildError, build_runner

    try:
        runner = build_runner()
    except BuildError as exc:
        pytest.skip(str(exc))
    huge = tmp_path / "huge.ekm"
    with open(huge, "wb") as f:
        f.truncate((1 << 30) + 1)
    for path, why in (("/dev/zero", "not a regular file"), (fifo, "not a regular file"),
                      (huge, "more than the 1073741824")):
        r = subprocess.run([str(runner), "info", str(path), "--json"], capture_output=True, text=True, timeout=60)
        doc = json.loads(r.stdout)
        assert r.returncode == 1 and doc["kind"] == "edgekit.error" and why in doc["error"], (path, r.stdout, r.stderr)


# -- a corrupt .ekm on the device: the agent reports the loader's own reason ----------------------


def test_agent_reports_the_loaders_reason_for_a_corrupt_model(tmp_path):
    from edgekit.agent import AgentFailure
    from edgekit.agent.runner import bench
    from edgekit.bundle import TensorSpec, Variant, write_bundle
    from edgekit.fsutil import sha256_file
    from edgekit.targets.native.build import BuildError, build_runner

    try:
        runner = build_runner()
    except BuildError as exc:
        pytest.skip(str(exc))
    b = every_op_model(size=8, channels=4)
    blob = bytearray(b.finish())
    blob[-1] ^= 0xFF  # inside the checksummed contents
    model = tmp_path / "model.ekm"
    model.write_bytes(bytes(blob))
    (name, shape), = _ekrt.Model(b.finish()).inputs
    variant = Variant("int8", "native", "int8", "int8/model.ekm", (TensorSpec(name, shape, "float32"),),
                      (TensorSpec("y", (1,), "float32"),), {"runner": "bin/ekrt"})
    bundle = write_bundle(tmp_path / "bundle", files={"int8/model.ekm": model, "bin/ekrt": runner}, model_name="m",
                          model_sha256=sha256_file(model), profile="local", backend="native", precision="int8",
                          variants=[variant], plan={})
    with pytest.raises(AgentFailure) as info:
        bench(str(bundle.root), "int8", warmup=0, iterations=1)
    assert "checksum" in info.value.message and "corrupt file" in info.value.message, info.value.message
    assert "exit code" not in info.value.message
