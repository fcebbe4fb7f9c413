"""Timing a variant in several agent processes (``--rounds``, profile ``bench.rounds``): the plan
alternates the variants round by round, the host merges each variant's documents, and the
spread between the processes counts as the runs' noise when they are compared."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgekit.bench.compare import compare, latency_change, run_noise
from edgekit.bench.record import (
    make_record,
    measurement_warnings,
    merge_rounds,
    round_slices,
    validate_record,
)
from edgekit.bench.verdict import int8_verdict
from edgekit.errors import EXIT_USAGE, AgentError, ResultsError
from edgekit.modelio import load_model
from edgekit.plan import Bench, make_plan, step_dict
from edgekit.profiles import load_profile
from tests.builders import bench_doc
from tests.conftest import EXAMPLES, assert_one_line_error

DIGITS = EXAMPLES / "digits" / "digits_cnn.onnx"
PROBE = {"loop": "python-sum-200", "ns": 5000, "bursts": 40}


def _samples(n: int, median_ns: float, seed: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).lognormal(np.log(median_ns), 0.03, n)]


def _round(median_ns: float, seed: int, n: int = 400, **over) -> dict:
    fields = {"speed_probe": dict(PROBE), "energy": {"source": "rapl", "joules": 0.5, "mj_per_inference": 1.25}, **over}
    return bench_doc(_samples(n, median_ns, seed), **fields)


# -- merging the documents of one variant's rounds -------------------------------------------
def test_merge_keeps_every_sample_in_order_and_each_rounds_share():
    docs = [
        _round(1e6, 1, started_at="2025-03-01T10:00:00Z", peak_rss_bytes=80 * 2**20),
        _round(1.1e6, 2, n=300, started_at="2025-03-01T10:00:02Z", peak_rss_bytes=90 * 2**20, speed_probe={**PROBE, "ns": 5300}),
        _round(1e6, 3, started_at="2025-03-01T10:00:04Z", peak_rss_bytes=85 * 2**20, speed_probe={**PROBE, "ns": 5100}),
    ]
    docs[2]["device_state"] = {"before": {"temp_c": 50.0}, "after": {"temp_c": 61.0}}
    merged = merge_rounds(docs)
    assert merged["samples_ns"] == docs[0]["samples_ns"] + docs[1]["samples_ns"] + docs[2]["samples_ns"]
    assert [r["samples"] for r in merged["rounds"]] == [400, 300, 400]
    assert [r["started_at"] for r in merged["rounds"]] == ["2025-03-01T10:00:00Z", "2025-03-01T10:00:02Z", "2025-03-01T10:00:04Z"]
    assert [r["speed_probe_ns"] for r in merged["rounds"]] == [5000, 5300, 5100]
    assert merged["speed_probe"] == {"loop": "python-sum-200", "ns": 5100, "bursts": 120}  # the median round
    assert merged["peak_rss_bytes"] == 90 * 2**20
    assert merged["energy"] == {"source": "rapl", "joules": 1.5, "mj_per_inference": pytest.approx(1.5 * 1000 / 1100)}
    assert merged["device_state"] == {"before": docs[0]["device_state"]["before"], "after": {"temp_c": 61.0}}
    assert merged["load_ns"] == docs[0]["load_ns"] and merged["started_at"] == docs[0]["started_at"]
    assert [len(s) for s in round_slices(merged)] == [400, 300, 400]
    record = make_record(merged, model_name="m", target="rpi5", device="pi")
    assert record["stats"]["n"] == 1100
    assert merge_rounds(docs[:1]) == docs[0] and "rounds" not in merge_rounds(docs[:1])


def test_merge_drops_what_the_rounds_do_not_share():
    a, b = _round(1e6, 1), _round(1e6, 2, energy=None, speed_probe=None)
    merged = merge_rounds([a, b])
    assert merged["energy"] is None and merged["speed_probe"] is None  # not one round's figure passed off as all of them


@pytest.mark.parametrize(
    "field, value", [("variant", "fp32"), ("bundle_hash", "f" * 64), ("backend_version", "1.30.0"), ("backend", "openvino")]
)
def test_merge_refuses_rounds_of_different_things(field, value):
    with pytest.raises(AgentError, match=f"differ in {field}"):
        merge_rounds([_round(1e6, 1), _round(1e6, 2, **{field: value})])
    other = _round(1e6, 3)
    other["config"] = {**other["config"], "threads": 1}  # the first round's probe chose 2: later rounds must time 2
    with pytest.raises(AgentError, match="differ in config.threads"):
        merge_rounds([_round(1e6, 1), other])


@pytest.mark.parametrize(
    "rounds", [[{"samples": 400}], [{"samples": 400}, {"samples": 398}], [{"samples": 799}, {"samples": 0}], "2", [{"n": 1}, {"n": 2}]]
)
def test_a_record_whose_rounds_do_not_add_up_is_refused(rounds):
    record = make_record(merge_rounds([_round(1e6, 1), _round(1e6, 2, n=399)]), model_name="m", target="rpi5", device="pi")
    assert [r["samples"] for r in validate_record(record)["agent"]["rounds"]] == [400, 399]
    record["agent"]["rounds"] = rounds
    with pytest.raises(ResultsError, match="'agent.rounds'"):
        validate_record(record)


# -- the spread between processes is noise ---------------------------------------------------
def test_the_spread_between_processes_counts_as_noise():
    one = {"samples_ns": _samples(1200, 1e6, 1)}
    assert run_noise(one) < 0.01
    # three processes of one build: the middle one ran 20 % slower (per-process effects)
    rounds = merge_rounds([_round(1e6, 1), _round(1.2e6, 2), _round(1e6, 3)])
    assert run_noise(rounds) == pytest.approx(0.1 / 1.02, abs=0.01)
    # another build at +10 %: about 7 % above the merged p50, beyond the 5 % floor but within the processes' spread
    other = merge_rounds([_round(1.1e6, 4), _round(1.1e6, 5), _round(1.1e6, 6)])
    change = latency_change(rounds, other)
    assert change.outside_ci and 0.05 < change.change < run_noise(rounds) <= change.floor
    assert change.verdict == "no change" and "spread between processes" in change.why()
    # one process each (the first of either): the same +10 % is called a slowdown, the spread unseen
    assert latency_change(_round(1e6, 1), _round(1.1e6, 4)).verdict == "slower"
    # a real slowdown still stands out
    slow = merge_rounds([_round(1.5e6, 7), _round(1.5e6, 8), _round(1.5e6, 9)])
    assert latency_change(rounds, slow).verdict == "slower"
    a, b = (make_record(d, model_name="m", target="rpi5", device="pi") for d in (rounds, slow))
    assert compare(a, b).row("p50").verdict == "slower"


def test_warnings_see_drift_within_a_process_not_steps_between_them():
    steps = merge_rounds([_round(1e6, 1), _round(1.08e6, 2)])
    assert measurement_warnings(steps) == ["rounds: p50 0.998-1.08 ms across the 2 processes (counted as noise when runs are compared)"]
    drifting = _round(1e6, 3)
    drifting["samples_ns"] = [int(s * (1 + 0.2 * i / 400)) for i, s in enumerate(drifting["samples_ns"])]
    lines = measurement_warnings(merge_rounds([_round(1e6, 4), drifting]))
    assert any(line.startswith("drift: p50 +") for line in lines)
    assert measurement_warnings(merge_rounds([_round(1e6, 5), _round(1.01e6, 6)])) == []


# -- the int8 verdict wants int8 faster in every round ----------------------------------------
def test_the_int8_verdict_looks_at_every_round():
    agreement = {"accuracy_drop": 0.0}
    fp32, int8 = _samples(1200, 2e6, 1), _samples(1200, 1e6, 2)
    v = int8_verdict("fp32", fp32, int8, agreement, 0.01, rounds=(1.9, 2.1, 2.0))
    assert v.recommended == "int8" and "per round 1.90x, 2.10x, 2.00x" in v.reasons[0]
    assert v.to_dict()["speedup_rounds"] == [1.9, 2.1, 2.0]
    # the merged samples say 2x, but one round's int8 process was no faster than its fp32 one
    v = int8_verdict("fp32", fp32, int8, agreement, 0.01, rounds=(2.6, 0.98, 2.5))
    assert v.recommended == "fp32" and v.checks["faster"] is False
    assert v.reasons[0].startswith("int8 was not faster than fp32 in every round")
    assert int8_verdict("fp32", fp32, int8, agreement, 0.01).to_dict()["speedup_rounds"] is None


# -- the plan alternates the variants ---------------------------------------------------------
def test_the_plan_alternates_variants_round_by_round():
    plan = make_plan(load_model(DIGITS), load_profile("local"), rounds=3)
    benches = [s for s in plan.steps if isinstance(s, Bench)]
    assert [(s.variant.name, s.round) for s in benches] == [("fp32", 1), ("int8", 1), ("fp32", 2), ("int8", 2), ("fp32", 3), ("int8", 3)]
    assert all(s.config.rounds == 3 for s in benches)
    assert "round 1 of 3" in benches[0].detail and "round 3 of 3" in benches[-1].detail
    assert [step_dict(s)["round"] for s in benches] == [1, 1, 2, 2, 3, 3]
    one = make_plan(load_model(DIGITS), load_profile("local"))
    assert [(s.variant.name, s.round) for s in one.steps if isinstance(s, Bench)] == [("fp32", 1), ("int8", 1)]


def test_bad_rounds_on_the_command_line(cli):
    for bad in ("0", "two", "101"):
        r = cli("bench", DIGITS, "--rounds", bad)
        assert_one_line_error(r, EXIT_USAGE, "--rounds")
        assert r.stdout == ""


# -- for real: a local deploy in rounds ---------------------------------------------------------
@pytest.mark.slow
def test_a_deploy_in_rounds_measures_each_variant_in_separate_processes(cli, tmp_path):
    args = ("deploy", DIGITS, "--iterations", "200", "--warmup", "5", "--rounds", "3", "-o", tmp_path / "b", "--json")
    planned = json.loads(cli(*args, "--dry-run").stdout)["plan"]["steps"]
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    executed = doc["executed_steps"]
    assert [(s["name"], s.get("variant", {}).get("name"), s.get("round")) for s in executed] == [
        (s["name"], s.get("variant", {}).get("name"), s.get("round")) for s in planned
    ]
    assert [(s["variant"]["name"], s["round"]) for s in executed if s["name"] == "bench"] == [
        ("fp32", 1), ("int8", 1), ("fp32", 2), ("int8", 2), ("fp32", 3), ("int8", 3)
    ]  # fmt: skip
    assert len(doc["runs"]) == 2  # one record per variant
    per_round = doc["summary"]["recommendation"]["speedup_rounds"]
    assert len(per_round) == 3 and all(r > 0 for r in per_round)
    for run in doc["runs"]:
        shown = json.loads(cli("results", "show", str(run["id"]), "--json", "--samples").stdout)
        agent = shown["agent"]
        assert [x["samples"] for x in agent["rounds"]] == [200, 200, 200] and len(agent["samples_ns"]) == 600
        starts = [x["started_at"] for x in agent["rounds"]]
        assert starts == sorted(starts) and len(set(starts)) == 3  # three processes, one after another
        if agent["backend"] == "native":  # ekrt's runner times itself in its own process: no loop
            assert agent["speed_probe"] is None and all(x["speed_probe_ns"] is None for x in agent["rounds"])
        else:
            assert agent["speed_probe"]["bursts"] >= 3 and all(x["speed_probe_ns"] > 0 for x in agent["rounds"])
        assert shown["stats"]["n"] == 600
    human = cli("results", "show", str(doc["runs"][0]["id"]))
    assert "3 agent processes, p50 " in human.stdout, human.stdout
    # an unchanged redeploy reuses both merged runs and measures nothing
    again = json.loads(cli(*args).stdout)
    assert [x["reused"] for x in again["runs"]] == [True, True]
    assert [x["id"] for x in again["runs"]] == [x["id"] for x in doc["runs"]]
