"""Target profiles: built-in facts, search order, validation messages, probing, CLI."""

from __future__ import annotations

import json
import os
import platform
import re
from pathlib import Path

import pytest

from edgekit.agent.facts import parse_cpuinfo
from edgekit.errors import EXIT_INPUT, ProfileError
from edgekit.profiles import (
    BACKENDS,
    ISA_FEATURES,
    PRECISIONS,
    CpuSpec,
    cpu_from_cpuinfo,
    list_profiles,
    load_profile,
    probe_host,
    profile_dirs,
    resolve,
    validate_file,
)
from edgekit.profiles.loader import BUILTIN_DIR
from edgekit.profiles.probe import normalize_arch
from tests.builders import arm_cpuinfo, cpuinfo
from tests.conftest import REPO, assert_one_line_error

BUILTINS = (
    "local",
    "linux-cpu",
    "rpi4",
    "rpi5",
    "jetson-nano",
    "jetson-orin-nano",
    "jetson-agx-orin",
    "intel-ncs2",
    "intel-npu",
    "x86-openvino",
)

# A valid user profile; the invalid cases below are one edit away from it.
HEAD = """\
schema = 1
name = "board"
description = "test board"
"""
CPU = """
[cpu]
arch = "aarch64"
core = "cortex-a76"
isa = ["neon", "asimddp"]
cores = 4
"""
BACKS = """
[[backends]]
name = "native"
precisions = ["int8"]

[[backends]]
name = "onnxruntime"
device = "CPUExecutionProvider"
precisions = ["int8", "fp32"]
"""
BENCH = """
[bench]
warmup = 5
"""
BASE = HEAD + CPU + BACKS + BENCH


def write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.toml"
    path.write_text(text)
    return path


# -- built-ins ------------------------------------------------------------------------


def test_builtin_set_is_complete():
    shipped = {p.stem for p in BUILTIN_DIR.glob("*.toml")}
    assert shipped == set(BUILTINS)


@pytest.mark.parametrize("name", BUILTINS)
def test_every_builtin_loads_and_validates(name, tmp_path):
    profile = load_profile(name, cwd=tmp_path)
    assert profile.name == name
    assert profile.source == "builtin"
    assert profile.description
    assert profile.backends
    for spec in profile.backends:
        assert spec.name in BACKENDS
        assert spec.precisions and set(spec.precisions) <= set(PRECISIONS)
    assert validate_file(BUILTIN_DIR / f"{name}.toml") == profile
    json.dumps(profile.to_dict())  # JSON-able as-is


def test_rpi_dot_product_facts(tmp_path):
    rpi4, rpi5 = load_profile("rpi4", cwd=tmp_path), load_profile("rpi5", cwd=tmp_path)
    assert (rpi4.cpu.arch, rpi4.cpu.core, rpi4.cpu.cores) == ("aarch64", "cortex-a72", 4)
    assert "neon" in rpi4.cpu.isa and "asimddp" not in rpi4.cpu.isa and "fp16" not in rpi4.cpu.isa
    assert (rpi5.cpu.arch, rpi5.cpu.core, rpi5.cpu.cores) == ("aarch64", "cortex-a76", 4)
    assert {"neon", "asimddp", "fp16"} <= set(rpi5.cpu.isa)
    assert "i8mm" not in rpi5.cpu.isa  # i8mm is ARMv8.6; the A76 is ARMv8.2
    assert [b.name for b in rpi4.backends] == ["native", "tflite", "onnxruntime", "numpy"]
    assert rpi4.backend("native").precisions == ("int8",)


