"""Measure once: an unchanged redeploy reuses the identical earlier measurement, and says so."""

from __future__ import annotations

import json
import sqlite3

import pytest

from edgekit.bench import reuse
from edgekit.bench.store import default_db_path
from edgekit.fsutil import cache_dir
from tests.conftest import EXAMPLES

DIGITS = EXAMPLES / "digits" / "digits_cnn.onnx"
CALIB = EXAMPLES / "digits" / "calib.npz"


def _stored_runs() -> int:
    with sqlite3.connect(default_db_path()) as conn:
        return conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0]


def _deploy(cli, out, *extra):
    r = cli("deploy", DIGITS, "--iterations", "5", "--warmup", "1", "--no-layers", "-o", out, "--json", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), r.stderr


@pytest.mark.slow
def test_an_unchanged_redeploy_reuses_the_runs_and_says_so(cli, tmp_path):
    first, _ = _deploy(cli, tmp_path / "b")
    assert [r["reused"] for r in first["runs"]] == [False, False]
    assert _stored_runs() == 2
    again, err = _deploy(cli, tmp_path / "b")
    assert [r["reused"] for r in again["runs"]] == [True, True]
    assert [r["id"] for r in again["runs"]] == [r["id"] for r in first["runs"]]
    assert [r["stats"] for r in again["runs"]] == [r["stats"] for r in first["runs"]]  # the very numbers, not new ones
    assert [r["measured"] for r in again["runs"]] == [r["measured"] for r in first["runs"]]
    assert _stored_runs() == 2  # nothing measured, nothing stored twice
    assert err.count("reusing it (--remeasure to measure again)") == 2
    assert again["summary"]["agreement"] == first["summary"]["agreement"]  # from the cached device outputs
    assert again["summary"]["recommended"] == first["summary"]["recommended"]
    assert [s["name"] for s in again["executed_steps"]] == [s["name"] for s in first["executed_steps"]]
    assert all(s["reuse"] for s in again["executed_steps"] if s["name"] in ("bench", "eval"))
    human = cli("deploy", DIGITS, "--iterations", "5", "--warmup", "1", "--no-layers", "-o", tmp_path / "b")
    assert human.returncode == 0, human.stderr
    assert "measurements reused: run(s) 1, 2, measured" in human.stdout, human.stdout

    fresh, _ = _deploy(cli, tmp_path / "b", "--remeasure")
    assert [r["reused"] for r in fresh["runs"]] == [False, False] and _stored_runs() == 4
    plan = json.loads(cli("deploy", DIGITS, "--remeasure", "--dry-run", "--json").stdout)["plan"]
    assert not any(s.get("reuse") for s in plan["steps"])
    # the newest identical measurement is the one reused next
    latest, _ = _deploy(cli, tmp_path / "b")
    assert [r["id"] for r in latest["runs"]] == [r["id"] for r in fresh["runs"]]


@pytest.mark.slow
def test_what_changes_the_measurement_measures_again(cli, tmp_path):
    _deploy(cli, tmp_path / "b")
    other, _ = _deploy(cli, tmp_path / "b", "--threads", "1")  # another bench setting
    assert [r["reused"] for r in other["runs"]] == [False, False]
    labelled, _ = _deploy(cli, tmp_path / "c", "--eval", CALIB)  # another bundle (other held-out samples)
    assert not any(r["reused"] for r in labelled["runs"])
    assert labelled["bundle"]["hash"] != other["bundle"]["hash"]
    # all or nothing: without one eval's outputs in the cache, both variants are measured again
    for p in cache_dir("measurements").glob("*.npz"):  # the benches' runs are still in the store
        p.unlink()
    again, _ = _deploy(cli, tmp_path / "c", "--eval", CALIB)
    assert [r["reused"] for r in again["runs"]] == [False, False]


@pytest.mark.slow
def test_bench_and_gated_deploys_always_measure(cli, tmp_path):
    _deploy(cli, tmp_path / "b")
    gated, _ = _deploy(cli, tmp_path / "b", "--fail", "p50:<1000ms")
    assert [r["reused"] for r in gated["runs"]] == [False, False]
    before = _stored_runs()
    bench = cli("bench", DIGITS, "--iterations", "3", "--json")
    assert bench.returncode == 0, bench.stderr
    assert [r["id"] for r in json.loads(bench.stdout)] == [before + 1] and _stored_runs() == before + 1


def _facts(**device) -> dict:
    base = {"arch": "aarch64", "cpu_model": "Cortex-A76", "cores": 4, "isa": ["asimd", "asimddp"], "kernel": "6.6", "runtimes": {"onnxruntime": "1.20.0"}}
    return {
        "agent_version": "0.1.0",
        "device": {**base, **device},
        "device_state": {"governor": "performance", "temp_c": 41.0, "freq_mhz": 2400, "freq_max_mhz": 2400},
        "probe": {"memory_available_bytes": 1 << 30, "python": {"executable": "/usr/bin/python3"}, "libc": {"name": "glibc"}},
    }


def test_the_key_follows_the_device_not_its_momentary_state():
    def k(facts, **over):
        args = {"bundle_hash": "b" * 64, "variant": {"name": "int8"}, "settings": {"iterations": 100}, "device": "pi1", "facts": facts, "agent": "/a.pyz"}
        return reuse.key("bench", **{**args, **over})

    base = k(_facts())
    hot = _facts()
    hot["device_state"].update(temp_c=79.0, freq_mhz=1500)  # a warm board is the same board
    hot["probe"]["memory_available_bytes"] = 1 << 20
    assert k(hot) == base
    governor = _facts()
    governor["device_state"]["governor"] = "powersave"
    changed = [
        k(_facts(runtimes={"onnxruntime": "1.21.0"})), k(_facts(kernel="6.12")), k(_facts(isa=["asimd"])), k(governor),
        k(_facts(), device="pi2"), k(_facts(), bundle_hash="c" * 64), k(_facts(), settings={"iterations": 50}), k(_facts(), agent="/b.pyz"),
    ]  # fmt: skip
    assert base not in changed and len(set(changed)) == len(changed)
    assert reuse.key("eval", bundle_hash="b" * 64, variant={"name": "int8"}, settings={"iterations": 100}, device="pi1", facts=_facts(), agent="/a.pyz") != base
