from __future__ import annotations

import copy
import json
import sqlite3
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from edgekit.bench.record import RECORD_SCHEMA, make_record, validate_record
from edgekit.bench.stats import Stats
from edgekit.bench.store import DB_SCHEMA_VERSION, ResultsStore, default_db_path
from edgekit.errors import EXIT_DEVICE, EXIT_INPUT, AgentError, ResultsError
from tests.builders import bench_doc, bench_record

# -- make_record / validate_record -------------------------------------------------------


def test_make_record_wraps_the_agent_document():
    doc = bench_doc()
    rec = make_record(
        doc,
        model_name="resnet18",
        target="rpi5",
        device="pi@10.0.0.7",
        extra={"profile": "rpi5.toml"},
    )
    assert rec["schema"] == RECORD_SCHEMA
    assert len(rec["run_uuid"]) == 32 and int(rec["run_uuid"], 16) >= 0
    created = datetime.fromisoformat(rec["created"])
    assert created.utcoffset().total_seconds() == 0
    assert abs((datetime.now(timezone.utc) - created).total_seconds()) < 60
    assert (rec["model_name"], rec["target"], rec["device"]) == ("resnet18", "rpi5", "pi@10.0.0.7")
    assert rec["stats"] == Stats.from_samples(doc["samples_ns"]).to_dict()
    assert rec["stats"]["p50"] == 3.0
    assert rec["agent"] == doc
    assert rec["profile"] == "rpi5.toml"
    doc["samples_ns"].append(1)  # the record holds its own copy
    assert len(rec["agent"]["samples_ns"]) == 5


def test_make_record_uses_batch_for_throughput():
    doc = bench_doc(samples=[4_000_000] * 3)
    doc["config"]["batch"] = 8
    rec = make_record(doc, model_name="m", target="t", device="d")
    assert rec["stats"]["throughput"] == pytest.approx(2000.0)


def test_each_record_gets_its_own_uuid():
    assert bench_record()["run_uuid"] != bench_record()["run_uuid"]


def test_extra_cannot_overwrite_record_fields():
    with pytest.raises(ValueError, match="stats"):
        make_record(bench_doc(), model_name="m", target="t", device="d", extra={"stats": {}})


@pytest.mark.parametrize("field", ["model_name", "target", "device"])
def test_make_record_needs_host_fields(field):
    host = {"model_name": "m", "target": "t", "device": "d", field: ""}
    with pytest.raises(ValueError, match=field):
        make_record(bench_doc(), **host)


def _without(key):
    doc = bench_doc()
    del doc[key]
    return doc


def _config(**kv):
    doc = bench_doc()
    doc["config"].update(kv)
    return doc


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        (_without("samples_ns"), "samples_ns"),
        (bench_doc(samples=[]), "samples_ns"),
        (bench_doc(samples=[1_000, 0]), "samples_ns"),
        (bench_doc(samples=[1_000, -5]), "samples_ns"),
        (bench_doc(samples=[1_000, 2.5]), "samples_ns"),
        (bench_doc(samples=[1_000, True]), "samples_ns"),
        (bench_doc(samples="1000"), "samples_ns"),
        (_without("kind"), "kind"),
        (bench_doc(kind="something.else"), "kind"),
        (bench_doc(schema="1"), "schema"),
        (_without("backend"), "backend"),
        (bench_doc(precision=""), "precision"),
        (_without("variant"), "variant"),
        (_without("config"), "config"),
        (_config(batch=0), "config.batch"),
        (_config(batch=None), "config.batch"),
        (_without("device"), "device"),
        (bench_doc(bundle_hash=12), "bundle_hash"),
        (bench_doc(load_ns=-1), "load_ns"),
        (bench_doc(peak_rss_bytes="85M"), "peak_rss_bytes"),
        (bench_doc(device_state=[]), "device_state"),
        (bench_doc(speed_probe={"loop": "python-sum-200", "ns": 0, "bursts": 3}), "speed_probe"),
        (bench_doc(speed_probe={"loop": "python-sum-200", "ns": 5000, "bursts": 2.5}), "speed_probe"),
        (bench_doc(speed_probe={"ns": 5000, "bursts": 3}), "speed_probe"),
        (bench_doc(speed_probe=5000), "speed_probe"),
    ],
)
def test_make_record_names_the_bad_agent_field(doc, field):
    with pytest.raises(AgentError) as info:
        make_record(doc, model_name="m", target="t", device="d")
    assert f"'{field}'" in info.value.message
    assert info.value.hint
    assert info.value.exit_code == EXIT_DEVICE


