from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import assert_one_line_error

from edgekit.bench.record import make_record
from edgekit.bench.store import ResultsStore
from edgekit.errors import EXIT_INPUT, EXIT_USAGE
from tests.builders import bench_doc


@pytest.fixture
def populated():
    """Three runs in the test's own store; returns their ids, oldest first."""
    runs = [
        # p50 12.5 ms exactly: 10, 12, 13, 20 ms
        (
            "resnet18",
            "rpi5",
            "pi@10.0.0.7",
            bench_doc([10_000_000, 12_000_000, 13_000_000, 20_000_000]),
        ),
        ("resnet18", "rpi4", "pi@10.0.0.8", bench_doc([30_000_000, 31_000_000, 32_000_000])),
        (
            "mobilenet",
            "rpi5",
            "pi@10.0.0.7",
            bench_doc([5_000_000] * 4, variant="fp32", precision="fp32"),
        ),
    ]
    with ResultsStore() as store:
        return [
            store.add(make_record(doc, model_name=m, target=t, device=d)) for m, t, d, doc in runs
        ]


def test_list_empty_store(cli):
    r = cli("results", "list")
    assert r.returncode == 0
    assert r.stdout == ""
    assert "no results yet" in r.stderr and "edgekit deploy" in r.stderr
    r = cli("results", "list", "--json")
    assert r.returncode == 0
    assert json.loads(r.stdout) == []


