"""What a forge run already did, read back from its transcript so that the run can go on.

A run that is started again on the transcript of an earlier one (the same `forge --out`, the same
`bench --results`) continues it: the recorded LLM replies answer the calls with the same role and
tag (agents.loop.call_tag), the recorded evaluations answer for candidates with the same sha256,
and only the first call or candidate without a record goes live. The loop is deterministic given
its replies and results, so the replayed part asks what it asked before. This works after a crash
or a kill too: records are written as they happen, and a torn last line is ignored.

A run whose evaluations ran on a GPU, resumed on a machine without one, replays what is recorded
and stops with `needs_gpu` at its first new candidate (RecordedRun.on_gpu).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..harness.results import EvalResult
from .providers import Reply


def source_sha256(source: str) -> str:
    """The hash evaluations are recorded and found by."""
    return hashlib.sha256(source.encode()).hexdigest()


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a transcript; a torn line (the writer was killed mid-line) is skipped."""
    records = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return records


@dataclass
class RecordedRun:
    """The replies and evaluations of a transcript, for a resumed run.

    start: the first start record (problem, models, gpu text, target). replies: (role, tag) ->
    llm record. evaluations: candidate sha256 -> result dict. on_gpu: some recorded evaluation
    ran on a GPU (its result names a CUDA device). notes: the notes the run's prompts last had."""

    path: Path
    start: dict[str, Any]
    replies: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    evaluations: dict[str, dict[str, Any]] = field(default_factory=dict)
    on_gpu: bool = False
    notes: str = ""  # the latest start or resume record's (run_loop's notes)

    def of_another_problem(self, problem_source: str) -> bool:
        """Whether this run was of a problem other than `problem_source` (a start record
        without the problem's hash counts as this one's)."""
        return self.start.get("problem_sha256") not in (None, source_sha256(problem_source))

    @classmethod
    def read(cls, path: str | os.PathLike) -> RecordedRun | None:
        """The run recorded at `path`, or None when there is none (no file, no start record)."""
        path = Path(path)
        if not path.is_file():
            return None
        records = read_records(path)
        start = next((r for r in records if r.get("kind") == "start"), None)
        if start is None:
            return None
        run = cls(path, start)
        for record in records:
            if record.get("kind") in ("start", "resume") and "notes" in record:
                run.notes = record["notes"] or ""
            if record.get("kind") == "llm" and record.get("tag"):
                run.replies.setdefault((record.get("role", ""), record["tag"]), record)
            elif record.get("kind") == "eval" and record.get("source") is not None:
                digest = record.get("source_sha256") or source_sha256(record["source"])
                run.evaluations.setdefault(digest, record["result"])
                run.on_gpu = run.on_gpu or "cuda" in str(record["result"].get("device", ""))
        return run

    @property
    def problem_source(self) -> str:
        return self.start.get("problem_source", "")

    def reply(self, role: str, tag: str) -> Reply | None:
        """The recorded reply of the call `role` made under `tag`, or None."""
        record = self.replies.get((role, tag))
        if record is None:
            return None
        return Reply.from_record(record, attempts=0)  # no request made this time

    def evaluation(self, source: str) -> EvalResult | None:
        """The recorded result for the candidate `source`, or None."""
        result = self.evaluations.get(source_sha256(source))
        return EvalResult.from_dict(result) if result is not None else None


def recorded_problem(path: str | os.PathLike) -> str | None:
    """The problem source a transcript's run was started with, or None when there is no run
    there: a resumed run goes on with the problem it began with (a run started on a CPU keeps
    its shrunk sizes, a GPU run resumed on a CPU keeps the GPU's)."""
    run = RecordedRun.read(path)
    return run.problem_source or None if run is not None else None


def transcript_for(folder: Path, name: str, problem_source: str) -> tuple[str, Path]:
    """(run name, transcript path) of a hot spot's loop in a transcripts folder: its name's
    file, resumed by the next run; where that file records another problem (the model or its
    inputs changed since), the name with the problem's hash, a transcript (and a file:
    provider's folder) of its own beside the other, which is kept."""
    path = Path(folder) / f"{transcript_file_name(name)}.jsonl"
    recorded = RecordedRun.read(path)
    if recorded is not None and recorded.of_another_problem(problem_source):
        name = f"{name} [{source_sha256(problem_source)[:8]}]"
        path = Path(folder) / f"{transcript_file_name(name)}.jsonl"
    return name, path


def transcript_file_name(name: str) -> str:
    return re.sub(r"[^\w.-]+", "_", name).strip("._") or "hotspot"


__all__ = [
    "RecordedRun",
    "read_records",
    "recorded_problem",
    "source_sha256",
    "transcript_file_name",
    "transcript_for",
]
