"""cudaforge.evaluate on the CPU: the result schema, right and wrong torch candidates, and the cheats
that can be shown without a GPU (aliasing, mutated inputs, reused or replayed results, tampering).
Candidates run in a pool of CPU worker processes, as they would anywhere."""

from __future__ import annotations

import json
import math

import pytest
import torch

import cudaforge
from cudaforge.harness.compare import check_outputs
from cudaforge.harness.guards import GUARDS, is_own_kernel, kernel_names_in
from cudaforge.harness.options import EvalOptions, make_options
from cudaforge.harness.pool import WorkerPool
from cudaforge.harness.problem import Problem
from cudaforge.harness.results import EvalResult, TrialFailure

FAST = {"trials": 3, "timed_runs": 6, "warmup": 2, "input_sets": 2}

RELU = Problem.from_source(
    """
import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)
batch_size = 8
dim = 256
def get_inputs():
    return [torch.randn(batch_size, dim)]
def get_init_inputs():
    return []
""",
    name="relu",
)

SOFTMAX = Problem.from_source(
    """
import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)
batch_size = 4
dim = 16384
def get_inputs():
    return [torch.randn(batch_size, dim)]
def get_init_inputs():
    return []
""",
    name="softmax",
)

PAIR = Problem.from_source(
    """
import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return x.sum(dim=1), torch.relu(x)
def get_inputs():
    return [torch.randn(8, 32)]
def get_init_inputs():
    return []
""",
    name="pair",
)

GOOD_RELU = """
import torch
class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.clamp(x, min=0)
"""


def candidate(body: str, init: str = "", header: str = "") -> str:
    """A ModelNew whose forward(x) is `body` (indented 8 spaces by the caller's lines)."""
    lines = ["import torch", header, "class ModelNew(torch.nn.Module):",
             "    def __init__(self, *args):", "        super().__init__()"]  # fmt: skip
    lines += ["        " + line for line in init.splitlines() if line.strip()]
    lines += ["    def forward(self, x):"]
    lines += ["        " + line for line in body.strip().splitlines()]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(2, device="cpu", timeout=30, compile_timeout=30) as p:
        yield p


# ---------------------------------------------------------------------- schema


def test_correct_candidate_is_ok_with_times_and_the_schema_filled(pool):
    r = pool.evaluate(RELU, GOOD_RELU, **FAST)
    assert r.status == "ok", r.error
    assert r.ok and r.compiled and r.correct and r.trials == 3
    assert r.candidate_ms > 0 and r.reference_ms > 0
    assert r.speedup == pytest.approx(r.reference_ms / r.candidate_ms)
    assert r.candidate_spread >= 0 and r.reference_spread >= 0
    assert r.tolerances == {"float32.atol": 1e-4, "float32.rtol": 1e-4, "float32.norm_tol": 1e-3}
    assert r.timing["method"] == "wall_clock" and r.timing["runs"] == 6
    assert len(r.timing["candidate_runs_ms"]) == 6
    assert r.device == "cpu" and r.worker in (0, 1)
    assert r.problem_hash == RELU.hash and len(r.candidate_hash) == 64
    # every guard is accounted for: fired, passed or skipped with a reason
    assert r.guards == []
    for guard in ("output_aliases_input", "output_reused", "input_mutated", "tampering",
                  "timed_output", "revalidation"):  # fmt: skip
        assert guard in r.guards_passed
    for guard in ("no_own_kernels", "unwritten_output", "persisting_l2", "unmeasured_work",
                  "bandwidth_floor"):  # fmt: skip
        assert r.guards_skipped[guard]
    assert set(r.guards_passed) | set(r.guards_skipped) == set(GUARDS)
    phases = {"setup", "load", "correctness", "timing", "revalidation", "end", "cleanup", "total"}
    assert phases <= set(r.phase_seconds)


def test_on_a_cpu_the_fixed_rule_times_the_sides_one_after_the_other(pool):
    r = pool.evaluate(RELU, GOOD_RELU, **FAST)
    assert r.status == "ok", r.error
    assert r.timing["rule"] == "fixed" and r.timing["order"] == "sequential"  # "auto" on a CPU
    eager = r.timing["candidate_eager"]
    assert eager["stop"] == "fixed" and eager["runs"] == 6 and eager["median_ms"] == r.candidate_ms
    # 6 runs give a 95% interval: from the fastest run to the slowest
    runs = r.timing["candidate_runs_ms"]
    assert r.candidate_low_ms == pytest.approx(min(runs), abs=1e-6)
    assert r.candidate_high_ms == pytest.approx(max(runs), abs=1e-6)
    assert r.timing["speedup_basis"] == "eager"
    assert r.timing["graph"] == "not tried: needs a CUDA GPU"


