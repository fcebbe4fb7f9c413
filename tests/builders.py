"""Builders of test inputs shared by the test modules: plain functions, no fixtures.

``cpuinfo(kind)``: /proc/cpuinfo texts of real machines (copied from the devices, serials
scrambled), the one table every cpuinfo test reads.
``tiny_onnx`` / ``onnx_model`` / ``Graph`` / ``tiny_bundle``: small real ONNX models and a bundle of one.
``bench_doc`` / ``bench_record``: an agent's bench document (schema 1) and the host's record of it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

_ARM_BLOCK = """\
processor\t: {n}
BogoMIPS\t: 108.00
Features\t: {features}
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x{variant}
CPU part\t: {part}
CPU revision\t: {rev}

"""

_A76_FEATURES = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp"


def arm_cpuinfo(features: str, parts: list[str], variant: str = "0", rev: str = "1", tail: str = "") -> str:
    """An arm64 kernel's /proc/cpuinfo: one block per core (``parts``: "CPU part" of each), then ``tail``."""
    blocks = [_ARM_BLOCK.format(n=i, features=features, part=p, variant=variant, rev=rev) for i, p in enumerate(parts)]
    return "".join(blocks) + tail


def _x86(model: str, flags: str) -> str:
    return f"processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel name\t: {model}\nflags\t\t: {flags}\n"


_CPUINFO = {
    # Raspberry Pi 4 (BCM2711, 4x Cortex-A72: NEON, no dot product), 64-bit OS
    "rpi4": lambda: arm_cpuinfo(
        "fp asimd evtstrm crc32 cpuid", ["0xd08"] * 4, rev="3",
        tail="Hardware\t: BCM2835\nRevision\t: c03114\nSerial\t\t: 100000002b3e1c4a\nModel\t\t: Raspberry Pi 4 Model B Rev 1.4\n",
    ),
    # the same board under a 32-bit Raspberry Pi OS: armv7 words, "neon" instead of "asimd"
    "rpi4-32bit": lambda: """\
processor\t: 0
model name\t: ARMv7 Processor rev 3 (v7l)
BogoMIPS\t: 108.00
Features\t: half thumb fastmult vfp edsp neon vfpv3 tls vfpv4 idiva idivt vfpd32 lpae evtstrm crc32
CPU implementer\t: 0x41
CPU architecture: 7
CPU variant\t: 0x0
CPU part\t: 0xd08
CPU revision\t: 3

Hardware\t: BCM2835
Model\t\t: Raspberry Pi 4 Model B Rev 1.4
""",
    # Raspberry Pi 5 (BCM2712, 4x Cortex-A76: asimddp, asimdhp)
    "rpi5": lambda: arm_cpuinfo(
        _A76_FEATURES, ["0xd0b"] * 4, variant="4",
        tail="Revision\t: d04170\nSerial\t\t: 3b4a1f0e2c9d8a71\nModel\t\t: Raspberry Pi 5 Model B Rev 1.0\n",
    ),
    # Jetson Orin Nano (6x Cortex-A78AE)
    "jetson-orin": lambda: arm_cpuinfo(_A76_FEATURES + " uscat ilrcpc flagm paca pacg", ["0xd42"] * 6),
    # Jetson Nano (4x Cortex-A57)
    "jetson-nano": lambda: arm_cpuinfo("fp asimd evtstrm aes pmull sha1 sha2 crc32 cpuid", ["0xd07"] * 4, variant="1", rev="1"),
    # RK3588 (4x Cortex-A55 + 4x Cortex-A76, big.LITTLE)
    "rk3588": lambda: arm_cpuinfo(_A76_FEATURES, ["0xd05"] * 4 + ["0xd0b"] * 4),
    # Xeon E5-2686 v4 (Broadwell): AVX2, no AVX-512
    "x86-avx2": lambda: _x86(
        "Intel(R) Xeon(R) CPU E5-2686 v4 @ 2.30GHz",
        "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht "
        "syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid aperfmperf "
        "tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer "
        "aes xsave avx f16c rdrand hypervisor lahf_lm abm 3dnowprefetch cpuid_fault invpcid_single pti fsgsbase "
        "bmi1 hle avx2 smep bmi2 erms invpcid rtm rdseed adx xsaveopt",
    ),
    # Xeon Platinum 8259CL (Cascade Lake): AVX-512 with VNNI
    "x86-avx512-vnni": lambda: _x86(
        "Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz",
        "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ss ht "
        "syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid aperfmperf "
        "tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer "
        "aes xsave avx f16c rdrand hypervisor lahf_lm abm 3dnowprefetch invpcid_single pti fsgsbase tsc_adjust "
        "bmi1 avx2 smep bmi2 erms invpcid mpx avx512f avx512dq rdseed adx smap clflushopt clwb avx512cd avx512bw "
        "avx512vl xsaveopt xsavec xgetbv1 xsaves ida arat pku ospke avx512_vnni",
    ),
    # Core Ultra 7 155H (Meteor Lake): AVX2 with AVX-VNNI, no AVX-512
    "x86-avx-vnni": lambda: _x86(
        "Intel(R) Core(TM) Ultra 7 155H",
        "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush dts acpi mmx fxsr sse sse2 "
        "ss ht tm pbe syscall nx pdpe1gb rdtscp lm constant_tsc art arch_perfmon pebs bts rep_good nopl xtopology "
        "nonstop_tsc cpuid aperfmperf tsc_known_freq pni pclmulqdq dtes64 monitor ds_cpl vmx smx est tm2 ssse3 sdbg "
        "fma cx16 xtpr pdcm sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand lahf_lm "
        "abm 3dnowprefetch cpuid_fault epb intel_ppin ssbd ibrs ibpb stibp ibrs_enhanced tpr_shadow flexpriority ept "
        "vpid ept_ad fsgsbase tsc_adjust bmi1 avx2 smep bmi2 erms invpcid rdt_a rdseed adx smap clflushopt clwb "
        "intel_pt sha_ni xsaveopt xsavec xgetbv1 xsaves split_lock_detect avx_vnni dtherm ida arat pln pts hwp "
        "hwp_notify hwp_act_window hwp_epp hwp_pkg_req hfi vnmi umip pku ospke waitpkg gfni vaes vpclmulqdq rdpid "
        "bus_lock_detect movdiri movdir64b fsrm md_clear serialize arch_lbr ibt flush_l1d arch_capabilities",
    ),
}