def test_jetson_facts(tmp_path):
    nano = load_profile("jetson-nano", cwd=tmp_path)
    trt = nano.backend("tensorrt")
    assert trt.precisions == ("fp16",)
    assert trt.max_version == "8.2" and "sm_53" in trt.notes and "DP4A" in trt.notes
    assert nano.backends[0] is trt
    assert nano.backend("onnxruntime").precisions == ("int8", "fp32")
    assert (nano.cpu.core, nano.cpu.isa) == ("cortex-a57", ("neon",))

    orin_nano = load_profile("jetson-orin-nano", cwd=tmp_path)
    trt = orin_nano.backend("tensorrt")
    assert trt.precisions[0] == "int8" and trt.dla_cores == 0
    assert "symmetric" in trt.notes and "zero point 0" in trt.notes
    assert (orin_nano.cpu.core, orin_nano.cpu.cores) == ("cortex-a78ae", 6)

    agx = load_profile("jetson-agx-orin", cwd=tmp_path)
    trt = agx.backend("tensorrt")
    assert trt.precisions == ("int8", "fp16") and trt.dla_cores == 2
    assert (agx.cpu.core, agx.cpu.cores) == ("cortex-a78ae", 12)
    assert "asimddp" in agx.cpu.isa


def test_intel_facts(tmp_path):
    ncs2 = load_profile("intel-ncs2", cwd=tmp_path).backend("openvino")
    assert ncs2.device == "MYRIAD" and ncs2.precisions == ("fp16",)
    assert ncs2.max_version == "2022.3" and "2023.0" in ncs2.notes
    assert ncs2.version_ok("2022.3.2") and ncs2.version_ok("2021.4")
    assert not ncs2.version_ok("2023.0") and not ncs2.version_ok("2024.6.0")

    npu_profile = load_profile("intel-npu", cwd=tmp_path)
    npu = npu_profile.backend("openvino")
    assert npu.device == "NPU" and npu.precisions == ("int8", "fp16") and npu.min_version == "2023.3"
    assert not npu.version_ok("2023.2") and npu.version_ok("2024.0")
    assert {"avx2", "avx_vnni"} <= set(npu_profile.cpu.isa) and "avx512f" not in npu_profile.cpu.isa

    x86 = load_profile("x86-openvino", cwd=tmp_path)
    assert [(b.name, b.device) for b in x86.backends] == [("openvino", "CPU"), ("onnxruntime", "CPUExecutionProvider")]


def test_probe_profiles_resolve_to_this_machine(tmp_path):
    for name in ("local", "linux-cpu"):
        profile = load_profile(name, cwd=tmp_path)
        assert profile.probe and profile.cpu.arch == ""
        resolved = resolve(profile)
        assert resolved.cpu.arch == normalize_arch(platform.machine())
        assert resolved.cpu.cores == len(os.sched_getaffinity(0))
        assert resolved.backends == profile.backends
    local = load_profile("local", cwd=tmp_path)
    assert [b.name for b in local.backends] == ["native", "onnxruntime", "openvino"]


def test_resolve_leaves_fixed_profiles_alone_and_takes_given_facts(tmp_path):
    rpi5 = load_profile("rpi5", cwd=tmp_path)
    assert resolve(rpi5) is rpi5
    facts = CpuSpec(arch="aarch64", core="cortex-a72", isa=("neon",), cores=4)
    assert resolve(load_profile("linux-cpu", cwd=tmp_path), cpu=facts).cpu == facts


# -- probing ----------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("kind", "machine", "core", "isa"),
    [
        ("rpi4", "aarch64", "cortex-a72", ("neon",)),
        ("rpi4-32bit", "armv7l", "cortex-a72", ("neon",)),
        ("rpi5", "aarch64", "cortex-a76", ("neon", "asimddp", "fp16")),
        ("jetson-orin", "aarch64", "cortex-a78ae", ("neon", "asimddp", "fp16")),
        ("jetson-nano", "aarch64", "cortex-a57", ("neon",)),
        ("rk3588", "aarch64", "cortex-a55+cortex-a76", ("neon", "asimddp", "fp16")),
        ("x86-avx2", "x86_64", "Intel(R) Xeon(R) CPU E5-2686 v4 @ 2.30GHz", ("sse4_2", "avx2")),
        ("x86-avx512-vnni", "x86_64", "Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz", ("sse4_2", "avx2", "avx512f", "avx512_vnni")),
        ("x86-avx-vnni", "x86_64", "Intel(R) Core(TM) Ultra 7 155H", ("sse4_2", "avx2", "avx_vnni")),
    ],
)
def test_one_cpuinfo_parser_for_device_and_host(kind, machine, core, isa):
    """The agent's parser (what the device reports) and the host's probe name things alike."""
    text = cpuinfo(kind)
    assert parse_cpuinfo(text, machine) == (core, list(isa))
    host = cpu_from_cpuinfo(text, machine)
    assert (host.core, host.isa) == (core, isa)
    assert set(isa) <= set(ISA_FEATURES)


