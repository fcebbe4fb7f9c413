"""Facts over profile guesses (issue 24, item 8): where the probed device contradicts its
profile (ISA, cores, runtimes), the plan follows the device and says so.

The known case: ``deploy --target x86-openvino`` on an AVX-512 VNNI machine planned 7-bit weights
and printed "this x86 CPU has no VNNI", reading the profile's ISA list (sse4_2) while the facts
it had just probed said avx512_vnni. Fabricated facts cover both directions on any host; the
last test uses this machine's own facts, whatever its CPU.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from edgekit.agentclient import device_facts
from edgekit.modelio import load_model
from edgekit.plan import make_plan, replan
from edgekit.profiles import load_profile
from edgekit.profiles.model import CpuSpec
from edgekit.transport.local import LocalTransport
from tests.conftest import EXAMPLES

DIGITS = EXAMPLES / "digits" / "digits_cnn.onnx"
VNNI_ISA = ["sse4_2", "avx2", "avx512f", "avx512_vnni"]
AVX2_ISA = ["sse4_2", "avx2"]
NO_VNNI = "this x86 CPU has no VNNI"


def _facts(isa: list[str], *, cores: int = 2, runtimes: dict | None = None, arch: str = "x86_64") -> dict:
    """An agent facts document as a device would report it (only what the planner reads)."""
    runtimes = {"onnxruntime": "1.20.1", "openvino": "2026.4.1", "numpy": "2.1.0"} if runtimes is None else runtimes
    return {"device": {"arch": arch, "cpu_model": "Intel(R) Xeon(R) Processor", "isa": isa, "cores": cores, "runtimes": runtimes}, "probe": {}}


def _plans(profile, facts):
    model = load_model(DIGITS)
    paper = make_plan(model, profile, device="box", goal="deploy")
    return paper, replan(paper, model, profile, facts)


def test_a_vnni_device_gets_full_8_bit_weights_under_a_profile_that_lists_only_sse4_2():
    profile = load_profile("x86-openvino")
    assert profile.cpu.isa == ("sse4_2",)  # the profile's minimum, not this device
    paper, fitted = _plans(profile, _facts(VNNI_ISA))
    assert paper.backend == "openvino" and paper.scheme.weight_qmax == 63
    assert any(NO_VNNI in n for n in paper.notes)  # on paper, the profile is all there is to go by
    assert fitted.backend == "openvino" and fitted.scheme.weight_qmax == 127
    assert not any(NO_VNNI in n for n in fitted.notes), fitted.notes
    said = [n for n in fitted.notes if "planned with the device's facts" in n]
    assert len(said) == 1 and "avx512_vnni" in said[0] and "beyond the profile's sse4_2" in said[0]
    assert fitted.to_dict()["scheme"]["weight_qmax"] == 127 and fitted.probed


def test_a_device_without_the_vnni_its_profile_lists_gets_7_bit_weights():
    # the other direction: a profile written for a VNNI machine, a device without it
    vnni_profile = dataclasses.replace(load_profile("x86-openvino"), cpu=CpuSpec("x86_64", None, tuple(VNNI_ISA), 4))
    paper, fitted = _plans(vnni_profile, _facts(AVX2_ISA))
    assert paper.scheme.weight_qmax == 127 and not any(NO_VNNI in n for n in paper.notes)
    assert fitted.scheme.weight_qmax == 63
    assert any(NO_VNNI in n for n in fitted.notes), fitted.notes
    said = next(n for n in fitted.notes if "planned with the device's facts" in n)
    assert "lacks avx512f avx512_vnni, which the profile lists" in said and "2 cores, not 4" in said


def test_onnxruntimes_scheme_follows_the_facts_too():
    # the other backend that reads the CPU: ORT's x86 int8 kernels (forced, so both plans use it)
    model = load_model(DIGITS)
    profile = load_profile("x86-openvino")
    paper = make_plan(model, profile, backend="onnxruntime", goal="deploy")
    fitted = replan(paper, model, profile, _facts(VNNI_ISA))
    assert (paper.scheme.weight_qmax, fitted.scheme.weight_qmax) == (63, 127)
    assert fitted.scheme.activation_dtype == "uint8"


def test_facts_that_agree_with_the_profile_add_no_note():
    profile = dataclasses.replace(load_profile("x86-openvino"), cpu=CpuSpec("x86_64", None, tuple(AVX2_ISA), 2))
    _, fitted = _plans(profile, _facts(AVX2_ISA, cores=2))
    assert not any("planned with the device's facts" in n for n in fitted.notes)
    assert fitted.scheme.weight_qmax == 63  # still narrowed: the device itself has no VNNI


def test_a_missing_runtime_moves_the_plan_to_the_next_backend_and_says_so():
    profile = load_profile("x86-openvino")
    paper, fitted = _plans(profile, _facts(VNNI_ISA, runtimes={"onnxruntime": "1.20.1", "numpy": "2.1.0"}))
    assert (paper.backend, fitted.backend) == ("openvino", "onnxruntime")
    moved = next(n for n in fitted.notes if n.startswith("on paper openvino"))
    assert "openvino is not installed on the device" in moved and moved.endswith("running onnxruntime")


def test_a_device_of_another_arch_keeps_the_profile_for_preflight_to_refuse():
    profile = load_profile("x86-openvino")
    paper, fitted = _plans(profile, _facts(["neon", "asimddp"], arch="aarch64"))
    assert fitted.scheme == paper.scheme
    assert not any("planned with the device's facts" in n for n in fitted.notes)


def test_probe_profiles_take_the_facts_without_a_note():
    profile = load_profile("linux-cpu")
    model = load_model(DIGITS)
    paper = make_plan(model, dataclasses.replace(profile, cpu=CpuSpec("x86_64", None, tuple(AVX2_ISA), 8)), backend="onnxruntime")
    fitted = replan(paper, model, profile, _facts(VNNI_ISA))
    assert fitted.scheme.weight_qmax == 127
    assert not any("planned with the device's facts" in n for n in fitted.notes)


def test_this_machines_own_facts_decide_the_x86_openvino_scheme(tmp_path):
    facts = device_facts(LocalTransport(tmp_path / "device"))
    d = facts["device"]
    if d["arch"] != "x86_64":
        pytest.skip("an x86 profile on an x86 host")
    vnni = any(f in d["isa"] for f in ("avx512_vnni", "avx_vnni"))
    _, fitted = _plans(load_profile("x86-openvino"), facts)
    assert fitted.scheme.weight_qmax == (127 if vnni else 63)
    assert any(NO_VNNI in n for n in fitted.notes) == (not vnni), fitted.notes


@pytest.mark.slow
def test_deploy_x86_openvino_prints_what_the_cpu_has(cli, tmp_path):
    facts = device_facts(LocalTransport(tmp_path / "probe"))
    if facts["device"]["arch"] != "x86_64" or not facts["device"]["runtimes"].get("openvino"):
        pytest.skip("needs an x86 host with openvino")
    vnni = any(f in facts["device"]["isa"] for f in ("avx512_vnni", "avx_vnni"))
    r = cli("deploy", DIGITS, "--target", "x86-openvino", "--iterations", "5", "--warmup", "1", "--no-layers", "--json", "-o", tmp_path / "b")
    assert r.returncode == 0, r.stderr
    assert (NO_VNNI in r.stderr) == (not vnni), r.stderr
    doc = json.loads(r.stdout)
    assert doc["plan"]["scheme"]["weight_qmax"] == (127 if vnni else 63)
    recorded = json.loads((tmp_path / "b" / "manifest.json").read_text())["plan"]
    assert recorded["scheme"]["weight_qmax"] == doc["plan"]["scheme"]["weight_qmax"]  # the bundle was made as planned
