"""What an evaluation is parameterized by: EvalOptions, make_options() that resolves evaluate()'s
keywords, and the one tolerance table (atol, rtol and relative-L2 bound per dtype) that every
check of a candidate's outputs reads, in the workers and in swap alike."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .guards import GUARDS
from .layouts import check_orders

# atol and rtol by dtype name. fp32 and fp16 are KernelBench's current values. fp64 is held to
# 1e-6: fp64 carries ~16 digits, and 1e-4 would pass a kernel that quietly computes in fp32.
# bf16 has an 8-bit mantissa (one ulp is 0.8% of a value near 1): a fused kernel that rounds once
# differs from eager PyTorch, which rounds after every op, by two ulps, and 1e-2 would reject it.
DEFAULT_ATOL = {"float32": 1e-4, "float64": 1e-6, "float16": 1e-2, "bfloat16": 2e-2}
DEFAULT_RTOL = dict(DEFAULT_ATOL)
# bound on ||actual - expected|| / ||expected||: what makes the tolerance scale-aware. An output
# whose values are all far below atol (softmax over 16k columns: ~6e-5) passes atol elementwise
# even when it is all zeros; its relative L2 error is then 1.
DEFAULT_NORM_TOL = {"float32": 1e-3, "float64": 1e-5, "float16": 1e-2, "bfloat16": 2e-2}

# Reduced precision follows the reference's own numerics. For a bf16 or fp16 output the reference
# also runs in fp32 (its weights and floating inputs upcast), and the candidate's error against
# that fp32 result may be at most REF_ERROR_MULTIPLE times the error of PyTorch's own bf16/fp16
# result against it, plus a floor of REF_ERROR_FLOOR_ULPS ulps of the dtype at the output's scale;
# both for the largest error and for the root mean square. A kernel as accurate as PyTorch's op
# passes whatever that op's own error is; one that quietly computes in lower precision (fp8
# inputs, bf16 accumulation where PyTorch accumulates in fp32) fails. fp32 and fp64 are unchanged.
REDUCED_PRECISION_EPS = {"bfloat16": 2.0**-7, "float16": 2.0**-10}  # one ulp at 1.0
REF_ERROR_MULTIPLE = 2.0
REF_ERROR_FLOOR_ULPS = 0.25

_DTYPE_ALIASES = {"fp32": "float32", "fp64": "float64", "fp16": "float16", "bf16": "bfloat16",
                  "half": "float16", "float": "float32", "double": "float64"}  # fmt: skip


@dataclass
class EvalOptions:
    """Everything an evaluation is parameterized by (sent to workers as JSON: options_dict)."""

    trials: int = 5
    # how the timed runs are counted: "adaptive" (candidate and reference interleaved until the
    # median's interval is within `precision`, or `time_budget_s` per side, or `max_runs`),
    # "fixed" (`timed_runs` runs of the candidate, then of the reference: the rule before
    # adaptive timing), "auto" (adaptive on a GPU, fixed on a CPU, whose wall-clock times are for
    # tests). See stopping.py and interleave.py.
    timing_rule: str = "auto"
    timed_runs: int = 100  # the fixed rule's runs per side
    precision: float = 0.01  # half-width of the median's 95% interval, over the median
    time_budget_s: float = 2.0  # s of timed runs per side, at most (adaptive)
    # runs per side (adaptive): the spread of today's forwards needs ~20-40 runs for 1%; the cap
    # keeps a noisy forward's evaluation within ~1.5x the fixed rule's time
    min_runs: int = 20
    max_runs: int = 250
    # also time CUDA-graph replays of both sides when a forward takes under graph_below_ms (ms)
    # eagerly: launching from Python is then much of the time; the speedup uses the graph times
    # where both sides were captured (timing["speedup_basis"])
    cuda_graphs: bool = True
    graph_below_ms: float = 0.05
    # us the host waits between recording a graph replay's start event and launching the replay
    # (the GPU is still busy with the run's preparation, so the wait is outside the window). A
    # direct launch right after its start event reads ~0.5 us noisier than one after a 5 us wait
    # on the H200; a replay did not gain from the wait (RESULTS.md, issue 20, 16:59), hence 0
    replay_gap_us: float = 0.0
    # queue every eager run behind a spin of 1.5x the host's time to issue it, so that the events
    # time the GPU's work, not the host's (timed_sides.py); False: the GPU may wait for the host
    # inside the events, as before (forwards slower to issue than to run then spread 10-40%)
    host_ahead: bool = True
    # runs after the timed ones, traced by CUPTI (KERNEL records: kernels serialized and timed
    # without instrumenting them; the CONCURRENT_KERNEL kind instruments kernels before Blackwell,
    # which made a 0.21 ms kernel of 262k blocks read 9% longer on the H200); 0: no trace
    traced_runs: int = 20
    warmup: int = 10
    # and at least this long (s) on the GPU: an idle GPU's clocks take a moment to rise (a
    # 0.07 ms kernel measured first after idling read 34% slower on the H200)
    warmup_s: float = 0.05
    input_sets: int = 4
    fresh_inputs: bool = True  # refill the timed buffers with new values before every run
    atol: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_ATOL))
    rtol: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_RTOL))
    norm_tol: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_NORM_TOL))
    compare_compile: bool = False
    device: str | None = None  # None: the worker's GPU, else the CPU
    seed: int = 0
    bandwidth_ceiling: float | None = None  # bytes/s; None: datasheet value of the GPU
    allow_tf32: bool = False  # False: fp32 matmul/conv of the reference in true fp32
    # bf16/fp16 outputs: judged against an fp32 run of the reference (see REF_ERROR_MULTIPLE);
    # False: the tolerance table against the reduced-precision reference alone
    fp32_reference: bool = True
    ref_error_multiple: float = REF_ERROR_MULTIPLE
    ref_error_floor_ulps: float = REF_ERROR_FLOOR_ULPS
    profile: bool | str = False  # True: cudaforge.profile.profile_forward; or "module:function"
    ignore_guards: tuple[str, ...] = ()  # still checked and reported, but they do not reject
    extra_sizes: tuple[dict, ...] = ()  # more correctness trials, one per set of size overrides
    # per output, the dimensions (outermost first) of the memory the caller keeps it in, or
    # None: an output in another layout is copied into that one in the timed forward, as the
    # model would copy it (harness.layouts; optimize gives the model's layouts)
    output_orders: tuple[tuple[int, ...] | None, ...] | None = None
    timeout: float = 60.0  # s, for the runs after loading (enforced by the worker pool)
    compile_timeout: float = 300.0  # s, for loading and compiling the candidate


@dataclass
class Tolerances:
    """The three tables a comparison reads, by dtype name (EvalOptions has the same fields)."""

    atol: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_ATOL))
    rtol: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_RTOL))
    norm_tol: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_NORM_TOL))
    ref_error_multiple: float = REF_ERROR_MULTIPLE
    ref_error_floor_ulps: float = REF_ERROR_FLOOR_ULPS

    @classmethod
    def uniform(cls, tolerance: float | None) -> Tolerances:
        """The default table, or with one `tolerance` as atol and rtol of every dtype (the
        relative-L2 bound then 10x it, never below the dtype's default)."""
        if tolerance is None:
            return cls()
        bounds = {k: max(tolerance * 10, v) for k, v in DEFAULT_NORM_TOL.items()}
        every = dict.fromkeys(DEFAULT_ATOL, float(tolerance))
        return cls(atol=every, rtol=dict(every), norm_tol=bounds)


def dtype_name(dtype: Any) -> str:
    """'float32' for torch.float32, 'fp32', 'float' or 'torch.float32': the tables' keys."""
    name = str(dtype).replace("torch.", "")
    return _DTYPE_ALIASES.get(name, name)


def tolerance_of(tables: EvalOptions | Tolerances, dtype: Any) -> tuple[float, float, float]:
    """(atol, rtol, relative-L2 bound) for a dtype; fp32's for a dtype the tables do not name."""
    name = dtype_name(dtype)
    return (
        tables.atol.get(name, tables.atol["float32"]),
        tables.rtol.get(name, tables.rtol["float32"]),
        tables.norm_tol.get(name, tables.norm_tol["float32"]),
    )


def reduced_precision_bound(tables: EvalOptions | Tolerances, dtype: Any):
    """(multiple, floor in ulps, ulp at 1.0) of the reduced-precision rule for a dtype; None for
    a dtype the rule does not apply to (fp32, fp64, integers)."""
    eps = REDUCED_PRECISION_EPS.get(dtype_name(dtype))
    if eps is None:
        return None
    return (
        getattr(tables, "ref_error_multiple", REF_ERROR_MULTIPLE),
        getattr(tables, "ref_error_floor_ulps", REF_ERROR_FLOOR_ULPS),
        eps,
    )


def make_options(
    *,
    trials: int = 5,
    timed_runs: int = 100,
    warmup: int = 10,
    atol: float | Mapping[str, float] | None = None,
    rtol: float | Mapping[str, float] | None = None,
    norm_tol: float | Mapping[str, float] | None = None,
    **more: Any,
) -> EvalOptions:
    """EvalOptions from evaluate()'s keywords, with the tolerance shorthands resolved: a float
    applies to every floating dtype, a mapping overrides some ("fp16", "bf16", "fp32" accepted)."""
    known = {f for f in EvalOptions.__dataclass_fields__}
    unknown = sorted(set(more) - known)
    if unknown:
        raise TypeError(f"unknown evaluation option(s): {', '.join(unknown)}")
    if trials < 1 or timed_runs < 1 or warmup < 0:
        raise ValueError("trials and timed_runs must be >= 1 and warmup >= 0")
    if more.get("traced_runs", 20) < 0:
        raise ValueError("traced_runs must be >= 0")
    if more.get("input_sets", 4) < 1:
        raise ValueError("input_sets must be >= 1")
    if more.get("warmup_s", 0.0) < 0:
        raise ValueError("warmup_s must be >= 0")
    _check_timing(more)
    if more.get("ref_error_multiple", REF_ERROR_MULTIPLE) < 1:
        raise ValueError("ref_error_multiple must be >= 1 (1: as accurate as the reference)")
    if more.get("ref_error_floor_ulps", REF_ERROR_FLOOR_ULPS) < 0:
        raise ValueError("ref_error_floor_ulps must be >= 0")
    if "extra_sizes" in more:
        more["extra_sizes"] = tuple(dict(s) for s in more["extra_sizes"])
    if "output_orders" in more:
        more["output_orders"] = check_orders(more["output_orders"])
    if "ignore_guards" in more:
        bad = [g for g in more["ignore_guards"] if g not in GUARDS]
        if bad:
            raise ValueError(f"unknown guard(s) {bad}; guards: {', '.join(GUARDS)}")
        more["ignore_guards"] = tuple(more["ignore_guards"])
    return EvalOptions(
        trials=trials,
        timed_runs=timed_runs,
        warmup=warmup,
        atol=_per_dtype(atol, DEFAULT_ATOL, "atol"),
        rtol=_per_dtype(rtol, DEFAULT_RTOL, "rtol"),
        norm_tol=_per_dtype(norm_tol, DEFAULT_NORM_TOL, "norm_tol"),
        **more,
    )


TIMING_RULES = ("auto", "adaptive", "fixed")


def _check_timing(more: dict[str, Any]) -> None:
    """ValueError for timing options no evaluation could use."""
    rule = more.get("timing_rule", "auto")
    if rule not in TIMING_RULES:
        raise ValueError(f"timing_rule {rule!r} is not one of {', '.join(TIMING_RULES)}")
    for name in ("precision", "time_budget_s"):
        if name in more and not more[name] > 0:
            raise ValueError(f"{name} must be > 0, not {more[name]}")
    for name in ("graph_below_ms", "replay_gap_us"):
        if more.get(name, 0.0) < 0:
            raise ValueError(f"{name} must be >= 0")
    low, high = more.get("min_runs", 20), more.get("max_runs", 250)
    if not 1 <= low <= high:
        raise ValueError(f"need 1 <= min_runs <= max_runs, got {low} and {high}")


def _per_dtype(value, defaults: dict[str, float], what: str) -> dict[str, float]:
    out = dict(defaults)
    if value is None:
        return out
    if isinstance(value, (int, float)):
        return {k: float(value) for k in out}
    if isinstance(value, Mapping):
        for key, v in value.items():
            out[dtype_name(key)] = float(v)
        return out
    raise TypeError(f"{what} must be a float or a mapping of dtype name to float")


def options_dict(options: EvalOptions) -> dict[str, Any]:
    """The options as JSON-able data (what the pool sends to its processes)."""
    return asdict(options)


def options_from_dict(data: dict[str, Any]) -> EvalOptions:
    """EvalOptions from options_dict()'s data (lists back to tuples); unknown keys refused."""
    known = set(EvalOptions.__dataclass_fields__)
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown evaluation option(s): {', '.join(unknown)}")
    data = dict(data)
    data["extra_sizes"] = tuple(dict(s) for s in data.get("extra_sizes", ()))
    data["ignore_guards"] = tuple(data.get("ignore_guards", ()))
    data["output_orders"] = check_orders(data.get("output_orders"))
    return EvalOptions(**data)