@pytest.mark.parametrize(
    ("kind", "arch", "profile"),
    [("rpi4", "aarch64", "rpi4"), ("rpi5", "aarch64", "rpi5"), ("jetson-orin", "aarch64", "jetson-orin-nano"),
     ("jetson-nano", "aarch64", "jetson-nano"), ("x86-avx-vnni", "x86_64", "intel-npu")],
)
def test_cpuinfo_of_real_boards_matches_their_profiles(kind, arch, profile, tmp_path):
    facts = cpu_from_cpuinfo(cpuinfo(kind), arch)
    expected = load_profile(profile, cwd=tmp_path).cpu
    assert facts.isa == expected.isa
    if arch == "aarch64":
        assert (facts.core, facts.cores) == (expected.core, expected.cores)


def test_cpuinfo_details():
    mtl = cpu_from_cpuinfo(cpuinfo("x86-avx-vnni"), "x86_64", cores=22)
    assert mtl.core == "Intel(R) Core(TM) Ultra 7 155H" and mtl.cores == 22
    assert cpu_from_cpuinfo(cpuinfo("rk3588"), "aarch64").cores == 8
    armv7 = cpu_from_cpuinfo(cpuinfo("rpi4-32bit"), "armv7l")
    assert (armv7.arch, armv7.core, armv7.isa) == ("armv7l", "cortex-a72", ("neon",))
    assert cpu_from_cpuinfo(cpuinfo("rpi4-32bit"), "armv8l").arch == "armv7l"
    unknown = cpu_from_cpuinfo(arm_cpuinfo("fp asimd", ["0xfff"]), "arm64")
    assert (unknown.arch, unknown.core, unknown.isa) == ("aarch64", "0x41:0xfff", ("neon",))
    assert cpu_from_cpuinfo("", "aarch64").isa == ("neon",)  # Advanced SIMD is mandatory in AArch64


def test_dot_product_has_one_name():
    """asimddp (Linux's word) everywhere; "dotprod" is a compiler flag, never a feature name."""
    assert "asimddp" in ISA_FEATURES and "dotprod" not in ISA_FEATURES and "neondot" not in ISA_FEATURES
    assert parse_cpuinfo(cpuinfo("rpi5"), "aarch64")[1] == ["neon", "asimddp", "fp16"]


def test_unsupported_arch_is_a_profile_error():
    with pytest.raises(ProfileError) as err:
        normalize_arch("riscv64")
    assert "'riscv64'" in err.value.message and "x86_64, aarch64, armv7l" in err.value.message


def test_probe_host_agrees_with_proc_cpuinfo():
    cpu = probe_host()
    assert cpu.arch == normalize_arch(platform.machine())
    flags = set(re.findall(r"\S+", " ".join(
        ln.split(":", 1)[1] for ln in Path("/proc/cpuinfo").read_text().splitlines()
        if ln.lower().startswith(("flags", "features"))
    )))
    if cpu.arch == "x86_64":
        for feature in ("sse4_2", "avx2", "avx512f", "avx512_vnni", "avx_vnni"):
            assert (feature in cpu.isa) == (feature in flags)
    else:
        assert "neon" in cpu.isa
        assert ("asimddp" in cpu.isa) == ("asimddp" in flags)


# -- search order, shadowing, paths -------------------------------------------------------


def test_profile_dirs_search_order(tmp_path, edgekit_home):
    assert profile_dirs(tmp_path) == [
        tmp_path / "profiles",
        edgekit_home / "config" / "profiles",
        BUILTIN_DIR,
    ]