def test_the_adaptive_rule_interleaves_the_sides_until_the_rule_holds(pool):
    opts = {**FAST, "timing_rule": "adaptive", "min_runs": 6, "max_runs": 40,
            "time_budget_s": 0.5, "precision": 0.05}  # fmt: skip
    r = pool.evaluate(RELU, GOOD_RELU, **opts)
    assert r.status == "ok", r.error
    assert r.timing["rule"] == "adaptive" and r.timing["order"] == "interleaved"
    assert r.timing["precision"] == 0.05 and r.timing["max_runs"] == 40
    cand, ref = r.timing["candidate_eager"], r.timing["reference_eager"]
    assert cand["runs"] == ref["runs"] == r.timing["runs"]  # interleaved: as many runs each
    assert 6 <= cand["runs"] <= 40 and len(r.timing["candidate_runs_ms"]) == cand["runs"]
    for side, who in ((cand, "candidate"), (ref, "reference")):
        assert side["stop"] in ("precision", "budget", "max_runs")
        assert side["low_ms"] <= side["median_ms"] <= side["high_ms"]
        met = (side["high_ms"] - side["low_ms"]) / 2 <= 0.05 * side["median_ms"]
        assert side["stop"] == "precision" or not met  # a side within precision says so
        assert getattr(r, f"{who}_low_ms") == side["low_ms"]
        assert getattr(r, f"{who}_high_ms") == side["high_ms"]
    assert r.speedup == pytest.approx(r.reference_ms / r.candidate_ms)
    assert r.timing["speedup_basis"] == "eager" and "candidate_graph" not in r.timing
    assert EvalResult.from_json(r.to_json()).candidate_high_ms == cand["high_ms"]
    # where the timing phase's time went, in parts that add up to no more than the phase
    parts = r.timing["phase_s"]
    assert {"warm-up", "timed runs", "traced and checked runs", "graphs"} <= set(parts)
    assert 0 < sum(parts.values()) <= r.phase_seconds["timing"] + 1e-3


def test_results_round_trip_through_json(pool):
    ok = pool.evaluate(RELU, GOOD_RELU, **FAST)
    bad = pool.evaluate(RELU, candidate("return x"), **FAST)
    for r in (ok, bad):
        text = r.to_json()
        again = EvalResult.from_json(text)
        assert again.to_json() == text
        assert json.loads(text)["status"] == r.status
    assert isinstance(EvalResult.from_json(bad.to_json()).failure, TrialFailure)


def test_the_evaluate_function_and_a_problem_given_as_source(pool):
    r = cudaforge.evaluate(RELU.source, GOOD_RELU, pool=pool, **FAST)
    assert r.status == "ok", r.error


# ---------------------------------------------------------------------- wrong candidates


def test_wrong_candidate_reports_the_first_failing_trial(pool):
    r = pool.evaluate(RELU, candidate("return torch.clamp(x, min=0.05)"), **FAST)
    assert r.status == "incorrect" and not r.correct and r.compiled
    f = r.failure
    assert (f.trial, f.output_index, f.phase, f.seed) == (0, 0, "correctness", 0)
    assert 0 < f.mismatches < f.total == 8 * 256
    assert len(f.worst_index) == 2 and f.actual == pytest.approx(0.05)
    assert f.max_abs_err == pytest.approx(0.05, rel=1e-3)
    assert "atol 0.0001" in f.message and "trial 0 (seed 0)" in f.message


def test_a_candidate_wrong_from_its_fifth_call_fails_in_trial_2(pool):
    body = """
self.calls = getattr(self, "calls", 0) + 1
return torch.relu(x) + (1.0 if self.calls >= 5 else 0.0)
"""
    r = pool.evaluate(RELU, candidate(body), **FAST)
    assert r.status == "incorrect" and r.failure.trial == 2 and r.trials == 3


def test_all_zero_output_of_a_tiny_valued_problem_fails(pool):
    # KernelBench issue #165: zeros pass softmax over 16k columns at atol 1e-2 elementwise
    x = SOFTMAX.make_inputs(seed=0)[0]
    expected = SOFTMAX.make_model()(x)
    assert torch.allclose(torch.zeros_like(expected), expected, atol=1e-2, rtol=1e-2)
    kb_v0 = {"atol": 1e-2, "rtol": 1e-2}  # KernelBench v0's tolerances
    r = pool.evaluate(SOFTMAX, candidate("return torch.zeros_like(x)"), **kb_v0, **FAST)
    assert r.status == "incorrect"
    assert "relative L2 error" in r.failure.message and r.failure.rel_l2_err == pytest.approx(1.0)
    # and the right answer at the same problem passes
    ok = pool.evaluate(
        SOFTMAX, candidate("return torch.exp(x) / torch.exp(x).sum(1, True)"), **FAST
    )
    assert ok.status == "ok", ok.error


def test_nan_where_the_reference_has_none_fails(pool):
    body = """
y = torch.relu(x)
y[3, 7] = float("nan")
return y
"""
    r = pool.evaluate(RELU, candidate(body), **FAST)
    assert r.status == "incorrect"
    assert r.failure.worst_index == [3, 7] and r.failure.mismatches == 1
    assert "NaN/Inf where the reference is finite" in r.failure.message


@pytest.mark.parametrize(
    "body,words",
    [
        ("return torch.relu(x).double()", "dtype torch.float64"),
        ("return torch.relu(x)[:, :-1]", "shape (8, 255)"),
        ("return torch.relu(x.t().contiguous()).t()", "strides (1, 8)"),
        ("return torch.relu(torch.cat([x, x], 1))[:, :256]", "strides (512, 1)"),
        ("return torch.nn.Parameter(torch.relu(x))", "Parameter"),
        ("return torch.relu(x).tolist()", "where the reference returns a tensor"),
        ("return None", "expected a tensor"),
    ],
)
def test_outputs_are_checked_for_type_shape_dtype_and_strides(pool, body, words):
    r = pool.evaluate(RELU, candidate(body), **FAST)
    assert r.status == "incorrect", r.error
    assert words in r.failure.message


