"""The Coder/Judge loop on the GPU with scripted replies (hand-written FIXTURE kernels, not model
output) on two dev problems: a correct but slow kernel first, then the shipped fast one; the loop
must end with the fastest correct kernel."""

from __future__ import annotations

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