def test_make_record_refuses_a_newer_agent_schema():
    with pytest.raises(AgentError, match="schema 2 is newer"):
        make_record(bench_doc(schema=2), model_name="m", target="t", device="d")


def test_make_record_refuses_a_non_object():
    with pytest.raises(AgentError, match="JSON object"):
        make_record(["not", "a", "doc"], model_name="m", target="t", device="d")  # type: ignore[arg-type]


def test_optional_agent_fields_may_be_null_or_absent():
    doc = bench_doc(load_ns=None, bundle_hash=None, backend_version=None, device_state=None)
    del doc["peak_rss_bytes"], doc["layers"], doc["started_at"]
    rec = make_record(doc, model_name="m", target="t", device="d")
    assert rec["agent"]["bundle_hash"] is None


def test_validate_record_round_trips_and_normalises():
    rec = bench_record()
    assert validate_record(json.loads(json.dumps(rec))) == rec
    other = copy.deepcopy(rec)
    other["run_uuid"] = "12345678-1234-5678-1234-567812345678"
    other["created"] = "2025-03-01T12:00:00+02:00"
    other["stats"] = {"p50": 0.001}  # derived data: recomputed from the raw samples
    out = validate_record(other)
    assert out["run_uuid"] == "12345678123456781234567812345678"
    assert out["created"] == "2025-03-01T10:00:00.000000+00:00"
    assert out["stats"] == rec["stats"]
    assert validate_record({**rec, "created": "2025-03-01T10:00:00Z"})["created"] == out["created"]


def _set(path, value):
    rec = bench_record()
    target = rec
    *parents, last = path.split(".")
    for key in parents:
        target = target[key]
    if value is KeyError:
        del target[last]
    else:
        target[last] = value
    return rec


@pytest.mark.parametrize(
    ("rec", "field"),
    [
        (_set("schema", "1"), "schema"),
        (_set("schema", 0), "schema"),
        (_set("run_uuid", "not-a-uuid"), "run_uuid"),
        (_set("run_uuid", KeyError), "run_uuid"),
        (_set("created", "yesterday"), "created"),
        (_set("created", "2025-03-01T10:00:00"), "created"),  # no UTC offset
        (_set("model_name", ""), "model_name"),
        (_set("target", None), "target"),
        (_set("device", 7), "device"),
        (_set("stats", [1, 2]), "stats"),
        (_set("agent", KeyError), "agent"),
        (_set("agent.samples_ns", []), "agent.samples_ns"),
        (_set("agent.kind", "edgekit.other"), "agent.kind"),
        (_set("agent.config.batch", -1), "agent.config.batch"),
    ],
)
def test_validate_record_names_the_bad_field(rec, field):
    with pytest.raises(ResultsError) as info:
        validate_record(rec)
    assert f"'{field}'" in info.value.message
    assert info.value.hint
    assert info.value.exit_code == EXIT_INPUT


def test_validate_record_refuses_a_newer_schema():
    with pytest.raises(ResultsError, match="newer"):
        validate_record({**bench_record(), "schema": RECORD_SCHEMA + 1})


# -- the store ---------------------------------------------------------------------------


def test_default_db_path_follows_edgekit_data_dir(edgekit_home):
    assert default_db_path() == edgekit_home / "data" / "results.db"