def test_extra_sizes_add_trials_on_other_shapes(pool):
    # right only for the problem's own 256 columns: caught on a second shape
    body = "return torch.relu(x) if x.shape[1] == 256 else x"
    r = pool.evaluate(RELU, candidate(body), **FAST)
    assert r.status == "ok"
    extra = [{"dim": 100}, {"batch_size": 1, "dim": 7}]
    r = pool.evaluate(RELU, candidate(body), extra_sizes=extra, **FAST)
    assert r.status == "incorrect" and r.failure.trial == 3
    assert "with sizes {'dim': 100}" in r.failure.message
    r = pool.evaluate(RELU, GOOD_RELU, extra_sizes=extra, **FAST)
    assert r.status == "ok" and r.trials == 5
    with pytest.raises(ValueError, match="not a size constant"):
        pool.submit(RELU, GOOD_RELU, extra_sizes=[{"width": 3}])


def test_every_output_of_a_tuple_is_compared(pool):
    r = pool.evaluate(PAIR, candidate("return x.sum(dim=1), torch.relu(x) * 1.01"), **FAST)
    assert r.status == "incorrect" and r.failure.output_index == 1
    r = pool.evaluate(PAIR, candidate("return x.sum(dim=1)"), **FAST)
    assert "returned a tensor where the reference returns a tuple of 2" in r.failure.message
    r = pool.evaluate(PAIR, candidate("return x.sum(1), x.clamp(min=0)"), **FAST)
    assert r.status == "ok", r.error


# ---------------------------------------------------------------------- cheats


def test_an_output_aliasing_its_input_fails(pool):
    r = pool.evaluate(RELU, candidate("return x.relu_()"), **FAST)
    assert r.status == "incorrect"
    assert "output_aliases_input" in r.guards and "input_mutated" in r.guards


def test_zeroing_the_inputs_does_not_fool_the_reference(pool):
    # KernelBench PR #82: zero the inputs, return zeros; the reference runs on its own clone
    r = pool.evaluate(RELU, candidate("x.zero_()\nreturn torch.zeros_like(x)"), **FAST)
    assert r.status == "incorrect"


def test_a_mutated_input_fails_even_with_the_right_output(pool):
    r = pool.evaluate(RELU, candidate("y = torch.relu(x)\nx.mul_(2)\nreturn y"), **FAST)
    assert r.status == "incorrect" and "input_mutated" in r.guards
    assert "input 0 was changed" in r.guard_details["input_mutated"]


def test_returning_an_earlier_calls_tensor_fails(pool):
    body = """
if getattr(self, "cached", None) is None:
    self.cached = torch.relu(x)
return self.cached
"""
    r = pool.evaluate(RELU, candidate(body), **FAST)
    assert r.status == "incorrect" and "output_reused" in r.guards


def test_replaying_results_during_timing_is_caught(pool):
    # honest for the correctness trials (6 calls), then replays its last output (batch-and-skip)
    body = """
self.calls = getattr(self, "calls", 0) + 1
if self.calls > 8:
    return self.last.clone()
self.last = torch.relu(x)
return self.last
"""
    r = pool.evaluate(RELU, candidate(body), **FAST)
    assert r.status == "rejected" and not r.correct
    assert r.guards == ["timed_output"] and r.failure.phase == "timed_output"


def test_going_wrong_after_timing_is_caught_by_revalidation(pool):
    # 2 calls per trial, warm-up, timed runs and one checked run per input set, then wrong
    honest = 2 * FAST["trials"] + FAST["warmup"] + FAST["timed_runs"] + FAST["input_sets"]
    body = f"""
self.calls = getattr(self, "calls", 0) + 1
return torch.relu(x) if self.calls <= {honest} else torch.relu(x) * 0.5
"""
    r = pool.evaluate(RELU, candidate(body), **FAST)
    assert r.status == "rejected" and r.guards == ["revalidation"]
    assert r.failure.phase == "revalidation" and "after timing" in r.failure.message


@pytest.mark.parametrize("fresh", [True, False])
def test_fresh_inputs_leave_a_fingerprint_cache_no_hits_in_timing(pool, tmp_path, fresh):
    hits = tmp_path / "hits"
    body = f"""
key = (tuple(x.shape), tuple(x.flatten()[:8].tolist()))
cache = self.__dict__.setdefault("cache", {{}})
if key in cache:
    with open({str(hits)!r}, "a") as f:
        f.write("hit\\n")
    return cache[key].clone()
cache[key] = torch.relu(x)
return cache[key].clone()
"""
    opts = {**FAST, "trials": 2, "warmup": 2, "timed_runs": 10, "fresh_inputs": fresh}
    r = pool.evaluate(RELU, candidate(body), **opts)
    count = len(hits.read_text().splitlines()) if hits.exists() else 0
    assert r.status == "ok", r.error  # its outputs are right: a value cache is not wrong
    # the second call of each trial hits (same values); with fresh inputs no timed run does
    expected = 2 if fresh else 2 + 10
    assert count == expected


def test_replacing_torch_functions_is_tampering(pool):
    cheat = """
import torch
torch.softmax = lambda x, dim: torch.zeros_like(x)
class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.zeros_like(x)
"""
    r = pool.evaluate(SOFTMAX, cheat, **FAST)
    assert r.status == "rejected" and "tampering" in r.guards
    assert "torch.softmax" in r.guard_details["tampering"]


