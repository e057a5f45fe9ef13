"""Adaptive timing on the GPU (the H200): a kernel timed twice agrees with itself within the
intervals it reports (on the scale of the reference timed alongside it), and short forwards are also timed as CUDA-graph replays, or said not to be
capturable. Run with `pytest -m gpu -s tests/test_timing_gpu.py` (-s prints the figures)."""

from __future__ import annotations

import pytest
from test_evaluate_gpu import GOOD, RELU, compiled_candidate

from cudaforge.harness.interleave import BLOCK
from cudaforge.harness.pool import WorkerPool
from cudaforge.harness.problem import Problem
from cudaforge.harness.ties import compare_results

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(1, device="cuda", timeout=60, compile_timeout=600) as p:
        yield p


def figures(r) -> str:
    return (f"{r.candidate_ms:.5f} ms [{r.candidate_low_ms:.5f}, {r.candidate_high_ms:.5f}] "
            f"({r.timing['speedup_basis']}, {r.timing['candidate_eager']['runs']} eager runs, "
            f"stop {r.timing['candidate_eager']['stop']}), speedup {r.speedup:.4f}")  # fmt: skip


def test_a_kernel_timed_twice_agrees_within_its_intervals(pool):
    first, second = (pool.evaluate(RELU, GOOD, trials=2) for _ in range(2))
    for r in (first, second):
        assert r.status == "ok", r.error
        assert r.timing["rule"] == "adaptive" and r.timing["order"] == "interleaved"
        assert r.candidate_low_ms <= r.candidate_ms <= r.candidate_high_ms
        assert r.reference_low_ms <= r.reference_ms <= r.reference_high_ms
        eager = r.timing["candidate_eager"]
        assert eager["runs"] == r.timing["reference_eager"]["runs"] <= r.timing["max_runs"]
    print(f"\nfirst:  {figures(first)}\nsecond: {figures(second)}")
    assert first.timing["speedup_basis"] == second.timing["speedup_basis"]
    # Each median lies within the other run's interval, widened by the stated precision, once
    # the two runs are put on one scale by their references. The two evaluations are two worker
    # processes: on the H200 a 50 us forward's absolute time moved 5% between them, the
    # reference timed alongside it by as much (a shift common to both sides, which the intervals
    # of one run cannot know of and the speedup cancels). The raw shift is printed.
    shift = second.reference_ms / first.reference_ms
    print(f"common shift (second/first reference): {shift:.4f}; candidate: "
          f"{second.candidate_ms / first.candidate_ms:.4f}")  # fmt: skip
    for a, b, scale in ((first, second, 1 / shift), (second, first, shift)):
        slack = a.timing["precision"] * a.candidate_ms
        assert a.candidate_low_ms - slack <= b.candidate_ms * scale <= a.candidate_high_ms + slack
    assert compare_results(first, second)[0] == "tie"
    assert abs(first.speedup / second.speedup - 1) < 0.03  # the issue's goal


def test_a_short_forward_is_timed_as_graph_replays_too(pool):
    r = pool.evaluate(RELU, GOOD, trials=2)
    assert r.status == "ok", r.error
    eager = r.timing["candidate_eager"]
    if min(eager["median_ms"], r.timing["reference_eager"]["median_ms"]) >= 0.05:
        pytest.skip(f"the forwards take {eager['median_ms']:.4f} ms here: no graph tried")
    assert r.timing["graph"].startswith("on"), r.timing["graph"]
    assert r.timing["speedup_basis"] == "graph"
    graph = r.timing["candidate_graph"]
    assert r.candidate_ms == graph["median_ms"] and graph["stop"] in ("precision", "budget",
                                                                      "max_runs")  # fmt: skip
    assert r.speedup == pytest.approx(r.reference_ms / r.candidate_ms)
    replays = r.timing["candidate_graph_runs_ms"]  # every replay's time is on record
    assert len(replays) == graph["runs"] and min(replays) == pytest.approx(
        graph["min_ms"], abs=1e-6
    )
    # the eager runs stopped at the least the rule allows (and the blocks queued meanwhile), a
    # side already within the precision then says so: the replays decide, the eager times are
    # reported
    assert eager["stop"] in ("short", "precision"), eager
    # the rule is checked on the runs read, while the next block is queued: at most two blocks
    # past min_runs
    assert eager["runs"] <= r.timing["min_runs"] + 2 * BLOCK, eager
    print(f"\ngraph {graph['median_ms']:.5f} ms (spread {graph['spread']:.2%}), eager "
          f"{eager['median_ms']:.5f} ms (spread {eager['spread']:.2%})")  # fmt: skip


