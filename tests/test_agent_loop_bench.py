"""benchmarks/agent_loop.py on the CPU: the per-round table's numbers on a tiny run made by the
loop with scripted models and a recorded evaluator (no GPU, no LLM)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_demo import PROBLEM  # the same tiny ReLU problem

from cudaforge.agents.providers import ScriptedProvider
from cudaforge.cli.bench import BenchProblem, loop_forge, run_bench
from cudaforge.harness.results import EvalResult

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import agent_loop


def candidate(tag: str) -> str:
    return f"import torch\nclass ModelNew(torch.nn.Module):  # {tag}\n    pass\n"


def coder_reply(tag: str) -> str:
    return f"Here it is.\n```python\n{candidate(tag)}```\n"


# candidate -> (status, speedup over eager, speedup over torch.compile)
RECORDED = {
    "A1": ("ok", 1.2, 0.8),
    "A2": ("ok", 2.5, 1.6),
    "B1": ("incorrect", None, None),
    "B2": ("ok", 1.6, None),  # torch.compile not timed: max(eager, compile) is eager alone
}


def recorded_evaluate(problem_source: str, candidate_source: str) -> EvalResult:
    tag = candidate_source.split("# ")[1].split()[0]
    status, speedup, vs_compile = RECORDED[tag]
    if status != "ok":
        return EvalResult(problem="p", status=status, error="output 0 differs")
    return EvalResult(
        problem="p", status="ok", correct=True, candidate_ms=1.0 / speedup, reference_ms=1.0,
        speedup=speedup, speedup_vs_compile=vs_compile,
        compiled_reference_ms=vs_compile / speedup if vs_compile else None,
    )  # fmt: skip


@pytest.fixture
def tiny_run(tmp_path):
    """Two problems, two rounds: A correct in round 1 and faster in round 2; B wrong in round 1,
    repaired in round 2."""
    coder = ScriptedProvider([coder_reply("A1"), coder_reply("A2"), coder_reply("B1"),
                              coder_reply("B2")])  # fmt: skip
    judge = ScriptedProvider(["BOTTLENECK: x\nOPTIMIZATION: y\nVERDICT: CONTINUE",
                              "CAUSE: wrong\nFIX: repair"])  # fmt: skip
    results = tmp_path / "results.jsonl"
    problems = [BenchProblem(f"level1/{n}", n, 1, i, PROBLEM) for i, n in enumerate("AB", 1)]
    forge = loop_forge(
        recorded_evaluate, coder=coder, judge=judge, rounds=2,
        transcripts_dir=tmp_path / "results_transcripts",
    )  # fmt: skip
    run_bench(problems, forge, results, progress=None)
    return results, [p.key for p in problems]


def test_rounds_count_the_best_kernel_so_far(tiny_run):
    results, keys = tiny_run
    runs = agent_loop.read_runs(results)
    assert sorted(runs) == keys
    first, second = agent_loop.round_rows(runs, problems=2, rounds=2)
    assert (first.correct, first.improved) == (1, 1)
    assert first.eager.fast_p == {"fast_1": 0.5, "fast_1.5": 0.0, "fast_2": 0.0}
    assert first.faster.fast_p == {"fast_1": 0.0, "fast_1.5": 0.0, "fast_2": 0.0}
    assert first.eager.geomean == pytest.approx(1.2) and first.faster.median == pytest.approx(0.8)
    assert (second.correct, second.improved) == (2, 2)
    assert second.eager.fast_p == {"fast_1": 1.0, "fast_1.5": 1.0, "fast_2": 0.5}
    assert second.faster.fast_p == {"fast_1": 1.0, "fast_1.5": 1.0, "fast_2": 0.0}
    assert second.eager.geomean == pytest.approx(2.0)  # sqrt(2.5 * 1.6)
    assert second.eager.median == pytest.approx(2.05)
    assert second.faster.geomean == pytest.approx(1.6)


def test_table_has_rounds_calls_and_estimated_tokens(tiny_run):
    results, keys = tiny_run
    text = agent_loop.report_markdown(agent_loop.read_runs(results), keys, 2, "tiny")
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert rows[2].split(" | ")[:5] == ["| 1", "50.0% (1)", "50.0%", "0.0%", "0.0%"]
    assert rows[3].split(" | ")[1:8] == ["100.0% (2)", "100.0%", "100.0%", "50.0%", "100.0%",
                                         "100.0%", "0.0%"]  # fmt: skip
    assert rows[3].rstrip(" |").endswith("| 2.00x | 2.05x | 1.60x | 1.60x | 2")
    # each problem: the Coder in round 1, the Judge and the Coder in round 2
    assert "6 (4 + 2)" in text and "estimates" in text


def test_problems_without_a_run_count_as_not_correct(tiny_run):
    results, keys = tiny_run
    runs = agent_loop.read_runs(results)
    (last,) = agent_loop.round_rows({keys[0]: runs[keys[0]]}, problems=4, rounds=2)[1:]
    assert last.correct == 1 and last.eager.fast_p["fast_2"] == 0.25


def test_resumed_transcript_counts_each_call_and_candidate_once(tiny_run):
    results, keys = tiny_run
    path = results.with_name("results_transcripts") / "level1" / "A.jsonl"
    once = agent_loop.read_problem_run(keys[0], path)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines + lines) + "\n")  # the same records again, clock restarted
    run = agent_loop.read_runs(results)[keys[0]]
    assert run.calls == {"coder": 2, "judge": 1} and len(run.candidates) == 2
    assert run.wall_seconds == pytest.approx(2 * once.wall_seconds)


def test_sets_are_dev_problems_of_the_stated_levels():
    levels = [p.level for p in agent_loop.set_problems("agent16")]
    assert (levels.count(1), levels.count(2), levels.count(3)) == (8, 6, 2)
    ablation = {p.key for p in agent_loop.set_problems("ablation8")}
    assert len(ablation) == 8 and ablation <= {p.key for p in agent_loop.set_problems("agent16")}


def test_report_only_needs_no_gpu(tiny_run, tmp_path, capsys):
    results, _ = tiny_run
    md = tmp_path / "table.md"
    code = agent_loop.main(["--set", "ablation8", "--report-only", "--out", str(results.parent),
                            "--md", str(md), "--rounds", "2"])  # fmt: skip
    assert code == 0 and "8 problems, 0 with a transcript" in md.read_text()
    assert "| round | correct |" in capsys.readouterr().out


@pytest.mark.parametrize("gpu_here", [False, True])
def test_prompts_describe_the_h200_only_when_rendered_without_a_gpu(
    tmp_path, monkeypatch, gpu_here
):
    """Rendered here (no GPU), the prompts describe the H200 that will evaluate them; where the
    benchmark itself sees a GPU, they describe that GPU (this machine's facts), not the H200."""
    import cudaforge.cli.doctor

    monkeypatch.setattr(cudaforge.cli.doctor, "has_gpu", lambda: gpu_here)
    out = tmp_path / "run"
    code = agent_loop.main(["--set", "ablation8", "--rounds", "1", "--out", str(out),
                            "--llm", f"file:{tmp_path / 'llm'}?wait=0"])  # fmt: skip
    assert code == 4  # waiting for the Coder's replies
    (prompt, *_) = sorted((tmp_path / "llm").rglob("coder-r1-l0.prompt.md"))
    text = prompt.read_text()
    assert (agent_loop.H200 in text) is not gpu_here
    assert (cudaforge.cli.doctor.gpu_facts() in text) is gpu_here