def test_patching_the_timer_is_tampering(pool):
    body = """
import time
time.perf_counter_ns = lambda: 0
return torch.relu(x)
"""
    r = pool.evaluate(RELU, candidate(body), **FAST)
    assert r.status == "rejected" and "time.perf_counter_ns" in r.guard_details["tampering"]


def test_changed_torch_settings_are_noted_and_undone(pool):
    cheat = "import torch\ntorch.set_default_dtype(torch.float64)\n" + GOOD_RELU
    r = pool.evaluate(RELU, cheat, **FAST)
    assert r.status == "ok", r.error
    assert any("default_dtype" in note for note in r.notes)


def test_bandwidth_floor_with_a_given_ceiling(pool):
    # 1 byte/s: every forward is "faster than memory allows", so the guard must fire
    r = pool.evaluate(RELU, GOOD_RELU, bandwidth_ceiling=1.0, **FAST)
    assert r.status == "rejected" and r.guards == ["bandwidth_floor"]
    assert r.timing["floor_bytes"] == 8 * 256 * 4 * 2
    r = pool.evaluate(RELU, GOOD_RELU, bandwidth_ceiling=1.0, ignore_guards=["bandwidth_floor"],
                      **FAST)  # fmt: skip
    assert r.status == "ok" and r.guards == ["bandwidth_floor"]
    r = pool.evaluate(RELU, GOOD_RELU, bandwidth_ceiling=1e15, **FAST)
    assert r.status == "ok" and "bandwidth_floor" in r.guards_passed, r.error


# ---------------------------------------------------------------------- bad candidates


@pytest.mark.parametrize(
    "source,status,words",
    [
        ("import torch\nclass Other: pass\n", "load_error", "defines no ModelNew"),
        ("import torch\nclass ModelNew(torch.nn.Module:\n", "load_error", "syntax error at line 2"),
        ("import nonexistent_module_xyz\n", "load_error", "ModuleNotFoundError"),
        (
            (
                "import torch\nclass ModelNew(torch.nn.Module):\n    def __init__(self, a, b):\n"
                "        super().__init__()\n"
            ),
            "load_error",
            "missing 2 required positional arguments",
        ),
        (
            (
                "import torch\nclass ModelNew(torch.nn.Module):\n    def __init__(self):\n"
                "        raise ValueError('no weights')\n"
            ),
            "load_error",
            "ValueError: no weights",
        ),
        (
            candidate("raise RuntimeError('kernel launch failed')"),
            "runtime_error",
            "RuntimeError: kernel launch failed",
        ),
        (
            GOOD_RELU.replace("forward(self, x)", "forward(self, x, y)"),
            "runtime_error",
            "TypeError",
        ),
        (
            "import torch\nraise RuntimeError(\"Error building extension 'k': nvcc: bad\")\n",
            "compile_error",
            "did not compile",
        ),
    ],
)
def test_bad_candidates_get_a_clear_error(pool, source, status, words):
    r = pool.evaluate(RELU, source, **FAST)
    assert r.status == status and words in r.error, r.error
    if "kernel launch failed" in words:
        assert "<candidate" in r.traceback and "kernel launch failed" in r.traceback
    if status == "compile_error":
        assert "nvcc: bad" in r.compile_log and not r.compiled
    # the worker is fine afterwards
    assert pool.evaluate(RELU, GOOD_RELU, **FAST).ok


# ---------------------------------------------------------------------- pure functions


def test_options_resolve_tolerances_and_refuse_unknowns():
    o = make_options(atol=1e-3)
    assert o.atol["float16"] == o.atol["float32"] == 1e-3 and o.rtol["float32"] == 1e-4
    o = make_options(atol={"fp16": 5e-3}, rtol={"torch.bfloat16": 2e-2})
    assert (o.atol["float16"], o.atol["float32"], o.rtol["bfloat16"]) == (5e-3, 1e-4, 2e-2)
    with pytest.raises(TypeError, match="unknown evaluation option"):
        make_options(trails=3)
    with pytest.raises(ValueError, match="unknown guard"):
        make_options(ignore_guards=["speed"])
    with pytest.raises(ValueError):
        make_options(trials=0)
    with pytest.raises(ValueError, match="warmup_s"):
        make_options(warmup_s=-1)
    with pytest.raises(ValueError, match="traced_runs"):
        make_options(traced_runs=-1)
    assert make_options().traced_runs == 20 and make_options(traced_runs=0).traced_runs == 0


def test_check_outputs_handles_special_values_and_exact_dtypes():
    o = EvalOptions()
    e = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 0.0])
    assert check_outputs(e.clone(), e, o) is None
    bad = e.clone()
    bad[2] = -float("inf")
    f = check_outputs(bad, e, o)
    assert f.mismatches == 1 and f.worst_index == [2]
    ints = torch.arange(10)
    f = check_outputs(ints + (ints == 7), ints, o)
    assert f.mismatches == 1 and f.worst_index == [7] and "compared exactly" in f.message
    assert check_outputs(3.0, 3.0 + 1e-6, o) is None
    assert check_outputs(3, 4, o) is not None
    half = torch.randn(100).half()
    assert check_outputs(half + 1e-3, half, o) is None  # within fp16's 1e-2
    assert check_outputs(half.float(), half, o).message.endswith("expected torch.float16")
    assert math.isnan(TrialFailure(0, 0, "m").max_abs_err)


