"""The results store checks itself on open (``PRAGMA quick_check``, issue 26 item 9): a damaged
store still lists, shows and exports what can be read, takes no writes, and says how to rescue
it; a store this user may not write (read-only file system or permissions) is still readable."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgekit.bench.store import ResultsStore
from tests.builders import bench_record
from tests.conftest import assert_one_line_error

RUNS = 6


def _fill(db: Path, runs: int = RUNS, samples: int = 5000) -> dict[int, dict]:
    """``runs`` stored records, big enough that each spans several overflow pages."""
    rng = random.Random(0)
    with ResultsStore(db) as store:
        ids = [store.add(bench_record(samples=[1_000_000 + rng.randrange(100_000) for _ in range(samples)])) for _ in range(runs)]
        return {i: store.get(i) for i in ids}


def _edgekit(*args: str, env_dir: Path, cwd: Path, wrap: list[str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "CI": "1", "EDGEKIT_DATA_DIR": str(env_dir)}
    return subprocess.run([*(wrap or []), sys.executable, "-m", "edgekit", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_a_damaged_store_is_found_and_what_can_be_read_is_rescued(tmp_path, cli):
    data = Path(os.environ["EDGEKIT_DATA_DIR"])
    db = data / "results.db"
    originals = _fill(db)
    page = 4096
    pages = db.stat().st_size // page
    with open(db, "r+b") as fh:  # scramble one page in the middle: one record's overflow chain
        fh.seek(pages * 6 // 10 * page)
        fh.write(random.Random(1).randbytes(page))
    with ResultsStore(db) as store:
        store.list()
        assert store.damage is not None, "quick_check found nothing"

    r = cli("results", "export", "-o", "rescued.json")
    assert r.returncode == 0, r.stderr
    assert "is damaged (" in r.stderr and "results export -o rescued.json" in r.stderr
    rescued = json.loads((tmp_path / "rescued.json").read_text())["records"]
    said = [ln.split(": ids ")[1] for ln in r.stderr.splitlines() if "not in the export: ids " in ln]
    skipped = [int(i) for i in said[0].split(", ")] if said else []
    assert rescued and len(rescued) + len(skipped) == RUNS
    # a stored run's id and its gate outcome (None: never gated) are the store's, not the record's
    by_uuid = {rec["run_uuid"]: {k: v for k, v in rec.items() if k != "id" and not (k == "outcome" and v is None)} for rec in originals.values()}
    assert all(by_uuid[rec["run_uuid"]] == rec for rec in rescued), "an exported record differs from what was stored"

    # no writes into a damaged store; an unreadable record is an input error with the way out
    r = cli("results", "import", "rescued.json")
    assert_one_line_error(r, 3, "is damaged (")
    assert "nothing is written to it" in r.stderr and "move results.db aside" in r.stderr
    for run_id in skipped:
        r = cli("results", "show", str(run_id))
        assert_one_line_error(r, 3)
        assert "hint: save what can still be read" in r.stderr

    # the rescue: a new store takes the export whole
    fresh = tmp_path / "fresh"
    r = _edgekit("results", "import", "rescued.json", env_dir=fresh, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    with ResultsStore(fresh / "results.db") as store:
        assert len(store.list(limit=100)) == len(rescued) and store.damage is None


def test_an_intact_store_reports_no_damage(tmp_path):
    _fill(tmp_path / "results.db", runs=2, samples=10)
    with ResultsStore(tmp_path / "results.db") as store:
        assert len(store.list()) == 2 and store.damage is None and not store.read_only


def _read_only(data: Path) -> list[str]:
    """A command prefix that runs with ``data`` read-only: a read-only bind mount as root (root
    ignores file modes), file modes otherwise."""
    if os.geteuid() == 0:
        if shutil.which("unshare") is None:
            pytest.skip("needs unshare(1) to mount a read-only directory as root")
        probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
        if probe.returncode != 0:
            pytest.skip(f"cannot make a mount namespace here: {probe.stderr.decode().strip()}")
        return ["unshare", "-m", "sh", "-c", 'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" "$0" && exec "$@"', str(data)]
    for p in (data / "results.db", data):
        p.chmod(0o555 if p.is_dir() else 0o444)
    return []


def test_a_read_only_store_can_be_listed_shown_and_exported(tmp_path):
    data = tmp_path / "data"
    originals = _fill(data / "results.db", runs=2, samples=10)
    wrap = _read_only(data)
    before = sorted(p.name for p in data.iterdir())

    r = _edgekit("results", "list", "--json", env_dir=data, cwd=tmp_path, wrap=wrap)
    assert r.returncode == 0, r.stderr
    assert sorted(row["id"] for row in json.loads(r.stdout)) == sorted(originals)
    first = min(originals)
    r = _edgekit("results", "show", str(first), "--json", env_dir=data, cwd=tmp_path, wrap=wrap)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["run_uuid"] == originals[first]["run_uuid"]
    r = _edgekit("results", "export", "-o", str(tmp_path / "all.json"), env_dir=data, cwd=tmp_path, wrap=wrap)
    assert r.returncode == 0, r.stderr
    assert len(json.loads((tmp_path / "all.json").read_text())["records"]) == 2

    r = _edgekit("results", "import", str(tmp_path / "all.json"), env_dir=data, cwd=tmp_path, wrap=wrap)
    assert r.returncode == 3 and "error: the results store" in r.stderr and "is read-only here" in r.stderr, r.stderr
    assert sorted(p.name for p in data.iterdir()) == before


def test_a_read_only_store_from_before_gate_outcomes_is_read_as_it_is(tmp_path):
    """A schema-1 store (before outcomes and pins) that this user may not migrate: listed, shown,
    exported and used as a baseline source, its file untouched (still schema 1)."""
    from edgekit.bench.record import validate_record
    from tests.test_store import write_v1_store

    data = tmp_path / "data"
    data.mkdir()
    db = data / "results.db"
    records = [validate_record(bench_record(model=f"m{i}")) for i in range(2)]
    write_v1_store(db, records)
    digest = db.read_bytes()
    wrap = _read_only(data)
    r = _edgekit("results", "list", "--json", env_dir=data, cwd=tmp_path, wrap=wrap)
    assert r.returncode == 0, r.stderr
    assert sorted(row["model"] if "model" in row else row["model_name"] for row in json.loads(r.stdout)) == ["m0", "m1"]
    r = _edgekit("results", "show", "1", "--json", env_dir=data, cwd=tmp_path, wrap=wrap)
    assert r.returncode == 0 and json.loads(r.stdout)["run_uuid"] == records[0]["run_uuid"], r.stderr
    r = _edgekit("results", "export", "-o", str(tmp_path / "all.json"), env_dir=data, cwd=tmp_path, wrap=wrap)
    assert r.returncode == 0, r.stderr
    assert len(json.loads((tmp_path / "all.json").read_text())["records"]) == 2
    r = _edgekit("results", "compare", "1", "2", env_dir=data, cwd=tmp_path, wrap=wrap)
    assert "no such column" not in r.stderr and "no such table" not in r.stderr, r.stderr
    assert db.read_bytes() == digest  # not migrated, not touched
