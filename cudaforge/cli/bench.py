"""Run many KernelBench problems through the agents and keep one JSON line per problem.

The problems come from a directory of problem files (KernelBench's `level1/19_ReLU.py` layout, or
flat) or from the dev set (`dev_problems.jsonl`, filtered by level and ids). Each goes through an
injected `forge_one(problem)` (the Coder/Judge loop; tests pass a fake), and its record is appended
to the results file as soon as it finishes, so a crash or Ctrl-C loses at most the problems that
were running. A second run with the same results file skips the problems already in it, except
those whose loop stopped unfinished ("waiting" for file: replies, "needs_gpu"): they continue from
their transcripts. A torn last line (the process died mid-write) is dropped and its problem runs
again. An exception of one
problem becomes a record with status "error" and the run goes on.

Record status: "ok" (a correct kernel was found), else the status of the last candidate
("compile_error", "incorrect", ... as in cudaforge.harness.results.STATUSES), "no_candidate" (the loop
evaluated none), or "error" (forge_one raised).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; one run per results file is then up to the user
    fcntl = None

from ..errors import LibraryNotFound, NeedsKeyError, NoGPUError
from ..harness.problem import Problem, dev_set_path

RECORD_VERSION = 1
# stop reasons of a loop that continues from its transcript when the bench runs again
UNFINISHED = ("waiting", "needs_gpu")
# exceptions that would fail every problem the same way: they end the run instead of being recorded
STOP_ON: tuple[type[BaseException], ...] = (NeedsKeyError, LibraryNotFound, NoGPUError)


# ---------------------------------------------------------------- problems


@dataclass
class BenchProblem:
    """One problem to forge. key: its identity in a results file ("level1/19_ReLU"), the same
    for the dev set and for a KernelBench checkout, so either can resume the other's run."""

    key: str
    name: str  # "19_ReLU"
    level: int | None
    problem_id: int | None
    source: str  # KernelBench-format source: Model, get_inputs, get_init_inputs
    path: str | None = None  # the file it was read from; None for the dev set

    def to_problem(self) -> Problem:
        """The cudaforge.harness.problem.Problem (raises ValueError if the source is not a problem)."""
        origin = self.path or f"dev:{self.level}/{self.problem_id}"
        return Problem.from_source(
            self.source,
            name=self.name,
            level=self.level,
            problem_id=self.problem_id,
            origin=origin,
        )


def _problem_key(name: str, level: int | None) -> str:
    return f"level{level}/{name}" if level is not None else name


def _select(
    problems: list[BenchProblem],
    level: int | Iterable[int] | None,
    ids: Iterable[int] | None,
    where: str,
) -> list[BenchProblem]:
    levels = None if level is None else {level} if isinstance(level, int) else set(level)
    wanted = None if ids is None else set(ids)
    chosen = [
        p
        for p in problems
        if (levels is None or p.level in levels) and (wanted is None or p.problem_id in wanted)
    ]
    if wanted is not None:
        missing = sorted(wanted - {p.problem_id for p in chosen})
        if missing:
            in_levels = f" of level {', '.join(map(str, sorted(levels)))}" if levels else ""
            raise ValueError(f"{where} has no problem{in_levels} with id {missing}")
    if not chosen:
        of_level = f" of level {', '.join(map(str, sorted(levels)))}" if levels else "s"
        raise ValueError(f"{where} has no problem{of_level}")
    chosen.sort(key=lambda p: (p.level or 0, p.problem_id or 0, p.key))
    return chosen


