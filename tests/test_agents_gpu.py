"""The Coder/Judge loop on the GPU with scripted replies (hand-written FIXTURE kernels, not model
output) on two dev problems: a correct but slow kernel first, then the shipped fast one; the loop
must end with the fastest correct kernel. And forge with the `file:` provider, answered by a
real model's committed replies (not fixtures) for two rounds."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import cudaforge
from cudaforge.agents.loop import run_loop
from cudaforge.agents.providers import ScriptedProvider
from cudaforge.cli.demo import EXAMPLES_DIR

pytestmark = pytest.mark.gpu


def _slow(source: str) -> str:
    # FIXTURE: the same kernel behind a ~0.5 ms spin on the GPU (torch's test helper)
    return source.replace(
        "        x = x.contiguous()",
        "        torch.cuda._sleep(1_000_000)\n        x = x.contiguous()",
    )


@pytest.mark.parametrize(
    "level, pid, example", [(1, 19, "l1_019_relu.py"), (1, 88, "l1_088_gelu.py")]
)
def test_the_loop_keeps_the_fastest_correct_kernel(level, pid, example, tmp_path):
    problem = cudaforge.Problem.from_dev_set(level, pid).shrink(256 << 20)
    fast = (EXAMPLES_DIR / example).read_text()
    slow = _slow(fast)
    assert slow != fast
    coder = ScriptedProvider([f"FIXTURE\n```python\n{slow}\n```", f"FIXTURE\n```python\n{fast}\n```"],
                             model="fixture")  # fmt: skip
    judge = ScriptedProvider(["FIXTURE Judge: the spin before the kernel costs 0.5 ms; drop it.",
                              "FIXTURE Judge: nothing left to gain.\nVERDICT: STOP"],
                             model="fixture")  # fmt: skip

    def evaluate(problem_source, candidate_source):
        return cudaforge.evaluate(
            cudaforge.Problem.from_source(problem_source), candidate_source, trials=3, timed_runs=30
        )

    loop = run_loop(
        problem.source,
        evaluate,
        coder=coder,
        judge=judge,
        rounds=4,
        transcript=str(tmp_path / "t.jsonl"),
        name=problem.name,
    )
    statuses = [a.result.status for a in loop.attempts if a.result is not None]
    assert statuses == ["ok", "ok"], [a.result.error for a in loop.attempts if a.result]
    slow_ms, fast_ms = (a.result.candidate_ms for a in loop.attempts if a.result is not None)
    assert fast_ms < slow_ms
    assert loop.best_source.strip() == fast.strip() and loop.stop_reason == "judge_stop"
    assert loop.best_result.own_kernel_share > 0.5  # its own kernels ran (CUPTI)


RUNS = Path(__file__).resolve().parents[1] / "benchmarks" / "runs" / "agent16-metrics-on"


def test_forge_replays_a_real_models_replies_through_the_file_provider(tmp_path):
    """forge with the `file:` provider for two rounds on dev problem L1/23 (Softmax, its own
    size), answered by the replies a real model wrote for the agent-loop benchmark (committed
    verbatim under benchmarks/runs/agent16-metrics-on/llm/23_Softmax): the Coder's round-1
    kernel, the Judge's advice on it (asked in round 2), the Coder's round-2 kernel."""
    answers = tmp_path / "llm" / "23_Softmax"
    answers.mkdir(parents=True)
    for stem in ("coder-r1-l0", "judge-r2-l0", "coder-r2-l0"):
        shutil.copy(RUNS / "llm" / "23_Softmax" / f"{stem}.reply.md", answers)
    problem = cudaforge.Problem.from_dev_set(1, 23)

    def evaluate(problem_source, candidate_source):
        return cudaforge.evaluate(
            cudaforge.Problem.from_source(problem_source), candidate_source, trials=3, timed_runs=30
        )

    loop = cudaforge.forge(
        problem.source,
        evaluate,
        coder=f"file:{tmp_path / 'llm'}?wait=0",
        rounds=2,
        transcript=str(tmp_path / "t.jsonl"),
        name=problem.name,  # "23_Softmax": the replies' folder
    )
    assert loop.stop_reason != "waiting", loop.waiting_for  # every call found its reply
    results = [a.result for a in loop.attempts if a.result is not None]
    assert [r.status for r in results] == ["ok", "ok"], [r.error for r in results]
    assert loop.best_result.speedup > 1.0  # the benchmark measured 1.73x and 1.76x on the H200
    judged = (tmp_path / "llm" / "23_Softmax" / "judge-r2-l0.prompt.md").read_text()
    assert "speedup" in judged.lower()  # the Judge was shown round 1's measurements
    print(f"forge, 2 rounds: {[f'{r.speedup:.2f}x' for r in results]}, stop {loop.stop_reason}")
