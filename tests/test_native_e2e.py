"""ekrt end to end: the runner built from the packaged C sources, on this machine and cross-built
for aarch64 under qemu-user (Cortex-A72: the NEON path, Cortex-A76: the dot-product path),
bit for bit against the numpy reference; and `edgekit deploy` choosing native, locally and on
an emulated Raspberry Pi 5 over SSH (tests/lab/armboard.py).

Needs a C compiler (cc, or the ziglang package); the aarch64 parts need aarch64-linux-gnu-gcc
or ziglang and qemu-user-static; the board needs root. Where these are missing the tests skip
and say why. Emulated timing means nothing: only correctness and dispatch are asserted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest

from edgekit.targets.native import build, ekm, ekm_reference, sources
from edgekit.targets.native.lower import lower
from tests.conftest import EXAMPLES
from tests.lab.fixtures import emulated_boards
from tests.test_native_lower import quantize_native, random_feeds, resnet_shaped

DIGITS = EXAMPLES / "digits" / "digits_cnn.onnx"
MNV2 = EXAMPLES / "mobilenetv2" / "mobilenetv2.onnx"
QEMU = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
AARCH64_ISA = {"cortex-a72": "neon", "cortex-a76": "neondot"}


def _runner(arch: str, cache: Path) -> Path:
    """Build (once per session, in ``cache``) the runner for ``arch``, or skip saying why."""
    reason = build.why_not_buildable(arch)
    if reason:
        pytest.skip(reason)
    old = os.environ.get("EDGEKIT_CACHE_DIR")
    os.environ["EDGEKIT_CACHE_DIR"] = str(cache)
    try:
        return build.build_runner(arch)
    finally:
        if old is not None:
            os.environ["EDGEKIT_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def runner_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ekrt-runner-cache")


@pytest.fixture(scope="session")
def host_runner(runner_cache) -> Path:
    return _runner(build.host_arch(), runner_cache)


@pytest.fixture(scope="session")
def arm_runner(runner_cache) -> Path:
    if QEMU is None:
        pytest.skip("qemu-user-static is not installed (apt-get install qemu-user-static)")
    return _runner("aarch64", runner_cache)


@pytest.fixture
def shared_runner_cache(runner_cache, host_runner, edgekit_home):
    """This test's EDGEKIT_CACHE_DIR starts with the session's runners (same content hash: the
    deploy finds them instead of compiling again); none when the host's came with the package."""
    if (runner_cache / "ekrt-runner").is_dir():
        shutil.copytree(runner_cache / "ekrt-runner", edgekit_home / "cache" / "ekrt-runner", dirs_exist_ok=True)


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, tuple[Path, list[dict]]]:
    """.ekm files of digits, MobileNetV2 and the ResNet-shaped model, with a few held-out inputs."""
    out = tmp_path_factory.mktemp("ekm")
    resnet = out / "resnet_shaped.onnx"
    onnx.save(resnet_shaped(), resnet)
    found = {}
    for name, path, calib, held in (
        ("digits", DIGITS, None, None),
        ("mobilenetv2", MNV2, None, None),
        ("resnet_shaped", resnet, random_feeds(16, 1), random_feeds(4, 2)),
    ):
        qdq, heldout = quantize_native(path, calib, held)
        m, _ = lower(qdq)
        ekm.save(m, out / f"{name}.ekm")
        found[name] = (out / f"{name}.ekm", heldout.feeds[:3])
    return found