def test_store_opens_lazily_in_wal_mode(tmp_path):
    path = tmp_path / "sub" / "dir" / "results.db"
    store = ResultsStore(path)
    assert not path.exists()  # nothing touches the disk until first use
    assert store.list() == []
    store.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == DB_SCHEMA_VERSION
    conn.close()


def test_add_then_get_returns_the_full_record():
    rec = bench_record(samples=list(range(1, 1001)))
    with ResultsStore() as store:
        run_id = store.add(rec)
        got = store.get(run_id)
    assert got == {"id": run_id, "outcome": None, **rec}  # outcome: what gates decided (None: never gated)
    assert got["agent"]["samples_ns"] == list(range(1, 1001))  # raw samples kept
    # A new store object (another process, later) sees the same thing.
    with ResultsStore() as again:
        assert again.get(run_id) == got


def test_add_validates_and_refuses_duplicates():
    rec = bench_record()
    with ResultsStore() as store:
        store.add(rec)
        with pytest.raises(ResultsError, match="already in the results store"):
            store.add(rec)
        with pytest.raises(ResultsError, match="'model_name'"):
            store.add({**bench_record(), "model_name": ""})
        assert len(store.list()) == 1


def test_get_unknown_id():
    with ResultsStore() as store:
        store.add(bench_record())
        with pytest.raises(ResultsError, match="no result with id 42") as info:
            store.get(42)
    assert "edgekit results list" in info.value.hint


def test_list_newest_first_with_summary_columns():
    with ResultsStore() as store:
        old = {**bench_record(model="old"), "created": "2024-01-01T00:00:00+00:00"}
        old_id = store.add(old)
        new_id = store.add(bench_record(model="new"))
        imported_id = store.add({**bench_record(model="mid"), "created": "2024-06-01T00:00:00Z"})
        rows = store.list()
    assert [r["id"] for r in rows] == [new_id, imported_id, old_id]
    assert list(rows[0]) == [
        "id", "created", "model_name", "target", "device", "variant", "backend", "precision",
        "p50", "p99", "mean", "n", "bundle_hash",
    ]  # fmt: skip
    assert rows[0]["p50"] == 3.0
    assert rows[0]["p99"] == pytest.approx(4.96)
    assert rows[0]["mean"] == 3.0
    assert rows[0]["n"] == 5
    assert rows[0]["bundle_hash"] == "0123456789abcdef" * 4
    assert rows[0]["backend"] == "onnxruntime"


def test_list_filters_and_limit():
    with ResultsStore() as store:
        store.add(bench_record(model="resnet18", target="rpi5", device="pi@a"))
        store.add(bench_record(model="resnet18", target="rpi4", device="pi@b"))
        store.add(
            bench_record(
                model="mobilenet", target="rpi5", device="pi@a", variant="fp32", precision="fp32"
            )
        )
        store.add(bench_record(model="mobilenet", target="rpi5", device="pi@b"))

        def models(**kw):
            return sorted(
                (r["model_name"], r["target"], r["device"], r["variant"]) for r in store.list(**kw)
            )

        assert models(model="resnet18") == [
            ("resnet18", "rpi4", "pi@b", "int8"),
            ("resnet18", "rpi5", "pi@a", "int8"),
        ]
        assert models(target="rpi5", device="pi@a") == [
            ("mobilenet", "rpi5", "pi@a", "fp32"),
            ("resnet18", "rpi5", "pi@a", "int8"),
        ]
        assert models(variant="fp32") == [("mobilenet", "rpi5", "pi@a", "fp32")]
        assert models(model="resnet18", target="nope") == []
        assert len(store.list(limit=3)) == 3
        assert len(store.list(limit=2, target="rpi5")) == 2
        with pytest.raises(ValueError):
            store.list(limit=0)


