"""cudaforge/bench.py: many problems through a forge_one callable, one JSON line each, resumable
after an interruption or a torn last line, one problem's exception recorded and not fatal. The
forge_one here is a fake (FIXTURE records), except where the agents loop itself runs on scripted
replies."""

from __future__ import annotations

import json
import math
import threading
import time

import pytest

from cudaforge.agents.providers import ScriptedProvider
from cudaforge.cli.bench import (
    BenchProblem,
    BenchRecord,
    dev_set_problems,
    dir_problems,
    loop_forge,
    read_results,
    run_bench,
)
from cudaforge.errors import NeedsKeyError
from cudaforge.harness.problem import dev_set_path
from cudaforge.harness.results import EvalResult

PROBLEM_SOURCE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """FIXTURE problem: y = relu(x)."""

    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(8, 8)]


def get_init_inputs():
    return []
'''


def make_problems(count: int = 5, level: int = 1) -> list[BenchProblem]:
    return [
        BenchProblem(f"level{level}/{i}_Fixture", f"{i}_Fixture", level, i, PROBLEM_SOURCE, None)
        for i in range(1, count + 1)
    ]


def fake_record(problem: BenchProblem) -> dict:
    """FIXTURE: a correct kernel with a speedup of 1 + id/10, $0.01 per id."""
    return {
        "status": "ok",
        "correct": True,
        "speedup": 1 + problem.problem_id / 10,
        "cost_usd": problem.problem_id / 100,
        "rounds": 3,
    }


def lines_of(path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def test_every_problem_is_appended_with_its_fields(tmp_path):
    results = tmp_path / "results.jsonl"
    said: list[str] = []
    outcome = run_bench(
        make_problems(3), fake_record, results, meta={"coder": "scripted:"}, progress=said.append
    )
    rows = lines_of(results)
    assert [r["key"] for r in rows] == ["level1/1_Fixture", "level1/2_Fixture", "level1/3_Fixture"]
    first = rows[0]
    assert first["problem"] == "1_Fixture" and first["level"] == 1 and first["problem_id"] == 1
    assert first["status"] == "ok" and first["correct"] is True
    assert first["speedup"] == pytest.approx(1.1) and first["cost_usd"] == pytest.approx(0.01)
    assert first["rounds"] == 3 and first["meta"] == {"coder": "scripted:"}
    assert first["seconds"] >= 0 and first["finished"].endswith("Z")
    assert outcome.correct == 3 and outcome.errors == 0 and outcome.skipped == []
    assert said[0].startswith("bench: 3 problems; 0 already in")
    assert any("level1/2_Fixture: ok, speedup 1.2x; 3 rounds, $0.02" in line for line in said)
    assert said[-1].startswith("bench: done: 3 of 3 run, 3 correct, 0 errors")


def test_resume_after_keyboard_interrupt_runs_only_the_rest(tmp_path):
    results = tmp_path / "results.jsonl"
    problems = make_problems(5)
    calls: list[str] = []

    def interrupted(problem):
        calls.append(problem.key)
        if problem.problem_id == 3:
            raise KeyboardInterrupt  # Ctrl-C while the third problem runs
        return fake_record(problem)

    with pytest.raises(KeyboardInterrupt):
        run_bench(problems, interrupted, results, progress=None)
    assert [r["key"] for r in lines_of(results)] == ["level1/1_Fixture", "level1/2_Fixture"]

    calls.clear()
    outcome = run_bench(problems, fake_record, results, progress=None)
    assert outcome.skipped == ["level1/1_Fixture", "level1/2_Fixture"]
    assert [r.key for r in outcome.records] == [p.key for p in problems[2:]]
    keys = [r["key"] for r in lines_of(results)]
    assert keys == [p.key for p in problems]  # all done, none twice

    # a third run has nothing left to do
    again = run_bench(problems, lambda p: pytest.fail("ran again"), results, progress=None)
    assert again.records == [] and len(again.skipped) == 5


def test_torn_last_line_is_dropped_and_its_problem_redone(tmp_path):
    results = tmp_path / "results.jsonl"
    problems = make_problems(3)
    run_bench(problems[:2], fake_record, results, progress=None)
    whole = results.read_bytes()
    torn = json.dumps({"key": problems[2].key, "status": "ok", "correct": True})[:25]
    results.write_bytes(whole + torn.encode())  # the process died while writing line 3

    read = read_results(results)
    assert len(read.records) == 2 and read.torn_bytes == len(torn)

    said: list[str] = []
    calls: list[str] = []
    run_bench(
        problems, lambda p: calls.append(p.key) or fake_record(p), results, progress=said.append
    )
    assert calls == [problems[2].key]
    assert [r["key"] for r in lines_of(results)] == [p.key for p in problems]
    assert results.read_bytes().startswith(whole)
    assert any("dropped a torn last line" in line for line in said)


def test_whole_last_line_without_newline_is_kept(tmp_path):
    results = tmp_path / "results.jsonl"
    problems = make_problems(2)
    run_bench(problems[:1], fake_record, results, progress=None)
    results.write_bytes(results.read_bytes().rstrip(b"\n"))  # edited by hand, say
    run_bench(problems, fake_record, results, progress=None)
    assert [r["key"] for r in lines_of(results)] == [p.key for p in problems]


def test_a_bad_line_in_the_middle_is_an_error_not_a_guess(tmp_path):
    results = tmp_path / "results.jsonl"
    results.write_text('{"key": "a"}\nnot json\n{"key": "b"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        run_bench(make_problems(1), fake_record, results, progress=None)


def test_an_exception_is_recorded_and_the_run_goes_on(tmp_path):
    results = tmp_path / "results.jsonl"
    problems = make_problems(3)

    def flaky(problem):
        if problem.problem_id == 2:
            raise RuntimeError("worker died\nsecond line of detail")
        return fake_record(problem)

    outcome = run_bench(problems, flaky, results, progress=None)
    rows = {r["key"]: r for r in lines_of(results)}
    assert len(rows) == 3 and outcome.errors == 1
    failed = rows["level1/2_Fixture"]
    assert failed["status"] == "error" and failed["correct"] is False
    assert failed["error"] == "RuntimeError: worker died"
    assert "second line of detail" in failed["traceback"]
    assert failed["cost_usd"] is None and failed["seconds"] >= 0
    assert rows["level1/3_Fixture"]["status"] == "ok"

    # by default an error is not retried; with retry_errors it is, and appended
    assert run_bench(problems, fake_record, results, progress=None).records == []
    retried = run_bench(problems, fake_record, results, retry_errors=True, progress=None)
    assert [r.key for r in retried.records] == ["level1/2_Fixture"]
    latest = read_results(results).latest()
    assert latest["level1/2_Fixture"]["status"] == "ok"


def test_forge_one_returning_nonsense_is_an_error_record(tmp_path):
    results = tmp_path / "results.jsonl"
    run_bench(make_problems(1), lambda p: 42, results, progress=None)
    (row,) = lines_of(results)
    assert row["status"] == "error" and row["error"].startswith("TypeError: forge_one returned")


def test_missing_key_ends_the_run_instead_of_failing_every_problem(tmp_path):
    results = tmp_path / "results.jsonl"

    def no_key(problem):
        raise NeedsKeyError("set OPENAI_API_KEY", provider="openai", env_var="OPENAI_API_KEY")

    with pytest.raises(NeedsKeyError):
        run_bench(make_problems(3), no_key, results, progress=None)
    assert not results.exists() or results.read_text() == ""


def test_non_finite_numbers_are_written_as_null(tmp_path):
    results = tmp_path / "results.jsonl"
    record = BenchRecord(key="x", problem="x", status="ok", correct=True, speedup=math.nan)
    run_bench(make_problems(1), lambda p: record, results, progress=None)
    (row,) = lines_of(results)
    assert row["speedup"] is None and row["key"] == "level1/1_Fixture"  # key is the problem's


def test_two_runs_cannot_write_one_results_file(tmp_path):
    results = tmp_path / "results.jsonl"

    def nested(problem):  # a second run on the same file while the first holds it
        run_bench(make_problems(1, level=2), fake_record, results, progress=None)
        return fake_record(problem)

    run_bench(make_problems(1), nested, results, progress=None)
    (row,) = lines_of(results)
    assert row["status"] == "error" and "being written by another benchmark run" in row["error"]


def test_duplicate_problems_are_refused(tmp_path):
    problems = make_problems(2) + make_problems(1)
    with pytest.raises(ValueError, match="listed twice"):
        run_bench(problems, fake_record, tmp_path / "r.jsonl", progress=None)
    with pytest.raises(ValueError, match="no problems"):
        run_bench([], fake_record, tmp_path / "r.jsonl", progress=None)


def test_parallel_jobs_record_each_problem_once_and_resume(tmp_path):
    results = tmp_path / "results.jsonl"
    problems = make_problems(8)
    running, peak, lock = [0], [0], threading.Lock()

    def slow(problem):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.02)
        with lock:
            running[0] -= 1
        if problem.problem_id == 5:
            raise KeyboardInterrupt
        return fake_record(problem)

    with pytest.raises(KeyboardInterrupt):
        run_bench(problems, slow, results, jobs=3, progress=None)
    assert peak[0] == 3
    first = [r["key"] for r in lines_of(results)]
    assert "level1/5_Fixture" not in first and len(first) == len(set(first))

    time.sleep(0.1)  # threads of the first run that were still going have ended, unrecorded
    run_bench(problems, fake_record, results, jobs=3, progress=None)
    keys = [r["key"] for r in lines_of(results)]
    assert sorted(keys) == sorted(p.key for p in problems) and keys[: len(first)] == first


# ---------------------------------------------------------------- the agents loop as forge_one


def coder_reply(note: str) -> str:
    source = PROBLEM_SOURCE.replace("class Model(", "class ModelNew(").replace("relu(x)", note)
    return f"FIXTURE Coder reply.\n\n```python\n{source}```\n"


def test_loop_result_becomes_a_record_with_the_best_kernel_written(tmp_path):
    results = tmp_path / "results.jsonl"
    coder = ScriptedProvider([coder_reply("relu(x)  # fast")], cost_per_call=0.25)

    def evaluate(problem_source: str, candidate_source: str) -> EvalResult:
        assert "class Model(" in problem_source and "class ModelNew(" in candidate_source
        return EvalResult(
            problem="fixture", status="ok", compiled=True, correct=True, candidate_ms=0.5,
            reference_ms=1.0, speedup=2.0, speedup_vs_compile=1.25,
        )  # fmt: skip

    forge_one = loop_forge(evaluate, coder=coder, rounds=1, transcripts_dir=tmp_path / "logs")
    run_bench(make_problems(1), forge_one, results, progress=None)
    (row,) = lines_of(results)
    assert row["status"] == "ok" and row["correct"] is True
    assert row["speedup"] == 2.0 and row["speedup_vs_compile"] == 1.25
    assert row["cost_usd"] == pytest.approx(0.25) and row["rounds"] == 1
    assert row["stop_reason"] == "rounds"
    kernel = tmp_path / "results_kernels" / "level1" / "1_Fixture.py"
    assert row["best_path"] == str(kernel) and "# fast" in kernel.read_text()
    assert row["transcript"] == str(tmp_path / "logs" / "level1" / "1_Fixture.jsonl")
    assert (tmp_path / "logs" / "level1" / "1_Fixture.jsonl").is_file()


def test_loop_without_a_correct_kernel_records_the_last_status(tmp_path):
    results = tmp_path / "results.jsonl"
    coder = ScriptedProvider([coder_reply("sigmoid(x)")])

    def evaluate(problem_source: str, candidate_source: str) -> EvalResult:
        return EvalResult(problem="fixture", status="incorrect", error="output 0 differs")

    run_bench(make_problems(1), loop_forge(evaluate, coder=coder, rounds=1), results, progress=None)
    (row,) = lines_of(results)
    assert row["status"] == "incorrect" and row["correct"] is False
    assert row["error"] == "output 0 differs" and row["speedup"] is None
    assert row["best_path"] is None


# ---------------------------------------------------------------- choosing problems


def test_dir_problems_reads_levels_and_ids(tmp_path):
    (tmp_path / "level1").mkdir()
    (tmp_path / "level2").mkdir()
    (tmp_path / "level1" / "19_ReLU.py").write_text(PROBLEM_SOURCE)
    (tmp_path / "level1" / "21_Sigmoid.py").write_text(PROBLEM_SOURCE)
    (tmp_path / "level2" / "3_Conv.py").write_text(PROBLEM_SOURCE)
    (tmp_path / "level1" / "helpers.py").write_text("X = 1\n")  # not a problem
    (tmp_path / "level1" / "__init__.py").write_text("")
    problems = dir_problems(tmp_path)
    assert [(p.key, p.level, p.problem_id) for p in problems] == [
        ("level1/19_ReLU", 1, 19),
        ("level1/21_Sigmoid", 1, 21),
        ("level2/3_Conv", 2, 3),
    ]
    assert problems[0].path.endswith("19_ReLU.py") and "get_inputs" in problems[0].source
    assert problems[0].to_problem().origin == problems[0].path
    assert [p.key for p in dir_problems(tmp_path, level=1, ids=[21])] == ["level1/21_Sigmoid"]
    with pytest.raises(ValueError, match=r"id \[7\]"):
        dir_problems(tmp_path, level=1, ids=[7, 19])
    with pytest.raises(FileNotFoundError):
        dir_problems(tmp_path / "nowhere")


def test_flat_directory_problems_have_no_level(tmp_path):
    (tmp_path / "my_op.py").write_text(PROBLEM_SOURCE)
    (problem,) = dir_problems(tmp_path)
    assert problem.key == "my_op" and problem.level is None and problem.problem_id is None


def test_dev_set_problems_filters_by_level_and_ids(tmp_path):
    rows = [
        {"level": 1, "problem_id": 19, "name": "19_ReLU", "code": PROBLEM_SOURCE},
        {"level": 1, "problem_id": 21, "name": "21_Sigmoid", "code": PROBLEM_SOURCE},
        {"level": 2, "problem_id": 19, "name": "19_Other", "code": PROBLEM_SOURCE},
    ]
    dev = tmp_path / "dev_problems.jsonl"
    dev.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [p.key for p in dev_set_problems(path=dev)] == [
        "level1/19_ReLU",
        "level1/21_Sigmoid",
        "level2/19_Other",
    ]
    assert [p.key for p in dev_set_problems(1, [21], path=dev)] == ["level1/21_Sigmoid"]
    assert [p.key for p in dev_set_problems(ids=[19], path=dev)] == [
        "level1/19_ReLU",
        "level2/19_Other",
    ]
    with pytest.raises(ValueError, match=r"level 1 with id \[5\]"):
        dev_set_problems(1, [5], path=dev)
    with pytest.raises(ValueError, match="no problem of level"):
        dev_set_problems(3, path=dev)


def test_the_shipped_dev_set_uses_the_same_keys_as_a_kernelbench_checkout():
    try:
        dev_set_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    (relu,) = dev_set_problems(level=1, ids=[19])
    assert relu.key == "level1/19_ReLU" and "class Model" in relu.source
    problem = relu.to_problem()
    assert (problem.name, problem.level, problem.problem_id) == ("19_ReLU", 1, 19)
    assert problem.origin == "dev:1/19"