def _run_ekrt(argv: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, (argv, proc.returncode, proc.stderr)
    return proc


def _outputs_equal_reference(prefix: list[str], model: Path, feeds: list[dict], tmp: Path, env: dict | None = None) -> int:
    """Run ``ekrt run`` on each feed and compare every output with the reference, bit for bit."""
    m = ekm.load(model)
    checked = 0
    for k, feed in enumerate(feeds):
        files = []
        for j, (_, name) in enumerate(m.inputs):
            files.append(tmp / f"in{k}_{j}.npy")
            np.save(files[-1], feed[name].astype(np.float32))
        out = tmp / f"out{k}"
        out.mkdir()
        _run_ekrt([*prefix, "run", str(model), "--inputs", *map(str, files), "--save", str(out)], env)
        want = ekm_reference.run(m, feed)
        for i, (_, name) in enumerate(m.outputs):
            got = np.load(out / f"output{i}.npy")
            assert np.array_equal(got, want[name]), (model.name, name, np.abs(got - want[name]).max())
            checked += 1
    return checked


# -- the runner on this machine --------------------------------------------------------------------


def _host_isas(runner: Path) -> list[str]:
    info = json.loads(_run_ekrt([str(runner), "info", "--json"]).stdout)
    return [isa for isa in info["built_isas"] if isa == "scalar" or sources.ISA_FEATURE[isa] in info["features"]]


@pytest.mark.parametrize("name", ["digits", "mobilenetv2", "resnet_shaped"])
def test_host_runner_equals_the_reference_on_every_isa(host_runner, models, name, tmp_path):
    model, feeds = models[name]
    isas = _host_isas(host_runner)
    assert "scalar" in isas and len(isas) >= 2  # the reference path and at least one SIMD path
    for isa in isas:
        info = json.loads(_run_ekrt([str(host_runner), "info", "--json"], env={"EKRT_ISA": isa}).stdout)
        # the pinned ISA is the level of a kernel that runs (avx512vbmi has only x8-lut's: the
        # GEMM, and so info["isa"], stay avx512vnni's)
        assert isa in {fn.split("__", 1)[1].split("_")[0] for fn in info["kernels"].values()}, info["kernels"]
        assert info["isa"] == isa or (isa == "avx512vbmi" and info["isa"] == "avx512vnni"), info["isa"]
        d = tmp_path / isa
        d.mkdir()
        assert _outputs_equal_reference([str(host_runner)], model, feeds, d, env={"EKRT_ISA": isa}) == len(feeds)


def test_runner_is_static_and_small(host_runner):
    out = subprocess.run(["file", str(host_runner)], capture_output=True, text=True).stdout if shutil.which("file") else "statically"
    assert "statically" in out or "static-pie" in out
    assert host_runner.stat().st_size < 1_500_000


def test_runner_build_is_cached_by_content(host_runner, runner_cache, monkeypatch):
    monkeypatch.setenv("EDGEKIT_CACHE_DIR", str(runner_cache))
    before = host_runner.stat().st_mtime_ns
    assert build.build_runner(build.host_arch()) == host_runner
    assert host_runner.stat().st_mtime_ns == before  # found, not rebuilt


def test_no_compiler_for_an_arch_says_what_to_install():
    reason = build.why_not_buildable("riscv64")
    assert reason and "riscv64" in reason
    with pytest.raises(build.BuildError, match="cannot build the ekrt runner"):
        build.build_runner("riscv64")


# -- aarch64 under qemu-user -------------------------------------------------------------------


@pytest.mark.parametrize("cpu", ["cortex-a72", "cortex-a76"])
def test_cross_built_runner_takes_the_cpus_path_under_qemu(arm_runner, cpu, monkeypatch):
    monkeypatch.delenv("EKRT_ISA", raising=False)  # an ISA pinned for the suite (scalar, avx2) would cap this CPU's
    info = json.loads(_run_ekrt([QEMU, "-cpu", cpu, str(arm_runner), "info", "--json"]).stdout)
    assert info["arch"] == "aarch64"
    assert info["isa"] == AARCH64_ISA[cpu]
    assert set(info["built_isas"]) >= {"scalar", "neon", "neondot"}
    gemm = info["kernels"]["qs8-gemm"]
    assert gemm.endswith("__" + AARCH64_ISA[cpu])


@pytest.mark.parametrize("cpu", ["cortex-a72", "cortex-a76"])
@pytest.mark.parametrize("name", ["digits", "resnet_shaped", "mobilenetv2"])
def test_cross_built_runner_equals_the_reference_under_qemu(arm_runner, models, cpu, name, tmp_path, monkeypatch):
    monkeypatch.delenv("EKRT_ISA", raising=False)  # an x86 ISA pinned for the suite would cap the emulated CPU's
    model, feeds = models[name]
    assert _outputs_equal_reference([QEMU, "-cpu", cpu, str(arm_runner)], model, feeds[:2], tmp_path) == 2
    # edgekit's weights are never -128, so on the A72 the GEMMs take the SMLAL kernel (exact only
    # then, tests/test_kernels.py), except where k < 16 (its k group) keeps 2x8c8; the A76's
    # dot-product kernel is better still
    doc = json.loads(_run_ekrt([QEMU, "-cpu", cpu, str(arm_runner), "bench", str(model), "--json", "--profile",
                                "--iterations", "1", "--warmup", "0"]).stdout)
    gemms = {x["kernel"] for x in doc["layers"] if "gemm" in x.get("kernel", "")}
    dw = {x["kernel"] for x in doc["layers"] if "dwconv" in x.get("kernel", "")}
    assert dw <= {"ek_qs8_dwconv_ukernel_c16__neon_mlal"}, dw  # the depthwise taps pair up too, on both CPUs
    if cpu == "cortex-a72":
        assert "ek_qs8_gemm_ukernel_2x8c16__neon_mlal" in gemms and gemms <= {"ek_qs8_gemm_ukernel_2x8c16__neon_mlal", "ek_qs8_gemm_ukernel_2x8c8__neon"}, gemms
    else:
        assert gemms == {"ek_qs8_gemm_ukernel_4x16c4__neondot"}, gemms
    # and the scalar reference path the dispatch falls back to
    d = tmp_path / "scalar"
    d.mkdir()
    assert _outputs_equal_reference([QEMU, "-cpu", cpu, str(arm_runner)], model, feeds[:1], d, env={"EKRT_ISA": "scalar"}) == 1


def test_aarch64_runner_is_under_500_kb_with_zig(runner_cache):
    zig = [c for c in build.find_compilers("aarch64") if c.kind == "zig"]
    if not zig:
        pytest.skip("the ziglang package is not installed (pip install ziglang)")
    old = os.environ["EDGEKIT_CACHE_DIR"]
    os.environ["EDGEKIT_CACHE_DIR"] = str(runner_cache)
    try:
        runner = build.build_runner("aarch64", compiler=zig[0])
    finally:
        os.environ["EDGEKIT_CACHE_DIR"] = old
    assert runner.stat().st_size <= 500 * 1024
    assert "neondot" in (runner.parent / "build.txt").read_text()


# -- edgekit deploy ----------------------------------------------------------------------------


def test_deploy_digits_on_local_chooses_native_and_reports_latency_and_agreement(cli, tmp_path, shared_runner_cache, host_runner):
    r = cli("deploy", DIGITS, "--target", "local", "--json", "--iterations", "30", "-o", tmp_path / "b")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["backend"], doc["precision"]) == ("native", "int8")
    files = {f["path"] for f in doc["bundle"]["files"]}
    assert {"bin/ekrt", "int8/model.ekm", "fp32/model.onnx"} <= files and "int8/model.onnx" not in files
    v = doc["summary"]["variants"]
    assert v["int8"]["backend"] == "native" and v["fp32"]["backend"] == "onnxruntime"
    assert v["int8"]["p50_ms"] > 0 and v["fp32"]["p50_ms"] > 0 and "speedup_p50" in doc["summary"]
    assert doc["summary"]["agreement"]["outputs"][0]["top1"] >= 0.99
    assert v["int8"]["accuracy"] >= 0.98
    run = next(r for r in doc["runs"] if r["variant"] == "int8")
    assert (tmp_path / "b" / "bin" / "ekrt").read_bytes() == host_runner.read_bytes()
    info = json.loads(_run_ekrt([str(host_runner), "info", "--json"]).stdout)
    assert run["backend_info"]["isa"] == info["isa"] and run["backend_info"]["runner"] == "bin/ekrt"
    # ekrt's per-op times carry the ONNX node names (from int8/layers.json), so they join with the
    # quantizer's per-node error stored on the same record
    shown = json.loads(cli("results", "show", str(run["id"]), "--json").stdout)
    timed = {layer["name"]: layer["op"] for layer in shown["agent"]["layers"]}
    assert {"conv1": "CONV2D", "conv2": "CONV2D", "conv3": "CONV2D", "fc": "FULLY_CONNECTED"}.items() <= timed.items()
    assert {u["name"] for u in shown["quantization"]["layers"]} >= {"conv1", "conv2", "conv3", "fc"}
    ops = [layer["op"] for layer in run["layers"]]
    assert ops == ["QUANTIZE", "CONV2D", "CONV2D", "MAXPOOL", "CONV2D", "RESHAPE", "FULLY_CONNECTED", "DEQUANTIZE"]
    assert all(layer["ns"] >= 0 for layer in run["layers"])
    # the runner's own peak memory, not the Python agent's
    assert 0 < v["int8"]["peak_rss_bytes"] < v["fp32"]["peak_rss_bytes"]