def test_user_profiles_shadow_builtins(tmp_path, edgekit_home):
    config_file = write(edgekit_home / "config" / "profiles", "rpi5", BASE.replace('"board"', '"rpi5"'))
    assert load_profile("rpi5", cwd=tmp_path).source == str(config_file)
    local_file = write(tmp_path / "profiles", "rpi5", BASE.replace('"board"', '"rpi5"').replace("test board", "mine"))
    profile = load_profile("rpi5", cwd=tmp_path)
    assert profile.source == str(local_file) and profile.description == "mine"
    assert profile.backends[0].precisions == ("int8",)
    # list: one rpi5, the user's; the other built-ins still there; sorted by name
    listed = list_profiles(cwd=tmp_path)
    names = [p.name for p in listed]
    assert names == sorted(names) and names.count("rpi5") == 1
    assert {p.name: p.source for p in listed}["rpi5"] == str(local_file)
    assert set(BUILTINS) <= set(names)
    # another cwd does not see ./profiles of this one
    other = tmp_path / "elsewhere"
    other.mkdir()
    assert load_profile("rpi5", cwd=other).source == str(config_file)


def test_user_profile_with_new_name_is_listed(tmp_path):
    write(tmp_path / "profiles", "board", BASE)
    assert load_profile("board", cwd=tmp_path).cpu.core == "cortex-a76"
    assert "board" in [p.name for p in list_profiles(cwd=tmp_path)]


def test_load_by_path(tmp_path):
    path = write(tmp_path / "boards", "board", BASE)
    by_abs = load_profile(str(path), cwd=Path("/"))
    assert by_abs.name == "board" and by_abs.source == str(path)
    assert load_profile("boards/board.toml", cwd=tmp_path).source == str(path)
    assert load_profile(path).bench.warmup == 5
    write(tmp_path, "board", BASE)
    assert load_profile("board.toml", cwd=tmp_path).source == str(tmp_path / "board.toml")
    with pytest.raises(ProfileError, match="profile file not found"):
        load_profile("boards/nope.toml", cwd=tmp_path)
    with pytest.raises(ProfileError, match="not a TOML file"):
        load_profile(str(tmp_path / "boards") + "/", cwd=tmp_path)


def test_defaults_when_optional_sections_are_missing(tmp_path):
    text = (HEAD + CPU + BACKS).replace('name = "board"\n', "")
    profile = validate_file(write(tmp_path, "board", text))
    assert profile.name == "board"  # from the file name
    assert (profile.workdir, profile.python) == ("~/.edgekit", "python3")
    assert (profile.bench.warmup, profile.bench.iterations, profile.bench.min_time_s, profile.bench.threads) == ("auto", 100, 0.5, None)
    assert profile.bench.rounds == 1
    assert validate_file(write(tmp_path, "board", BASE + "rounds = 3\n")).bench.rounds == 3
    assert profile.accelerator is None and profile.probe is False


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [("rpi6", "'rpi5'"), ("jetson-nanoo", "'jetson-nano'"), ("x86_openvino", "'x86-openvino'")],
)
def test_unknown_name_suggests_close_match(name, suggestion, tmp_path):
    with pytest.raises(ProfileError) as err:
        load_profile(name, cwd=tmp_path)
    assert err.value.message == f"unknown target profile '{name}'"
    assert suggestion in err.value.hint and "edgekit profiles list" in err.value.hint


def test_unknown_name_suggests_user_profiles_too(tmp_path):
    write(tmp_path / "profiles", "my-board", BASE.replace('"board"', '"my-board"'))
    with pytest.raises(ProfileError) as err:
        load_profile("my-bord", cwd=tmp_path)
    assert "'my-board'" in err.value.hint


# -- validation: every class of error names file, key and allowed values --------------------