def test_a_forward_that_synchronizes_is_not_capturable_and_uses_eager_times(pool):
    syncing = compiled_candidate(
        """
x = x.contiguous()
y = torch.empty_like(x)
mod.relu_kernel(blocks(x.numel()), (256,), (x, y, x.numel()))
torch.cuda.synchronize()
return y
"""
    )
    r = pool.evaluate(RELU, syncing, trials=2)
    assert r.status == "ok", r.error
    if r.timing["graph"].startswith("not tried"):
        pytest.skip(r.timing["graph"])
    assert r.timing["graph"].startswith("not capturable: the candidate's forward"), r.timing
    assert r.timing["speedup_basis"] == "eager" and "candidate_graph" not in r.timing
    assert r.candidate_ms == r.timing["candidate_eager"]["median_ms"]
    assert r.timing["candidate_eager"]["stop"] != "short"  # timed in full: its eager runs decide


LAUNCHY = Problem.from_source(
    """
import torch
class Model(torch.nn.Module):
    def forward(self, x):
        for _ in range(30):
            x = torch.relu(x - 0.01)
        return x
def get_inputs():
    return [torch.randn(256, 1024)]
def get_init_inputs():
    return []
""",
    name="launchy_relu_chain",
)

LAUNCHY_KERNEL = compiled_candidate(
    """
for _ in range(30):
    shifted = (x - 0.01).contiguous()
    x = torch.empty_like(shifted)
    mod.relu_kernel(blocks(x.numel()), (256,), (shifted, x, x.numel()))
return x
"""
)


def test_a_forward_slower_to_issue_than_to_run_is_timed_on_the_gpu(pool):
    """60 launches of ~2 us kernels: the host takes longer to issue them than the GPU to run
    them. Queued behind the spin, the events time the GPU's work (close to CUPTI's busy time)
    and spread little; without it they time the host."""
    ahead = pool.evaluate(LAUNCHY, LAUNCHY_KERNEL, trials=2, cuda_graphs=False)
    behind = pool.evaluate(LAUNCHY, LAUNCHY_KERNEL, trials=2, cuda_graphs=False, host_ahead=False)
    for r in (ahead, behind):
        assert r.status == "ok", r.error
        t = r.timing
        print(
            f"\n{t['queued'][:40]}: candidate {r.candidate_ms:.4f} ms (spread "
            f"{r.candidate_spread:.2%}, CUPTI busy {t['cupti_busy_ms']:.4f} ms, host "
            f"{t['candidate_host_ms']}), reference {r.reference_ms:.4f} ms (spread "
            f"{r.reference_spread:.2%}, busy {t['reference_cupti_busy_ms']:.4f} ms)"
        )
    t = ahead.timing
    assert t["candidate_host_ms"] > t["cupti_busy_ms"]  # launch-bound, as meant
    assert ahead.candidate_ms < 1.3 * t["cupti_busy_ms"]
    assert ahead.reference_ms < 1.3 * t["reference_cupti_busy_ms"]
    assert max(ahead.candidate_spread, ahead.reference_spread) < 0.02
    assert behind.candidate_ms > ahead.candidate_ms