def test_deploy_without_quantization_skips_native(cli, tmp_path):
    r = cli("deploy", DIGITS, "--target", "local", "--no-quantize", "--no-bench", "--json", "-o", tmp_path / "b")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["backend"] == "onnxruntime" and doc["precision"] == "fp32"
    skipped = {s["backend"]: s["reason"] for s in doc["plan"]["skipped_backends"]}
    assert "int8 only" in skipped["native"]


# -- an emulated Raspberry Pi over SSH (tests/lab/armboard.py) ----------------------------------


@pytest.fixture(scope="module")
def a76_board():
    with emulated_boards(("ci-ekrt5", "cortex-a76", 21)) as boards:
        yield boards["ci-ekrt5"]


@pytest.mark.slow
def test_deploy_digits_to_an_emulated_rpi5_runs_ekrt_on_the_dot_product_path(a76_board, arm_runner, runner_cache, cli, tmp_path, edgekit_home):
    shutil.copytree(runner_cache / "ekrt-runner", edgekit_home / "cache" / "ekrt-runner", dirs_exist_ok=True)
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(a76_board.ssh_config("pi5-lab"))
    # The default thread count (every core): this deploy once hung for 600 s under qemu, 1 run in 8
    # when repeated. Both ekrt threads sat in futex waits: the last worker out read `caller_asleep`
    # before the caller's store of it became visible (qemu-user does not give aarch64's STLR/LDAR
    # pair its store-load order on an x86 host), so nobody woke the caller. The pool now decides
    # that under its mutex, and the caller's wait is bounded (csrc/src/pool.c): 12 of 12 since.
    r = cli("deploy", DIGITS, "--target", "rpi5", "--device", "pi5-lab", "--warmup", "1", "--iterations", "5",
            "--json", "-o", tmp_path / "b", env={"HOME": str(home)}, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["backend"], doc["precision"], doc["plan"]["probed"]) == ("native", "int8", True)
    v = doc["summary"]["variants"]
    # the board has numpy and no ONNX Runtime: the fp32 reference runs on edgekit's numpy backend
    assert v["int8"]["backend"] == "native" and v["fp32"]["backend"] == "numpy"
    assert v["int8"]["p50_ms"] > 0
    run = next(r for r in doc["runs"] if r["variant"] == "int8")
    assert run["backend_info"]["isa"] == "neondot"
    assert run["backend_info"]["kernels"]["qs8-gemm"].endswith("__neondot")
    assert doc["summary"]["agreement"]["outputs"][0]["top1"] >= 0.99