INVALID = [
    # (id, old, new, key, allowed values that must be listed, problem words)
    ("unknown-top-key", "schema = 1\n", "schema = 1\ncolour = 'red'\n", "colour", "schema, name, description", "unknown key"),
    ("unknown-cpu-key", "cores = 4\n", "cores = 4\nfrequency = 2400\n", "cpu.frequency", "arch, core, isa, cores, probe", "unknown key"),
    ("unknown-backend-key", 'name = "native"\n', 'name = "native"\nfast = true\n', "backends[0].fast", "name, precisions, device", "unknown key"),
    ("misspelled-key", "warmup = 5", "warmpu = 5", "bench.warmpu", "warmup, iterations, min_time, threads, rounds", "did you mean 'warmup'"),
    ("wrong-type-int", "cores = 4", 'cores = "4"', "cpu.cores", "an integer >= 1", "expected an integer, got a string"),
    ("bool-is-not-int", "warmup = 5", "warmup = true", "bench.warmup", "an integer >= 0", "expected an integer, got a boolean"),
    ("min-time-negative", "warmup = 5", "warmup = 5\nmin_time = -1", "bench.min_time", "a number of seconds in 0..3600", "expected seconds, got -1"),
    ("min-time-bool", "warmup = 5", "warmup = 5\nmin_time = true", "bench.min_time", "a number of seconds in 0..3600", "expected seconds, got True"),
    ("rounds-zero", "warmup = 5", "warmup = 5\nrounds = 0", "bench.rounds", "an integer >= 1", "0 is too small"),
    ("rounds-float", "warmup = 5", "warmup = 5\nrounds = 2.5", "bench.rounds", "an integer >= 1", "expected an integer, got a float"),
    ("wrong-type-list", 'isa = ["neon", "asimddp"]', 'isa = "neon"', "cpu.isa", "neon, asimddp, i8mm, fp16", "expected an array"),
    ("wrong-type-item", 'precisions = ["int8"]', "precisions = [8]", "backends[0].precisions[0]", "int8, fp16, fp32", "expected a string"),
    ("section-not-table", None, HEAD + "bench = 5\n" + CPU + BACKS, "bench", "warmup, iterations, min_time, threads", "expected a table"),
    ("unknown-backend", 'name = "native"', 'name = "tensorflow"', "backends[0].name", "native, tensorrt, openvino, tflite, onnxruntime", "unknown value 'tensorflow'"),
    ("unknown-precision", 'precisions = ["int8", "fp32"]', 'precisions = ["int4", "fp32"]', "backends[1].precisions[0]", "int8, fp16, fp32", "unknown precision 'int4'"),
    ("duplicate-precision", 'precisions = ["int8", "fp32"]', 'precisions = ["int8", "int8"]', "backends[1].precisions[1]", "int8, fp16, fp32", "duplicate precision"),
    ("empty-precisions", 'precisions = ["int8"]', "precisions = []", "backends[0].precisions", "int8, fp16, fp32", "empty array"),
    ("unknown-arch", 'arch = "aarch64"', 'arch = "riscv64"', "cpu.arch", "x86_64, aarch64, armv7l", "unknown value 'riscv64'"),
    ("missing-arch", 'arch = "aarch64"\n', "", "cpu.arch", "x86_64, aarch64, armv7l", "missing"),
    ("unknown-isa", 'isa = ["neon", "asimddp"]', 'isa = ["neon", "sve"]', "cpu.isa[1]", "neon, asimddp", "unknown ISA feature 'sve'"),
    ("isa-of-other-arch", 'isa = ["neon", "asimddp"]', 'isa = ["neon", "avx2"]', "cpu.isa[1]", "neon, asimddp, i8mm, fp16", "not a feature of aarch64"),
    ("empty-backends", None, HEAD + "backends = []\n" + CPU + BENCH, "backends", "native, tensorrt, openvino, tflite, onnxruntime", "empty array"),
    ("missing-backends", None, HEAD + CPU + BENCH, "backends", "native, tensorrt, openvino, tflite, onnxruntime", "missing"),
    ("duplicate-backend", 'name = "onnxruntime"', 'name = "native"', "backends[1].name", "each backend once", "duplicate backend 'native'"),
    ("bad-openvino-device", 'name = "onnxruntime"\ndevice = "CPUExecutionProvider"', 'name = "openvino"\ndevice = "VPU"', "backends[1].device", "CPU, GPU, NPU, MYRIAD", "unknown value 'VPU'"),
    ("bad-ort-device", 'device = "CPUExecutionProvider"', 'device = "cuda"', "backends[1].device", "execution provider name", "unknown value 'cuda'"),
    ("dla-on-cpu", 'precisions = ["int8"]\n', 'precisions = ["int8"]\ndla_cores = 2\n', "backends[0].dla_cores", "allowed: 0", "only tensorrt"),
    ("bad-version", 'precisions = ["int8"]\n', 'precisions = ["int8"]\nmin_version = "latest"\n', "backends[0].min_version", "dotted version", "not a version"),
    ("min-above-max", 'precisions = ["int8"]\n', 'precisions = ["int8"]\nmin_version = "2023.3"\nmax_version = "2022.3"\n', "backends[0].max_version", ">= 2023.3", "below min_version"),
    ("negative-warmup", "warmup = 5", "warmup = -1", "bench.warmup", "an integer >= 0", "too small"),
    ("schema-version", "schema = 1", "schema = 2", "schema", "allowed: 1", "unsupported schema version 2"),
    ("missing-schema", "schema = 1\n", "", "schema", "allowed: 1", "missing"),
    ("name-mismatch", 'name = "board"', 'name = "other"', "name", "'board'", "does not match the file name"),
    ("probe-with-facts", 'arch = "aarch64"', 'probe = true\narch = "aarch64"', "cpu.arch", "probe alone", "not allowed with cpu.probe"),
    ("probe-not-bool", 'arch = "aarch64"', 'probe = "yes"', "cpu.probe", "true, false", "expected a boolean"),
]


