"""The store of verified kernels: one SQLite file under the cache dir, reused across runs.

A row is one candidate that passed verification for one problem on one GPU arch, keyed by
(problem hash, arch, dtype, shapes) plus the hash of its source; it holds the candidate source,
the EvalResult JSON and the id of the transcript that produced it. The file is opened in WAL mode
with a busy timeout, and every write is one short IMMEDIATE transaction on its own connection, so
several processes (parallel optimize runs, bench jobs) can write to it at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..harness.problem import problem_hash
from ..harness.results import EvalResult

SCHEMA_VERSION = 1
DEFAULT_NAME = "kernels.sqlite3"
BUSY_TIMEOUT_S = 60.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kernels (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    problem_hash TEXT NOT NULL,
    arch TEXT NOT NULL,
    dtype TEXT NOT NULL,
    shapes TEXT NOT NULL,
    source_hash TEXT NOT NULL,
    source TEXT NOT NULL,
    result TEXT NOT NULL,
    transcript TEXT NOT NULL DEFAULT '',
    speedup REAL,
    candidate_ms REAL,
    reference_ms REAL,
    problem_source TEXT NOT NULL DEFAULT '',
    label TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    cudaforge_version TEXT NOT NULL DEFAULT '',
    UNIQUE (problem_hash, arch, dtype, shapes, source_hash)
);
CREATE INDEX IF NOT EXISTS kernels_key ON kernels (problem_hash, arch, dtype, shapes);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS searches (
    model_key TEXT PRIMARY KEY,
    paths TEXT NOT NULL,
    updated REAL NOT NULL
);
"""


def shapes_key(shapes: Sequence[Sequence[int]] | str) -> str:
    """The shapes part of a key: '[[8, 128, 512], [512]]' (JSON, no spaces), one list per input."""
    if isinstance(shapes, str):
        return shapes
    return json.dumps([list(map(int, s)) for s in shapes], separators=(",", ":"))


def default_path() -> Path:
    """cache_dir()/kernels.sqlite3 ($CUDAFORGE_CACHE_DIR moves it)."""
    from ..cuda.kernel import cache_dir

    return cache_dir() / DEFAULT_NAME


@dataclass
class StoredKernel:
    """One verified kernel from the store."""

    id: int
    problem_hash: str
    arch: str
    dtype: str
    shapes: str
    source: str
    result: EvalResult
    transcript: str
    speedup: float | None
    candidate_ms: float | None
    reference_ms: float | None
    problem_source: str
    label: str
    created: float
    cudaforge_version: str

    def to_dict(self) -> dict[str, Any]:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__}
        data["result"] = self.result.to_dict()
        return data