CPUINFO_KINDS = tuple(_CPUINFO)


def cpuinfo(kind: str) -> str:
    """/proc/cpuinfo of a real machine of ``kind`` (one of ``CPUINFO_KINDS``)."""
    return _CPUINFO[kind]()


# -- ONNX models and bundles ------------------------------------------------------------------


def onnx_model(nodes, inputs, outputs, inits=(), opset: int = 17, ir_version: int | None = 8) -> onnx.ModelProto:
    """A model of one graph ``g``; ``ir_version=None`` keeps what onnx writes by default."""
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                              opset_imports=[helper.make_opsetid("", opset)])
    if ir_version is not None:
        model.ir_version = ir_version
    return model


def float_io(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


class Graph:
    """An ONNX graph written node by node: ``const`` adds an initializer, ``node`` a node named
    after its (first) output; both return the name(s) to wire into the next node."""

    def __init__(self) -> None:
        self.inits: list[onnx.TensorProto] = []
        self.nodes: list[onnx.NodeProto] = []

    def const(self, name: str, arr, dtype=np.float32) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(arr, dtype), name))
        return name

    def node(self, op: str, ins: list[str], name: str, outs: list[str] | None = None, **attrs):
        self.nodes.append(helper.make_node(op, ins, outs or [name], name=name, **attrs))
        return outs or name

    def model(self, inputs, outputs) -> onnx.ModelProto:
        """The checked model of what was written."""
        model = onnx_model(self.nodes, inputs, outputs, self.inits)
        onnx.checker.check_model(model)
        return model


def tiny_onnx(path: Path) -> Path:
    """y = relu(x @ W): a real, tiny ONNX model with a dynamic batch dimension ([N, 16] -> [N, 8])."""
    w = numpy_helper.from_array(np.random.RandomState(1).randn(16, 8).astype(np.float32), "W")
    model = onnx_model(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        [float_io("x", ["N", 16])], [float_io("y", ["N", 8])], [w],
    )
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def tiny_bundle(out: Path, *, backend: str = "onnxruntime", precision: str = "fp32", inputs: Path | None = None,
                options: dict | None = None, profile: str = "local", model_sha256: str | None = None):
    """A bundle of ``tiny_onnx`` as one variant named ``precision`` run by ``backend`` (its
    sources next to ``out``); ``model_sha256`` defaults to the model file's."""
    from edgekit.bundle import TensorSpec, Variant, write_bundle
    from edgekit.fsutil import sha256_file

    src = out.parent / "src"
    src.mkdir(exist_ok=True)
    model = tiny_onnx(src / "tiny.onnx")
    files = {f"{precision}/tiny.onnx": model}
    if inputs is not None:
        files[f"{precision}/inputs.npz"] = inputs
    variant = Variant(
        precision, backend, precision, f"{precision}/tiny.onnx",
        (TensorSpec("x", (-1, 16), "float32"),), (TensorSpec("y", (-1, 8), "float32"),), options or {},
    )  # fmt: skip
    return write_bundle(
        out, files=files, model_name="tiny", model_sha256=model_sha256 or sha256_file(model),
        profile=profile, backend=backend, precision=precision, variants=[variant], plan={},
    )  # fmt: skip