def _make_invalid(old: str | None, new: str) -> str:
    if old is None:  # ``new`` is the whole file
        return new
    assert old in BASE, old
    return BASE.replace(old, new, 1)


@pytest.mark.parametrize(("old", "new", "key", "allowed", "problem"), [case[1:] for case in INVALID],
                         ids=[case[0] for case in INVALID])
def test_invalid_profile_message_names_file_key_and_allowed(old, new, key, allowed, problem, tmp_path):
    path = write(tmp_path, "board", _make_invalid(old, new))
    with pytest.raises(ProfileError) as err:
        validate_file(path)
    message = err.value.message
    assert message.startswith(f"{path}: {key}: "), message
    assert problem in message and "allowed: " in message and allowed in message, message
    assert "\n" not in message and "edgekit profiles validate" in err.value.hint


def test_missing_cpu_table(tmp_path):
    text = HEAD + BACKS + BENCH
    with pytest.raises(ProfileError, match=r"board\.toml: cpu: missing \[cpu\] table; allowed: .*x86_64, aarch64, armv7l.*probe = true"):
        validate_file(write(tmp_path, "board", text))


def test_probe_profile_without_facts_is_valid(tmp_path):
    text = HEAD + "[cpu]\nprobe = true\n" + BACKS
    profile = validate_file(write(tmp_path, "board", text))
    assert profile.probe and resolve(profile).cpu.arch == normalize_arch(platform.machine())


def test_toml_syntax_error_names_file_and_line(tmp_path):
    path = write(tmp_path, "board", BASE.replace("[cpu]", "[cpu"))
    with pytest.raises(ProfileError) as err:
        validate_file(path)
    assert err.value.message.startswith(f"{path}: invalid TOML: ")
    assert "line 5" in err.value.message


def test_non_utf8_file(tmp_path):
    path = tmp_path / "board.toml"
    path.write_bytes(BASE.encode().replace(b"test board", b"test \xff board"))
    with pytest.raises(ProfileError, match="not UTF-8"):
        validate_file(path)


def test_docs_example_is_a_valid_profile(tmp_path):
    docs = (REPO / "docs" / "profiles.md").read_text()
    example = re.search(r"```toml\n(.*?)```", docs, re.S).group(1)
    profile = validate_file(write(tmp_path, "rpi5", example))
    assert profile.cpu.core == "cortex-a76" and [b.name for b in profile.backends] == ["native", "onnxruntime"]


# -- CLI --------------------------------------------------------------------------------------