class KernelStore:
    """A SQLite store of verified kernels (default: cache_dir()/kernels.sqlite3)."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._ready = False
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"KernelStore({str(self.path)!r})"

    # ------------------------------------------------------------ connections

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        return conn

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        conn = self._connect()
        try:
            self._ensure_schema(conn)
            yield conn
        finally:
            conn.close()

    def _ensure_schema(self, conn: sqlite3.Connection) -> None:
        if self._ready:
            return
        with self._lock:
            if self._ready:
                return
            # Switching to WAL needs a moment without other writers; the busy timeout waits for it.
            mode = _retry_locked(lambda: conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
            if str(mode).lower() != "wal":
                raise sqlite3.OperationalError(
                    f"{self.path}: could not switch to WAL mode (got {mode!r}); is it on a "
                    "network file system? Set CUDAFORGE_CACHE_DIR to a local folder"
                )
            with _transaction(conn):
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(
                    "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema', ?)",
                    (str(SCHEMA_VERSION),),
                )
            self._ready = True

    # ------------------------------------------------------------ writing

    def put(
        self,
        *,
        problem_source: str,
        arch: str,
        dtype: str,
        shapes: Sequence[Sequence[int]] | str,
        source: str,
        result: EvalResult,
        transcript: str = "",
        label: str = "",
    ) -> int:
        """Record a verified kernel; returns its row id. The same source for the same key
        replaces the earlier row's result when the new one is faster."""
        if not result.ok:
            raise ValueError(f"only verified kernels are stored; this one is {result.status!r}")
        from .. import __version__

        row = {
            "problem_hash": problem_hash(problem_source),
            "arch": arch,
            "dtype": dtype,
            "shapes": shapes_key(shapes),
            "source_hash": hashlib.sha256(source.encode()).hexdigest(),
            "source": source,
            "result": result.to_json(),
            "transcript": transcript or "",
            "speedup": result.speedup,
            "candidate_ms": result.candidate_ms,
            "reference_ms": result.reference_ms,
            "problem_source": problem_source,
            "label": label,
            "created": time.time(),
            "cudaforge_version": __version__,
        }
        columns = ", ".join(row)
        marks = ", ".join(f":{k}" for k in row)
        sql = (
            f"INSERT INTO kernels ({columns}) VALUES ({marks}) "
            "ON CONFLICT (problem_hash, arch, dtype, shapes, source_hash) DO UPDATE SET "
            "result = excluded.result, speedup = excluded.speedup, "
            "candidate_ms = excluded.candidate_ms, reference_ms = excluded.reference_ms, "
            "transcript = excluded.transcript, created = excluded.created "
            "WHERE excluded.candidate_ms < kernels.candidate_ms OR kernels.candidate_ms IS NULL"
        )
        with self._connection() as conn, _transaction(conn):
            conn.execute(sql, row)
            found = conn.execute(
                "SELECT id FROM kernels WHERE problem_hash = ? AND arch = ? AND dtype = ? "
                "AND shapes = ? AND source_hash = ?",
                (row["problem_hash"], arch, dtype, row["shapes"], row["source_hash"]),
            ).fetchone()
        return int(found[0])

    def remove(self, kernel_id: int) -> bool:
        """Delete one row (e.g. a kernel that failed re-verification); True if it existed."""
        with self._connection() as conn, _transaction(conn):
            cursor = conn.execute("DELETE FROM kernels WHERE id = ?", (kernel_id,))
        return cursor.rowcount > 0

    def remember_search(self, model_key: str, paths: Sequence[str]) -> None:
        """Record the module paths of the hot spots a search chose for a model (its key:
        cudaforge.model.remembered_search.model_key), for load() to search only those."""
        with self._connection() as conn, _transaction(conn):
            conn.execute(
                "INSERT INTO searches (model_key, paths, updated) VALUES (?, ?, ?) "
                "ON CONFLICT (model_key) DO UPDATE SET paths = excluded.paths, "
                "updated = excluded.updated",
                (model_key, json.dumps(sorted(set(paths))), time.time()),
            )

    def searched(self, model_key: str) -> list[str] | None:
        """The module paths remembered for a model's key, or None."""
        with self._connection() as conn:
            row = conn.execute(
                "SELECT paths FROM searches WHERE model_key = ?", (model_key,)
            ).fetchone()
        return json.loads(row[0]) if row is not None else None

    # ------------------------------------------------------------ reading

    def find(
        self,
        problem: str,
        arch: str | None = None,
        dtype: str | None = None,
        shapes: Sequence[Sequence[int]] | str | None = None,
    ) -> list[StoredKernel]:
        """Kernels for a problem (its source or its hash), fastest first; arch, dtype and shapes
        narrow the match when given."""
        digest = problem if _is_hash(problem) else problem_hash(problem)
        clauses, params = ["problem_hash = ?"], [digest]
        for column, value in (("arch", arch), ("dtype", dtype)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if shapes is not None:
            clauses.append("shapes = ?")
            params.append(shapes_key(shapes))
        sql = (
            "SELECT * FROM kernels WHERE " + " AND ".join(clauses) +
            " ORDER BY candidate_ms IS NULL, candidate_ms, id"
        )  # fmt: skip
        return self._select(sql, params)

    def best(self, problem: str, arch: str, dtype: str, shapes) -> StoredKernel | None:
        """The fastest stored kernel for exactly this key, or None."""
        found = self.find(problem, arch, dtype, shapes)
        return found[0] if found else None

    def all(self) -> list[StoredKernel]:
        """Every row, oldest first."""
        return self._select("SELECT * FROM kernels ORDER BY id", [])

    def __len__(self) -> int:
        with self._connection() as conn:
            return int(conn.execute("SELECT COUNT(*) FROM kernels").fetchone()[0])

    def _select(self, sql: str, params: list[Any]) -> list[StoredKernel]:
        with self._connection() as conn:
            conn.row_factory = sqlite3.Row
            rows = conn.execute(sql, params).fetchall()
        return [_to_kernel(row) for row in rows]


def _to_kernel(row: sqlite3.Row) -> StoredKernel:
    data = dict(row)
    data.pop("source_hash")
    data["result"] = EvalResult.from_json(data["result"])
    return StoredKernel(**data)


def _is_hash(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE (takes the write lock up front, waiting up to the busy timeout) ...
    COMMIT, or ROLLBACK on an error."""
    _retry_locked(lambda: conn.execute("BEGIN IMMEDIATE"))
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _retry_locked(action, attempts: int = 50):
    """Run `action`, retrying 'database is locked' past what busy_timeout covers (the WAL
    switch and the first BEGIN can report it at once instead of waiting)."""
    delay = 0.01
    for attempt in range(attempts):
        try:
            return action()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc) or attempt == attempts - 1:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
    raise AssertionError("unreachable")


__all__ = ["KernelStore", "StoredKernel", "default_path", "shapes_key"]
