"""The results store: one SQLite file in the user data dir, safe for many writers at once.

Each run is one row: a few columns to filter and sort on, plus the full record as JSON
(raw samples included), so nothing a later tool may want is thrown away. A run that gates judged
carries their outcome (``pass``, ``fail``, ``inconclusive``; NULL: never gated), so a baseline is
never a failed run; ``pins`` names blessed baselines (``edgekit results pin RUN --name NAME``). WAL mode lets
readers run while a writer commits; writes take the lock up front (BEGIN IMMEDIATE) and wait
for it (busy_timeout), so parallel benchmarks of many devices never lose a result.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import platformdirs

from edgekit.bench.record import validate_record
from edgekit.errors import ResultsError
from edgekit.jsonable import is_int

DB_SCHEMA_VERSION = 2  # PRAGMA user_version; bump with a migration (_MIGRATIONS) when the tables change
OUTCOMES = ("pass", "fail", "inconclusive")
EXPORT_KIND = "edgekit.results"
EXPORT_SCHEMA = 1
_BUSY_TIMEOUT_MS = 60_000
_SUMMARY = (
    "id", "created", "model_name", "target", "device", "variant", "backend", "precision",
    "p50", "p99", "mean", "n", "bundle_hash",
)  # fmt: skip
# list/records filter name -> the column (or record field) it matches exactly
_FILTERS = {
    "model": "model_name",
    "target": "target",
    "device": "device",
    "variant": "variant",
    # The branch lives in the record only (record["vcs"], older records have none):
    # a scan of the filtered rows, fine at a store's size.
    "branch": "json_extract(record, '$.vcs.branch')",
    "commit": "json_extract(record, '$.vcs.commit')",
    "outcome": "outcome",
}
_DDL = """
CREATE TABLE runs (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_uuid    TEXT NOT NULL UNIQUE,
    created     TEXT NOT NULL,
    model_name  TEXT NOT NULL,
    target      TEXT NOT NULL,
    device      TEXT NOT NULL,
    variant     TEXT NOT NULL,
    backend     TEXT NOT NULL,
    precision   TEXT NOT NULL,
    bundle_hash TEXT,
    n           INTEGER NOT NULL,
    p50         REAL NOT NULL,
    p99         REAL NOT NULL,
    mean        REAL NOT NULL,
    record      TEXT NOT NULL,
    outcome     TEXT
);
CREATE INDEX runs_created ON runs (created);
CREATE INDEX runs_model_target ON runs (model_name, target);
CREATE TABLE pins (
    name    TEXT PRIMARY KEY,
    run_id  INTEGER NOT NULL REFERENCES runs (id),
    created TEXT NOT NULL
);
"""
# from version N to N + 1; every row is kept (a run stored before gates were recorded has outcome NULL)
_MIGRATIONS = {
    1: "ALTER TABLE runs ADD COLUMN outcome TEXT;"
       "CREATE TABLE pins (name TEXT PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs (id), created TEXT NOT NULL)",
}


def default_db_path() -> Path:
    """``$EDGEKIT_DATA_DIR/results.db``, else ``results.db`` in the platform's user data dir."""
    base = os.environ.get("EDGEKIT_DATA_DIR") or platformdirs.user_data_dir("edgekit")
    return Path(base) / "results.db"