def test_kernel_names_and_the_own_kernel_rule():
    source = """
    extern "C" __global__ void add_kernel(const float* a, float* b, int n) {}
    template <int B> __global__ void __launch_bounds__(256, 2) tiled_matmul(float* c) {}
    __global__ static void elementwise_kernel(float* x) {}
    """
    names = kernel_names_in(source)
    assert names == {"add_kernel", "tiled_matmul", "elementwise_kernel"}
    assert is_own_kernel("add_kernel", names)
    assert is_own_kernel("_Z12tiled_matmulILi128EEvPf", names)
    assert is_own_kernel("void tiled_matmul<128>(float*)", names)
    assert is_own_kernel("_ZN4mine18elementwise_kernelEPf", names)
    # torch's kernel of the same name is not the candidate's
    assert not is_own_kernel("_ZN2at6native18elementwise_kernelILi128ELi4EEEviT1_", names)
    assert not is_own_kernel("_Z13xadd_kernelPf", {"add_kernel"})  # a longer name
    assert not is_own_kernel("sm90_xmma_gemm_f32f32", names)
    assert not is_own_kernel("add_kernel", set())


# ---------------------------------------------------------------------- GPU logic on synthetic data
# The decisions made from CUPTI records and timings are plain Python: checked here with made-up
# records, so that the GPU tests only have to show that the records are right.


def _evaluation(own_names=(), runs=2):
    from cudaforge.harness.evaluate import _Evaluation

    result = EvalResult(problem="p")
    run = _Evaluation(RELU, GOOD_RELU, make_options(timed_runs=50, traced_runs=runs), result, None)
    run.own_names = set(own_names)
    return run, result


def _record(name, start_us, end_us, stream=7):
    return {"name": name, "start_ns": int(start_us * 1e3), "end_ns": int(end_us * 1e3),
            "duration_ns": int((end_us - start_us) * 1e3), "stream": stream}  # fmt: skip


def _measurement(records, times=(0.05, 0.05)):
    from cudaforge.harness.timing import _Measurement

    return _Measurement(list(times), records, [], [0.06, 0.06], [0.05, 0.05])


def _summary(median, low, high, stop="precision"):
    from cudaforge.harness.stopping import TimeSummary

    return TimeSummary(median, low, high, 40, stop, 0.01, median, low)


def test_graphs_are_tried_only_for_short_forwards_and_when_asked():
    run, r = _evaluation()
    run.cuda = True  # the decision before any CUDA call
    assert run.graph_timing(_summary(0.2, 0.19, 0.21), _summary(0.06, 0.059, 0.061), None) is None
    assert r.timing["graph"].startswith("not tried: the shorter forward takes 0.06 ms")
    run.opts.cuda_graphs = False
    assert run.graph_timing(_summary(0.01, 0.009, 0.011), _summary(1, 0.9, 1.1), None) is None
    assert r.timing["graph"] == "off (cuda_graphs=False)"


def test_a_capture_that_fails_leaves_the_eager_times_and_says_why(monkeypatch):
    from cudaforge.harness import graphs

    def refused(torch, model, inputs, device):
        try:
            raise RuntimeError("operation not permitted when stream is capturing")
        finally:
            raise RuntimeError("capture invalidated")  # what ending the capture raises over it

    monkeypatch.setattr(graphs, "capture_forward", refused)
    monkeypatch.setattr(graphs, "_context_alive", lambda torch, device: True)
    run, r = _evaluation()
    with torch.no_grad():  # as in an evaluation: setup() turns grad mode off inside it
        run.setup()
        try:
            run.load()
            run.cuda = True  # past the decision: the capture is tried, and fails
            short = _summary(0.01, 0.009, 0.011), _summary(0.02, 0.019, 0.021)
            assert run.graph_timing(*short, None) is None
        finally:
            run.cuda = False
            run.cleanup()
    assert torch.is_grad_enabled()
    assert r.timing["graph"] == (
        "not capturable: the candidate's forward: RuntimeError: operation not permitted when "
        "stream is capturing (then RuntimeError: capture invalidated)"
    )


def test_a_failed_capture_takes_the_random_generators_out_of_capture_mode():
    # torch ends the generators' capture mode only in a capture_end() that succeeded: after an
    # invalidated capture, the next random draw would raise "Offset increment outside graph
    # capture". capture_forward ends one empty capture after a failed one, which does.
    import contextlib
    from types import SimpleNamespace

    from cudaforge.harness import graphs

    calls = []

    class Graph:
        made = 0

        def __init__(self):
            Graph.made += 1
            self.n = Graph.made

        def capture_begin(self, capture_error_mode):
            calls.append((self.n, "begin", capture_error_mode))

        def capture_end(self):
            calls.append((self.n, "end"))
            if self.n == 1:
                raise RuntimeError("capture invalidated")

        def reset(self):
            calls.append((self.n, "reset"))

    stream = SimpleNamespace(wait_stream=lambda other: None, synchronize=lambda: None)
    cuda = SimpleNamespace(
        current_stream=lambda device: stream, Stream=lambda device: stream, CUDAGraph=Graph,
        stream=lambda s: contextlib.nullcontext(), synchronize=lambda device: None,
    )  # fmt: skip

    def forward():
        if calls and calls[-1][1] == "begin":
            raise RuntimeError("operation not permitted when stream is capturing")

    with pytest.raises(RuntimeError, match="capture invalidated"):
        graphs.capture_forward(SimpleNamespace(cuda=cuda), forward, [], "cuda", warmup=0)
    assert calls == [(1, "begin", "thread_local"), (1, "end"),
                     (2, "begin", "thread_local"), (2, "end"), (2, "reset")]  # fmt: skip
    calls.clear()
    Graph.made = 1  # a capture that succeeds ends no second one
    captured = graphs.capture_forward(SimpleNamespace(cuda=cuda), lambda: 1, [], "cuda", warmup=0)
    assert captured.output == 1 and [c[1] for c in calls] == ["begin", "end"]