# -- bench documents and records --------------------------------------------------------------

BENCH_SAMPLES = [3_000_000, 1_000_000, 2_000_000, 5_000_000, 4_000_000]


def bench_doc(samples=None, **overrides) -> dict:
    """A bench document as the device agent prints it (schema 1) from a Raspberry Pi 5."""
    samples = list(BENCH_SAMPLES) if samples is None else samples
    doc = {
        "schema": 1, "kind": "edgekit.bench", "agent_version": "0.1.0",
        "variant": "int8", "backend": "onnxruntime", "backend_version": "1.31.1", "precision": "int8",
        "model": "model.int8.onnx", "model_sha256": "a" * 64, "bundle_hash": "0123456789abcdef" * 4,
        "config": {"warmup": 10, "iterations": len(samples) if isinstance(samples, list) else 5,
                   "duration_s": None, "min_time_s": None, "threads": 2, "batch": 1},
        "samples_ns": samples,
        "load_ns": 123_400_000, "first_inference_ns": 9_870_000, "peak_rss_bytes": 85 * 2**20,
        "layers": None, "started_at": "2025-03-01T10:00:00Z",
        "device": {
            "hostname": "rpi5-lab-1", "arch": "aarch64", "cpu_model": "Cortex-A76", "cores": 4,
            "isa": ["neon", "asimddp"], "memory_bytes": 8 * 2**30, "os": "Debian GNU/Linux 12",
            "kernel": "6.6.31+rpt-rpi-2712", "python": "3.11.2", "runtimes": {"onnxruntime": "1.31.1"},
        },
        "device_state": {
            "before": {"governor": "performance", "temp_c": 48.5},
            "after": {"governor": "performance", "temp_c": 55.0},
        },
    }  # fmt: skip
    doc.update(overrides)
    return doc


def bench_record(model: str = "resnet18", target: str = "rpi5", device: str = "pi@10.0.0.7", samples=None, **overrides) -> dict:
    """The host's record of a ``bench_doc`` (``overrides`` go to the document)."""
    from edgekit.bench.record import make_record

    return make_record(bench_doc(samples, **overrides), model_name=model, target=target, device=device)


def smooth_model(producer: str = "layernorm", readers: tuple[str, ...] = ("gemm",), channels: int = 16, outlier: float = 40.0) -> onnx.ModelProto:
    """x [32, C] -> ``producer`` -> h, whose channel 3 carries outliers (scale 3 is ``outlier``),
    read by each of ``readers`` -> outputs y0, y1, ...

    producer: "layernorm" (LayerNormalization), "mul_add" (a decomposed LayerNorm's tail: Mul by a
    constant, then Add of one), "relu" (Mul by a constant, then Relu: nothing to fold into).
    readers: "gemm" (Gemm, transB=1, with bias), "matmul" (MatMul by a constant), "relu" (Relu)."""
    rng = np.random.default_rng(7)
    gamma = (1.0 + 0.2 * rng.standard_normal(channels)).astype(np.float32)
    gamma[3] = outlier
    beta = (0.1 * rng.standard_normal(channels)).astype(np.float32)
    inits = [numpy_helper.from_array(gamma, "gamma"), numpy_helper.from_array(beta, "beta")]
    nodes = {
        "layernorm": [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["h"], axis=-1)],
        "mul_add": [helper.make_node("Mul", ["x", "gamma"], ["m"]), helper.make_node("Add", ["m", "beta"], ["h"])],
        "relu": [helper.make_node("Mul", ["x", "gamma"], ["m"]), helper.make_node("Relu", ["m"], ["h"])],
    }[producer]
    outputs = []
    small = np.ones(channels, np.float32)
    small[3] = 1.0 / outlier  # as in a transformer, the outlier channel does not dominate the output
    for i, kind in enumerate(readers):
        y = f"y{i}"
        if kind == "gemm":
            inits += [numpy_helper.from_array((rng.standard_normal((8, channels)) * 0.3 * small).astype(np.float32), f"w{i}"),
                      numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(np.float32), f"b{i}")]
            nodes.append(helper.make_node("Gemm", ["h", f"w{i}", f"b{i}"], [y], transB=1))
        elif kind == "matmul":
            inits.append(numpy_helper.from_array((rng.standard_normal((channels, 8)) * 0.3 * small[:, None]).astype(np.float32), f"w{i}"))
            nodes.append(helper.make_node("MatMul", ["h", f"w{i}"], [y]))
        else:
            nodes.append(helper.make_node("Relu", ["h"], [y]))
        outputs.append(float_io(y, [32, channels if kind == "relu" else 8]))
    model = onnx_model(nodes, [float_io("x", [32, channels])], outputs, inits)
    onnx.checker.check_model(model)
    return model
