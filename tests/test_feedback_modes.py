"""Hardware feedback in every mode, and the torch.compile baseline, on the CPU: the options that
reach the evaluator from `forge`, `bench` and `optimize` (a recording evaluator stands in for the
workers), the compiled reference timed once per problem and GPU, and the report's three baselines."""

from __future__ import annotations

import inspect
import json
from types import SimpleNamespace

import pytest
import torch
from test_demo import PROBLEM  # the same tiny ReLU problem

import cudaforge.agents.loop as loop_module
import cudaforge.cli.main as cli
import cudaforge.harness.evaluate as evaluate_module
from cudaforge.agents.loop import LoopResult
from cudaforge.harness.compiled_reference import CompiledReferenceTimes, gpu_name, once_per_problem
from cudaforge.harness.results import EvalResult
from cudaforge.model.optimize import _Run, optimize
from cudaforge.reporting.summary import summarize

CANDIDATE = "import torch\nclass ModelNew(torch.nn.Module):\n    pass\n"
COMPILED_MS = 3.0


class RecordingEvaluate:
    """harness.evaluate's stand-in: records its keywords; a correct 1 ms candidate on an H200,
    with the compiled reference timed (3 ms) when asked."""

    def __init__(self):
        self.calls: list[dict] = []

    def __call__(self, problem, candidate_source, **options):
        self.calls.append(options)
        compiled = COMPILED_MS if options.get("compare_compile") else None
        return EvalResult(
            problem=problem.name, status="ok", correct=True, candidate_ms=1.0, reference_ms=2.0,
            speedup=2.0, compiled_reference_ms=compiled,
            speedup_vs_compile=compiled and compiled / 1.0, device="NVIDIA H200 (cuda:0)",
        )  # fmt: skip


@pytest.fixture
def harness(monkeypatch):
    """A recording evaluator behind the CLI, and a loop that evaluates one candidate twice."""
    recording = RecordingEvaluate()
    monkeypatch.setattr(evaluate_module, "evaluate", recording)
    seen: list[EvalResult] = []

    def run_loop(problem_source, evaluate, **options):
        seen.extend(evaluate(problem_source, CANDIDATE) for _ in range(2))
        return LoopResult(options.get("name") or "p", None, [], "rounds", 1, {}, 0.0, "")

    monkeypatch.setattr(loop_module, "run_loop", run_loop)
    return SimpleNamespace(calls=recording.calls, results=seen, gpu=monkeypatch)


def problem_dir(tmp_path):
    folder = tmp_path / "problems" / "level1"
    folder.mkdir(parents=True)
    (folder / "19_ReLU.py").write_text(PROBLEM)
    return folder.parent


def bench(tmp_path, *more):
    argv = ["bench", str(problem_dir(tmp_path)), "--results", str(tmp_path / "r.jsonl"),
            "--llm", "scripted:", *more]  # fmt: skip
    return cli.main(argv)


def test_bench_on_a_gpu_profiles_and_times_compile_once(harness, tmp_path):
    harness.gpu.setattr(cli, "has_gpu", lambda: True)
    bench(tmp_path)
    assert [c["profile"] for c in harness.calls] == [True, True]
    assert [c["compare_compile"] for c in harness.calls] == [True, False]
    # the second candidate gets the kept time and its speedup without compiling again
    assert [r.speedup_vs_compile for r in harness.results] == [COMPILED_MS, COMPILED_MS]
    kept = json.loads((tmp_path / "r_compiled_reference.json").read_text())
    assert [list(by_gpu) for by_gpu in kept.values()] == [["NVIDIA H200"]]
    record = json.loads((tmp_path / "r.jsonl").read_text().splitlines()[0])
    assert record["meta"]["profile"] is True


def test_bench_no_profile_turns_it_off(harness, tmp_path):
    harness.gpu.setattr(cli, "has_gpu", lambda: True)
    bench(tmp_path, "--no-profile")
    assert [c["profile"] for c in harness.calls] == [False, False]
    assert harness.calls[0]["compare_compile"] is True  # the baseline stays


def test_bench_on_the_cpu_neither_profiles_nor_compiles(harness, tmp_path):
    harness.gpu.setattr(cli, "has_gpu", lambda: False)
    bench(tmp_path)
    assert {(c["profile"], c["compare_compile"]) for c in harness.calls} == {(False, False)}


@pytest.mark.parametrize("more, profiled", [((), True), (("--no-profile",), False)])
def test_forge_on_a_gpu_profiles_unless_told(harness, tmp_path, more, profiled):
    harness.gpu.setattr(cli, "has_gpu", lambda: True)
    problem = tmp_path / "relu.py"
    problem.write_text(PROBLEM)
    cli.main(["forge", str(problem), "--llm", "scripted:", "--out", str(tmp_path / "o"), *more])
    assert [c["profile"] for c in harness.calls] == [profiled, profiled]
    assert [c["compare_compile"] for c in harness.calls] == [True, False]
    assert (tmp_path / "o" / "compiled_reference.json").is_file()