def dev_set_problems(
    level: int | Iterable[int] | None = None,
    ids: Iterable[int] | None = None,
    path: str | os.PathLike | None = None,
) -> list[BenchProblem]:
    """The dev set's problems of `level` (one or several; None: all) with these ids (None: all),
    ordered by level and id; the file is found as cudaforge.harness.problem.dev_set_path finds it.
    Raises ValueError naming any requested id the dev set lacks."""
    found = dev_set_path(path)
    problems = []
    with open(found, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                name, lvl, pid = row["name"], int(row["level"]), int(row["problem_id"])
                problems.append(
                    BenchProblem(_problem_key(name, lvl), name, lvl, pid, row["code"], None)
                )
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{found} line {number} is not a dev-set problem: {exc}") from exc
    return _select(problems, level, ids, f"the dev set {found}")


_LEVEL_DIR = re.compile(r"^level[_-]?(\d+)$", re.IGNORECASE)
_ID_PREFIX = re.compile(r"^(\d+)_")


def dir_problems(
    directory: str | os.PathLike,
    level: int | Iterable[int] | None = None,
    ids: Iterable[int] | None = None,
) -> list[BenchProblem]:
    """The problem files under `directory` (searched recursively): each .py file that defines
    get_inputs. The level comes from a `levelN` folder in its path, the id from the file name's
    leading number (`19_ReLU.py`); filters as in dev_set_problems."""
    root = Path(directory)
    if not root.is_dir():
        raise FileNotFoundError(f"problem directory {root} does not exist")
    problems = []
    for file in sorted(root.rglob("*.py")):
        parts = file.relative_to(root).parts
        if any(part.startswith((".", "_")) for part in parts):
            continue  # __init__.py, __pycache__, hidden folders
        source = file.read_text(encoding="utf-8")
        if "def get_inputs" not in source:
            continue  # a helper module, not a problem
        levels = [int(m[1]) for m in map(_LEVEL_DIR.match, parts[:-1]) if m]
        lvl = levels[-1] if levels else None
        pid = _ID_PREFIX.match(file.stem)
        name = file.stem
        key = _problem_key(name, lvl) if lvl is not None else file.relative_to(root).as_posix()[:-3]
        problems.append(
            BenchProblem(key, name, lvl, int(pid[1]) if pid else None, source, str(file))
        )
    if not problems:
        raise ValueError(f"no problem files (*.py defining get_inputs) under {root}")
    return _select(problems, level, ids, f"the directory {root}")


# ---------------------------------------------------------------- records


@dataclass
class BenchRecord:
    """What happened to one problem: one line of a results file. Times in seconds, money in USD;
    speedup is PyTorch eager time / the best kernel's time (None when no kernel was correct)."""

    key: str
    problem: str
    level: int | None = None
    problem_id: int | None = None
    status: str = "error"
    correct: bool = False
    speedup: float | None = None
    speedup_vs_compile: float | None = None  # torch.compile time / the kernel's time, when timed
    candidate_ms: float | None = None
    reference_ms: float | None = None
    compiled_reference_ms: float | None = None  # torch.compile of the reference, when timed
    cost_usd: float | None = None  # None: not known (forge_one raised)
    unpriced_calls: int = 0  # calls to models without a known price (not in cost_usd)
    llm_calls: int = 0
    input_tokens: int = 0  # as the providers count them (file: estimates them)
    output_tokens: int = 0
    seconds: float | None = None
    rounds: int = 0
    stop_reason: str = ""
    best_path: str | None = None  # the best kernel's source file
    transcript: str | None = None  # the loop's JSONL transcript
    waiting_for: list[str] = field(default_factory=list)  # prompt files without a reply (file:)
    error: str = ""  # one readable line
    traceback: str = ""
    finished: str = ""  # UTC, ISO 8601
    meta: dict[str, Any] = field(default_factory=dict)  # run settings (models, GPU, rounds)
    version: int = RECORD_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {k: _finite(v) for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchRecord:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values.setdefault("problem", str(values.get("key", "")))
        values.setdefault("key", values["problem"])
        return cls(**values)


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: they are written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _first_line(text: str, limit: int = 300) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _exception_line(exc: BaseException) -> str:
    message = _first_line(str(exc))
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _safe_relpath(key: str) -> Path:
    parts = [re.sub(r"[^A-Za-z0-9._-]", "_", part) for part in key.split("/") if part]
    parts = [part if part.strip(".") else part.replace(".", "_") for part in parts]
    return Path(*parts) if parts else Path("problem")


def compiled_times_path(results: str | os.PathLike) -> Path:
    """Where a run keeps each problem's torch.compile time (cudaforge.harness.compiled_reference):
    beside the results file, so that a resumed run on another machine does not compile again."""
    path = Path(results)
    return path.with_name(path.stem + "_compiled_reference.json")


def transcripts_dir_path(results: str | os.PathLike) -> Path:
    """The folder of a run's transcripts: `<results without suffix>_transcripts` beside it."""
    return Path(str(Path(results).with_suffix("")) + "_transcripts")


def transcript_path(transcripts_dir: str | os.PathLike, key: str) -> Path:
    """Where a run writes the transcript of problem `key`: transcripts_dir/<key>.jsonl."""
    path = Path(transcripts_dir) / _safe_relpath(key)
    return path.with_name(path.name + ".jsonl")


def write_kernel(kernels_dir: str | os.PathLike, key: str, source: str) -> Path:
    """Write a problem's best kernel source to kernels_dir/<key>.py; returns the path."""
    path = Path(kernels_dir) / _safe_relpath(key)
    path = path.with_name(path.name + ".py")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source, encoding="utf-8")
    return path


def record_from_loop(
    problem: BenchProblem, loop: Any, kernels_dir: str | os.PathLike | None = None
) -> BenchRecord:
    """A record from the agents loop's LoopResult; the best kernel is written to kernels_dir."""
    best = loop.best
    usage = loop.usage.get("total") if isinstance(loop.usage, dict) else None
    record = BenchRecord(
        key=problem.key,
        problem=problem.name,
        level=problem.level,
        problem_id=problem.problem_id,
        cost_usd=usage.cost_usd if usage is not None else None,
        unpriced_calls=usage.unpriced_calls if usage is not None else 0,
        llm_calls=usage.calls if usage is not None else 0,
        input_tokens=usage.input_tokens if usage is not None else 0,
        output_tokens=usage.output_tokens if usage is not None else 0,
        seconds=loop.seconds,
        rounds=loop.rounds,
        stop_reason=loop.stop_reason,
        transcript=str(loop.transcript) if loop.transcript else None,
        waiting_for=list(getattr(loop, "waiting_for", [])),
    )
    if best is not None:
        result = best.result
        record.status, record.correct = "ok", True
        record.speedup = result.speedup
        record.speedup_vs_compile = result.speedup_vs_compile
        record.candidate_ms, record.reference_ms = result.candidate_ms, result.reference_ms
        record.compiled_reference_ms = result.compiled_reference_ms
        if kernels_dir is not None and best.source:
            record.best_path = str(write_kernel(kernels_dir, problem.key, best.source))
    elif loop.attempts:
        last = loop.attempts[-1].result
        record.status = last.status
        record.error = _first_line(last.error or f"no correct kernel ({loop.stop_reason})")
    else:
        record.status = "no_candidate"
        record.error = _first_line(f"no candidate was evaluated ({loop.stop_reason})")
    return record


def _as_record(
    problem: BenchProblem, value: Any, kernels_dir: str | os.PathLike | None
) -> BenchRecord:
    if isinstance(value, BenchRecord):
        record = value
    elif isinstance(value, dict):
        identity = {
            "problem": problem.name,
            "level": problem.level,
            "problem_id": problem.problem_id,
        }
        record = BenchRecord.from_dict({**identity, **value})
    elif hasattr(value, "attempts") and hasattr(value, "best"):
        record = record_from_loop(problem, value, kernels_dir)
    else:
        raise TypeError(
            f"forge_one returned a {type(value).__name__}; expected a BenchRecord, a dict of its "
            "fields or a LoopResult"
        )
    record.key = problem.key  # the identity that resuming relies on
    return record


# ---------------------------------------------------------------- the results file


@dataclass
class ResultsFile:
    """The records of a results file, in file order. torn_bytes: length of a torn last line that
    was left out; good_size: bytes up to the end of the last whole line."""

    path: Path
    records: list[dict[str, Any]]
    torn_bytes: int = 0
    good_size: int = 0
    ends_with_newline: bool = True

    def latest(self) -> dict[str, dict[str, Any]]:
        """The last record of each problem key (a retried problem has several)."""
        return {_record_key(r): r for r in self.records}


def _record_key(record: dict[str, Any]) -> str:
    return str(record.get("key") or record.get("problem") or "")


def read_results(path: str | os.PathLike) -> ResultsFile:
    """Read a results JSONL file. A last line that is not whole (no newline, not JSON) is left
    out and counted in torn_bytes; any other line that is not a JSON record raises ValueError."""
    path = Path(path)
    data = path.read_bytes()
    lines = data.split(b"\n")
    tail = lines.pop()  # after the last newline: b"" when the file ends with one
    records, offset = [], 0
    for number, line in enumerate(lines, 1):
        offset += len(line) + 1
        if line.strip():
            records.append(_parse_record(path, number, line))
    result = ResultsFile(path, records, good_size=offset)
    if tail.strip():
        try:
            records.append(_parse_record(path, len(lines) + 1, tail))
            result.good_size, result.ends_with_newline = len(data), False
        except ValueError:
            result.torn_bytes = len(tail)
    return result


def _parse_record(path: Path, number: int, line: bytes) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(
            f"{path} line {number} is not JSON ({exc}); remove or repair that line"
        ) from exc
    if not isinstance(record, dict) or not _record_key(record):
        raise ValueError(f"{path} line {number} is not a benchmark record (no key or problem)")
    return record


class _Appender:
    """Appends whole lines: one unbuffered write per record, flushed to disk. Holds an exclusive
    lock on the file (POSIX) so that two runs cannot interleave or truncate each other's lines."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(path, "ab", buffering=0)  # noqa: SIM115 (closed by close())
        if fcntl is not None:
            try:
                fcntl.flock(self.file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.file.close()
                raise RuntimeError(
                    f"{path} is being written by another benchmark run; wait for it to end or "
                    "give this run another results file"
                ) from None

    def truncate(self, size: int) -> None:
        self.file.truncate(size)
        os.fsync(self.file.fileno())

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[self.file.write(view) :]
        os.fsync(self.file.fileno())

    def append(self, record: BenchRecord) -> None:
        line = json.dumps(record.to_dict(), allow_nan=False, ensure_ascii=False)
        self.write(line.encode("utf-8") + b"\n")

    def close(self) -> None:
        self.file.close()


# ---------------------------------------------------------------- the run


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass
class BenchOutcome:
    """What one run_bench call did: the records it appended (in finishing order) and the keys of
    the problems it skipped because the results file already had them."""

    results: Path
    records: list[BenchRecord]
    skipped: list[str]
    torn_bytes: int = 0  # a torn last line that was dropped

    @property
    def correct(self) -> int:
        return sum(r.correct for r in self.records)

    @property
    def errors(self) -> int:
        return sum(r.status == "error" for r in self.records)


def _minutes(seconds: float | None) -> str:
    if seconds is None:
        return "? s"
    return f"{seconds:.1f} s" if seconds < 60 else f"{seconds / 60:.1f} min"


def _done_line(record: BenchRecord) -> str:
    if record.status == "error":
        return f"{record.key}: error: {record.error}"
    if record.correct:
        speed = f"{record.speedup:.3g}x" if record.speedup is not None else "not timed"
        what = f"ok, speedup {speed}"
    else:
        what = record.status + (f" ({_first_line(record.error, 120)})" if record.error else "")
    cost = f"${record.cost_usd:.2f}" if record.cost_usd is not None else "$?"
    rounds = f"{record.rounds} round{'s' if record.rounds != 1 else ''}"
    return f"{record.key}: {what}; {rounds}, {cost}, {_minutes(record.seconds)}"


def _forge(
    problem: BenchProblem,
    forge_one: Callable[[BenchProblem], Any],
    kernels_dir: Path | None,
    stop_on: tuple[type[BaseException], ...],
    meta: dict[str, Any],
) -> BenchRecord:
    """One problem, never raising except for KeyboardInterrupt and the stop_on types."""
    started = time.monotonic()
    try:
        record = _as_record(problem, forge_one(problem), kernels_dir)
    except stop_on:
        raise
    except Exception as exc:  # noqa: BLE001 (one problem's failure is a record, not fatal)
        record = BenchRecord(
            key=problem.key,
            problem=problem.name,
            level=problem.level,
            problem_id=problem.problem_id,
            status="error",
            error=_exception_line(exc),
            traceback="".join(traceback.format_exception(exc)),
        )
    if record.seconds is None:
        record.seconds = time.monotonic() - started
    record.meta = {**meta, **record.meta}
    record.finished = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return record


def run_bench(
    problems: Iterable[BenchProblem],
    forge_one: Callable[[BenchProblem], Any],
    results: str | os.PathLike,
    *,
    jobs: int = 1,
    retry_errors: bool = False,
    kernels_dir: str | os.PathLike | None = None,
    meta: dict[str, Any] | None = None,
    stop_on: tuple[type[BaseException], ...] = STOP_ON,
    progress: Callable[[str], None] | None = _to_stderr,
) -> BenchOutcome:
    """Forge each problem not yet in `results` and append its record there as it finishes.

    forge_one(problem) returns a BenchRecord, a dict of its fields, or the agents' LoopResult
    (its best kernel is then written under kernels_dir, default `<results stem>_kernels/` beside
    the results file). An exception of forge_one becomes a record with status "error", except
    KeyboardInterrupt and the `stop_on` types (a missing API key, library or GPU), which end the
    run. retry_errors: run again the problems whose last record is an "error". jobs: problems run
    at once in threads (forge_one must then be thread-safe); when the run ends early, problems
    still running are not recorded and run again next time, but Python waits for their threads
    before the process exits. meta: settings stored in every record (models, GPU, rounds).
    progress(line) gets one line per event (default: stderr; None: silent).
    """
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")
    say = progress or (lambda line: None)
    path = Path(results)
    problems = list(problems)
    seen: set[str] = set()
    for problem in problems:
        if problem.key in seen:
            raise ValueError(f"problem {problem.key} is listed twice")
        seen.add(problem.key)
    kernels = (
        Path(kernels_dir) if kernels_dir is not None else path.with_name(path.stem + "_kernels")
    )
    if not problems:
        raise ValueError("no problems to run")

    appender = _Appender(path)  # locks the file before it is read, so no other run can append
    try:
        return _run_locked(
            problems, forge_one, path, appender, jobs, retry_errors, kernels, meta, stop_on, say
        )
    finally:
        appender.close()


def _run_locked(
    problems, forge_one, path, appender, jobs, retry_errors, kernels, meta, stop_on, say
) -> BenchOutcome:
    existing = read_results(path)
    if existing.torn_bytes:
        appender.truncate(existing.good_size)
        say(
            f"bench: dropped a torn last line of {path} ({existing.torn_bytes} bytes); its "
            "problem runs again"
        )
    latest = existing.latest()
    skipped = [
        p.key
        for p in problems
        if p.key in latest
        and not (retry_errors and latest[p.key].get("status") == "error")
        and latest[p.key].get("stop_reason") not in UNFINISHED
    ]
    todo = [p for p in problems if p.key not in set(skipped)]
    say(
        f"bench: {len(problems)} problems; {len(skipped)} already in {path}, {len(todo)} to run"
        + (f", {jobs} at a time" if jobs > 1 and todo else "")
    )
    outcome = BenchOutcome(path, [], skipped, existing.torn_bytes)
    if not todo:
        return outcome
    if not existing.ends_with_newline:
        appender.write(b"\n")
    settings = dict(meta or {})
    width = len(str(len(todo)))
    finished = 0

    def record_it(record: BenchRecord) -> None:
        nonlocal finished
        appender.append(record)
        outcome.records.append(record)
        finished += 1
        say(f"[{finished:>{width}}/{len(todo)}] {_done_line(record)}")

    started = time.monotonic()
    try:
        if jobs == 1:
            for problem in todo:
                say(f"[{finished + 1:>{width}}/{len(todo)}] {problem.key}: started")
                record_it(_forge(problem, forge_one, kernels, stop_on, settings))
        else:
            _run_parallel(todo, jobs, forge_one, kernels, stop_on, settings, record_it, say)
    finally:
        spent = sum(r.cost_usd or 0.0 for r in outcome.records)
        say(
            f"bench: {'done' if finished == len(todo) else 'stopped'}: {finished} of {len(todo)} "
            f"run, {outcome.correct} correct, {outcome.errors} errors; ${spent:.2f}, "
            f"{_minutes(time.monotonic() - started)}; results in {path}"
        )
    return outcome


def _run_parallel(todo, jobs, forge_one, kernels, stop_on, settings, record_it, say) -> None:
    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="cudaforge-bench")
    waiting = iter(todo)
    running: dict[Future, BenchProblem] = {}

    def submit_next() -> None:
        problem = next(waiting, None)
        if problem is not None:
            say(f"{problem.key}: started")
            running[pool.submit(_forge, problem, forge_one, kernels, stop_on, settings)] = problem

    try:
        for _ in range(jobs):
            submit_next()
        while running:
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                running.pop(future)
                record_it(future.result())  # re-raises KeyboardInterrupt and the stop_on types
                submit_next()
    finally:
        if running:
            say(f"bench: {len(running)} running problems are left unrecorded; they run again next")
        pool.shutdown(wait=False, cancel_futures=True)


def loop_forge(
    evaluate: Callable[[str, str], Any],
    *,
    transcripts_dir: str | os.PathLike | None = None,
    **loop_options: Any,
) -> Callable[[BenchProblem], Any]:
    """A forge_one for run_bench that runs the agents loop (cudaforge.agents.loop.run_loop) on each
    problem and returns its LoopResult (run_bench writes the best kernel out).

    evaluate(problem_source, candidate_source) -> EvalResult; loop_options go to run_loop (coder,
    judge, rounds, max_dollars, max_seconds, candidates, gpu, ...). Transcripts are written to
    transcripts_dir/<key>.jsonl (default: run_loop's own place)."""
    from ..agents.loop import run_loop
    from ..agents.resume import recorded_problem

    def forge_one(problem: BenchProblem) -> Any:
        transcript = None
        if transcripts_dir is not None:
            transcript = transcript_path(transcripts_dir, problem.key)
            transcript.parent.mkdir(parents=True, exist_ok=True)
        # a problem run before goes on with the problem it began with (agents.resume)
        source = (recorded_problem(transcript) if transcript else None) or problem.source
        return run_loop(source, evaluate, name=problem.name, transcript=transcript, **loop_options)

    return forge_one


__all__ = [
    "STOP_ON",
    "BenchOutcome",
    "BenchProblem",
    "BenchRecord",
    "ResultsFile",
    "compiled_times_path",
    "dev_set_problems",
    "dir_problems",
    "loop_forge",
    "read_results",
    "record_from_loop",
    "run_bench",
    "transcript_path",
    "transcripts_dir_path",
    "write_kernel",
]