def test_a_timing_that_did_not_settle_is_timed_again_and_said_so():
    from cudaforge.harness.stopping import TimeSummary
    from cudaforge.harness.timing import _Measurement

    def measured(spread_pct, stop, ms=1.0):
        times = [ms] * 10 + [ms * (1 + spread_pct / 100 * k / 10) for k in range(1, 31)]
        m = _Measurement(times, None, [], [], [])
        m.summary = TimeSummary.of(times, stop)
        return m

    calm, noisy = measured(0.5, "precision"), measured(40, "max_runs")
    assert calm.summary.settled and not noisy.summary.settled
    # a 10 us forward that reached the precision: its own jitter, settled; a 1 ms one spreading
    # 40% was disturbed even so (the H200's 2.24 ms forward that spread 12.7% once, 0.27% after)
    assert measured(40, "precision", ms=0.01).summary.settled
    assert not measured(40, "precision").summary.settled
    assert measured(2, "precision").summary.settled and measured(2, "budget").summary.settled
    assert noisy.summary.to_dict()["settled"] is False
    run, r = _evaluation()
    attempts = [(calm, calm)]
    run.measure_interleaved = lambda sets, tracer: attempts.pop(0)
    kept = run.time_again(1, None, noisy, calm)
    assert kept == (calm, calm) and r.timing["retimed"] == "kept the second attempt"
    assert r.timing["first_attempt"]["candidate"]["settled"] is False and not r.notes
    # unsettled twice: the calmer attempt is kept, and the result says it did not settle
    run, r = _evaluation()
    worse = measured(80, "budget")
    run.measure_interleaved = lambda sets, tracer: (worse, calm)
    assert run.time_again(1, None, noisy, calm) == (noisy, calm)
    assert r.timing["retimed"] == "kept the first attempt"
    assert "did not settle in two attempts" in r.notes[0]
    run.record_times(noisy, calm, None)
    assert r.timing["settled"] is False
    from cudaforge.profiling.measurements import measurements_text

    assert "the timing did not settle" in measurements_text(r).splitlines()[0]


def test_the_speedup_uses_graph_times_only_where_both_sides_have_them():
    from cudaforge.harness.timing import _Measurement

    run, r = _evaluation()
    cand = _Measurement([0.05, 0.051, 0.049], None, [], [], [],
                        summary=_summary(0.05, 0.049, 0.051))  # fmt: skip
    ref = _Measurement([0.07, 0.071, 0.069], None, [], [], [],
                       summary=_summary(0.07, 0.069, 0.071))  # fmt: skip
    run.record_times(cand, ref, None)
    assert (r.candidate_ms, r.reference_ms, r.timing["speedup_basis"]) == (0.05, 0.07, "eager")
    assert (r.candidate_low_ms, r.reference_high_ms) == (0.049, 0.071)
    graph = (_summary(0.02, 0.0199, 0.0201), _summary(0.045, 0.0448, 0.0452))
    run.record_times(cand, ref, graph)
    assert (r.candidate_ms, r.reference_ms, r.timing["speedup_basis"]) == (0.02, 0.045, "graph")
    assert r.timing["candidate_eager"]["median_ms"] == 0.05
    assert r.timing["reference_graph"]["high_ms"] == 0.0452
    # torch.compile's time is eager: the candidate's eager time is held against it
    r.compiled_reference_ms, r.correct, r.status = 0.06, True, "ok"
    run.finish()
    assert r.speedup == pytest.approx(0.045 / 0.02)
    assert r.speedup_vs_compile == pytest.approx(0.06 / 0.05)


def test_the_floors_see_the_faster_of_the_eager_and_the_graph_times():
    # an honest graph replay must not hide eager runs faster than the GPU can be
    run, r = _evaluation()
    r.candidate_ms = 0.03
    r.timing.update(candidate_eager={"median_ms": 0.0001}, candidate_graph={"median_ms": 0.03},
                    cupti_busy_ms=0.03)  # fmt: skip
    assert run.fastest_candidate_ms() == 0.0001
    run.timing_cross_check()
    assert "median is 0.0001 ms" in run.fired["timing_mismatch"]
    run.opts.bandwidth_ceiling, run.input_bytes, run.output_bytes = 1e12, 10**7, 0
    run.bandwidth_check()  # 10 MB at 1 TB/s: 0.01 ms at least
    assert run.fired["bandwidth_floor"].startswith("0.0001 ms is below the 0.0100 ms")