# -- 7-bit weights on AVX2 (ekrt's VPMADDUBSW GEMM) -------------------------------------------------


@pytest.fixture(scope="session")
def mnv2_w7(tmp_path_factory) -> tuple[Path, list[dict], onnx.ModelProto]:
    """The MobileNetV2 example quantized with the scheme ekrt gets on an x86 CPU without VNNI."""
    import dataclasses

    from edgekit.profiles import load_profile
    from edgekit.profiles.model import CpuSpec
    from edgekit.targets.native import NativeBackend

    avx2 = CpuSpec("x86_64", "Intel Core (AVX2)", ("sse4_2", "avx2"), 4)
    scheme = NativeBackend().quant_scheme(dataclasses.replace(load_profile("linux-cpu"), cpu=avx2, probe=False))
    assert scheme.weight_qmax == 63 and scheme.depthwise_weight_qmax == 127, scheme
    qdq, held = quantize_native(MNV2, scheme=scheme)
    path = tmp_path_factory.mktemp("w7") / "mobilenetv2_w7.ekm"
    ekm.save(lower(qdq)[0], path)
    return path, held.feeds[:3], qdq


def test_the_avx2_scheme_narrows_gemm_weights_and_keeps_depthwise_ones_8_bit(mnv2_w7):
    from onnx import numpy_helper

    _, _, qdq = mnv2_w7
    consts = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    made = {o: n for n in qdq.graph.node for o in n.output}
    widest = {"depthwise": 0, "gemm": 0}
    for node in qdq.graph.node:
        if node.op_type not in ("Conv", "Gemm"):
            continue
        dq = made[node.input[1]]  # the weight's DequantizeLinear, reading the int8 initializer
        q = consts[dq.input[0]]
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        kind = "depthwise" if node.op_type == "Conv" and group > 1 and group == q.shape[0] and q.shape[1] == 1 else "gemm"
        widest[kind] = max(widest[kind], int(np.abs(q.astype(np.int32)).max()))
    assert widest == {"depthwise": 127, "gemm": 63}, widest