def test_export_import_round_trip(tmp_path):
    recs = [bench_record(model=f"m{i}") for i in range(3)]
    with ResultsStore() as store:
        ids = [store.add(r) for r in recs]
        everything = store.export()
        some = store.export([ids[2], ids[0]])
        with pytest.raises(ResultsError, match="no result with id 999"):
            store.export([ids[0], 999])
    assert everything["kind"] == "edgekit.results" and everything["schema"] == 1
    assert everything["records"] == recs
    assert [r["model_name"] for r in some["records"]] == ["m2", "m0"]
    assert all("id" not in r for r in everything["records"])  # ids are local to a store

    document = json.loads(json.dumps(everything))  # through a file, as the CLI does
    with ResultsStore(tmp_path / "other.db") as other:
        assert other.import_(document) == (3, 0)
        assert other.import_(document) == (0, 3)  # dedupe by run_uuid
        assert sorted(r["model_name"] for r in other.list()) == ["m0", "m1", "m2"]
        new_ids = [r["id"] for r in other.list()]
        assert [other.get(i)["run_uuid"] for i in sorted(new_ids)] == [r["run_uuid"] for r in recs]


def test_import_skips_duplicates_within_one_document(tmp_path):
    rec = bench_record()
    with ResultsStore(tmp_path / "x.db") as store:
        assert store.import_({"schema": 1, "kind": "edgekit.results", "records": [rec, rec]}) == (
            1,
            1,
        )


def test_import_is_all_or_nothing():
    good, bad = bench_record(), bench_record()
    bad["agent"]["samples_ns"] = []
    document = {"schema": 1, "kind": "edgekit.results", "records": [good, bad]}
    with ResultsStore() as store:
        with pytest.raises(ResultsError, match=r"records\[1\].*'agent.samples_ns'"):
            store.import_(document)
        assert store.list() == []


@pytest.mark.parametrize(
    ("document", "needle"),
    [
        ([], "not an edgekit results export"),
        ({"schema": 1, "kind": "edgekit.bench", "records": []}, "not an edgekit results export"),
        ({"kind": "edgekit.results", "records": []}, "'schema'"),
        ({"schema": 2, "kind": "edgekit.results", "records": []}, "newer"),
        ({"schema": 1, "kind": "edgekit.results", "records": {}}, "'records'"),
        ({"schema": 1, "kind": "edgekit.results", "records": [1]}, "records[0]"),
    ],
)
def test_import_rejects_bad_documents(document, needle):
    with ResultsStore() as store, pytest.raises(ResultsError) as info:
        store.import_(document)
    assert needle in info.value.message
    assert info.value.hint


# A store as edgekit wrote it before gate outcomes and pins (schema version 1).
_V1_DDL = """
CREATE TABLE runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_uuid TEXT NOT NULL UNIQUE, created TEXT NOT NULL,
    model_name TEXT NOT NULL, target TEXT NOT NULL, device TEXT NOT NULL, variant TEXT NOT NULL,
    backend TEXT NOT NULL, precision TEXT NOT NULL, bundle_hash TEXT, n INTEGER NOT NULL,
    p50 REAL NOT NULL, p99 REAL NOT NULL, mean REAL NOT NULL, record TEXT NOT NULL
);
CREATE INDEX runs_created ON runs (created);
CREATE INDEX runs_model_target ON runs (model_name, target);
PRAGMA user_version = 1;
"""

def write_v1_store(path, records: list[dict]) -> None:
    """A schema-1 store at ``path`` holding ``records`` (validated), as edgekit wrote it then."""
    conn = sqlite3.connect(path)
    conn.executescript(_V1_DDL)
    for r in records:
        conn.execute(
            "INSERT INTO runs (run_uuid, created, model_name, target, device, variant, backend, precision, bundle_hash, n, p50, p99, mean, record)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (r["run_uuid"], r["created"], r["model_name"], r["target"], r["device"], r["agent"]["variant"], r["agent"]["backend"],
             r["agent"]["precision"], None, r["stats"]["n"], r["stats"]["p50"], r["stats"]["p99"], r["stats"]["mean"], json.dumps(r)),
        )  # fmt: skip
    conn.commit()
    conn.close()