def test_kernel_breakdown_finds_own_kernels_and_their_share():
    run, r = _evaluation({"relu_kernel"})
    cand = [_record("relu_kernel", 0, 30), _record("_ZN2at6native18elementwise_kernelIvE", 30, 40),
            _record("relu_kernel", 100, 130), _record("_ZN2at6native18elementwise_kernelIvE", 130, 140)]  # fmt: skip
    ref = [_record("_ZN2at6native18elementwise_kernelIvE", 0, 10)]
    run.kernel_breakdown(_measurement(cand), _measurement(ref))
    k0 = r.kernels[0]
    assert (k0.name, k0.calls, k0.own) == ("relu_kernel", 1, True)
    assert r.kernels[0].total_us == pytest.approx(30) and r.kernels[0].mean_us == pytest.approx(30)
    assert r.own_kernel_share == pytest.approx(0.75)
    assert "no_own_kernels" not in run.fired and "no_own_kernels" in run.passed


def test_no_own_kernels_fires_for_library_kernels_or_borrowed_names():
    run, r = _evaluation({"relu_kernel"})
    run.kernel_breakdown(_measurement([_record("ampere_sgemm_128x64", 0, 50)]), _measurement([]))
    assert "no_own_kernels" in run.fired and r.own_kernel_share == 0
    # a kernel named like one the reference launches is not counted as the candidate's
    run, r = _evaluation({"sm90_xmma_gemm_f32"})
    gemm = [_record("sm90_xmma_gemm_f32", 0, 50)]
    run.kernel_breakdown(_measurement(gemm), _measurement(gemm))
    assert "no_own_kernels" in run.fired and any("named like" in n for n in r.notes)


def test_unmeasured_work_from_synchronized_runs_and_from_cupti():
    from cudaforge.harness.timing import _Measurement

    run, r = _evaluation()
    r.candidate_ms = 0.01
    r.timing["candidate_mean_ms"] = 0.01
    honest = _Measurement([0.01], None, [], [0.03, 0.03], [0.01, 0.01])
    run.unmeasured_check(honest, honest)
    assert "unmeasured_work" not in run.fired
    hidden = _Measurement([0.01], None, [], [1.5, 1.5], [0.01, 0.01])  # a side stream's 1.5 ms
    run.unmeasured_check(hidden, honest)
    assert "synchronized run took 1.5000 ms" in run.fired["unmeasured_work"]
    # CUPTI's busy time is held against the events of the traced runs, not the timed ones
    run, r = _evaluation()
    r.candidate_ms = 0.01
    r.timing.update(candidate_mean_ms=0.5, cupti_busy_ms=0.4)
    traced = _Measurement([0.5], None, [], [0.03, 0.03], [0.01, 0.01], traced=[0.01, 0.01])
    run.unmeasured_check(traced, honest)
    assert "CUPTI saw the GPU busy 0.4000 ms" in run.fired["unmeasured_work"]
    assert "measured 0.0100 ms" in run.fired["unmeasured_work"]
    assert r.timing["candidate_traced_mean_ms"] == pytest.approx(0.01)
    run, r = _evaluation()
    r.timing.update(candidate_mean_ms=0.01, cupti_busy_ms=0.4)
    run.unmeasured_check(_Measurement([0.01], None, [], [0.03], [0.01], traced=[0.45]), honest)
    assert "unmeasured_work" not in run.fired


def test_the_tracer_drops_the_harness_stream_and_measures_busy_time():
    from cudaforge.harness.tracer import _Tracer

    run, r = _evaluation(runs=2)
    harness = [_record("fill", 0, 5, stream=3)]
    timed = [_record("fill", 0, 5, stream=3), _record("k", 10, 20, stream=7),
             _record("k2", 15, 30, stream=9), _record("fill", 40, 45, stream=3),
             _record("k", 50, 60, stream=7)]  # fmt: skip
    batches = [harness, timed]

    class FakeCore:
        def timing_start(self):
            pass

        def timing_stop(self):
            return batches.pop(0)

    run.sync = lambda who="candidate": None
    run.prepare_run = lambda buffers, seed, index: None
    tracer = _Tracer.__new__(_Tracer)
    tracer.run, tracer.active, tracer.harness_stream_id, tracer.reason = run, False, None, None
    tracer.core = FakeCore()
    tracer.calibrate()
    assert tracer.harness_stream_id == 3
    tracer.start()
    records = tracer.stop("candidate")
    assert [rec["name"] for rec in records] == ["k", "k2", "k"]
    # union of [10, 30] and [50, 60] us over 2 runs: 15 us per forward
    assert r.timing["cupti_busy_ms"] == pytest.approx(0.015)
    assert r.timing["cupti_streams"] == 2


def test_poison_fills_only_the_free_blocks():
    from types import SimpleNamespace

    from cudaforge.harness.guards import _Poison

    filled = []

    class View:
        def __init__(self, cai):
            self.cai = cai

        def fill_(self, value):
            filled.append((self.cai["data"][0], self.cai["shape"][0], value))

    snapshot = [
        {"device": 0, "address": 1000, "blocks": [
            {"size": 100, "state": "active_allocated"}, {"size": 50, "state": "inactive"},
            {"size": 30, "state": "active_pending_free"}, {"size": 20, "state": "inactive"}]},
        {"device": 1, "address": 9000, "blocks": [{"size": 10, "state": "inactive"}]},
    ]  # fmt: skip
    fake = SimpleNamespace(
        cuda=SimpleNamespace(memory_snapshot=lambda: snapshot),
        as_tensor=lambda obj, device: View(obj.__cuda_array_interface__),
    )
    poison = _Poison(fake, SimpleNamespace(index=0))
    poison.reserved = 1 << 40  # skip the reservation (it allocates)
    assert poison.fill(0, 0) == 70
    assert filled == [(1100, 50, 0xFF), (1180, 20, 0xFF)]