def test_list_json_newest_first_and_filters(cli, populated):
    r = cli("results", "list", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [row["id"] for row in rows] == populated[::-1]
    assert rows[-1]["p50"] == 12.5
    assert rows[-1]["bundle_hash"] == "0123456789abcdef" * 4

    def ids(*args):
        r = cli("results", "list", "--json", *args)
        assert r.returncode == 0, r.stderr
        return [row["id"] for row in json.loads(r.stdout)]

    assert ids("--model", "resnet18") == [populated[1], populated[0]]
    assert ids("--target", "rpi5", "--device", "pi@10.0.0.7") == [populated[2], populated[0]]
    assert ids("--variant", "fp32") == [populated[2]]
    assert ids("--limit", "1") == [populated[2]]


def test_list_human_table(cli, populated):
    r = cli("results", "list", env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    assert "resnet18" in r.stdout and "mobilenet" in r.stdout
    assert "12.500" in r.stdout  # p50 of the first run, in ms
    assert "01234567" in r.stdout  # short bundle hash
    assert r.stderr == ""


def test_list_with_no_match_says_so(cli, populated):
    r = cli("results", "list", "--model", "nope", "--json")
    assert r.returncode == 0
    assert json.loads(r.stdout) == []
    assert "--model nope" in r.stderr


def test_list_bad_limit_is_a_usage_error(cli):
    assert_one_line_error(cli("results", "list", "--limit", "0"), EXIT_USAGE)


def test_show_json_is_the_stored_record_without_samples_unless_asked(cli, populated):
    with ResultsStore() as store:
        stored = store.get(populated[0])
    r = cli("results", "show", str(populated[0]), "--json", "--samples")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == stored
    r = cli("results", "show", str(populated[0]), "--json")
    doc = json.loads(r.stdout)
    assert "samples_ns" not in doc["agent"] and doc["agent"]["samples_ns_count"] == len(stored["agent"]["samples_ns"])
    assert {k: v for k, v in doc["agent"].items() if not k.startswith(("samples_ns", "warmup_samples_ns"))} == {
        k: v for k, v in stored["agent"].items() if k not in ("samples_ns", "warmup_samples_ns")}
    assert len(r.stdout) < len(json.dumps(stored, indent=2))


def test_pin_names_a_baseline_and_pins_lists_them(cli, populated):
    r = cli("results", "pin", str(populated[1]), "--name", "golden")
    assert r.returncode == 0, r.stderr
    assert f"pinned run {populated[1]} " in r.stderr and "--baseline tag:golden" in r.stderr
    assert json.loads(cli("results", "pins", "--json").stdout) == {"golden": populated[1]}
    assert "golden" in cli("results", "pins").stdout
    assert_one_line_error(cli("results", "pin", "999", "--name", "x"), 3, "no result with id 999")
    assert_one_line_error(cli("results", "pin", str(populated[0]), "--name", "bad name;rm"), 2, "bad pin name")


def test_show_human(cli, populated):
    r = cli("results", "show", str(populated[0]), env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for needle in (
        "p50 ms", "12.500", "throughput /s",  # stats
        "onnxruntime 1.31.1", "0123456789abcdef" * 4,  # backend, bundle
        "123.400 ms", "9.870 ms", "85.0 MiB",  # load, first inference, peak RSS
        "rpi5-lab-1", "Cortex-A76", "neon asimddp", "8.00 GiB",  # device facts
        "48.5 C -> 55.0 C", "warmup", "threads",  # device state, config
    ):  # fmt: skip
        assert needle in out, needle


def test_show_unknown_id(cli, populated):
    r = cli("results", "show", "999")
    assert_one_line_error(r, EXIT_INPUT, "no result with id 999")
    assert "edgekit results list" in r.stderr
    assert r.stdout == ""


def test_show_non_integer_id_is_a_usage_error(cli):
    assert_one_line_error(cli("results", "show", "abc"), EXIT_USAGE)


def test_export_to_stdout_and_file(cli, populated, tmp_path):
    r = cli("results", "export")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["kind"] == "edgekit.results"
    assert len(doc["records"]) == 3

    r = cli("results", "export", str(populated[1]), "-o", "one.json")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    assert "exported 1 run to one.json" in r.stderr
    one = json.loads((tmp_path / "one.json").read_text())
    assert [rec["target"] for rec in one["records"]] == ["rpi4"]
    assert [p.name for p in tmp_path.iterdir()] == ["one.json"]  # no temp file left over


def test_export_unknown_id_writes_nothing(cli, populated, tmp_path):
    r = cli("results", "export", str(populated[0]), "999", "-o", "out.json")
    assert_one_line_error(r, EXIT_INPUT, "no result with id 999")
    assert list(tmp_path.iterdir()) == []


def test_export_into_a_missing_directory(cli, populated, tmp_path):
    r = cli("results", "export", "-o", "no/such/dir/out.json")
    assert_one_line_error(r, EXIT_INPUT, "output directory does not exist")


def _other_store(tmp_path) -> dict:
    """Environment that points the CLI at a second, empty store."""
    data = tmp_path / "other-data"
    data.mkdir()
    return {"EDGEKIT_DATA_DIR": str(data)}


def test_import_round_trip_and_dedupe(cli, populated, tmp_path):
    assert cli("results", "export", "-o", "all.json").returncode == 0
    other = _other_store(tmp_path)
    r = cli("results", "import", "all.json", env=other)
    assert r.returncode == 0, r.stderr
    assert "imported 3 runs, skipped 0" in r.stdout
    r = cli("results", "import", "all.json", "--json", env=other)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"imported": 0, "skipped": 3}
    mine = json.loads(cli("results", "export").stdout)
    theirs = json.loads(cli("results", "export", env=other).stdout)
    assert sorted(theirs["records"], key=lambda d: d["run_uuid"]) == sorted(
        mine["records"], key=lambda d: d["run_uuid"]
    )


def test_import_from_stdin(populated, tmp_path):
    exported = subprocess.run(
        [sys.executable, "-m", "edgekit", "results", "export"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    env = {**os.environ, **_other_store(tmp_path)}
    r = subprocess.run(
        [sys.executable, "-m", "edgekit", "results", "import", "-", "--json"],
        input=exported,
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"imported": 3, "skipped": 0}


def test_import_missing_file(cli):
    assert_one_line_error(
        cli("results", "import", "nope.json"), EXIT_INPUT, "no such file: nope.json"
    )


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"{not json", "is not JSON"),
        (b"\xff\xfe\x00garbage", "is not JSON"),
        (b'{"schema": 1, "kind": "edgekit.bench", "records": []}', "not an edgekit results export"),
        (b"[1, 2, 3]", "not an edgekit results export"),
    ],
)
def test_import_bad_files(cli, tmp_path, content, needle):
    (tmp_path / "bad.json").write_bytes(content)
    assert_one_line_error(cli("results", "import", "bad.json"), EXIT_INPUT, needle)


def test_import_with_one_bad_record_imports_nothing(cli, populated, tmp_path):
    assert cli("results", "export", "-o", "all.json").returncode == 0
    doc = json.loads((tmp_path / "all.json").read_text())
    doc["records"][2]["agent"]["samples_ns"] = [1000, -1]
    (tmp_path / "all.json").write_text(json.dumps(doc))
    other = _other_store(tmp_path)
    r = cli("results", "import", "all.json", env=other)
    assert_one_line_error(r, EXIT_INPUT, "records[2]")
    assert "agent.samples_ns" in r.stderr
    assert json.loads(cli("results", "list", "--json", env=other).stdout) == []


def test_every_command_has_an_example_in_help(cli):
    for command in ("list", "show", "export", "import"):
        r = cli("results", command, "--help")
        assert r.returncode == 0
        assert f"edgekit results {command}" in r.stdout.split("Examples:")[1], command
