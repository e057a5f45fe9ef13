"""optimize(site_graphs=...) on the CPU: the swapped sites' CUDA graphs turned on, settled and
checked, and with "auto" kept only where the model is faster with them beyond the noise. CUDA
graphs need a GPU, so the stand-in graphs of test_site_graphs (test fixture) replay here and the
timings are scripted; the fc site reads the model's input, whose address stays put."""

from __future__ import annotations

import statistics

import pytest
import torch
from test_optimize_cpu import LINEAR_AS_IS, Net, build, run, scripted
from test_site_graphs import StandInGraph, graphs  # noqa: F401 - graphs is a fixture

import cudaforge
from cudaforge.harness.pool import WorkerPool
from cudaforge.harness.stopping import median_interval
from cudaforge.model import end_to_end
from cudaforge.model import optimize as optimize_module
from cudaforge.model import swap as swap_module
from cudaforge.model.swap import swaps

NOISY = [4.6, 4.8, 5.0, 5.2, 5.4, 4.7, 4.9, 5.1, 5.3, 5.5, 4.5, 5.0]


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(1, device="cpu") as workers:
        yield workers


@pytest.fixture()
def on_cpu(graphs, monkeypatch):  # noqa: F811 - the fixture of that name, used
    """Site graphs tried on the CPU (stand-in captures); the Linear kernel faster on its own and
    the model no slower with it; `timed` collects the call_samples calls, `with_graphs` scales
    the model's times with its graphs on."""
    monkeypatch.setattr(end_to_end, "GRAPH_DEVICE_TYPES", ("cuda", "cpu"))

    def fast_alone(swap):
        swap.check.original_ms, swap.check.kernel_ms = 2.0, 1.0
        return swap.check

    monkeypatch.setattr(swap_module, "measure", fast_alone)
    monkeypatch.setattr(optimize_module._Run, "faster", lambda run, result: result.ok)
    state = {"timed": [], "with_graphs": 0.8, "inplace": False}

    def scripted_samples(fns, device, **options):
        state["timed"].append(len(fns))
        times = [list(NOISY) for _ in fns]
        # the user's model, the optimized one without its graphs, with them; in place the
        # user's model is the optimized one: without, with
        if len(fns) == 3 or state["inplace"]:
            times[-1] = [t * state["with_graphs"] for t in NOISY]
        return times

    monkeypatch.setattr(end_to_end, "call_samples", scripted_samples)
    return state


def optimized(pool, **options):
    torch.manual_seed(0)
    model, x = build(Net, 128, 64)
    return run(model, x, False, pool, scripted([LINEAR_AS_IS]), targets=["fc"], **options)


def test_auto_keeps_the_graphs_where_the_model_is_faster_with_them(pool, on_cpu, monkeypatch):
    rounds = []
    real_settle = end_to_end.settle

    def settle_spy(call, site_graphs, most=200):
        rounds.append(call)
        return real_settle(call, site_graphs, most)

    monkeypatch.setattr(end_to_end, "settle", settle_spy)
    result = optimized(pool, site_graphs="auto")
    # settled in rounds of what is timed, in its order: the user's model, without, with
    with torch.no_grad():
        assert len(rounds[0]()) == 3
    (swap,) = swaps(result.model)
    assert result.site_graphs == (
        "site graphs: on, faster with them (5 ms per forward without, 4 "
        "ms with (95% intervals 4.7-5.3 and 3.76-4.24 ms)); 1 of 1 "
        "sites replay after 9 forwards, their outputs keep 0.125 MiB"
    )
    # settled: captured at the third forward, then six without a capture
    assert swap.graphs is not None and swap.graphs.replays >= 5
    assert result.after_ms == pytest.approx(statistics.median(NOISY) * 0.8)
    assert result.before_interval is not None and result.after_interval[1] < 5.0 * 0.9
    assert result.site_graphs in result.report() and "faster with them" in result._repr_html_()
    captures = swap.graphs.captures
    with torch.no_grad():
        x = torch.randn(128, 64)
        torch.testing.assert_close(result.model(x), result.model(x))  # another address: as usual
    assert swap.graphs.captures == captures
    assert result.to_dict()["site_graphs"] == result.site_graphs
    on_cpu["inplace"] = True  # patched in place: without and with its graphs, timed in pairs
    inplace = optimized(pool, site_graphs="auto", inplace=True)
    assert inplace.site_graphs.startswith("site graphs: on, faster with them (5 ms per forward")
    assert inplace.after_ms == pytest.approx(statistics.median(NOISY) * 0.8)
    assert swaps(inplace.model)[0].graphs.replays >= 5 and on_cpu["timed"][-1] == 2


