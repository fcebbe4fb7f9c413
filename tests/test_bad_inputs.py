"""Bad inputs through the real CLI: one ``error:`` line, one ``hint:`` line, the right exit code,
no traceback and nothing left behind in the working directory (no partial output, no temp file).

Each row is (id, argv, exit code). In argv, ``{bad}`` is a folder of broken inputs built once for
the module, ``{ex}`` the examples folder and ``{bundle}`` a real bundle of the digits model.

Every row is its own ``python -m edgekit`` process, exactly as the ``cli`` fixture runs it (own
data/config/cache dirs, ``CI=1``). They are started together, a few at a time, because most of
each run is interpreter and import start-up: one after another they would take minutes.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.builders import onnx_model
from tests.conftest import EXAMPLES, CliResult, assert_one_line_error

USAGE, INPUT, DEVICE = 2, 3, 4
M = "{ex}/digits/digits_cnn.onnx"  # small (8x8 input): quantizing it takes a fraction of a second
CAL = "{ex}/digits/calib.npz"

CASES = [
    # -- the model file ---------------------------------------------------------------------------
    ("quantize-missing-model", "quantize {bad}/nope.onnx -o out.onnx", INPUT),
    ("quantize-model-is-dir", "quantize {bad} -o out.onnx", INPUT),
    ("quantize-empty-model", "quantize {bad}/empty.onnx -o out.onnx", INPUT),
    ("quantize-corrupt-model", "quantize {bad}/corrupt.onnx -o out.onnx", INPUT),
    ("quantize-truncated-model", "quantize {bad}/truncated.onnx -o out.onnx", INPUT),
    ("quantize-npz-as-model", f"quantize {CAL} -o out.onnx", INPUT),
    ("quantize-opset-999", "quantize {bad}/opset999.onnx -o out.onnx", INPUT),
    ("quantize-shapes-contradict", "quantize {bad}/badmatmul.onnx -o out.onnx", INPUT),
    ("quantize-checker-rejects", "quantize {bad}/nograph_output.onnx -o out.onnx", INPUT),
    ("quantize-no-nodes", "quantize {bad}/nonodes.onnx -o out.onnx", INPUT),
    ("quantize-external-data-missing", "quantize {bad}/external.onnx -o out.onnx", INPUT),
    ("quantize-over-2gib", "quantize {bad}/huge.onnx -o out.onnx", INPUT),
    ("quantize-dynamic-no-shape", "quantize {bad}/dynamic.onnx -o out.onnx", INPUT),
    ("plan-missing-model", "plan {bad}/nope.onnx", INPUT),
    ("plan-corrupt-model", "plan {bad}/corrupt.onnx", INPUT),
    ("plan-opset-999", "plan {bad}/opset999.onnx", INPUT),
    ("plan-bad-tflite", "plan {bad}/corrupt.tflite", INPUT),
    ("deploy-truncated-model", "deploy {bad}/truncated.onnx --no-bench -o bundle", INPUT),
    ("deploy-opset-999", "deploy {bad}/opset999.onnx --no-bench -o bundle", INPUT),
    ("bench-corrupt-model", "bench {bad}/corrupt.onnx", INPUT),
    # -- --shape ----------------------------------------------------------------------------------
    ("shape-no-colon", "quantize {bad}/dynamic.onnx -o out.onnx --shape x", USAGE),
    ("shape-letters", "quantize {bad}/dynamic.onnx -o out.onnx --shape x:a,4", USAGE),
    ("shape-zero-dim", "quantize {bad}/dynamic.onnx -o out.onnx --shape x:0,4", USAGE),
    ("shape-unknown-input", "quantize {bad}/dynamic.onnx -o out.onnx --shape nope:1,4", USAGE),
    ("shape-wrong-rank", "plan {bad}/dynamic.onnx --shape x:1,4,4", USAGE),
    ("shape-fixed-dim", "plan {bad}/dynamic.onnx --shape x:1,5", USAGE),
    ("shape-too-big-for-random-data", "quantize {bad}/dynamic.onnx -o out.onnx --shape x:99999999999,4", INPUT),
    ("preprocess-std-zero", f"quantize {M} -o out.onnx --preprocess std=0", USAGE),
    # -- targets, backends, methods, options ------------------------------------------------------
    ("quantize-unknown-target", f"quantize {M} -o out.onnx --target no-such-board", INPUT),
    ("plan-unknown-target", f"plan {M} --target no-such-board", INPUT),
    ("plan-unknown-backend", f"plan {M} --backend nosuch", USAGE),
    ("deploy-missing-model", "deploy {bad}/nope.onnx --no-bench -o bundle", INPUT),
    ("quantize-bad-method", f"quantize {M} -o out.onnx --method median", USAGE),
    ("quantize-bad-metric", f"quantize {M} -o out.onnx --max-drop 1 --metric median", USAGE),
    ("quantize-threshold-without-metric", f"quantize {M} -o out.onnx --threshold 0.9", USAGE),
    ("quantize-threshold-out-of-range", f"quantize {M} -o out.onnx --metric iou --threshold 1.5", USAGE),
    ("quantize-metric-module-missing", f"quantize {M} -o out.onnx --max-drop 1 --metric {{bad}}/nope.py:fn", INPUT),
    ("quantize-max-drop-negative", f"quantize {M} -o out.onnx --max-drop -1", USAGE),
    ("plan-bad-method", f"plan {M} --method median", USAGE),
    ("quantize-bad-preprocess", f"quantize {M} -o out.onnx --preprocess size=big", USAGE),
    ("quantize-unknown-option", f"quantize {M} -o out.onnx --fast", USAGE),
    ("quantize-no-output", f"quantize {M}", USAGE),
    ("bench-zero-iterations", f"bench {M} --iterations 0", USAGE),
    # -- profile TOML files -----------------------------------------------------------------------
    ("validate-profile-syntax", "profiles validate {bad}/syntax.toml", INPUT),
    ("validate-profile-unknown-key", "profiles validate {bad}/unknown_key.toml", INPUT),
    ("validate-profile-wrong-type", "profiles validate {bad}/wrong_type.toml", INPUT),
    ("validate-profile-missing", "profiles validate {bad}/nope.toml", INPUT),
    ("show-unknown-profile", "profiles show no-such-board", INPUT),
    ("plan-profile-file-syntax", f"plan {M} --target {{bad}}/syntax.toml", INPUT),
    ("quantize-profile-file-wrong-type", f"quantize {M} -o out.onnx --target {{bad}}/wrong_type.toml", INPUT),
    # -- calibration / evaluation data ------------------------------------------------------------
    ("calib-nan", f"quantize {M} -o out.onnx --calib {{bad}}/nan.npz", INPUT),
    ("calib-inf-npy", f"quantize {M} -o out.onnx --calib {{bad}}/inf.npy", INPUT),
    ("calib-nan-folder", f"quantize {M} -o out.onnx --calib {{bad}}/nanfolder", INPUT),
    ("eval-nan", f"quantize {M} -o out.onnx --calib {CAL} --eval {{bad}}/nan.npz", INPUT),
    ("calib-wrong-shape", f"quantize {M} -o out.onnx --calib {{bad}}/wrong_shape.npz", INPUT),
    ("calib-wrong-key", f"quantize {M} -o out.onnx --calib {{bad}}/wrong_key.npz", INPUT),
    ("calib-wrong-dtype", f"quantize {M} -o out.onnx --calib {{bad}}/uint8.npz", INPUT),
    ("calib-missing", f"quantize {M} -o out.onnx --calib {{bad}}/nope.npz", INPUT),
    ("calib-wrong-extension", f"quantize {M} -o out.onnx --calib {{bad}}/data.csv", INPUT),
    ("calib-onnx-as-data", f"quantize {M} -o out.onnx --calib {M}", INPUT),
    ("calib-corrupt-npz", f"quantize {M} -o out.onnx --calib {{bad}}/corrupt.npz", INPUT),
    ("calib-empty-folder", f"quantize {M} -o out.onnx --calib {{bad}}/emptydir", INPUT),
    ("labels-length-mismatch", f"quantize {M} -o out.onnx --calib {CAL} --eval {{ex}}/digits/heldout.npz --labels {{bad}}/labels10.npy", INPUT),
    ("labels-float", f"quantize {M} -o out.onnx --calib {CAL} --eval {{ex}}/digits/heldout.npz --labels {{bad}}/labels_float.npy", INPUT),
    ("deploy-calib-nan", f"deploy {M} --no-bench -o bundle --calib {{bad}}/nan.npz", INPUT),
    # -- output paths -----------------------------------------------------------------------------
    ("quantize-output-dir-missing", f"quantize {M} -o no/such/dir/out.onnx", INPUT),
    ("quantize-output-is-dir", f"quantize {M} -o {{bad}}/emptydir", INPUT),
    ("deploy-output-is-file", f"deploy {M} --no-bench -o {{bad}}/empty.onnx", INPUT),
    ("export-output-dir-missing", "results export -o no/such/dir/runs.json", INPUT),
    # -- bench inputs -----------------------------------------------------------------------------
    ("bench-missing-bundle", "bench {bad}/nope", INPUT),
    ("bench-dir-without-manifest", "bench {bad}/emptydir", INPUT),
    ("bench-corrupt-manifest", "bench {bad}/badbundle", INPUT),
    ("bench-unknown-variant", "bench {bundle} --variant int4", USAGE),
    ("bench-tampered-bundle", "bench {bundle_tampered}", INPUT),
    # -- results ----------------------------------------------------------------------------------
    ("results-show-unknown-id", "results show 424242", INPUT),
    ("results-show-not-a-number", "results show abc", USAGE),
    ("results-export-unknown-id", "results export 424242", INPUT),
    ("results-import-missing", "results import {bad}/nope.json", INPUT),
    ("results-import-not-json", "results import {bad}/not.json", INPUT),
    ("results-import-not-an-export", "results import {bad}/not_an_export.json", INPUT),
    ("results-import-future-schema", "results import {bad}/future_schema.json", INPUT),
    ("results-import-bad-record", "results import {bad}/bad_record.json", INPUT),
    ("results-import-a-directory", "results import {bad}", INPUT),
    ("results-list-zero-limit", "results list -n 0", USAGE),
    # -- inventories and devices ------------------------------------------------------------------
    ("devices-list-missing-inventory", "devices list --inventory {bad}/nope.toml", INPUT),
    ("devices-list-inventory-syntax", "devices list --inventory {bad}/syntax.toml", INPUT),
    ("devices-list-inventory-unknown-key", "devices list --inventory {bad}/inv_unknown_key.toml", INPUT),
    ("devices-list-inventory-shell-host", "devices list --inventory {bad}/inv_shell.toml", INPUT),
    ("devices-list-ini-shell-host", "devices list --inventory {bad}/inv_shell.ini", INPUT),
    ("devices-check-unknown-target", "devices check local --target no-such-board", INPUT),
    ("devices-check-unknown-name", "devices check -- -oProxyCommand=x", USAGE),
    ("devices-unlock-bad-name", "devices unlock 'a;touch PWNED'", USAGE),
    ("deploy-unknown-group", f"deploy {M} --no-bench --device @nogroup --inventory {{bad}}/inv_ok.toml", USAGE),
    ("bench-unreachable-device", "bench {bundle} --device nobody@127.0.0.1:1 --lock-wait 0", DEVICE),
    # -- issue 26: malformed inputs that were exit 1, hung, or were taken silently ------------------
    ("quantize-zero-size-weight", "quantize {bad}/zero_weight.onnx -o out.onnx", INPUT),
    ("quantize-inf-weight", "quantize {bad}/inf_weight.onnx -o out.onnx", INPUT),
    ("quantize-huge-weight", "quantize {bad}/huge_weight.onnx -o out.onnx", INPUT),
    ("quantize-nan-weight", "quantize {bad}/nan_weight.onnx -o out.onnx", INPUT),
    ("deploy-nan-weight", "deploy {bad}/nan_weight.onnx --no-bench -o bundle", INPUT),
    ("quantize-dev-zero-as-model", "quantize /dev/zero -o out.onnx", INPUT),
    ("quantize-fifo-as-model", "quantize {bad}/fifo.onnx -o out.onnx", INPUT),
    ("plan-fifo-as-model", "plan {bad}/fifo.onnx", INPUT),
    ("devices-list-ini-huge-range", "devices list --inventory {bad}/huge_range.ini", INPUT),
    ("devices-list-yaml-alias-cycle", "devices list --inventory {bad}/alias_cycle.yaml", INPUT),
    ("results-import-100000-deep", "results import {bad}/deep.json", INPUT),
    ("results-import-1e400", "results import {bad}/overflow.json", INPUT),
    ("report-100000-deep", "report {bad}/deep.json -o r.html", INPUT),
    ("labels-negative", f"quantize {M} -o out.onnx --calib {CAL} --eval {{ex}}/digits/heldout.npz --labels {{bad}}/labels_neg.npy", INPUT),
    ("labels-10-to-the-12", f"quantize {M} -o out.onnx --calib {CAL} --eval {{ex}}/digits/heldout.npz --labels {{bad}}/labels_big.npy", INPUT),
    ("labels-beyond-the-classes", f"quantize {M} -o out.onnx --calib {CAL} --eval {{ex}}/digits/heldout.npz --labels {{bad}}/labels_10.npy", INPUT),
    ("gate-accuracy-over-100", "bench {bundle} --fail accuracy:>200%", USAGE),
    ("ci-gate-accuracy-over-100", "ci -c {bad}/ci_gate200.toml --junit j.xml --summary s.md", INPUT),
    ("ci-targets-empty", "ci -c {bad}/ci_no_targets.toml --junit j.xml --summary s.md", INPUT),
    ("ci-non-onnx-model-writes-nothing", "ci -c {bad}/ci_not_onnx.toml --junit j.xml --summary s.md --report r.html", INPUT),
    # -- issue 26: outputs that are not regular files -----------------------------------------------
    ("export-output-is-a-device-node", "results export -o {bad}/null", INPUT),
    ("export-output-is-a-fifo", "results export -o {bad}/fifo.onnx", INPUT),
    ("export-output-dev-full", "results export -o /dev/full", INPUT),
    ("quantize-output-is-a-fifo", f"quantize {M} -o {{bad}}/fifo.onnx", INPUT),
    ("ci-junit-is-a-device-node", "ci -c {bad}/ci_gate200.toml --junit {bad}/null", INPUT),
]
XFAIL: dict[str, str] = {}


@pytest.fixture(scope="module")
def bad(tmp_path_factory) -> Path:
    from onnx import TensorProto, numpy_helper
    from onnx.helper import make_node
    from onnx.helper import make_tensor_value_info as vi

    d = tmp_path_factory.mktemp("bad-inputs")
    digits = (EXAMPLES / "digits" / "digits_cnn.onnx").read_bytes()
    (d / "empty.onnx").write_bytes(b"")
    (d / "corrupt.onnx").write_bytes(bytes(range(256)) * 8)
    (d / "truncated.onnx").write_bytes(digits[: len(digits) // 2])
    (d / "corrupt.tflite").write_bytes(b"\x1c\x00\x00\x00TFL3" + b"\xff" * 64)
    m = onnx.load_from_string(digits)
    m.opset_import[0].version = 999
    onnx.save(m, d / "opset999.onnx")
    w = numpy_helper.from_array(np.ones((5, 3), np.float32), "w")
    mm = [make_node("MatMul", ["x", "w"], ["y"])]
    onnx.save(onnx_model(mm, [vi("x", TensorProto.FLOAT, [1, 4])], [vi("y", TensorProto.FLOAT, [1, 3])], [w]), d / "badmatmul.onnx")
    onnx.save(onnx_model(mm, [vi("x", TensorProto.FLOAT, [1, 4])], [vi("y", TensorProto.FLOAT, None)], [w]), d / "nograph_output.onnx")
    onnx.save(onnx_model([], [vi("x", TensorProto.FLOAT, [1, 4])], [vi("x", TensorProto.FLOAT, [1, 4])]), d / "nonodes.onnx")
    relu = [make_node("Relu", ["x"], ["y"])]
    onnx.save(onnx_model(relu, [vi("x", TensorProto.FLOAT, ["N", 4])], [vi("y", TensorProto.FLOAT, ["N", 4])]), d / "dynamic.onnx")
    ext = onnx_model(mm, [vi("x", TensorProto.FLOAT, [1, 5])], [vi("y", TensorProto.FLOAT, [1, 3])], [w])
    onnx.save(ext, d / "external.onnx", save_as_external_data=True, all_tensors_to_one_file=True, location="w.data", size_threshold=0)
    (d / "w.data").unlink()
    # 3 GiB of external weights, as a sparse file: refused from the sizes, never read
    huge = onnx_model(mm, [vi("x", TensorProto.FLOAT, [1, 5])], [vi("y", TensorProto.FLOAT, [1, 3])], [w])
    onnx.save(huge, d / "huge.onnx", save_as_external_data=True, all_tensors_to_one_file=True, location="huge.data", size_threshold=0)
    with open(d / "huge.data", "r+b") as fh:
        fh.truncate(3 * 2**30)
    m = onnx.load(str(d / "huge.onnx"), load_external_data=False)
    for e in m.graph.initializer[0].external_data:
        if e.key == "length":
            e.value = str(3 * 2**30)
    onnx.save(m, d / "huge.onnx")

    (d / "syntax.toml").write_text('schema = 1\nname = "x\n')
    rpi4 = (Path(__file__).resolve().parents[1] / "edgekit" / "profiles" / "rpi4.toml").read_text()
    (d / "unknown_key.toml").write_text(rpi4.replace('name = "rpi4"', 'name = "unknown_key"\nturbo = true'))
    (d / "wrong_type.toml").write_text(rpi4.replace('name = "rpi4"', 'name = "wrong_type"').replace("cores = 4", 'cores = "four"'))

    x = np.random.default_rng(0).standard_normal((8, 1, 8, 8)).astype(np.float32)
    nan = x.copy()
    nan[5, 0, 2, 2] = np.nan
    np.savez(d / "nan.npz", input=nan)
    inf = x.copy()
    inf[3] = np.inf
    np.save(d / "inf.npy", inf)
    (d / "nanfolder").mkdir()
    for i in range(3):
        np.savez(d / "nanfolder" / f"s{i}.npz", input=nan[i + 4 : i + 5])
    np.savez(d / "wrong_shape.npz", input=x[:, :, :7, :])
    np.savez(d / "wrong_key.npz", image=x)
    np.savez(d / "uint8.npz", input=(x * 10).astype(np.uint8))
    (d / "data.csv").write_text("1,2,3\n")
    (d / "corrupt.npz").write_bytes(b"PK\x03\x04" + b"\x00" * 40)
    (d / "emptydir").mkdir()
    np.save(d / "labels10.npy", np.arange(10))
    np.save(d / "labels_float.npy", np.zeros(360, np.float32))

    (d / "badbundle").mkdir()
    (d / "badbundle" / "manifest.json").write_text("{not json")

    (d / "not.json").write_text("[{]")
    (d / "not_an_export.json").write_text(json.dumps({"schema": 1, "records": []}))
    (d / "future_schema.json").write_text(json.dumps({"kind": "edgekit.results", "schema": 999, "records": []}))
    (d / "bad_record.json").write_text(json.dumps({"kind": "edgekit.results", "schema": 1, "records": [{"latencies_ns": "fast"}]}))

    (d / "inv_unknown_key.toml").write_text('[devices.pi1]\nssh = "pi@10.0.0.7"\ncolour = "red"\n')
    (d / "inv_shell.toml").write_text('[devices.pi1]\nssh = "lab-1;touch${IFS}PWNED;"\n')
    (d / "inv_shell.ini").write_text("[pis]\npi1 ansible_host='a;touch PWNED'\n")
    (d / "inv_ok.toml").write_text('[devices.pi1]\nssh = "pi@10.0.0.7"\n')

    # issue 26
    def matmul(weight: np.ndarray, name: str) -> None:
        k, n = weight.shape
        nodes = [make_node("MatMul", ["x", "w"], ["y"])]
        model = onnx_model(nodes, [vi("x", TensorProto.FLOAT, [1, k])], [vi("y", TensorProto.FLOAT, [1, n])], [numpy_helper.from_array(weight, "w")])
        onnx.save(model, d / name)

    ones = np.ones((4, 3), np.float32)
    matmul(np.ones((4, 0), np.float32), "zero_weight.onnx")
    for name, value in (("inf_weight.onnx", np.inf), ("huge_weight.onnx", 2.6e35), ("nan_weight.onnx", np.nan)):
        w = ones.copy()
        w[1, 2] = value
        matmul(w, name)
    os.mkfifo(d / "fifo.onnx")  # read, it would block for ever; written, replaced by a file
    if os.geteuid() == 0:
        os.mknod(d / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # what /dev/null is
    else:
        os.mkfifo(d / "null")
    (d / "huge_range.ini").write_text("[pis]\npi[0:99999999]\n")
    (d / "alias_cycle.yaml").write_text("all:\n  hosts:\n    pi1: &vars\n      again: *vars\n")
    (d / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    export = {"kind": "edgekit.results", "schema": 1, "records": [{"latencies_ns": [1e400]}]}
    (d / "overflow.json").write_text(json.dumps(export).replace("Infinity", "1e400"))
    np.save(d / "labels_neg.npy", np.full(360, -1, np.int64))
    np.save(d / "labels_big.npy", np.full(360, 10**12, np.int64))
    np.save(d / "labels_10.npy", np.full(360, 10, np.int64))  # the digits model has classes 0..9
    digits_path = EXAMPLES / "digits" / "digits_cnn.onnx"
    (d / "ci_gate200.toml").write_text(f'[[models]]\npath = "{digits_path}"\ngates = ["accuracy:>200%"]\n')
    (d / "ci_no_targets.toml").write_text(f'[[models]]\npath = "{digits_path}"\ntargets = []\n')
    (d / "ci_not_onnx.toml").write_text('[[models]]\npath = "corrupt.onnx"\n')
    return d


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, Path]:
    """A real bundle of the digits model (float only, not quantized) and a tampered copy."""
    d = tmp_path_factory.mktemp("bundles")
    env = {**os.environ, "CI": "1", "EDGEKIT_DATA_DIR": str(d / "data"), "EDGEKIT_CONFIG_DIR": str(d / "cfg"), "EDGEKIT_CACHE_DIR": str(d / "cache")}
    subprocess.run(
        [sys.executable, "-m", "edgekit", "deploy", EXAMPLES / "digits" / "digits_cnn.onnx", "--no-quantize", "--no-bench", "-o", d / "b"],
        check=True, capture_output=True, env=env, cwd=d, timeout=300,
    )  # fmt: skip
    tampered = d / "tampered"
    shutil.copytree(d / "b", tampered)
    model = next(p for p in tampered.rglob("model.onnx"))
    model.write_bytes(model.read_bytes()[:-10] + b"0123456789")
    return {"bundle": d / "b", "bundle_tampered": tampered}


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture(scope="module")
def runs(request, bad, bundles, tmp_path_factory) -> dict[str, tuple[CliResult, set[str]]]:
    """Each selected row's CLI result and what its (initially empty) working directory held afterwards."""
    root = tmp_path_factory.mktemp("runs")
    selected = {item.callspec.params.get("name") for item in request.session.items if hasattr(item, "callspec")}
    cases = [c for c in CASES if c[0] in selected]
    before = _tree(bad)

    def run(case: tuple[str, str, int]) -> tuple[CliResult, set[str]]:
        name, argv, _code = case
        work, home = root / name / "work", root / name / "home"
        work.mkdir(parents=True)
        env = {**os.environ, "CI": "1"}
        env.pop("EDGEKIT_DEBUG", None)
        for var in ("EDGEKIT_DATA_DIR", "EDGEKIT_CONFIG_DIR", "EDGEKIT_CACHE_DIR"):
            (home / var).mkdir(parents=True)
            env[var] = str(home / var)
        args = [a.format(bad=bad, ex=EXAMPLES, **bundles) for a in shlex.split(argv)]
        proc = subprocess.run([sys.executable, "-m", "edgekit", *args], cwd=work, env=env, capture_output=True, text=True, timeout=300)
        return CliResult(proc.returncode, proc.stdout, proc.stderr), _tree(work)

    with ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 2))) as pool:
        out = dict(zip((c[0] for c in cases), pool.map(run, cases)))
    assert _tree(bad) == before, "a bad-input run wrote into the inputs folder"
    return out


@pytest.mark.parametrize(
    ("name", "code"),
    [pytest.param(i, c, id=i, marks=[pytest.mark.xfail(strict=True, reason=XFAIL[i])] if i in XFAIL else []) for i, _a, c in CASES],
)
def test_bad_input(runs, name, code):
    result, left = runs[name]
    assert_one_line_error(result, code)
    assert not left, f"left in the working directory: {sorted(left)}"


def test_the_table_is_big_enough():
    assert len(CASES) >= 60 and len({c[0] for c in CASES}) == len(CASES)