def test_persisting_l2_is_read_and_reset_through_the_c_core(monkeypatch):
    from types import SimpleNamespace

    import cudaforge._core as core

    from cudaforge.errors import CudaError
    from cudaforge.harness.guards import _PersistingL2

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: SimpleNamespace(cuda_stream=7))
    calls = []
    state = {"limit": 0, "windows": {7: 0}}

    def window(stream):
        if stream not in state["windows"]:
            raise CudaError("cuStreamGetAttribute: invalid resource handle")
        return state["windows"][stream]

    fakes = {
        "persisting_l2_limit": lambda: state["limit"],
        "set_persisting_l2_limit": lambda n: calls.append(("limit", n)),
        "stream_window_bytes": window,
        "clear_stream_window": lambda stream: calls.append(("clear", stream)),
        "reset_persisting_l2": lambda: calls.append(("reset",)),
    }
    for name in fakes:
        monkeypatch.delattr(core, name, raising=False)
    assert "no persisting-L2 calls" in _PersistingL2("cuda:0").reason
    for name, fake in fakes.items():
        monkeypatch.setattr(core, name, fake, raising=False)
    l2 = _PersistingL2("cuda:0")
    assert l2.reason is None and l2.check_and_reset() is None and calls == []
    state["limit"], state["windows"][7] = 32 << 20, 4096
    found = l2.check_and_reset()
    assert "persisting-L2 limit 33554432 bytes" in found and "window of 4096 bytes" in found
    assert calls == [("limit", 0), ("clear", 7), ("reset",)]
    # a stream without the attribute (the legacy default stream): the window check is turned off
    state["limit"], state["windows"] = 0, {}
    assert l2.check_and_reset() is None and not l2.window_ok

    def no_context():
        raise CudaError("cuCtxGetLimit: invalid context")

    monkeypatch.setattr(core, "persisting_l2_limit", no_context)
    assert "cuCtxGetLimit" in _PersistingL2("cuda:0").reason


def test_a_worker_leaves_the_cleanup_to_its_exit(monkeypatch):
    # a worker runs one evaluation and exits: collecting garbage first only delays its result
    from cudaforge.harness import evaluation, worker
    from cudaforge.harness.evaluate import run_evaluation
    from cudaforge.harness.options import make_options
    from cudaforge.profiling import profiler

    monkeypatch.setattr(evaluation, "EXITS_AFTER", False)
    monkeypatch.setattr(profiler, "KEEP_ENABLED", profiler.KEEP_ENABLED)
    collected = []
    monkeypatch.setattr(evaluation.gc, "collect", lambda *a: collected.append(1))
    options = make_options(device="cpu", **FAST)
    assert run_evaluation(RELU, GOOD_RELU, options).status == "ok"
    assert collected  # in-process: the evaluation's tensors go before it returns
    collected.clear()
    assert worker._warm_up() == "cpu" and evaluation.EXITS_AFTER is True
    assert run_evaluation(RELU, GOOD_RELU, options).status == "ok"
    assert collected == []


def test_a_workers_comparison_warm_up_takes_the_equal_and_the_unequal_path(monkeypatch):
    # a fresh worker loads each comparison kernel at its first launch: the warm-up launches
    # those of both outcomes, for each usual dtype
    from cudaforge.harness import compare

    seen = []
    real = compare.tensor_difference

    def spy(actual, expected, options, chunk=1 << 26):
        found = real(actual, expected, options, chunk)
        seen.append((expected.dtype, found.ok))
        return found

    monkeypatch.setattr(compare, "tensor_difference", spy)
    compare.warm_up_comparisons("cpu")
    dtypes = {torch.float32, torch.bfloat16, torch.float16}
    assert {(d, ok) for d in dtypes for ok in (True, False)} == set(seen)


def test_large_checks_are_computed_one_at_a_time_and_never_ahead():
    """The reference keeps two checks' inputs and outputs and computes the next one while the
    candidate works; over `large_bytes` (a 16th of the GPU's memory on a GPU) it keeps one and
    computes none ahead: ReLU at its own size ran out of the H200's memory that way."""
    from cudaforge.harness.reference import ReferenceJudge

    judge = ReferenceJudge(RELU, EvalOptions(trials=3), torch.device("cpu"))
    # as in the reference process: its settings (grad mode off among them) inside no_grad()
    with torch.no_grad():
        try:
            judge.build()
            assert judge.large_bytes is None  # no bound on the CPU
            for i in range(3):
                judge.expected("correctness", i)
            assert len(judge._cache) == 2
            assert judge.prefetch("timed_output", 0) and ("timed_output", 0) in judge._cache

            judge.large_bytes = judge._entry_bytes(next(iter(judge._cache.values()))) - 1
            first = judge.expected("correctness", 0)
            assert list(judge._cache) == [("correctness", 0)]
            assert not judge.prefetch("correctness", 1) and list(judge._cache) == [
                ("correctness", 0)
            ]
            again = judge.expected("correctness", 1)
            assert list(judge._cache) == [("correctness", 1)]
            assert not torch.equal(first[2], again[2])  # each check its own inputs
        finally:
            judge.settings.restore()
    assert torch.is_grad_enabled()