def test_a_version_1_store_is_migrated_without_losing_a_row(tmp_path):
    path = tmp_path / "results.db"
    records = [validate_record(bench_record(model=f"m{i}")) for i in range(3)]
    write_v1_store(path, records)
    with ResultsStore(path) as store:
        rows = store.records(limit=10)
        assert sorted(r["run_uuid"] for r in rows) == sorted(r["run_uuid"] for r in records)
        assert {r["outcome"] for r in rows} == {None}  # stored before gates were recorded: not gated
        store.set_outcome(1, "pass")
        store.pin(2, "golden")
        assert (store.get(1)["outcome"], store.pins()) == ("pass", {"golden": 2})
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == DB_SCHEMA_VERSION == 2
    conn.close()


def test_outcomes_filter_travel_with_exports_and_pins_move(tmp_path):
    with ResultsStore(tmp_path / "a.db") as store:
        ids = [store.add(bench_record(model="m")) for _ in range(3)]
        store.set_outcome(ids[0], "pass")
        store.set_outcome(ids[1], "fail")
        with pytest.raises(ValueError, match="outcome must be one of"):
            store.set_outcome(ids[2], "green")
        with pytest.raises(ResultsError, match="no result with id 99"):
            store.set_outcome(99, "pass")
        assert [r["id"] for r in store.records(outcome="pass")] == [ids[0]]
        assert [r["id"] for r in store.records(outcome="fail")] == [ids[1]]
        doc = store.export()
        store.pin(ids[0], "golden")
        store.pin(ids[2], "golden")  # a name pinned again moves
        assert store.pinned("golden") == ids[2] and store.pinned("nope") is None
        with pytest.raises(ResultsError, match="no result with id 42"):
            store.pin(42, "x")
    assert [r.get("outcome") for r in doc["records"]] == ["pass", "fail", None]
    with ResultsStore(tmp_path / "b.db") as other:
        assert other.import_(doc) == (3, 0)
        assert [r["outcome"] for r in other.records()][::-1] == ["pass", "fail", None]


def test_a_newer_database_is_refused(tmp_path):
    path = tmp_path / "results.db"
    with ResultsStore(path) as store:
        store.add(bench_record())
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {DB_SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    with (
        ResultsStore(path) as store,
        pytest.raises(ResultsError, match="newer than this edgekit") as info,
    ):
        store.list()
    assert "upgrade edgekit" in info.value.hint


def test_a_file_that_is_not_a_database_is_refused(tmp_path):
    path = tmp_path / "results.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with ResultsStore(path) as store, pytest.raises(ResultsError, match="unusable"):
        store.list()


_WRITER = r"""
import sys
sys.path[:0] = [sys.argv[3]]
from tests.builders import bench_record
from edgekit.bench.store import ResultsStore

store = ResultsStore()
store.list()  # open + create the schema before the race starts
print("ready", flush=True)
assert sys.stdin.readline() == "go\n"
for i in range(int(sys.argv[2])):
    store.add(bench_record(model=sys.argv[1], device=f"dev-{i}"))
store.close()
print("done", flush=True)
"""


def test_two_processes_write_at_once():
    """Two writers add 200 records each at the same moment; nothing is lost or refused."""
    repo = str(Path(__file__).parents[1])
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, name, "200", repo],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("writer-a", "writer-b")
    ]
    try:
        for p in procs:  # a barrier: both are connected before either writes
            assert p.stdout.readline() == "ready\n", p.stderr.read()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err
        assert out == "done\n"
    with ResultsStore() as store:
        rows = store.list(limit=1000)
        assert len(rows) == 400
        assert len({r["id"] for r in rows}) == 400
        assert len(store.list(model="writer-a", limit=1000)) == 200
        assert len(store.list(model="writer-b", limit=1000)) == 200
        assert len({r["run_uuid"] for r in store.export()["records"]}) == 400
