"""`cudaforge demo` without a GPU and without a model: it shows the agents' recorded runs. The
transcript here is a TEST FIXTURE made by the loop with scripted models and a recording evaluator,
not a real LLM's run."""

from __future__ import annotations

import pytest

from cudaforge.agents.loop import run_loop
from cudaforge.agents.providers import ScriptedProvider
from cudaforge.cli import doctor
from cudaforge.cli.demo import recorded_runs, run_demo
from cudaforge.harness.results import EvalResult

PROBLEM = """import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)
def get_inputs():
    return [torch.randn(8)]
def get_init_inputs():
    return []
"""


def reply(version: int) -> str:
    return (f"```python\nimport torch\nclass ModelNew(torch.nn.Module):  # v{version}\n"
            "    def forward(self, x):\n        return torch.relu(x)\n```\n")  # fmt: skip


def evaluate(problem_source: str, candidate_source: str) -> EvalResult:
    if "# v1" in candidate_source:
        return EvalResult(problem="p", status="incorrect", error="output 0 differs")
    return EvalResult(problem="p", status="ok", correct=True, candidate_ms=0.5, reference_ms=1.0,
                      compiled_reference_ms=0.8, speedup=2.0, speedup_vs_compile=1.6)  # fmt: skip


@pytest.fixture
def runs(tmp_path):
    """benchmarks/runs/ as the agent-loop benchmark leaves it: a results file and a transcript."""
    folder = tmp_path / "runs" / "agent16-metrics-on"
    (folder / "results.jsonl").parent.mkdir(parents=True)
    (folder / "results.jsonl").write_text('{"key": "level1/test_fixture_relu"}\n')
    judge = ScriptedProvider([
        "CAUSE: negative inputs leak through.\nFIX: clamp them at zero.\nThird line.\nFourth.",
        "BOTTLENECK: memory bound.\nOPTIMIZATION: vectorize.\nVERDICT: STOP",
    ])  # fmt: skip
    run_loop(PROBLEM, evaluate, coder=ScriptedProvider([reply(1), reply(2)]), judge=judge,
             rounds=3, name="test_fixture_relu",
             transcript=folder / "results_transcripts" / "level1" / "test_fixture_relu.jsonl")  # fmt: skip
    return tmp_path / "runs"


def test_demo_without_gpu_shows_the_recorded_agents(runs, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(doctor, "has_gpu", lambda: False)
    assert [p.name for p in recorded_runs(runs)] == ["test_fixture_relu.jsonl"]
    code = run_demo(out_dir=str(tmp_path / "demo"), runs_dir=runs)
    report = (tmp_path / "demo" / "demo.md").read_text()
    assert code == 0 and "## The agents at work" in capsys.readouterr().out
    assert "## The agents at work" in report and "as recorded (no GPU here" in report
    assert "Coder scripted:, Judge scripted:" in report
    assert "| 1 | first | incorrect | - | - | - |" in report
    assert "| 2 | repair | ok | 0.5 | 2.00x | 1.60x |" in report
    # the Judge's reasoning, its first three lines
    assert (
        "- round 2: CAUSE: negative inputs leak through. / FIX: clamp them at zero. / Third line."
        in report
    )
    assert "Fourth" not in report
    assert (
        "Best kernel: round 2, 2.00x against eager PyTorch, 1.60x against torch.compile." in report
    )
    assert "Shipped example kernels" not in report


def test_demo_falls_back_to_the_examples_with_a_note(tmp_path, monkeypatch):
    monkeypatch.setattr(doctor, "has_gpu", lambda: False)
    monkeypatch.setattr("cudaforge.cli.demo._compile_examples", lambda lines: True)
    assert run_demo(out_dir=str(tmp_path / "demo"), runs_dir=tmp_path / "none") == 0
    report = (tmp_path / "demo" / "demo.md").read_text()
    assert "No recorded agent runs in" in report and "shipped hand-written examples" in report


def test_runs_that_found_a_kernel_come_first(tmp_path):
    """A TEST FIXTURE of two hand-made transcripts: the one without a correct kernel sorts first
    by path, but the demo shows the one that found a kernel first."""
    import json

    records = [{"kind": "start", "problem": "p"}, {"kind": "llm", "role": "coder", "reply": ""}]
    (tmp_path / "a_none.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    found = records + [{"kind": "best", "round": 1}]
    (tmp_path / "b_found.jsonl").write_text("".join(json.dumps(r) + "\n" for r in found))
    assert [p.name for p in recorded_runs(tmp_path)] == ["b_found.jsonl", "a_none.jsonl"]
