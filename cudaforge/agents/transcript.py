"""The record of a forge run: a JSONL transcript (prompts, replies, evaluation results, timings,
usage; API keys redacted) written as the loop goes, appended to when the run resumes
(agents.resume), read back for reports, and replayed: its
evaluation records answer for `evaluate` (recorded_evaluator) and its replies for the models
(`replay:PATH`, agents.providers.ReplayProvider)."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..harness.results import EvalResult
from .providers import redact

Evaluate = Callable[[str, str], EvalResult]  # (problem_source, candidate_source) -> EvalResult
TRANSCRIPT_VERSION = 1


def default_transcript_path(name: str) -> Path:
    """cache_dir()/transcripts/<UTC time>-<name>.jsonl ($CUDAFORGE_CACHE_DIR moves the cache)."""
    from ..cuda.kernel import cache_dir

    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    safe = re.sub(r"[^\w.-]+", "_", name)[:60]
    return cache_dir() / "transcripts" / f"{stamp}-{safe}-{os.getpid()}.jsonl"


class Transcript:
    """A JSONL file, one record a line, flushed as written; every line goes through `redact`.

    An existing file is appended to (a resumed run goes on in it, agents.resume); a line torn by
    a kill is closed first, so that the next record starts on a line of its own."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        torn = self.path.is_file() and _ends_mid_line(self.path)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed by close())
        if torn:
            self._file.write("\n")
        self._lock = threading.Lock()
        self._started = time.monotonic()

    def write(self, kind: str, **fields: Any) -> None:
        record = {"kind": kind, "t": round(time.monotonic() - self._started, 4), **fields}
        line = redact(json.dumps(record, default=str))
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        self._file.close()


def _ends_mid_line(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() == 0:
            return False
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


def read_transcript(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a transcript, in order."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def recorded_evaluator(path: str | os.PathLike) -> Evaluate:
    """An `evaluate` that answers from a transcript's evaluation records, matched by candidate
    source: re-runs a loop with `replay:PATH` without a GPU. A source the transcript never saw
    gets a 'crashed' result saying so."""
    results = {}
    for record in read_transcript(path):
        if record["kind"] == "eval" and record.get("source") is not None:
            results[record["source"]] = record["result"]

    def evaluate(problem_source: str, candidate_source: str) -> EvalResult:
        if candidate_source in results:
            return EvalResult.from_dict(results[candidate_source])
        return EvalResult(
            problem="", status="crashed", error=f"candidate not evaluated in transcript {path}"
        )

    return evaluate


__all__ = [
    "TRANSCRIPT_VERSION",
    "Evaluate",
    "Transcript",
    "default_transcript_path",
    "read_transcript",
    "recorded_evaluator",
]