@pytest.mark.skipif(sources.normalize_arch(build.host_arch()) != "x86_64", reason="an x86 kernel")
def test_seven_bit_weights_run_the_avx2_w7_gemm_bit_exact(host_runner, mnv2_w7, models, tmp_path):
    """Under EKRT_ISA=avx2 every non-depthwise convolution of the 7-bit model runs the VPMADDUBSW
    kernel, bit for bit the reference; an 8-bit model never does (a weight of 127 would saturate
    it), and with VNNI the 7-bit model takes the VNNI kernel (better there)."""
    if "avx2" not in _host_isas(host_runner):
        pytest.skip("the CPU lacks avx2")

    def kernels(model: Path, isa: str) -> dict[str, int]:
        doc = json.loads(_run_ekrt([str(host_runner), "bench", str(model), "--json", "--profile", "--iterations", "3"],
                                   env={"EKRT_ISA": isa}).stdout)
        counts: dict[str, int] = {}
        for layer in doc["layers"]:
            if "kernel" in layer:
                counts[layer["kernel"]] = counts.get(layer["kernel"], 0) + 1
        # the record says which kernels ran, beside the CPU's per-family pick for any weights
        assert doc["backend_info"]["kernels_used"] == list(counts), (doc["backend_info"], counts)
        return counts

    path, feeds, _ = mnv2_w7
    seven = kernels(path, "avx2")
    assert set(seven) == {"ek_qs8_gemm_ukernel_4x16c4__avx2_w7", "ek_qs8_dwconv_ukernel_c16__avx2"}, seven
    assert _outputs_equal_reference([str(host_runner)], path, feeds, tmp_path, env={"EKRT_ISA": "avx2"}) == len(feeds)
    eight = kernels(models["mobilenetv2"][0], "avx2")
    assert "ek_qs8_gemm_ukernel_4x16c4__avx2_w7" not in eight and "ek_qs8_gemm_ukernel_4x16c2__avx2" in eight, eight
    if "avx512vnni" in _host_isas(host_runner):
        assert not any("avx2_w7" in k for k in kernels(path, "avx512vnni")), "VNNI's kernel is the better one there"