def test_optimize_profiles_by_default_on_a_gpu():
    assert inspect.signature(optimize).parameters["profile"].default is True
    seen = []
    pool = SimpleNamespace(evaluate=lambda problem, source, **options: seen.append(options))

    def run(profile: bool, device: str, eval_options=None):
        seen.clear()
        stub = SimpleNamespace(_evaluate=None, pool=pool,
                               device=torch.device(device), profile=profile,
                               eval_options=dict(eval_options or {}))  # fmt: skip
        _Run.evaluate(stub, PROBLEM, CANDIDATE)
        return seen[0]

    assert run(True, "cuda")["profile"] is True
    assert run(False, "cuda")["profile"] is False  # optimize(..., profile=False)
    assert run(True, "cuda", {"profile": False})["profile"] is False  # eval_options win
    assert run(False, "cpu") == {"profile": False, "device": "cpu"}


def test_optimize_tells_its_run_to_profile_only_on_a_gpu():
    model = torch.nn.Linear(4, 4)

    def make(profile):
        return _Run(mode="optimize", model=model, example_inputs=(torch.randn(2, 4),), targets=None,
                    training=False, inplace=False, verify_every=0, pool=None, evaluate=None,
                    store=False, progress=False, min_share=0.0, max_hotspots=1, min_speedup=1.0,
                    tolerance=None, eval_options=None, profile=profile)  # fmt: skip

    assert make(True).profile is False  # the CPU: nothing to profile


def test_compiled_reference_kept_per_problem_and_gpu(tmp_path):
    times = CompiledReferenceTimes(tmp_path / "c.json")
    asked = []

    def evaluate(problem_source, candidate_source, compare_compile):
        asked.append(compare_compile)
        return EvalResult(problem="p", status="ok", correct=True, candidate_ms=2.0,
                          compiled_reference_ms=4.0 if compare_compile else None,
                          device="NVIDIA H200 (cuda:1)")  # fmt: skip

    run = once_per_problem(evaluate, times)
    first, second = run(PROBLEM, CANDIDATE), run(PROBLEM, CANDIDATE)
    other = run(PROBLEM + "\n# another problem\n", CANDIDATE)
    assert asked == [True, False, True]
    assert second.compiled_reference_ms == 4.0 and second.speedup_vs_compile == 2.0
    assert first.compiled_reference_ms == other.compiled_reference_ms == 4.0
    # a new process (a resumed run on another machine) reads what was kept
    again = once_per_problem(evaluate, CompiledReferenceTimes(tmp_path / "c.json"), "NVIDIA H200")
    assert again(PROBLEM, CANDIDATE).speedup_vs_compile == 2.0 and asked[-1] is False
    assert gpu_name("NVIDIA H200 (cuda:1)") == "NVIDIA H200" and gpu_name("cpu") == "cpu"


def test_failed_candidate_leaves_the_compile_for_the_next(tmp_path):
    asked = []

    def evaluate(problem_source, candidate_source, compare_compile):
        asked.append(compare_compile)
        return EvalResult(problem="p", status="incorrect", device="NVIDIA H200 (cuda:0)")

    run = once_per_problem(evaluate, CompiledReferenceTimes(tmp_path / "c.json"))
    run(PROBLEM, CANDIDATE), run(PROBLEM, CANDIDATE)
    assert asked == [True, True]


def test_failed_torch_compile_is_kept_as_a_note(tmp_path):
    asked = []

    def evaluate(problem_source, candidate_source, compare_compile):
        asked.append(compare_compile)
        notes = ["torch.compile of the reference failed: boom"] if compare_compile else []
        return EvalResult(problem="p", status="ok", correct=True, candidate_ms=1.0, notes=notes,
                          device="NVIDIA H200 (cuda:0)")  # fmt: skip

    run = once_per_problem(evaluate, CompiledReferenceTimes(tmp_path / "c.json"))
    run(PROBLEM, CANDIDATE)
    later = run(PROBLEM, CANDIDATE)
    assert asked == [True, False] and later.speedup_vs_compile is None
    assert "boom" in later.notes[0]


def test_report_gives_fast_p_against_eager_compile_and_the_faster():
    records = [
        {"key": "a", "level": 1, "correct": True, "status": "ok", "speedup": 2.5,
         "speedup_vs_compile": 1.2},
        {"key": "b", "level": 1, "correct": True, "status": "ok", "speedup": 1.6,
         "speedup_vs_compile": 3.0},
        {"key": "c", "level": 1, "correct": True, "status": "ok", "speedup": 1.1},
        {"key": "d", "level": 1, "correct": False, "status": "incorrect"},
    ]  # fmt: skip
    summary = summarize(records)
    eager, compiled, faster = summary.overall.baselines
    assert eager.fast_p == {"fast_1": 0.75, "fast_1.5": 0.5, "fast_2": 0.25}
    assert compiled.n == 2 and compiled.fast_p == {"fast_1": 0.5, "fast_1.5": 0.25, "fast_2": 0.25}
    # max(eager, compile): a 1.2x, b 1.6x, c eager alone 1.1x
    assert faster.fast_p == {"fast_1": 0.75, "fast_1.5": 0.25, "fast_2": 0.0}
    assert faster.median == pytest.approx(1.2)
    assert faster.geomean == pytest.approx((1.2 * 1.6 * 1.1) ** (1 / 3))
    text = summary.to_markdown()
    assert "| all | max(eager, compile) | 3 of 4 | 75.0% | 25.0% | 0.0% | 1.28x | 1.20x |" in text
    assert "max(eager, compile)" in summary.to_html()
