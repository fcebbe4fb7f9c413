"""Quantize once: an unchanged redeploy reuses the int8 model, and a fleet quantizes once for all its devices."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgekit.quantize import cache as qcache
from tests.conftest import EXAMPLES

DIGITS = EXAMPLES / "digits" / "digits_cnn.onnx"


@pytest.mark.slow
def test_unchanged_redeploy_reuses_the_quantization(cli, tmp_path):
    first = cli("deploy", DIGITS, "--no-bench", "--json", "-o", tmp_path / "b")
    assert first.returncode == 0, first.stderr
    again = cli("deploy", DIGITS, "--no-bench", "--json", "-o", tmp_path / "b")
    assert again.returncode == 0, again.stderr
    a, b = json.loads(first.stdout), json.loads(again.stdout)
    assert not a["quantize"]["cached"] and b["quantize"]["cached"]
    assert "reusing the cached quantization" in again.stderr and "quantizing" not in again.stderr
    assert a["bundle"]["hash"] == b["bundle"]["hash"]  # the same int8 model, byte for byte
    assert a["quantize"]["agreement"] == b["quantize"]["agreement"]
    # anything that decides the int8 model changes the key: here the calibration method
    other = cli("deploy", DIGITS, "--no-bench", "--json", "--method", "percentile", "-o", tmp_path / "c")
    assert other.returncode == 0 and not json.loads(other.stdout)["quantize"]["cached"]


def test_a_damaged_cache_entry_is_rebuilt_not_trusted(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKIT_CACHE_DIR", str(tmp_path))
    (tmp_path / "quantized" / "abc").mkdir(parents=True)
    (tmp_path / "quantized" / "abc" / qcache.REPORT).write_text("{not json")
    assert qcache.load("abc") is None
    assert qcache.load("missing") is None


@pytest.mark.slow
def test_a_fleet_quantizes_once(cli, tmp_path):
    (tmp_path / "devices.toml").write_text(
        "".join(f'[devices.dev{i}]\nssh = "local"\nworkdir = "{tmp_path / f"dev{i}"}"\n' for i in range(3))
    )
    r = cli("deploy", DIGITS, "--device", "dev0", "--device", "dev1", "--device", "dev2", "--iterations", "5", "--json", "-o", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("quantizing digits_cnn.onnx") == 1, r.stderr
    outcomes = json.loads(r.stdout)
    assert [o["status"] for o in outcomes] == ["ok"] * 3
    hashes = {o["result"]["bundle"]["hash"] for o in outcomes}
    assert len(hashes) == 1  # one int8 model for all three


def test_mixed_precision_asks_are_part_of_the_key(tmp_path):
    from edgekit.quantize import SCHEMES, FeedSet

    cal = FeedSet([{"x": np.full((1, 4), i, np.float32)} for i in range(3)], "cal")
    held = FeedSet([{"x": np.ones((1, 4), np.float32)}], "held")
    scheme = SCHEMES["onnxruntime"]

    def k(**kw):
        return qcache.key("sha", scheme, "minmax", (), cal, held, **kw)

    module = tmp_path / "m.py"
    module.write_text("def f(r, q):\n    return 1.0\n")
    keys = {k(), k(max_drop=1.0), k(max_drop=2.0), k(max_drop=1.0, metric="ctc"), k(max_drop=1.0, metric=f"{module}:f")}
    assert len(keys) == 5
    assert k(max_drop=1.0, metric="ctc") == k(max_drop=1.0, metric="ctc")
    before = k(max_drop=1.0, metric=f"{module}:f")
    module.write_text("def f(r, q):\n    return 2.0\n")  # the metric's source decides the model too
    assert k(max_drop=1.0, metric=f"{module}:f") != before


def test_the_quantizers_own_source_is_part_of_the_key(tmp_path, monkeypatch):
    from edgekit.quantize import SCHEMES, FeedSet

    cal = FeedSet([{"x": np.zeros((1, 4), np.float32)}], "cal")
    scheme = SCHEMES["onnxruntime"]
    before = qcache.key("sha", scheme, "minmax", (), cal, cal)
    # a checkout whose quantizer code differs (here: a copy with one file edited) keys differently
    src = tmp_path / "quantize"
    src.mkdir()
    for path in qcache.Path(qcache.__file__).parent.glob("*.py"):
        (src / path.name).write_bytes(path.read_bytes())
    (src / "calib.py").write_bytes((src / "calib.py").read_bytes() + b"\n# edited\n")
    monkeypatch.setattr(qcache, "__file__", str(src / "cache.py"))
    qcache.code_digest.cache_clear()
    try:
        assert qcache.key("sha", scheme, "minmax", (), cal, cal) != before
    finally:
        qcache.code_digest.cache_clear()