def test_cli_list_json(cli, tmp_path):
    write(tmp_path / "profiles", "board", BASE)
    result = cli("profiles", "list", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    by_name = {p["name"]: p for p in doc["profiles"]}
    assert set(BUILTINS) | {"board"} == set(by_name)
    assert by_name["board"]["source"] == str(tmp_path / "profiles" / "board.toml")
    assert by_name["rpi4"]["source"] == "builtin"
    assert by_name["local"]["probe"] is True and by_name["local"]["cpu"]["arch"] == normalize_arch(platform.machine())
    assert [b["name"] for b in by_name["jetson-nano"]["backends"]] == ["tensorrt", "onnxruntime"]
    assert doc["search_path"][0] == str(tmp_path / "profiles")


def test_cli_list_human(cli):
    result = cli("profiles", "list")
    assert result.returncode == 0, result.stderr
    for name in BUILTINS:
        assert name in result.stdout
    assert "(probed)" in result.stdout and "builtin" in result.stdout


def test_cli_show_json_and_human(cli):
    result = cli("profiles", "show", "jetson-nano", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["backends"][0]["precisions"] == ["fp16"] and doc["cpu"]["core"] == "cortex-a57"
    local = json.loads(cli("profiles", "show", "local", "--json").stdout)
    assert local["cpu"]["arch"] == normalize_arch(platform.machine()) and local["cpu"]["cores"] >= 1
    human = cli("profiles", "show", "intel-ncs2")
    assert human.returncode == 0
    assert "MYRIAD" in human.stdout and "<=2022.3" in human.stdout and "2023.0" in human.stdout


def test_cli_show_by_path(cli, tmp_path):
    write(tmp_path / "boards", "board", BASE)
    doc = json.loads(cli("profiles", "show", "boards/board.toml", "--json").stdout)
    assert doc["name"] == "board" and doc["bench"]["warmup"] == 5


def test_cli_validate(cli, tmp_path):
    write(tmp_path, "board", BASE)
    result = cli("profiles", "validate", "board.toml")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok: board.toml (board)"
    doc = json.loads(cli("profiles", "validate", "board.toml", "--json").stdout)
    assert doc["ok"] is True and doc["name"] == "board" and doc["profile"]["cpu"]["cores"] == 4


def test_cli_bad_inputs(cli, tmp_path):
    result = cli("profiles", "show", "rpi6")
    assert_one_line_error(result, EXIT_INPUT, "unknown target profile 'rpi6'")
    assert "did you mean 'rpi5'" in result.stderr and result.stdout == ""

    write(tmp_path, "board", _make_invalid('precisions = ["int8", "fp32"]', 'precisions = ["int4", "fp32"]'))
    result = cli("profiles", "validate", "board.toml", "--json")
    assert_one_line_error(result, EXIT_INPUT, "backends[1].precisions[0]: unknown precision 'int4'; allowed: int8, fp16, fp32")
    assert str(tmp_path / "board.toml") in result.stderr and result.stdout == ""

    assert_one_line_error(cli("profiles", "validate", "missing.toml"), EXIT_INPUT, "profile file not found")

    write(tmp_path, "syntax", BASE.replace('name = "board"', 'name = "syntax"').replace("[cpu]", "[cpu"))
    assert_one_line_error(cli("profiles", "validate", "syntax.toml"), EXIT_INPUT, "line 5")

    # a broken user profile breaks list too, naming the file, rather than vanishing silently
    write(tmp_path / "profiles", "broken", "schema = 1\n")
    assert_one_line_error(cli("profiles", "list"), EXIT_INPUT, "broken.toml: cpu: missing")


def test_cli_help_has_examples(cli):
    for command in ("list", "show", "validate"):
        result = cli("profiles", command, "--help")
        assert result.returncode == 0
        assert f"edgekit profiles {command}" in result.stdout


def test_bench_warmup_is_a_count_or_auto(tmp_path):
    base = (Path(__file__).resolve().parents[1] / "edgekit" / "profiles" / "rpi5.toml").read_text()
    assert load_profile("rpi5").bench.warmup == "auto" and load_profile("jetson-nano").bench.warmup == 50
    bad = tmp_path / "bad.toml"
    bad.write_text(base.replace('warmup = "auto"', 'warmup = "fast"'))
    with pytest.raises(ProfileError, match="bench.warmup"):
        load_profile(str(bad))