class ResultsStore:
    """Benchmark records in SQLite. Opens (and creates) the database on first use."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_db_path()
        self._conn: sqlite3.Connection | None = None
        self.read_only = False  # opened read-only: the file or its directory is not writable
        self.damage: str | None = None  # what PRAGMA quick_check found wrong on open; None: intact
        self.skipped: list[int] = []  # run ids the last export could not read (a damaged store)

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writes -------------------------------------------------------------------------
    def add(self, record: dict) -> int:
        """Validate and store one record (raw samples included); return its run id."""
        record = validate_record(record)
        with self._write() as conn:
            if self._stored(conn, record):
                raise ResultsError(
                    f"run {record['run_uuid']} is already in the results store",
                    "each record is stored once; make a new record for a new run",
                )
            return self._insert(conn, record)

    def import_(self, document: dict) -> tuple[int, int]:
        """Add the records of an export document; return (imported, skipped duplicates).

        All or nothing: every record is validated first, and the inserts are one transaction.
        Duplicates (same run_uuid, in the store or earlier in the document) are skipped.
        """
        records = check_export(document)
        with self._write() as conn:
            skipped = 0
            for record in records:
                if self._stored(conn, record):
                    skipped += 1
                else:
                    self._insert(conn, record)
        return len(records) - skipped, skipped

    # -- reads --------------------------------------------------------------------------
    def get(self, run_id: int) -> dict:
        """The stored record with its ``id`` and gate ``outcome`` (None: never gated) added."""
        found, text, outcome = self._row(run_id)
        return {**self._record(found, text), "id": found, "outcome": outcome}

    def _row(self, run_id: int) -> tuple[int, str, str | None]:
        row = self._read(lambda conn: conn.execute("SELECT id, record, outcome FROM runs WHERE id = ?", (run_id,)).fetchone())
        if row is None:
            raise ResultsError(f"no result with id {run_id}", "see the stored runs with: edgekit results list")
        return row

    def _record(self, run_id: int, text: Any) -> dict:
        try:
            record = json.loads(text)
        except (TypeError, ValueError):
            record = None
        if not isinstance(record, dict):
            raise ResultsError(f"run {run_id}'s record in {self.path} is damaged", self._rescue_hint())
        return record

    def _read(self, fn: Any) -> Any:
        """``fn(conn)``; a damaged database file is a ResultsError with the way out, not a crash."""
        conn = self._connect()
        try:
            return fn(conn)
        except sqlite3.DatabaseError as exc:
            raise ResultsError(f"results database {self.path} is damaged: {exc}", self._rescue_hint()) from None

    def _rescue_hint(self) -> str:
        return (
            f"save what can still be read (edgekit results export -o rescued.json), move {self.path.name} aside, "
            "then edgekit results import rescued.json into a new store"
        )

    def set_outcome(self, run_id: int, outcome: str) -> None:
        """Record what the gates decided about run ``run_id`` (one of ``OUTCOMES``)."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
        with self._write() as conn:
            if conn.execute("UPDATE runs SET outcome = ? WHERE id = ?", (outcome, run_id)).rowcount != 1:
                raise ResultsError(f"no result with id {run_id}", "see the stored runs with: edgekit results list")

    def pin(self, run_id: int, name: str) -> None:
        """Name run ``run_id`` a blessed baseline (``--baseline tag:NAME``); a name pinned before moves."""
        from datetime import datetime, timezone

        self._row(run_id)  # a clear error for an unknown id
        with self._write() as conn:
            conn.execute(
                "INSERT INTO pins (name, run_id, created) VALUES (?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET run_id = excluded.run_id, created = excluded.created",
                (name, run_id, datetime.now(timezone.utc).isoformat(timespec="seconds")),
            )

    def pinned(self, name: str) -> int | None:
        """The run id pinned as ``name``, or None."""
        row = self._connect().execute("SELECT run_id FROM pins WHERE name = ?", (name,)).fetchone()
        return None if row is None else int(row[0])

    def pins(self) -> dict[str, int]:
        """Every pin: name -> run id."""
        return dict(self._connect().execute("SELECT name, run_id FROM pins ORDER BY name").fetchall())

    def list(self, *, limit: int = 50, **filters: str | None) -> list[dict]:
        """Summary rows, newest first, optionally filtered by exact model/target/device/variant/branch."""
        rows = self._select(", ".join(_SUMMARY), limit, filters)
        return [dict(zip(_SUMMARY, row, strict=True)) for row in rows]

    def records(self, *, limit: int = 50, **filters: str | None) -> list[dict]:
        """Whole records (with their ``id`` and ``outcome``), newest first, filtered as ``list``."""
        return [{**self._record(i, record), "id": i, "outcome": outcome} for i, record, outcome in self._select("id, record, outcome", limit, filters)]

    def _select(self, columns: str, limit: int, filters: dict[str, str | None]) -> list[tuple]:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        unknown = sorted(set(filters) - set(_FILTERS))
        if unknown:
            raise TypeError(f"unknown filter(s) {', '.join(unknown)}; known: {', '.join(_FILTERS)}")
        used = [(_FILTERS[name], value) for name, value in filters.items() if value is not None]
        where = " WHERE " + " AND ".join(f"{column} = ?" for column, _ in used) if used else ""
        sql = f"SELECT {columns} FROM runs{where} ORDER BY created DESC, id DESC LIMIT ?"
        return self._read(lambda conn: conn.execute(sql, [*(value for _, value in used), limit]).fetchall())

    def export(self, ids: Sequence[int] | None = None) -> dict:
        """An import-ready document with the given runs (all runs when ``ids`` is None), oldest first.

        In a damaged store (``damage``), all runs means all that can still be read: each is read on
        its own, and the ids of those that cannot be are in ``skipped``. The gates' outcome travels
        with each run, so an exported baseline is never a failed run."""
        self.skipped = []
        self._connect()  # opening checks the store: ``damage`` is known from here on
        rows: list = []
        if ids is not None:
            rows = [self._row(run_id) for run_id in dict.fromkeys(ids)]
        elif self.damage is None:
            rows = self._read(lambda conn: conn.execute("SELECT id, record, outcome FROM runs ORDER BY id").fetchall())
        else:
            # each id looked up on its own: a damaged page loses the runs on it, not the scan
            for run_id in range(1, self._last_id() + 1):
                try:
                    row = self._connect().execute("SELECT id, record, outcome FROM runs WHERE id = ?", (run_id,)).fetchone()
                    if row is not None:
                        validate_record(self._record(row[0], row[1]))
                        rows.append(row)
                except (sqlite3.DatabaseError, ResultsError):
                    self.skipped.append(run_id)
        records = [{**self._record(i, t), **({"outcome": o} if o else {})} for i, t, o in rows]
        return {"schema": EXPORT_SCHEMA, "kind": EXPORT_KIND, "records": records}

    def _last_id(self) -> int:
        """The highest run id ever given (AUTOINCREMENT keeps it in sqlite_sequence), else max(id)."""
        for sql in ("SELECT seq FROM sqlite_sequence WHERE name = 'runs'", "SELECT max(id) FROM runs"):
            try:
                row = self._connect().execute(sql).fetchone()
            except sqlite3.DatabaseError:
                continue
            if row is not None and isinstance(row[0], int):
                return row[0]
        raise ResultsError(f"results database {self.path} is too damaged to find its runs", self._rescue_hint())

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- internals ------------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        if self.path.is_file() and not (os.access(self.path, os.W_OK) and os.access(self.path.parent, os.W_OK | os.X_OK)):
            self._conn = self._connect_read_only()
            return self._conn
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ResultsError(
                f"cannot create the results directory {self.path.parent}: {exc.strerror}",
                "set EDGEKIT_DATA_DIR to a writable directory",
            ) from None
        try:
            # autocommit mode: transactions are explicit (BEGIN IMMEDIATE in _write).
            conn = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        except sqlite3.Error as exc:
            raise self._db_error(exc) from None
        deadline = time.monotonic() + _BUSY_TIMEOUT_MS / 1000
        while True:
            try:
                conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                # never touch a database from a newer edgekit; switching to WAL takes a lock that
                # SQLite does not wait for (no busy handler): two processes opening a new store at
                # once see "database is locked" here, so it is retried as the busy timeout would
                if version <= DB_SCHEMA_VERSION and conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    conn.execute("PRAGMA journal_mode = WAL")
                if version == 0:
                    version = self._create_schema(conn)
                elif version < DB_SCHEMA_VERSION:
                    version = self._migrate(conn)
                break
            except sqlite3.Error as exc:
                if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc) and time.monotonic() <= deadline:
                    time.sleep(0.01)
                    continue
                conn.close()
                raise self._db_error(exc) from None
        self._check_version(conn, version)
        self._quick_check(conn)
        self._conn = conn
        return conn

    def _check_version(self, conn: sqlite3.Connection, version: int) -> None:
        if version > DB_SCHEMA_VERSION:
            conn.close()
            raise ResultsError(
                f"results database {self.path} has schema version {version}, newer than this "
                f"edgekit supports ({DB_SCHEMA_VERSION})",
                "upgrade edgekit (pip install -U edgekit), or set EDGEKIT_DATA_DIR to use another store",
            )

    def _connect_read_only(self) -> sqlite3.Connection:
        """A store this user may not write (a shared or archived one) can still be listed, shown and
        exported. ``immutable``: a WAL database's -shm file cannot be made in a read-only directory."""
        from urllib.parse import quote

        self.read_only = True
        uri = f"file:{quote(str(self.path.resolve()))}?mode=ro"
        try:
            conn = sqlite3.connect(uri, uri=True, isolation_level=None)
            try:
                version = conn.execute("PRAGMA user_version").fetchone()[0]
            except sqlite3.OperationalError:  # WAL without a -shm it may create: read the file as it is
                conn.close()
                conn = sqlite3.connect(uri + "&immutable=1", uri=True, isolation_level=None)
                version = conn.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.Error as exc:
            raise self._db_error(exc) from None
        self._check_version(conn, version)
        self._quick_check(conn)
        if version < DB_SCHEMA_VERSION:
            self._read_as_current(conn, version)
        return conn

    @staticmethod
    def _read_as_current(conn: sqlite3.Connection, version: int) -> None:
        """An older store this user may not migrate: read it through TEMP objects of today's shape,
        which shadow its tables (SQLite looks in ``temp`` first); nothing is written to the file."""
        try:
            if version < 2:  # before gate outcomes and pins
                conn.execute("CREATE TEMP VIEW runs AS SELECT *, NULL AS outcome FROM main.runs")
                conn.execute("CREATE TEMP TABLE pins (name TEXT PRIMARY KEY, run_id INTEGER NOT NULL, created TEXT NOT NULL)")
        except sqlite3.Error:
            pass  # a store too damaged for this: its reads say so themselves

    def _quick_check(self, conn: sqlite3.Connection) -> None:
        """PRAGMA quick_check once per open: a damaged store still reads what it can (export
        skips what it cannot), but takes no writes (they could spread the damage)."""
        try:
            rows = conn.execute("PRAGMA quick_check").fetchall()
        except sqlite3.DatabaseError as exc:
            rows = [(str(exc),)]
        lines = [ln.strip() for r in rows if r and r[0] != "ok" for ln in str(r[0]).splitlines()]
        problems = [ln for ln in lines if ln and not ln.startswith("***")]
        self.damage = problems[0] + (f" and {len(problems) - 1} more problem(s)" if len(problems) > 1 else "") if problems else None

    @staticmethod
    def _create_schema(conn: sqlite3.Connection) -> int:
        """Create the tables unless another process just did; return the schema version."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                for statement in filter(str.strip, _DDL.split(";")):
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {DB_SCHEMA_VERSION}")
                version = DB_SCHEMA_VERSION
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return version

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> int:
        """Bring an older store to this schema in one transaction (unless another process just did)."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            while version < DB_SCHEMA_VERSION:
                for statement in filter(str.strip, _MIGRATIONS[version].split(";")):
                    conn.execute(statement)
                version += 1
            conn.execute(f"PRAGMA user_version = {version}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return version

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction that holds the write lock from its start."""
        conn = self._connect()
        if self.read_only:
            raise ResultsError(f"the results store {self.path} is read-only here", "set EDGEKIT_DATA_DIR to a writable directory to store results")
        if self.damage is not None:
            raise ResultsError(f"results database {self.path} is damaged ({self.damage}); nothing is written to it", self._rescue_hint())
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise self._db_error(exc) from None
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException as exc:
            conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise self._db_error(exc) from None
            raise

    @staticmethod
    def _stored(conn: sqlite3.Connection, record: dict) -> bool:
        """Is a run of ``record``'s run_uuid in the store already?"""
        return conn.execute("SELECT 1 FROM runs WHERE run_uuid = ?", (record["run_uuid"],)).fetchone() is not None

    @staticmethod
    def _insert(conn: sqlite3.Connection, record: dict) -> int:
        outcome = record.get("outcome") if record.get("outcome") in OUTCOMES else None  # an import carries it
        record = {k: v for k, v in record.items() if k not in ("id", "outcome")}  # columns, not the record's
        agent, stats = record["agent"], record["stats"]
        cur = conn.execute(
            "INSERT INTO runs (run_uuid, created, model_name, target, device, variant, backend,"
            " precision, bundle_hash, n, p50, p99, mean, record, outcome)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                record["run_uuid"], record["created"], record["model_name"], record["target"],
                record["device"], agent["variant"], agent["backend"], agent["precision"],
                agent.get("bundle_hash"), stats["n"], stats["p50"], stats["p99"], stats["mean"],
                json.dumps(record, separators=(",", ":")), outcome,
            ),
        )  # fmt: skip
        return int(cur.lastrowid)

    def _db_error(self, exc: sqlite3.Error) -> ResultsError:
        return ResultsError(
            f"results database {self.path} is unusable: {exc}",
            "check the file (is it a SQLite database? is the disk full or read-only?) "
            "or set EDGEKIT_DATA_DIR to use another store",
        )


def check_export(document: Any) -> list[dict]:
    """Validate an export document as a whole; return its normalised records (ResultsError naming the first bad one)."""
    hint = "give a file written by `edgekit results export`"
    if not isinstance(document, dict) or document.get("kind") != EXPORT_KIND:
        got = document.get("kind") if isinstance(document, dict) else type(document).__name__
        raise ResultsError(
            f"not an edgekit results export (kind is {got!r}, expected {EXPORT_KIND!r})", hint
        )
    schema = document.get("schema")
    if not is_int(schema) or schema < 1:
        raise ResultsError(
            f"export field 'schema' must be a positive integer, got {schema!r}", hint
        )
    if schema > EXPORT_SCHEMA:
        raise ResultsError(
            f"export schema {schema} is newer than this edgekit understands ({EXPORT_SCHEMA})",
            "upgrade edgekit (pip install -U edgekit) on this machine",
        )
    records = document.get("records")
    if not isinstance(records, list):
        raise ResultsError("export field 'records' must be a list", hint)
    checked = []
    for i, record in enumerate(records):
        try:
            checked.append(validate_record(record))
        except ResultsError as exc:
            raise ResultsError(f"records[{i}]: {exc.message}", exc.hint) from None
    return checked
