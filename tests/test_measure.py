"""Disciplined measurement on the device side: auto warm-up, device state (clocks, heat,
throttling), energy, drift, and per-layer times in one format (agent and ekrt's runner).

This machine exposes no thermal zones, cpufreq, powercap or hwmon: the real runs assert the
fields are null here, and the sysfs readers are tested on fake trees (EDGEKIT_SYSFS_ROOT) holding
what the kernel writes there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from edgekit.agent import energy, facts, runner
from edgekit.agent.backends.onnxruntime import profile_layers
from edgekit.bench.record import make_record
from edgekit.bench.stats import drift
from edgekit.errors import AgentError
from tests.builders import bench_doc, tiny_bundle
from tests.conftest import EXAMPLES

DIGITS = EXAMPLES / "digits" / "digits_cnn.onnx"
NULL_STATE = {"governor": None, "temp_c": None, "freq_mhz": None, "freq_max_mhz": None, "thermal": None, "throttled": None}


# -- auto warm-up: the stopping rule ------------------------------------------------------------


def auto_warmup_count(latencies_ns: list) -> int:
    """How many of these latencies (execution order; elapsed time is their sum) auto warm-up runs."""
    elapsed = 0
    for i, ns in enumerate(latencies_ns, 1):
        elapsed += ns
        if runner.warmup_done(latencies_ns[:i], elapsed):
            return i
    return len(latencies_ns)


def test_auto_warmup_stops_once_stable():
    # three cold runs, then steady within 1 %: at 11 runs the window before holds only two cold
    # ones, and its median is already steady
    cold = [900_000, 400_000, 200_000]
    steady = [100_000, 101_000, 99_500, 100_500, 100_000] * 10
    assert auto_warmup_count(cold + steady) == 11
    assert auto_warmup_count(steady) == 10  # two windows of 5 are needed to compare
    assert not runner.warmup_done(steady[:4], 10**12)  # never fewer than 5, even past the time cap


def test_auto_warmup_hits_the_run_cap_on_a_drifting_session():
    drifting = [int(1_000_000 * 0.98**i) + 1000 for i in range(400)]  # 2 % faster every run, 1 ms
    assert auto_warmup_count(drifting) == runner.AUTO_MAX_RUNS


def test_auto_warmup_hits_the_time_cap_on_a_slow_drifting_session():
    slow = [int(300e6 * 1.1**i) for i in range(100)]  # 300 ms and growing: 2 s pass after 6 runs
    count = auto_warmup_count(slow)
    assert sum(slow[: count - 1]) < runner.AUTO_MAX_NS <= sum(slow[:count]) and count == 6
    assert auto_warmup_count([5 * 10**9] * 20) == runner.AUTO_MIN  # slower than the cap: 5 runs


def test_warmup_median_is_robust_to_one_outlier():
    samples = [100] * 9 + [10_000]  # one hiccup in the last window does not restart the wait
    assert runner.warmup_done(samples, 0)


# -- device state from sysfs --------------------------------------------------------------------


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _cpufreq(root: Path, governor: str, cur_khz: list[int], max_khz: int) -> None:
    for i, cur in enumerate(cur_khz):
        base = f"sys/devices/system/cpu/cpu{i}/cpufreq/"
        _write(root, base + "scaling_governor", governor + "\n")
        _write(root, base + "scaling_cur_freq", f"{cur}\n")
        _write(root, base + "scaling_max_freq", f"{max_khz}\n")
        _write(root, base + "cpuinfo_max_freq", f"{max_khz}\n")
    _write(root, "sys/devices/system/cpu/online", f"0-{len(cur_khz) - 1}\n")  # not a cpuN directory


@pytest.fixture
def fake_sys(tmp_path, monkeypatch):
    root = tmp_path / "root"
    root.mkdir()
    monkeypatch.setenv("EDGEKIT_SYSFS_ROOT", str(root))
    monkeypatch.setenv("PATH", str(tmp_path / "bin") + os.pathsep + os.environ["PATH"])  # no vcgencmd unless a test adds it
    return root


def test_device_state_is_null_on_this_container(monkeypatch):
    monkeypatch.delenv("EDGEKIT_SYSFS_ROOT", raising=False)
    if any(Path("/sys/class/thermal").glob("thermal_zone*")) or Path("/sys/devices/system/cpu/cpu0/cpufreq").exists():
        pytest.skip("this machine exposes thermal zones or cpufreq")
    assert facts.device_state() == NULL_STATE


def test_device_state_reads_a_fake_raspberry_pi_tree(fake_sys):
    _cpufreq(fake_sys, "ondemand", [600000, 1500000, 1500000, 600000], 1800000)
    _write(fake_sys, "sys/class/thermal/thermal_zone0/type", "cpu-thermal\n")
    _write(fake_sys, "sys/class/thermal/thermal_zone0/temp", "48312\n")
    _write(fake_sys, "sys/class/thermal/thermal_zone1/type", "cpu-thermal\n")  # two zones of one type
    _write(fake_sys, "sys/class/thermal/thermal_zone1/temp", "51000\n")
    _write(fake_sys, "sys/class/thermal/thermal_zone2/type", "acpitz\n")
    (fake_sys / "sys/class/thermal/thermal_zone2/temp").mkdir(parents=True)  # unreadable: left out
    _write(fake_sys, "sys/class/thermal/cooling_device0/type", "Processor\n")
    state = facts.device_state()
    assert state["governor"] == "ondemand" and state["temp_c"] == 48.3
    assert state["freq_mhz"] == {"cpu0": 600.0, "cpu1": 1500.0, "cpu2": 1500.0, "cpu3": 600.0}
    assert state["freq_max_mhz"] == {f"cpu{i}": 1800.0 for i in range(4)}
    assert state["thermal"] == {"cpu-thermal": 48.3, "cpu-thermal (thermal_zone1)": 51.0}
    assert state["throttled"] is None  # ondemand scales by load: below max says nothing


def test_performance_governor_below_max_is_frequency_capped(fake_sys):
    _cpufreq(fake_sys, "performance", [1200000, 1800000], 1800000)
    assert facts.device_state()["throttled"] == {
        "source": "cpufreq", "now": True, "ever": True, "detail": "frequency capped: cpu0 1200/1800 MHz"}  # fmt: skip
    _cpufreq(fake_sys, "performance", [1800000, 1800000], 1800000)
    assert facts.device_state()["throttled"]["now"] is False


def test_vcgencmd_get_throttled(fake_sys, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "vcgencmd"
    tool.write_text('#!/bin/sh\n[ "$1" = get_throttled ] || exit 1\necho "throttled=0x50005"\n')
    tool.chmod(0o755)
    throttled = facts.device_state()["throttled"]
    assert throttled == {
        "source": "vcgencmd", "now": True, "ever": True,
        "detail": "now: under-voltage, throttled; since boot: under-voltage, throttled",
    }  # fmt: skip
    assert facts.parse_throttled("throttled=0x80000") == {
        "source": "vcgencmd", "now": False, "ever": True, "detail": "now: none; since boot: soft temperature limit"}  # fmt: skip
    assert facts.parse_throttled("throttled=0x0")["now"] is False
    assert facts.parse_throttled("error=1 error_msg=\"Command not registered\"") is None


# -- energy ---------------------------------------------------------------------------------------


def _rapl(root: Path, uj: int, max_range: int = 262143328850) -> None:
    base = "sys/class/powercap/intel-rapl:0/"
    _write(root, base + "name", "package-0\n")
    _write(root, base + "energy_uj", f"{uj}\n")
    _write(root, base + "max_energy_range_uj", f"{max_range}\n")
    _write(root, "sys/class/powercap/intel-rapl:0:0/name", "core\n")  # a subdomain: inside the package
    _write(root, "sys/class/powercap/intel-rapl:0:0/energy_uj", "5\n")


def test_no_energy_source_starts_no_thread(fake_sys):
    before = threading_names()
    assert energy.open_meter() is None
    assert threading_names() == before


def threading_names() -> list[str]:
    import threading

    return sorted(t.name for t in threading.enumerate())


def test_rapl_counter_across_a_wrap(fake_sys):
    top = 262143328850
    _rapl(fake_sys, top - 1_000_000, top)
    meter = energy.open_meter()
    assert meter.source == "rapl" and meter.kind == "counter"
    path = fake_sys / "sys/class/powercap/intel-rapl:0/energy_uj"
    for value in (top - 1_000_000, top - 200_000, 300_000, 2_300_000):  # wraps between 2nd and 3rd
        path.write_text(f"{value}\n")
        meter.sample()
        time.sleep(0.001)  # distinct timestamps
    start, end = meter.samples[0][0], meter.samples[-1][0]
    assert meter.joules(start, end) == pytest.approx(3.3)  # 1.0 J to the wrap, 2.3 J after
    mid = meter.samples[1][0]
    assert meter.joules(start, mid) == pytest.approx(0.8)
    assert meter.joules(start - 1, end) is None  # outside what was sampled
    assert energy.unwrap([(0, (10,)), (1, (2,))], [12]) == [10.0, 14.0]


def test_rapl_root_only_counter_is_absent(fake_sys):
    _rapl(fake_sys, 1000)
    counter = fake_sys / "sys/class/powercap/intel-rapl:0/energy_uj"
    counter.unlink()
    counter.mkdir()  # reading fails as it does for a root-only file (root could read that one)
    assert energy.open_meter() is None


def test_hwmon_power_is_sampled_in_a_thread_and_integrated(fake_sys):
    _write(fake_sys, "sys/class/hwmon/hwmon0/name", "acpitz\n")
    _write(fake_sys, "sys/class/hwmon/hwmon0/temp1_input", "45000\n")
    _write(fake_sys, "sys/class/hwmon/hwmon3/name", "amdgpu\n")
    _write(fake_sys, "sys/class/hwmon/hwmon3/power1_input", "5000000\n")  # 5 W in µW
    meter = energy.open_meter()
    assert meter.source == "hwmon"
    meter.start()
    deadline = time.monotonic() + 10
    while len(meter.samples) < 6 and time.monotonic() < deadline:  # the thread samples by itself
        time.sleep(0.005)
    meter.stop()
    assert len(meter.samples) >= 7
    start, end = meter.samples[0][0], meter.samples[-1][0]
    assert meter.joules(start, end) == pytest.approx(5.0 * (end - start) / 1e9)
    rec = energy.energy_record(meter, start, end, 100)
    assert rec["source"] == "hwmon" and rec["mj_per_inference"] == pytest.approx(rec["joules"] * 10, rel=1e-4)
    assert energy.integrate_power([(0, 2e6), (10**9, 4e6)], 0, 10**9) == pytest.approx(3e6)  # 3 J in µJ


def test_jetson_ina3221_board_rail(fake_sys):
    base = "sys/class/hwmon/hwmon1/"
    _write(fake_sys, base + "name", "ina3221\n")
    for ch, label, mv, ma in ((1, "VDD_IN", 5072, 1232), (2, "VDD_CPU_GPU_CV", 5064, 400), (3, "VDD_SOC", 5072, 320)):
        _write(fake_sys, base + f"in{ch}_label", label + "\n")
        _write(fake_sys, base + f"in{ch}_input", f"{mv}\n")
        _write(fake_sys, base + f"curr{ch}_input", f"{ma}\n")
    meter = energy.open_meter()
    assert meter.source == "jetson-ina3221" and meter._read() == 5072 * 1232  # VDD_IN only, in µW


# -- drift ------------------------------------------------------------------------------------------


def test_drift_from_the_first_to_the_last_tenth():
    samples = [1_000_000] * 50 + [1_120_000] * 50
    d = drift(samples)
    assert d.n == 10 and d.first_p50 == 1.0 and d.last_p50 == 1.12 and d.change_pct == pytest.approx(12.0)
    assert drift([1_000_000] * 49) is None  # a tenth of fewer than 5 samples


# -- per-layer times in one format ------------------------------------------------------------------


def test_common_layers_format():
    got = runner.common_layers([{"name": "conv", "op": "Conv", "ns": 12.6, "exec_type": "jit_avx2"},
                                {"name": "fc", "op": "Gemm", "ns": 3, "ns_p25": 2.4, "ns_p75": 9, "calls": 20}])  # fmt: skip
    assert got == [{"name": "conv", "op": "Conv", "ns": 13, "ns_p25": None, "ns_p75": None, "calls": None, "exec_type": "jit_avx2"},
                   {"name": "fc", "op": "Gemm", "ns": 3, "ns_p25": 2, "ns_p75": 9, "calls": 20}]  # fmt: skip
    assert runner.common_layers(None) is None and runner.common_layers([]) is None


def test_ort_profile_events_skip_warmup_runs():
    def run(ts):
        return [{"cat": "Session", "name": "model_run", "ts": ts, "dur": 100},
                {"cat": "Node", "name": "c_kernel_time", "ts": ts + 1, "dur": 40 if ts else 900, "args": {"op_name": "Conv"}},
                {"cat": "Node", "name": "c_fence_before", "ts": ts + 1, "dur": 0, "args": {"op_name": "Conv"}},
                {"cat": "Node", "name": "r_kernel_time", "ts": ts + 50, "dur": 10, "args": {"op_name": "Relu"}}]  # fmt: skip

    events = run(0) + run(1000) + run(2000)
    assert profile_layers(events, skip_runs=1) == [
        {"name": "c", "op": "Conv", "ns": 40_000, "ns_p25": 40_000, "ns_p75": 40_000, "calls": 2},
        {"name": "r", "op": "Relu", "ns": 10_000, "ns_p25": 10_000, "ns_p75": 10_000, "calls": 2}]  # fmt: skip
    # one profiled run stalled by another process (the kernel took 20x): the median ignores it
    stalled = run(3000)
    stalled[1]["dur"] = 800
    got = profile_layers(events + run(2500) + stalled, skip_runs=1)[0]
    assert {k: got[k] for k in ("ns", "calls", "ns_p25")} == {"ns": 40_000, "calls": 4, "ns_p25": 40_000}
    assert got["ns_p75"] > 40_000  # the stalled run shows as spread, not as the layer's time


def _digits_bundle(tmp_path: Path):
    import onnx

    from edgekit.bundle import TensorSpec, Variant, write_bundle
    from edgekit.fsutil import sha256_file

    graph = onnx.load(str(DIGITS)).graph
    out = graph.output[0]
    shape = tuple(d.dim_value or -1 for d in out.type.tensor_type.shape.dim)
    variant = Variant("fp32", "onnxruntime", "fp32", "fp32/digits.onnx", (TensorSpec(graph.input[0].name, (1, 1, 8, 8), "float32"),),
                      (TensorSpec(out.name, shape, "float32"),), {})  # fmt: skip
    return write_bundle(tmp_path / "digits", files={"fp32/digits.onnx": DIGITS}, model_name="digits", model_sha256=sha256_file(DIGITS),
                        profile="local", backend="onnxruntime", precision="fp32", variants=[variant], plan={})  # fmt: skip


def test_ort_profile_layers_on_digits(tmp_path):
    bundle = _digits_bundle(tmp_path)
    doc = runner.bench(str(bundle.root), "fp32", warmup=2, iterations=5, profile=True)
    layers = doc["layers"]
    assert layers and all(set(x) == {"name", "op", "ns", "ns_p25", "ns_p75", "calls"} for x in layers)
    assert all(x["ns_p25"] <= x["ns"] <= x["ns_p75"] for x in layers)  # the median between its quartiles
    assert {"Conv", "Gemm"} <= {x["op"] for x in layers} and all(x["calls"] == 20 for x in layers)
    assert sum(x["ns"] for x in layers) > 0
    assert runner.bench(str(bundle.root), "fp32", warmup=0, iterations=2)["layers"] is None  # not asked


# -- the agent's command line, on this machine ------------------------------------------------------


def test_agent_bench_reports_the_new_fields(tmp_path, monkeypatch):
    monkeypatch.delenv("EDGEKIT_SYSFS_ROOT", raising=False)
    bundle = tiny_bundle(tmp_path / "bundle")
    proc = subprocess.run([sys.executable, "-m", "edgekit.agent", "bench", str(bundle.root), "--variant", "fp32", "--iterations", "20", "--profile"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    config = doc["config"]
    assert config["warmup_mode"] == "auto" and config["warmup"] == len(doc["warmup_samples_ns"]) >= runner.AUTO_MIN
    assert config["warmup"] <= runner.AUTO_MAX_RUNS
    assert all(type(s) is int and s > 0 for s in doc["warmup_samples_ns"])
    if facts.device_state() == NULL_STATE:
        assert doc["device_state"] == {"before": NULL_STATE, "after": NULL_STATE}
        assert doc["energy"] is None
    assert [x["op"] for x in doc["layers"]] == ["MatMul", "Relu"]
    record = make_record(doc, model_name="tiny", target="local", device="local")
    assert record["agent"]["config"]["warmup_mode"] == "auto" and record["stats"]["n"] == 20

    fixed = subprocess.run([sys.executable, "-m", "edgekit.agent", "bench", str(bundle.root), "--variant", "fp32", "--warmup", "3", "--iterations", "2"],
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    doc = json.loads(fixed.stdout)
    assert doc["config"]["warmup"] == 3 and doc["config"]["warmup_mode"] == "fixed" and len(doc["warmup_samples_ns"]) == 3
    assert doc["layers"] is None
    bad = subprocess.run([sys.executable, "-m", "edgekit.agent", "bench", str(bundle.root), "--variant", "fp32", "--warmup", "soon"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert bad.returncode == 1 and "'auto' or an integer" in json.loads(bad.stdout)["error"]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (("config", "warmup_mode"), "sometimes", "config.warmup_mode"),
        (("warmup_samples_ns",), [5, 0], "warmup_samples_ns"),
        (("energy",), {"source": "rapl", "joules": -1.0, "mj_per_inference": 1.0}, "energy"),
        (("layers",), [{"name": "c", "op": "Conv", "ns": 5, "calls": "many"}], "layers"),
        (("device_state",), {"before": {"thermal": {"cpu": "hot"}}, "after": None}, "device_state.before.thermal"),
        (("device_state",), {"before": {"throttled": {"now": 1, "ever": False}}}, "device_state.before.throttled"),
    ],
)
def test_record_rejects_malformed_measurement_fields(field, value, message):
    doc = bench_doc()
    target = doc
    for key in field[:-1]:
        target = target[key]
    target[field[-1]] = value
    with pytest.raises(AgentError, match=message.replace(".", r"\.")):
        make_record(doc, model_name="m", target="t", device="d")


def test_record_accepts_full_measurement_fields():
    state = {"governor": "performance", "temp_c": 48.3, "freq_mhz": {"cpu0": 1800.0}, "freq_max_mhz": {"cpu0": 1800.0},
             "thermal": {"cpu-thermal": 48.3}, "throttled": {"source": "vcgencmd", "now": False, "ever": True, "detail": "x"}}  # fmt: skip
    doc = bench_doc(warmup_samples_ns=[3, 2, 2], energy={"source": "rapl", "joules": 1.5, "mj_per_inference": 15.0},
                    layers=[{"name": "c", "op": "Conv", "ns": 5, "calls": None}], device_state={"before": state, "after": state})  # fmt: skip
    doc["config"].update(warmup=3, warmup_mode="auto")
    assert make_record(doc, model_name="m", target="t", device="d")["agent"]["energy"]["joules"] == 1.5


# -- ekrt's runner ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ekrt(tmp_path_factory):
    from edgekit.targets.native.build import build_runner, host_arch, why_not_buildable

    reason = why_not_buildable(host_arch())
    if reason:
        pytest.skip(reason)
    old = os.environ.get("EDGEKIT_CACHE_DIR")
    os.environ["EDGEKIT_CACHE_DIR"] = str(tmp_path_factory.mktemp("runner-cache"))
    try:
        return build_runner()
    finally:
        if old is None:
            del os.environ["EDGEKIT_CACHE_DIR"]
        else:
            os.environ["EDGEKIT_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def ekm_file(tmp_path_factory) -> Path:
    from tests.test_ekrt_core import every_op_model

    path = tmp_path_factory.mktemp("ekm") / "every_op.ekm"
    path.write_bytes(every_op_model().finish())
    return path


def _ekrt_bench(runner_path: Path, *args) -> dict:
    proc = subprocess.run([str(runner_path), "bench", *map(str, args), "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_ekrt_runner_auto_warmup(ekrt, ekm_file):
    doc = _ekrt_bench(ekrt, ekm_file, "--iterations", "15", "--warmup", "auto")
    warm = doc["warmup_samples_ns"]
    assert doc["config"]["warmup_mode"] == "auto" and doc["config"]["warmup"] == len(warm)
    # the runner stopped where the agent's rule stops on the same latencies (its own elapsed
    # time includes the clock reads, so it can only stop at or before the sum-based count)
    assert runner.AUTO_MIN <= len(warm) <= auto_warmup_count(warm) and runner.warmup_done(warm, sum(warm) * 2)
    a, b = doc["timed_window_ns"]
    assert b - a >= sum(doc["samples_ns"]) and doc["layers"] is None
    default = _ekrt_bench(ekrt, ekm_file, "--iterations", "3")
    assert default["config"]["warmup_mode"] == "auto"
    fixed = _ekrt_bench(ekrt, ekm_file, "--iterations", "3", "--warmup", "4", "--profile")
    assert fixed["config"]["warmup"] == 4 and fixed["config"]["warmup_mode"] == "fixed" and len(fixed["warmup_samples_ns"]) == 4
    assert fixed["layers"] and all(x["calls"] == 3 and x["ns"] >= 0 for x in fixed["layers"])  # a pass of min(20, runs)
    make_record(fixed, model_name="m", target="local", device="local")


def test_agent_runs_ekrt_with_auto_warmup_and_layers(ekrt, ekm_file, tmp_path):
    import shutil

    from edgekit.agent.backends import native

    workdir = tmp_path / "bundle"
    (workdir / "bin").mkdir(parents=True)
    shutil.copy(ekrt, workdir / "bin" / "ekrt")
    shutil.copy(ekm_file, workdir / "m.ekm")
    session = native.load(str(workdir / "m.ekm"), None, {}, str(workdir))
    inputs = [{"name": "x", "shape": [1, 3, 16, 16], "dtype": "float32"}]
    samples, layers, info = session.bench("auto", 6, None, inputs, profile=True)
    assert len(samples) == 6 and info["warmup_mode"] == "auto" and info["warmup"] == len(info["warmup_samples_ns"])
    assert len(info["timed_window_ns"]) == 2 and info["threads"] >= 1
    assert layers and all(x["calls"] == 6 for x in layers)
    assert session.bench(3, 2, None, inputs)[1] is None  # layers only when asked
    assert np.isfinite(info["timed_window_ns"][0])


# -- threads: one against all, probed on the device when nobody chose ----------------------------------


@pytest.mark.parametrize(("all_ms", "one_ms", "chosen"), [(6.0, 1.0, 1), (1.0, 6.0, 2), (1.0, 1.05, 1)])
def test_thread_probe_times_the_faster_count(tmp_path, monkeypatch, all_ms, one_ms, chosen):
    # A pool that stalls (all cores slower than one) is timed on one thread; all cores must win
    # by PROBE_MARGIN to be used (a 5 % edge is not enough).
    import types

    from edgekit.agent import backends

    loads = []

    class Session:
        version = "0"

        def __init__(self, threads):
            self.threads, self.info = threads, {"threads": threads or 2}

        def run(self, feeds):
            time.sleep((one_ms if self.threads == 1 else all_ms) / 1e3)

    fake = types.ModuleType("edgekit.agent.backends.fake")
    fake.PROBE_THREADS = True
    fake.load = lambda path, threads, options=None, workdir=None: loads.append(threads) or Session(threads)
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setitem(backends.BACKENDS, "fake", "fake")
    monkeypatch.setattr(runner.os, "cpu_count", lambda: 2)
    bundle = tiny_bundle(tmp_path / "bundle")
    manifest = json.loads((bundle.root / "manifest.json").read_text())
    manifest["variants"][0]["backend"] = "fake"
    (bundle.root / "manifest.json").write_text(json.dumps(manifest))
    doc = runner.bench(str(bundle.root), "fp32", warmup=1, iterations=5)
    probe = doc["threads_probe"]
    assert loads == [None, 1] and probe["chosen"] == chosen and doc["config"]["threads"] == chosen
    assert probe["runs"] >= runner.PROBE_RUNS
    if max(all_ms, one_ms) >= 2 * min(all_ms, one_ms):  # the timed session is the faster one
        assert (probe["all_p50_ns"] > probe["one_p50_ns"]) == (all_ms > one_ms)
        assert runner._median(doc["samples_ns"]) / 1e6 < (all_ms + one_ms) / 2
    assert runner.bench(str(bundle.root), "fp32", warmup=0, iterations=2, threads=2)["threads_probe"] is None  # asked: no probe
    loads.clear()
    unprobed = runner.bench(str(bundle.root), "fp32", warmup=0, iterations=2, probe_threads=False)  # a later round of --rounds
    assert unprobed["threads_probe"] is None and loads == [None]  # the runtime's default, one load
    monkeypatch.setattr(runner.os, "cpu_count", lambda: 1)
    assert runner.bench(str(bundle.root), "fp32", warmup=0, iterations=2)["threads_probe"] is None  # one core: nothing to probe


def test_measurement_warnings_say_when_all_threads_lost():
    from edgekit.bench.record import measurement_warnings

    doc = bench_doc(samples=[1_000_000] * 100)
    doc["threads_probe"] = {"all_threads": 4, "all_p50_ns": 8_270_000, "one_p50_ns": 440_000, "runs": 12, "chosen": 1}
    assert measurement_warnings(doc) == ["threads: all 4 were slower than one here (8270 vs 440 us p50 in a 12-run probe each): timed with 1 thread"]
    doc["threads_probe"] = {"all_threads": 4, "all_p50_ns": 400_000, "one_p50_ns": 440_000, "runs": 12, "chosen": 1}
    assert measurement_warnings(doc) == []  # all a little faster, not by the margin: one thread, nothing wrong
    doc["threads_probe"] = {"all_threads": 4, "all_p50_ns": 460_000, "one_p50_ns": 440_000, "runs": 12, "chosen": 1}
    assert measurement_warnings(doc) == []  # a little slower: within the probe's noise


# -- host side: the CLI's --warmup and the warnings a run's numbers deserve --------------------------


def test_measurement_warnings_name_drift_heat_and_throttling():
    from edgekit.bench.record import measurement_warnings

    doc = bench_doc(samples=[1_000_000] * 50 + [1_120_000] * 50)
    doc["device_state"]["before"]["temp_c"], doc["device_state"]["after"]["temp_c"] = 48.0, 71.0
    assert measurement_warnings(doc) == ["drift: p50 +12% from the first to the last tenth of the run (temperature 48 -> 71 C)"]
    doc["device_state"]["after"]["throttled"] = facts.parse_throttled("throttled=0x20002")
    assert measurement_warnings(doc)[1] == "throttled (vcgencmd): now: arm frequency capped; since boot: arm frequency capped"
    assert measurement_warnings(bench_doc(samples=[1_000_000] * 50 + [1_030_000] * 50)) == []  # under 5 %: quiet


def test_layers_can_be_turned_off(cli, tmp_path):
    from edgekit.modelio import load_model
    from edgekit.plan import make_plan
    from edgekit.profiles import load_profile

    benches = [s for s in make_plan(load_model(DIGITS), load_profile("rpi5"), layers=False).steps if s.name == "bench"]
    assert benches and all(not s.config.profile and "profiled pass" not in s.detail for s in benches)
    assert all(s.config.profile and "profiled pass" in s.detail for s in make_plan(load_model(DIGITS), load_profile("rpi5")).steps if s.name == "bench")
    result = cli("deploy", DIGITS, "--target", "local", "--iterations", "5", "--no-layers", "--json", "-o", tmp_path / "b")
    assert result.returncode == 0, result.stderr
    runs = json.loads(result.stdout)["runs"]
    assert len(runs) == 2 and all(r["layers"] is None for r in runs)


def test_cli_warmup_takes_auto_or_a_count(cli):
    from edgekit.modelio import load_model
    from edgekit.plan import make_plan
    from edgekit.profiles import load_profile

    def benches(**asks):
        return [s for s in make_plan(load_model(DIGITS), load_profile("rpi5"), **asks).steps if s.name == "bench"]

    assert benches() and all(s.config.warmup == "auto" and "auto warm-up" in s.detail for s in benches())
    assert all(s.config.warmup == 3 for s in benches(warmup=3))
    bad = cli("deploy", DIGITS, "--warmup", "soon")
    assert bad.returncode == 2 and "wants a count N >= 0 or 'auto'" in bad.stderr


# -- ONNX Runtime's timed step: pre-bound inputs and outputs ----------------------------------------


def test_ort_timed_step_computes_what_run_does_on_bound_buffers(tmp_path):
    from edgekit.agent.backends import onnxruntime as agent_ort

    session = agent_ort.load(str(DIGITS), 1, {}, str(tmp_path))
    rng = np.random.RandomState(3)
    a, b = (rng.standard_normal((1, 1, 8, 8)).astype(np.float32) for _ in range(2))
    want_a, want_b = session.run({"input": a})[0], session.run({"input": b})[0]
    assert not np.allclose(want_a, want_b)
    step, how = session.timed({"input": a})
    assert "run_with_iobinding" in how
    out = session._bound[1][0]  # the preallocated array ORT writes the output into
    out[:] = 0
    times = [step() for _ in range(20)]
    assert all(type(t) is int and t > 0 for t in times)
    np.testing.assert_allclose(out, want_a, rtol=1e-5, atol=1e-6)  # ran on a, into the bound output
    step, _ = session.timed({"input": b})  # binding again follows the new feeds
    step()
    np.testing.assert_allclose(session._bound[1][0], want_b, rtol=1e-5, atol=1e-6)