def test_auto_turns_them_off_when_the_model_is_not_faster_with_them(pool, on_cpu):
    on_cpu["with_graphs"] = 1.0
    result = optimized(pool, site_graphs="auto")
    (swap,) = swaps(result.model)
    assert swap.graphs is None and StandInGraph.made[0].was_reset
    assert result.site_graphs.startswith("site graphs: off: not faster with them (5 ms per "
                                         "forward without, 5 ms with (95% intervals")  # fmt: skip
    # before and after are the user's model and the optimized one without graphs, as timed here
    assert result.after_ms == result.before_ms == statistics.median(NOISY)
    assert result.before_interval == result.after_interval == median_interval(NOISY)


def test_true_turns_them_on_without_timing_and_a_wrong_model_output_turns_them_off(
    pool, on_cpu, monkeypatch
):
    result = optimized(pool, site_graphs=True)
    assert result.site_graphs.startswith("site graphs: on (asked for); 1 of 1 sites replay")
    assert 3 not in on_cpu["timed"] and swaps(result.model)[0].graphs.replays > 0
    checks = []
    real = optimize_module._Run.check_outputs

    def second_differs(run, got, expected, expected32=None):
        checks.append(1)
        return (0.5, False) if len(checks) == 2 else real(run, got, expected, expected32)

    monkeypatch.setattr(optimize_module._Run, "check_outputs", second_differs)
    wrong = optimized(pool, site_graphs="auto")
    assert wrong.site_graphs == ("site graphs: off: the model's output with them differs from "
                                 "the original's (max abs error 0.5)")  # fmt: skip
    assert swaps(wrong.model)[0].graphs is None and wrong.outputs_match


def test_where_they_are_not_tried_the_report_says_why(pool, graphs):  # noqa: F811
    result = optimized(pool, site_graphs="auto")  # no stand-in device: the CPU as it is
    assert result.site_graphs == "site graphs: none on cpu (CUDA graphs need a GPU)"
    assert swaps(result.model)[0].graphs is None
    plain = optimized(pool)
    assert plain.site_graphs == "" and "site graphs" not in plain.report()
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match="site_graphs must be False, True or 'auto'"):
            cudaforge.optimize(Net(), (torch.randn(4, 64),), llm="scripted:", site_graphs=bad)


def test_a_failure_turns_them_off_and_for_compile_captures_them_under_compile(
    pool, on_cpu, monkeypatch
):
    def broken(call, site_graphs, most=200):
        call()
        raise RuntimeError("operation failed during capture")

    monkeypatch.setattr(end_to_end, "settle", broken)
    result = optimized(pool, site_graphs="auto")
    assert result.site_graphs == ("site graphs: off: RuntimeError: operation failed during "
                                  "capture")  # fmt: skip
    (swap,) = swaps(result.model)  # the kernel stays, without graphs
    assert swap.graphs is None and result.outputs_match
    compiled = optimized(pool, site_graphs=True, for_compile=True)
    assert compiled.site_graphs == "site graphs: on (asked for), captured under torch.compile"
    assert swaps(compiled.model)[0].graphs.captures == 0  # none on eager calls' tensors
    timed = optimized(pool, site_graphs="auto", for_compile=True)
    assert timed.site_graphs.startswith("site graphs: not timed for for_compile=True")
    assert swaps(timed.model)[0].graphs is None
