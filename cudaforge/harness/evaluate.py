"""Evaluating a candidate against its problem's PyTorch reference: correctness, timing and the guards
that keep a fast wrong (or fast-looking) kernel from passing. The result is an EvalResult.

`evaluate()` is what users call: it sends the work to a worker process (cudaforge/worker.py), so
the calling process never imports or runs a candidate. `run_evaluation()` is what a worker runs.

What one evaluation does, in order (the why of each step is in DESIGN.md "Verification"):

1. load: the reference Model and the candidate's ModelNew are built from the same seed. Hooks on
   cudaforge.compile and torch's load_inline/load record the CUDA sources compiled, so the
   candidate's own kernels can be told from torch's.
2. correctness: `trials` trials, each with fresh inputs from seed + t. The candidate runs first and
   twice, each time on its own clone of the inputs, then the reference on another clone. Before
   each candidate run the CUDA caching allocator's free blocks are filled with NaN bytes, so an
   output element the candidate never writes is NaN and fails. Every output is checked: type,
   shape, dtype, strides, device, then values (atol/rtol per dtype, NaN/Inf where the reference
   has none, and a relative-L2 bound that keeps all-zero outputs of tiny-valued problems from
   passing). An output sharing memory with an input, or the second call returning the first call's
   memory, fails; so does an input the candidate changed and the reference does not.
3. timing: the same procedure for candidate and reference: warm-up, then `timed_runs` runs, each
   on one of `input_sets` input buffers (rotating) refilled with fresh values before the run, the
   L2 cache flushed (a buffer of several times the L2 written) and CUDA events around the forward.
   All of that preparation runs on a separate harness stream, outside the events. Median and
   spread ((p75 - p25) / median) of the event times. Then `traced_runs` more runs the same way
   with CUPTI recording every kernel (the per-kernel times, the candidate's share, work outside
   the events): kept apart from the timed runs because CUPTI's trace slows some kernels (below).
   Then one checked run per input buffer, synchronized, whose outputs are compared with the
   reference afterwards.
4. revalidation: two more runs on values the candidate has not seen, written in place into the
   buffers it was timed on (same pointers), each compared with the reference.
5. guards (GUARDS below): each is recorded as fired (guards, guard_details), passed, or skipped
   with the reason (on a CPU, those that need CUDA).

Without a GPU the same steps run on the CPU with wall-clock timing; nothing is poisoned, flushed
or traced there, and the result says so in guards_skipped.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import gc
import hashlib
import linecache
import math
import re
import statistics
import struct
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .problem import Problem, _seeded
from .results import EvalResult, KernelTime, TrialFailure

# atol, rtol by dtype: KernelBench's current defaults
DEFAULT_ATOL = {"float32": 1e-4, "float64": 1e-4, "float16": 1e-2, "bfloat16": 1e-2}
DEFAULT_RTOL = dict(DEFAULT_ATOL)
# bound on ||actual - expected|| / ||expected||: what makes the tolerance scale-aware. An output
# whose values are all far below atol (softmax over 16k columns: ~6e-5) passes atol elementwise
# even when it is all zeros; its relative L2 error is then 1.
DEFAULT_NORM_TOL = {"float32": 1e-3, "float64": 1e-3, "float16": 1e-2, "bfloat16": 1e-2}

# memory bandwidth (bytes/s, datasheet) by device name: the floor no honest forward beats
DATASHEET_BANDWIDTH = {
    "H200": 4.8e12,
    "H100 PCIe": 2.0e12,
    "H100": 3.35e12,
    "H800": 3.35e12,
    "GH200": 4.0e12,
    "B200": 8.0e12,
    "B100": 8.0e12,
    "A100-SXM4-80GB": 2.039e12,
    "A100": 1.555e12,
    "L40S": 0.864e12,
    "L4": 0.3e12,
    "A10": 0.6e12,
}

GUARDS = {
    "output_aliases_input": "an output shares memory with an input (the reference's does not)",
    "output_reused": "a call returned memory that an earlier call's output still holds",
    "input_mutated": "the candidate changed an input (the reference does not)",
    "unwritten_output": "outputs are NaN-poisoned before each run, so unwritten elements fail",
    "tampering": "the candidate replaced functions of torch, the harness or the standard library",
    "no_own_kernels": "the candidate's GPU time is all PyTorch/library kernels, none of its own",
    "bandwidth_floor": "faster than moving its inputs and outputs through memory allows",
    "timed_output": "an output of a timed run was wrong (replayed, skipped or deferred work)",
    "revalidation": "after timing, an output on inputs it had not seen was wrong",
    "unmeasured_work": "GPU work ran outside the timed window (another stream, deferred)",
    "persisting_l2": "the candidate set a persisting-L2 limit or window (it was reset)",
}
CORRECTNESS_GUARDS = ("output_aliases_input", "output_reused", "input_mutated")


@dataclass
class EvalOptions:
    """Everything an evaluation is parameterized by (picklable: sent to workers)."""

    trials: int = 5
    timed_runs: int = 100
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
    profile: bool | str = False  # True: cudaforge.profile.profile_forward; or "module:function"
    ignore_guards: tuple[str, ...] = ()  # still checked and reported, but they do not reject
    extra_sizes: tuple[dict, ...] = ()  # more correctness trials, one per set of size overrides
    timeout: float = 60.0  # s, for the runs after loading (enforced by the worker pool)
    compile_timeout: float = 300.0  # s, for loading and compiling the candidate


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
    if "extra_sizes" in more:
        more["extra_sizes"] = tuple(dict(s) for s in more["extra_sizes"])
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


_DTYPE_ALIASES = {"fp32": "float32", "fp64": "float64", "fp16": "float16", "bf16": "bfloat16",
                  "half": "float16", "float": "float32", "double": "float64"}  # fmt: skip


def _per_dtype(value, defaults: dict[str, float], what: str) -> dict[str, float]:
    out = dict(defaults)
    if value is None:
        return out
    if isinstance(value, (int, float)):
        return {k: float(value) for k in out}
    if isinstance(value, Mapping):
        for key, v in value.items():
            name = str(key).replace("torch.", "")
            out[_DTYPE_ALIASES.get(name, name)] = float(v)
        return out
    raise TypeError(f"{what} must be a float or a mapping of dtype name to float")


def evaluate(
    problem: Problem | str,
    candidate_source: str,
    *,
    trials: int = 5,
    timed_runs: int = 100,
    warmup: int = 10,
    atol: float | Mapping[str, float] | None = None,
    rtol: float | Mapping[str, float] | None = None,
    compare_compile: bool = False,
    device: str | None = None,
    timeout: float = 60.0,
    pool=None,
    **options: Any,
) -> EvalResult:
    """Evaluate `candidate_source` (Python defining ModelNew) against `problem` in a worker process.

    `pool`: a cudaforge.WorkerPool; None uses the process-wide default pool (one worker per visible
    GPU, or CPU workers without one), started on first use and kept warm. Further options (see
    EvalOptions): input_sets, fresh_inputs, norm_tol, seed, bandwidth_ceiling (bytes/s), allow_tf32,
    profile, ignore_guards, extra_sizes, compile_timeout (s). Times in the result are in ms.
    `timeout` (s) covers everything after the candidate is built, torch.compile of the reference
    included when compare_compile is set.
    Never raises for a bad candidate: what went wrong is in the result's status and error."""
    opts = make_options(
        trials=trials,
        timed_runs=timed_runs,
        warmup=warmup,
        atol=atol,
        rtol=rtol,
        compare_compile=compare_compile,
        device=device,
        timeout=timeout,
        **options,
    )
    if isinstance(problem, str):
        problem = Problem.from_source(problem)
    if not isinstance(candidate_source, str):
        raise TypeError("candidate_source must be the candidate's Python source (a str)")
    if pool is None:
        from .pool import default_pool

        pool = default_pool()
    return pool.submit_options(problem, candidate_source, opts).result()


# ====================================================================== the evaluation itself


class _Stop(Exception):
    """Ends an evaluation early; the result already says why."""


class _CompiledReferenceFailed(Exception):
    """torch.compile of the reference failed: a note in the result, not the candidate's fault."""


def run_evaluation(
    problem: Problem | str,
    candidate_source: str,
    options: EvalOptions | None = None,
    on_phase: Callable[[str], None] | None = None,
) -> EvalResult:
    """Run one evaluation in this process. This imports and runs the candidate here: only worker
    processes call it (evaluate() does that for you). `on_phase("loaded")` is called once the
    candidate is built, so a pool can switch from the compile timeout to the run timeout."""
    options = options or EvalOptions()
    if isinstance(problem, str):
        problem = Problem.from_source(problem)
    result = EvalResult(
        problem=problem.name,
        problem_hash=problem.hash,
        candidate_hash=hashlib.sha256(candidate_source.encode()).hexdigest(),
        seed=options.seed,
    )
    started = time.perf_counter()
    run = _Evaluation(problem, candidate_source, options, result, on_phase)
    try:
        run.execute()
    except _Stop:
        pass
    except Exception as e:  # noqa: BLE001 - the harness itself failed: say so, never hang up
        with contextlib.suppress(_Stop):
            run.fail_from_exception(e, where="harness")
    finally:
        run.cleanup()
    result.phase_seconds["total"] = time.perf_counter() - started
    return result


class _Evaluation:
    def __init__(self, problem, source, options, result, on_phase):
        import torch

        self.torch = torch
        self.problem: Problem = problem
        self.source: str = source
        self.opts: EvalOptions = options
        self.result: EvalResult = result
        self.on_phase = on_phase or (lambda phase: None)
        self.device = None
        self.cuda = False
        self.poison = None
        self.l2 = None
        self.harness_stream = None
        self.flush = None
        self.hooks = None
        self.candidate_module = None
        self.settings = None
        self.fingerprint = None
        self.fired: dict[str, str] = {}
        self.passed: list[str] = []
        self.skipped: dict[str, str] = {}
        self.own_names: set[str] = set()
        self.output_bytes = 0
        self.input_bytes = 0

    # ------------------------------------------------------------------ driver

    def execute(self) -> None:
        torch = self.torch
        with torch.no_grad():
            self.setup()
            self.timed("load", self.load)
            self.timed("correctness", self.correctness)
            self.timed("timing", self.timing)
            self.timed("revalidation", self.revalidation)
            self.check_tampering("the end")
            if self.opts.compare_compile:
                self.timed("compile_reference", self.compile_reference)
            if self.opts.profile:
                self.timed("profile", self.run_profile)
        self.finish()

    def timed(self, phase: str, fn: Callable[[], None]) -> None:
        started = time.perf_counter()
        try:
            fn()
        finally:
            self.result.phase_seconds[phase] = time.perf_counter() - started

    def finish(self) -> None:
        r = self.result
        self.record_guards()
        rejecting = [g for g in r.guards if g not in self.opts.ignore_guards]
        if r.status in ("load_error", "ok") and r.correct:
            r.status = "rejected" if rejecting else "ok"
            if rejecting:
                r.error = "rejected by guard(s) " + ", ".join(
                    f"{g} ({r.guard_details.get(g, '')})" for g in rejecting
                )
        if r.candidate_ms and r.reference_ms:
            r.speedup = r.reference_ms / r.candidate_ms
        if r.candidate_ms and r.compiled_reference_ms:
            r.speedup_vs_compile = r.compiled_reference_ms / r.candidate_ms

    def record_guards(self) -> None:
        r = self.result
        r.guards = [g for g in GUARDS if g in self.fired]
        r.guard_details = {g: self.fired[g] for g in r.guards}
        r.guards_skipped = {g: why for g, why in self.skipped.items() if g not in self.fired}
        r.guards_passed = [
            g for g in GUARDS if g in self.passed and g not in self.fired and g not in self.skipped
        ]

    def fire(self, guard: str, detail: str) -> None:
        self.fired.setdefault(guard, detail)

    def passed_guard(self, *guards: str) -> None:
        for g in guards:
            if g not in self.passed:
                self.passed.append(g)

    def stop(self, status: str, error: str, failure: TrialFailure | None = None) -> None:
        r = self.result
        r.status = status
        r.error = error
        if failure is not None:
            r.failure = failure
        self.record_guards()
        raise _Stop

    # ------------------------------------------------------------------ setup and cleanup

    def setup(self) -> None:
        torch = self.torch
        name = self.opts.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.device = torch.device(name)
        self.cuda = self.device.type == "cuda"
        if self.cuda:
            if self.device.index is None:
                self.device = torch.device("cuda", torch.cuda.current_device())
            torch.cuda.set_device(self.device)
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            props = torch.cuda.get_device_properties(self.device)
            self.result.device = f"{props.name} ({self.device})"
            self.harness_stream = torch.cuda.Stream(self.device)
            self.l2 = _PersistingL2(self.device)
            self.poison = _Poison(torch, self.device)
        else:
            self.result.device = "cpu"
            why = "needs a CUDA GPU"
            self.skipped.update(
                unwritten_output="needs the CUDA caching allocator to poison",
                no_own_kernels=f"{why} (CUPTI kernel records)",
                unmeasured_work=f"{why} (streams)",
                persisting_l2=f"{why} (L2 cache)",
            )
        self.settings = _TorchSettings(torch, self.opts.allow_tf32)
        self.settings.apply()

    def cleanup(self) -> None:
        torch = self.torch
        if self.hooks is not None:
            self.hooks.remove()
        name = getattr(self.candidate_module, "__name__", None)
        if name:
            sys.modules.pop(name, None)
        self.candidate_module = None
        # drop every tensor and model this evaluation holds before returning memory to the GPU
        for name in (
            "candidate",
            "reference",
            "ref_module",
            "timed_buffers",
            "flush",
        ):
            self.__dict__.pop(name, None)
        self.poison = None
        if self.settings is not None:
            self.settings.restore()
        gc.collect()
        if self.cuda:
            with contextlib.suppress(Exception):
                if self.l2 is not None:
                    self.l2.check_and_reset()
                torch.cuda.synchronize(self.device)
                torch.cuda.empty_cache()

    # ------------------------------------------------------------------ load

    def load(self) -> None:
        torch, r, opts = self.torch, self.result, self.opts
        try:
            self.ref_module = self.problem.build_module()
            self.reference = self.problem.make_model(self.device, opts.seed, self.ref_module)
        except Exception as e:  # noqa: BLE001 - a broken problem is reported, not raised
            self.stop("load_error", f"the problem failed to build: {_one_line(e)}")
        self.hooks = _CompileHooks()
        self.hooks.install()
        self.fingerprint = _fingerprint(torch)
        module_name = f"cudaforge_candidate_{r.candidate_hash[:12]}"
        filename = f"<candidate {r.candidate_hash[:8]}>"
        self.candidate_filename = filename
        linecache.cache[filename] = (len(self.source), None, self.source.splitlines(True), filename)
        module = types.ModuleType(module_name, "candidate")
        module.__file__ = filename
        sys.modules[module_name] = module
        self.candidate_module = module
        try:
            code = compile(self.source, filename, "exec")
        except SyntaxError as e:
            self.stop("load_error", f"candidate: syntax error at line {e.lineno}: {e.msg}")
        try:
            with _seeded(opts.seed):
                exec(code, module.__dict__)  # noqa: S102 - running the candidate is the point
        except Exception as e:  # noqa: BLE001 - anything the candidate raises is its result
            self.fail_from_exception(e, where="import")
        model_new = module.__dict__.get("ModelNew")
        if model_new is None:
            self.stop(
                "load_error",
                "the candidate defines no ModelNew (it must define class ModelNew, built like the "
                "problem's Model from get_init_inputs())",
            )
        if not callable(model_new):
            self.stop("load_error", "ModelNew is not a class or callable")
        try:
            init = self.problem.init_inputs(opts.seed, self.device, self.ref_module)
            with _seeded(opts.seed), torch.device(self.device):
                candidate = model_new(*init)
            if hasattr(candidate, "to"):
                candidate = candidate.to(self.device)
        except Exception as e:  # noqa: BLE001
            self.fail_from_exception(e, where="init")
        if not callable(candidate):
            self.stop("load_error", "ModelNew(...) built an object that cannot be called")
        self.candidate = candidate
        self.model_new = model_new
        r.compiled = True
        self.own_names = self.hooks.kernel_names() | kernel_names_in(self.source)
        if self.hooks.compiled_modules:
            for mod in self.hooks.compiled_modules:
                self.own_names.update(getattr(mod, "kernels", ()) or ())
                self.own_names.update((getattr(mod, "lowered", None) or {}).values())
        self.check_tampering("loading the candidate")
        self.check_settings("loading the candidate")
        self.check_l2()
        self.on_phase("loaded")

    # ------------------------------------------------------------------ running the models

    def call(self, model, inputs: list, who: str):
        """One forward; exceptions become the result (runtime_error or crashed)."""
        try:
            return model(*inputs)
        except Exception as e:
            if who == "compiled reference" and _context_alive(self.torch, self.device):
                raise _CompiledReferenceFailed(_one_line(e)) from e
            if who == "reference":
                self.fail_from_exception(e, where="reference")
            self.fail_from_exception(e, where="forward")

    def sync(self, who: str = "candidate") -> None:
        if not self.cuda:
            return
        try:
            self.torch.cuda.synchronize(self.device)  # device-wide: every stream
        except Exception as e:  # noqa: BLE001
            self.fail_from_exception(e, where="forward" if who == "candidate" else who)

    def fail_from_exception(self, e: BaseException, where: str) -> None:
        r = self.result
        r.traceback = _candidate_traceback(e, getattr(self, "candidate_filename", "<candidate"))
        kind = type(e).__name__
        if self.cuda and not _context_alive(self.torch, self.device):
            self.stop(
                "crashed",
                f"sticky CUDA error during the {where}: {_one_line(e)}; the CUDA context is lost "
                "and this worker will be replaced",
            )
        if kind == "CompileError" or (
            isinstance(e, RuntimeError) and str(e).startswith("Error building extension")
        ):
            r.compile_log = str(getattr(e, "log", "") or e)
            self.stop("compile_error", f"the candidate's CUDA code did not compile: {_first(e)}")
        if where == "harness":
            r.status, r.error = "runtime_error", f"harness error: {kind}: {_one_line(e)}"
            return
        if where == "reference":
            self.stop("runtime_error", f"the reference failed: {kind}: {_one_line(e)}")
        if where in ("import", "init"):
            what = (
                "importing the candidate" if where == "import" else "ModelNew(*get_init_inputs())"
            )
            self.stop("load_error", f"{what} raised {kind}: {_one_line(e)}")
        self.stop("runtime_error", f"the candidate's forward raised {kind}: {_one_line(e)}")

    # ------------------------------------------------------------------ correctness

    def correctness(self) -> None:
        opts, r = self.opts, self.result
        r.trials = 0
        for trial in range(opts.trials):
            self.trial(trial, opts.seed + trial, self.problem, self.ref_module, self.reference,
                       self.candidate, "")  # fmt: skip
        # extra shapes: the same checks with other size constants (a new Model and ModelNew)
        for j, sizes in enumerate(opts.extra_sizes):
            problem = self.problem.with_sizes(**sizes)
            try:
                module = problem.build_module()
                reference = problem.make_model(self.device, opts.seed, module)
                init = problem.init_inputs(opts.seed, self.device, module)
            except Exception as e:  # noqa: BLE001 - sizes the problem itself cannot take
                r.notes.append(f"extra sizes {sizes} skipped: the problem fails with them "
                               f"({_one_line(e)})")  # fmt: skip
                continue
            try:
                with _seeded(opts.seed), self.torch.device(self.device):
                    candidate = self.model_new(*init)
                if hasattr(candidate, "to"):
                    candidate = candidate.to(self.device)
            except Exception as e:  # noqa: BLE001
                self.fail_from_exception(e, where="init")
            self.trial(opts.trials + j, opts.seed + 50_000 + j, problem, module, reference,
                       candidate, f" with sizes {sizes}")  # fmt: skip
        r.correct = True
        r.tolerances = self.tolerances_used
        self.passed_guard(*CORRECTNESS_GUARDS)
        if self.cuda:
            self.passed_guard("unwritten_output")

    def trial(self, trial, seed, problem, module, reference, candidate, label: str) -> None:
        """One trial: the candidate twice (each on its own clone of fresh inputs, on a poisoned
        allocator), then the reference on another clone; outputs, aliasing, reuse, inputs."""
        torch, opts, r = self.torch, self.opts, self.result
        main = not label
        base = problem.make_inputs(seed, self.device, module)
        if main:
            self.input_bytes = _tensor_bytes(base)
        runs = [_clone(base), _clone(base)]
        outs = []
        for j in range(2):
            self.poison_now()
            out = self.call(candidate, runs[j], "candidate")
            self.sync()
            outs.append(out)
        ref_inputs = _clone(base)
        self.settings.apply()
        ref_out = self.call(reference, ref_inputs, "reference")
        self.sync("reference")
        if main:
            self.output_bytes = _tensor_bytes(_leaves(ref_out))
        self.dtypes_seen = (self.dtypes_seen or set()) | {
            str(t.dtype).replace("torch.", "")
            for t in _leaves(ref_out)
            if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())
        }
        for j, out in enumerate(outs):
            failure = check_outputs(out, ref_out, opts, trial=trial, seed=seed)
            if failure is not None:
                failure.message = failure.message.replace(
                    f"trial {trial}", f"trial {trial}{label}", 1
                )
                if j == 1:
                    failure.message = (
                        "second call: " + failure.message + " (the first call was right: "
                        "state kept between calls, or a non-deterministic result)"
                    )
                self.incorrect(failure)
        ref_aliases = _aliases(_leaves(ref_out), ref_inputs)
        for j, out in enumerate(outs):
            hit = _aliases(_leaves(out), runs[j])
            if hit and not ref_aliases:
                self.fire("output_aliases_input", f"trial {trial}: output {hit[0]} shares "
                          f"memory with input {hit[1]}")  # fmt: skip
        # an output that is the model's own state (a parameter, a buffer) is the same memory
        # on every call for the reference too
        state = []
        if isinstance(reference, torch.nn.Module):
            state = [*reference.parameters(), *reference.buffers()]
        reused = _overlap(_leaves(outs[1]), _leaves(outs[0]))
        if reused and not _overlap(_leaves(ref_out), state):
            self.fire("output_reused", f"trial {trial}: the second call's output {reused[0]} "
                      f"is memory of the first call's output {reused[1]} (a cached result)")  # fmt: skip
        ref_mutated = _changed(base, ref_inputs)
        for j in range(2):
            mutated = _changed(base, runs[j])
            if mutated is not None and ref_mutated is None:
                self.fire("input_mutated", f"trial {trial}: input {mutated} was changed by the "
                          "candidate (the reference leaves it as it was)")  # fmt: skip
            elif mutated is not None:
                # the reference changes its inputs too: they must end up the same
                failure = check_outputs(runs[j], ref_inputs, opts, trial=trial, seed=seed)
                if failure is not None:
                    failure.message = "inputs after the call differ: " + failure.message
                    self.incorrect(failure)
        hit = [g for g in CORRECTNESS_GUARDS if g in self.fired]
        if hit:
            r.trials = trial + 1
            self.stop(
                "incorrect",
                "failed guard(s) " + ", ".join(f"{g}: {self.fired[g]}" for g in hit),
            )
        self.check_tampering(f"trial {trial}")
        self.check_settings(f"trial {trial}")
        self.check_l2()
        r.trials = trial + 1

    @property
    def tolerances_used(self) -> dict[str, float]:
        out = {}
        for dtype in sorted(self.dtypes_seen or {"float32"}):
            out[f"{dtype}.atol"] = self.opts.atol.get(dtype, self.opts.atol["float32"])
            out[f"{dtype}.rtol"] = self.opts.rtol.get(dtype, self.opts.rtol["float32"])
            out[f"{dtype}.norm_tol"] = self.opts.norm_tol.get(dtype, self.opts.norm_tol["float32"])
        return out

    dtypes_seen: set | None = None

    def incorrect(self, failure: TrialFailure) -> None:
        r = self.result
        r.trials = failure.trial + 1 if failure.phase == "correctness" else r.trials
        r.tolerances = self.tolerances_used
        if failure.phase == "correctness":
            self.stop("incorrect", failure.message, failure)
        r.correct = False
        guard = "revalidation" if failure.phase == "revalidation" else "timed_output"
        self.fire(guard, failure.message)
        self.stop("rejected", f"{guard}: {failure.message}", failure)

    def poison_now(self) -> None:
        if self.poison is not None:
            self.poison.fill(self.output_bytes, self.input_bytes)

    # ------------------------------------------------------------------ timing

    def timing(self) -> None:
        opts, r = self.opts, self.result
        sets = self.input_set_count()
        r.timing.update(
            method="cuda_events" if self.cuda else "wall_clock",
            runs=opts.timed_runs,
            traced_runs=opts.traced_runs if self.cuda else 0,
            warmup=opts.warmup,
            warmup_s=opts.warmup_s if self.cuda else 0.0,
            input_sets=sets,
            fresh_inputs=opts.fresh_inputs,
            tf32=opts.allow_tf32,
        )
        if self.cuda:
            self.make_flush_buffer()
        tracer = _Tracer(self) if self.cuda and opts.traced_runs > 0 else None
        if self.cuda and tracer is None:
            r.timing["cupti"] = "off (traced_runs=0)"
        cand = self.measure(self.candidate, "candidate", sets, tracer)
        self.check_tampering("the candidate's timed runs")
        ref = self.measure(self.reference, "reference", sets, tracer)
        r.candidate_ms, r.candidate_spread = cand.median, cand.spread
        r.reference_ms, r.reference_spread = ref.median, ref.spread
        r.timing.update(
            candidate_mean_ms=cand.mean,
            candidate_min_ms=min(cand.times),
            reference_mean_ms=ref.mean,
            candidate_runs_ms=[round(t, 6) for t in cand.times],
            reference_runs_ms=[round(t, 6) for t in ref.times],
        )
        # the guards read from the times first, so that they are all on record even when a
        # checked run below turns out wrong
        if self.cuda:
            self.unmeasured_check(cand, ref)
            self.kernel_breakdown(cand, ref)
        self.bandwidth_check()
        # the checked runs: the candidate's outputs against the reference on the same values
        self.settings.apply()
        for j, (snapshot, out) in enumerate(cand.checked):
            expected = self.call(self.reference, _clone(snapshot), "reference")
            self.sync("reference")
            failure = check_outputs(out, expected, opts, trial=j, seed=None, phase="timed_output")
            if failure is not None:
                failure.message = (
                    f"checked timed run {j + 1} of {len(cand.checked)} (fresh inputs in a buffer "
                    f"it had been timed on): {failure.message}"
                )
                self.incorrect(failure)
        cand.checked = []
        self.passed_guard("timed_output")

    def input_set_count(self) -> int:
        """At most opts.input_sets buffers, fewer when they would not fit (a quarter of free GPU
        memory for the buffers and their checked-run copies)."""
        want = self.opts.input_sets
        if not self.cuda or self.input_bytes == 0:
            return want
        free, _ = self.torch.cuda.mem_get_info(self.device)
        fit = int(free // 4 // max(1, 2 * self.input_bytes + self.output_bytes))
        return max(1, min(want, fit))

    def make_flush_buffer(self) -> None:
        from ..profiling.l2_flush import l2_flush

        self.flush = l2_flush(self.device)  # one per worker process, kept
        self.result.timing["l2_bytes"] = self.flush.l2_bytes
        self.result.timing["l2_flush_bytes"] = self.flush.bytes
        self.result.timing["l2_flush"] = self.flush.description
        if self.flush.fallback:
            self.result.notes.append(f"L2 flush: {self.flush.fallback}")

    def prepare_run(self, buffers: list, seed: int | None, index: int) -> None:
        """Before a run, on the harness stream (outside the events): fresh values into the
        buffers, then the L2 flush. The forward's stream waits for it."""
        torch = self.torch
        if not self.cuda:
            if seed is not None:
                _refill(buffers, self.problem.make_inputs(seed, self.device, self.ref_module))
            return
        main = torch.cuda.current_stream(self.device)
        side = self.harness_stream
        side.wait_stream(main)
        with torch.cuda.stream(side):
            if seed is not None:
                _refill(buffers, self.problem.make_inputs(seed, self.device, self.ref_module))
            self.flush(index)
        main.wait_stream(side)

    def measure(self, model, who: str, sets: int, tracer) -> _Measurement:
        torch, opts = self.torch, self.opts
        base_seed = opts.seed + (100_000 if who == "candidate" else 200_000)
        buffers = [
            self.problem.make_inputs(base_seed + k, self.device, self.ref_module)
            for k in range(sets)
        ]
        if self.cuda:
            self.settings.apply()
        started, i = time.perf_counter(), 0
        while i < opts.warmup or (self.cuda and time.perf_counter() - started < opts.warmup_s):
            self.call(model, buffers[i % sets], who)
            i += 1
            if self.cuda and i % 64 == 0:
                self.sync(who)  # time the GPU's work, not the queueing of it
        self.sync(who)
        seed = base_seed + 1000
        times = self.timed_loop(model, who, buffers, opts.timed_runs, seed, 0)
        seed += opts.timed_runs
        records, traced = None, []
        if tracer is not None:
            tracer.start()
            traced = self.timed_loop(model, who, buffers, opts.traced_runs, seed, opts.timed_runs)
            records = tracer.stop(who)
            seed += opts.traced_runs
        # checked runs: synchronized, one per buffer, fresh values, outputs kept
        checked, synced, checked_events = [], [], []
        for k in range(sets):
            seed += 1
            self.prepare_run(buffers[k], seed, opts.timed_runs + k)
            snapshot = _clone(buffers[k]) if who == "candidate" else None
            self.sync(who)
            if self.cuda:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                t0 = time.perf_counter_ns()
                start.record()
                out = self.call(model, buffers[k], who)
                end.record()
                self.sync(who)
                synced.append((time.perf_counter_ns() - t0) / 1e6)
                checked_events.append(start.elapsed_time(end))
            else:
                out = self.call(model, buffers[k], who)
            if who == "candidate":
                checked.append((snapshot, out))
            del out
        if who == "candidate":
            self.timed_buffers = buffers
        return _Measurement(times, records, checked, synced, checked_events, traced)

    def timed_loop(self, model, who: str, buffers: list, runs: int, seed: int, first: int):
        """`runs` runs rotating among `buffers`, each prepared (fresh values from seed + 1, +2, ...,
        flush) on the harness stream; ms per run (CUDA events, or the wall clock on a CPU)."""
        torch, sets = self.torch, len(buffers)
        times: list[float] = []
        events = []
        for i in range(runs):
            k = (first + i) % sets
            if self.cuda:
                self.check_l2()
            seed += 1
            self.prepare_run(buffers[k], seed if self.opts.fresh_inputs else None, first + i)
            if self.cuda:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                out = self.call(model, buffers[k], who)
                end.record()
                events.append((start, end))
            else:
                t0 = time.perf_counter_ns()
                out = self.call(model, buffers[k], who)
                times.append((time.perf_counter_ns() - t0) / 1e6)
            del out
        self.sync(who)
        if self.cuda:
            times = [s.elapsed_time(e) for s, e in events]
        return times

    def unmeasured_check(self, cand: _Measurement, ref: _Measurement) -> None:
        """Work the events did not see: a synchronized run that takes much longer than its events
        (another stream, deferred work), and, with CUPTI, kernels busier than the event window."""
        r = self.result
        if not cand.synced:
            return
        synced = statistics.median(cand.synced)
        events = statistics.median(cand.checked_events)
        ref_gap = max(0.0, statistics.median(ref.synced) - statistics.median(ref.checked_events))
        gap = synced - events
        r.timing.update(candidate_synced_ms=synced, candidate_checked_events_ms=events)
        if gap > 0.1 + 0.25 * events + 2 * ref_gap:
            self.fire(
                "unmeasured_work",
                f"a synchronized run took {synced:.4f} ms of which the CUDA events saw {events:.4f}"
                " ms: work ran outside the timed window (another stream, or deferred)",
            )
        busy = r.timing.get("cupti_busy_ms")
        if busy is not None and cand.traced:
            mean = statistics.fmean(cand.traced)
            r.timing["candidate_traced_mean_ms"] = mean
            if busy > 1.2 * mean + 0.005:
                self.fire(
                    "unmeasured_work",
                    f"CUPTI saw the GPU busy {busy:.4f} ms per forward with the candidate's "
                    f"kernels, but the CUDA events measured {mean:.4f} ms: kernels ran outside "
                    "the timed window (another stream, or deferred)",
                )
        self.passed_guard("unmeasured_work")

    def kernel_breakdown(self, cand: _Measurement, ref: _Measurement) -> None:
        r, runs = self.result, self.opts.traced_runs
        if cand.records is None:
            reason = r.timing.get("cupti", "CUPTI tracing unavailable")
            r.notes.append(f"no per-kernel times: {reason}")
            self.static_own_check()
            return
        ref_names = {rec["name"] for rec in ref.records or ()}
        names = {rec["name"] for rec in cand.records}
        own = {name for name in names if is_own_kernel(name, self.own_names)}
        borrowed = own & ref_names
        own -= ref_names
        if borrowed:
            r.notes.append(
                "kernel(s) named like the reference's own were not counted as the candidate's: "
                + ", ".join(sorted(borrowed))
            )
        per_name: dict[str, list[int]] = {}
        for rec in cand.records:
            per_name.setdefault(rec["name"], []).append(rec["duration_ns"])
        r.kernels = sorted(
            (
                KernelTime(
                    name=name,
                    calls=round(len(d) / runs) or 1,
                    total_us=sum(d) / runs / 1e3,
                    mean_us=sum(d) / len(d) / 1e3,
                    own=name in own,
                )
                for name, d in per_name.items()
            ),
            key=lambda k: -k.total_us,
        )
        total = sum(k.total_us for k in r.kernels)
        own_total = sum(k.total_us for k in r.kernels if k.own)
        r.own_kernel_share = own_total / total if total > 0 else 0.0
        r.timing["cupti_kernel_ms"] = total / 1e3
        if ref.records:
            ref_total = sum(rec["duration_ns"] for rec in ref.records)
            r.timing["reference_cupti_kernel_ms"] = ref_total / runs / 1e6
        if own_total == 0:
            names = ", ".join(k.name[:60] for k in r.kernels[:4]) or "no kernels at all"
            self.fire(
                "no_own_kernels",
                f"none of the GPU time is in the candidate's own kernels (ran: {names})",
            )
        self.passed_guard("no_own_kernels")

    def static_own_check(self) -> None:
        """Without CUPTI: does the candidate at least compile kernels of its own?"""
        if not self.own_names or not (self.hooks.sources or self.hooks.compiled_modules):
            self.fire(
                "no_own_kernels",
                "the candidate compiles no CUDA kernels (static check: CUPTI was unavailable)",
            )
        else:
            self.result.notes.append(
                "no_own_kernels checked statically (the candidate compiles kernels "
                f"{', '.join(sorted(self.own_names))}); CUPTI was unavailable to see them run"
            )
            self.passed_guard("no_own_kernels")

    def bandwidth_check(self) -> None:
        r, torch = self.result, self.torch
        ceiling = self.opts.bandwidth_ceiling
        source = "given"
        if ceiling is None and self.cuda:
            ceiling, source = _datasheet_bandwidth(torch, self.device)
        if ceiling is None:
            self.skipped["bandwidth_floor"] = "no memory bandwidth known for a CPU; pass " \
                "bandwidth_ceiling (bytes/s) to check"  # fmt: skip
            return
        l2 = self.flush.l2_bytes if self.flush is not None else 0
        floor_bytes = self.input_bytes + max(0, self.output_bytes - l2)
        floor_ms = floor_bytes / ceiling * 1e3
        r.timing.update(
            bandwidth_ceiling=ceiling,
            bandwidth_ceiling_source=source,
            floor_bytes=floor_bytes,
            floor_ms=floor_ms,
        )
        if r.candidate_ms is not None and r.candidate_ms < floor_ms:
            self.fire(
                "bandwidth_floor",
                f"{r.candidate_ms:.4f} ms is below the {floor_ms:.4f} ms that moving "
                f"{floor_bytes} bytes (inputs + outputs) takes at {ceiling / 1e12:.2f} TB/s",
            )
        self.passed_guard("bandwidth_floor")

    # ------------------------------------------------------------------ revalidation

    def revalidation(self) -> None:
        opts = self.opts
        buffers = getattr(self, "timed_buffers", None) or []
        previous = None
        for j in range(min(2, len(buffers)) or 0):
            seed = opts.seed + 300_000 + j
            fresh = self.problem.make_inputs(seed, self.device, self.ref_module)
            _refill(buffers[j], fresh)  # same pointers the candidate was timed on
            if self.cuda:
                self.sync()
            self.poison_now()
            out = self.call(self.candidate, buffers[j], "candidate")
            self.sync()
            if previous is not None:
                reused = _overlap(_leaves(out), _leaves(previous))
                if reused:
                    self.fire("output_reused", "after timing: a call returned the memory of the "
                              "previous call's output")  # fmt: skip
            self.settings.apply()
            expected = self.call(self.reference, _clone(fresh), "reference")
            self.sync("reference")
            failure = check_outputs(out, expected, opts, trial=j, seed=seed, phase="revalidation")
            if failure is not None:
                failure.message = (
                    f"after timing, on new values in a buffer it was timed on: {failure.message}"
                )
                self.incorrect(failure)
            previous = out
        self.timed_buffers = None
        self.passed_guard("revalidation")

    # ------------------------------------------------------------------ extras

    def compile_reference(self) -> None:
        torch, r = self.torch, self.result
        try:
            compiled = torch.compile(self.reference)
            m = self.measure(compiled, "compiled reference", self.input_set_count(), None)
            r.compiled_reference_ms = m.median
            r.timing["compiled_reference_spread"] = m.spread
        except _Stop:
            raise
        except Exception as e:  # noqa: BLE001 - torch.compile failing is a note, not a failure
            r.notes.append(f"torch.compile of the reference failed: {_one_line(e)}")

    def run_profile(self) -> None:
        r = self.result
        target = self.opts.profile
        spec = target if isinstance(target, str) else "cudaforge.profiling.profiler:profile_forward"
        try:
            module_name, _, func_name = spec.partition(":")
            hook = getattr(__import__(module_name, fromlist=[func_name]), func_name)
        except (ImportError, AttributeError) as e:
            r.notes.append(f"profile: {spec} is not available ({_one_line(e)})")
            return
        inputs = self.problem.make_inputs(self.opts.seed + 400_000, self.device, self.ref_module)

        def forward():
            return self.candidate(*inputs)

        extra: dict[str, Any] = {}
        if spec.endswith(":profile_forward"):
            # what profile_forward can use from the candidate's cudaforge.compile modules
            resources, kernels = {}, {}
            for mod in self.hooks.compiled_modules if self.hooks else ():
                with contextlib.suppress(Exception):
                    resources.update(mod.resources)
                    kernels.update({name: mod.kernel(name) for name in mod.kernels})
            extra = {"resources": resources or None, "kernels": kernels or None}
        try:
            got = hook(
                forward,
                own=sorted(self.own_names),
                min_bytes=self.input_bytes + self.output_bytes,
                **extra,
            )
            r.profile = got.to_dict() if hasattr(got, "to_dict") else dict(got)
        except Exception as e:  # noqa: BLE001 - profiling is best effort; the reason is kept
            r.notes.append(f"profile failed: {type(e).__name__}: {_one_line(e)}")

    # ------------------------------------------------------------------ state checks

    def check_tampering(self, when: str) -> None:
        if self.fingerprint is None:
            return
        changed = _fingerprint_diff(self.fingerprint, _fingerprint(self.torch))
        if sys.gettrace() is not None or sys.getprofile() is not None:
            changed.append("sys.settrace/setprofile hook")
        if changed:
            self.fire(
                "tampering",
                f"after {when}: replaced {', '.join(changed[:6])}"
                + (f" and {len(changed) - 6} more" if len(changed) > 6 else ""),
            )
            self.stop("rejected", f"tampering: {self.fired['tampering']}")
        self.passed_guard("tampering")

    def check_settings(self, when: str) -> None:
        changed = self.settings.changed()
        if changed:
            self.result.notes.append(
                f"the candidate changed torch settings while {when}: {', '.join(changed)}; "
                "the harness's settings were restored"
            )
            self.settings.apply()

    def check_l2(self) -> None:
        if self.l2 is None:
            return
        if self.l2.reason:
            self.skipped.setdefault("persisting_l2", self.l2.reason)
            return
        detail = self.l2.check_and_reset()
        if detail:
            self.fire("persisting_l2", detail + " (reset before timing)")
        else:
            self.passed_guard("persisting_l2")


@dataclass
class _Measurement:
    times: list[float]  # ms per timed run
    records: list[dict] | None  # CUPTI kernel records of the timed runs (harness stream removed)
    checked: list  # [(input snapshot, output)] of the checked runs (candidate only)
    synced: list[float]  # wall ms of the synchronized checked runs
    checked_events: list[float]  # event ms of the same runs
    traced: list[float] = field(default_factory=list)  # event ms of the traced runs

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.times)

    @property
    def spread(self) -> float:
        if len(self.times) < 2 or self.median <= 0:
            return 0.0
        q1, _, q3 = statistics.quantiles(self.times, n=4, method="inclusive")
        return (q3 - q1) / self.median


# ====================================================================== comparing outputs


def _leaves(out) -> list:
    if isinstance(out, (list, tuple)):
        return [y for x in out for y in _leaves(x)]
    if isinstance(out, dict):
        return [y for k in sorted(out, key=str) for y in _leaves(out[k])]
    return [out]


def _shape_of(out) -> str:
    if isinstance(out, (list, tuple)):
        return f"a {type(out).__name__} of {len(out)}"
    return "a tensor" if hasattr(out, "shape") else f"a {type(out).__name__}"


def check_outputs(
    actual,
    expected,
    options: EvalOptions,
    *,
    trial: int = 0,
    seed: int | None = None,
    phase: str = "correctness",
) -> TrialFailure | None:
    """None when `actual` matches `expected` (every output); else the first difference."""
    import torch

    def fail(index: int, message: str, **kw) -> TrialFailure:
        where = f"trial {trial}" + (f" (seed {seed})" if seed is not None else "")
        return TrialFailure(trial=trial, output_index=index, message=f"{where}, output {index}: "
                            f"{message}", phase=phase, seed=seed, **kw)  # fmt: skip

    got, want = _leaves(actual), _leaves(expected)
    if len(got) != len(want) or isinstance(actual, (list, tuple)) != isinstance(
        expected, (list, tuple)
    ):
        return fail(0, f"returned {_shape_of(actual)} where the reference returns "
                    f"{_shape_of(expected)}")  # fmt: skip
    for i, (a, e) in enumerate(zip(got, want, strict=True)):
        if not isinstance(e, torch.Tensor):
            if isinstance(a, torch.Tensor) or not _same_value(a, e, options):
                return fail(i, f"got {a!r}, expected {e!r}")
            continue
        if not isinstance(a, torch.Tensor):
            return fail(i, f"got {type(a).__name__}, expected a tensor")
        if type(a) is not type(e):
            return fail(i, f"is a {type(a).__name__}, expected a plain {type(e).__name__} "
                        "(tensor subclasses can defer or fake their values)")  # fmt: skip
        if a.device != e.device:
            return fail(i, f"is on {a.device}, expected {e.device}")
        if a.layout != e.layout:
            return fail(i, f"has layout {a.layout}, expected {e.layout}")
        if a.shape != e.shape:
            return fail(i, f"shape {tuple(a.shape)}, expected {tuple(e.shape)}")
        if a.dtype != e.dtype:
            return fail(i, f"dtype {a.dtype}, expected {e.dtype}")
        if not _strides_ok(a, e):
            return fail(i, f"strides {a.stride()} (contiguous: {a.is_contiguous()}), expected "
                        f"{e.stride()} or contiguous")  # fmt: skip
        mismatch = compare_tensors(a, e, options)
        if mismatch is not None:
            return fail(i, mismatch.pop("message"), **mismatch)
    return None


def _same_value(a, e, options: EvalOptions) -> bool:
    if isinstance(e, float) and isinstance(a, (int, float)):
        if math.isnan(e):
            return math.isnan(a)
        return abs(a - e) <= options.atol["float32"] + options.rtol["float32"] * abs(e)
    return type(a) is type(e) and a == e


def _strides_ok(a, e) -> bool:
    if a.numel() <= 1:
        return True
    if e.is_contiguous():
        return a.is_contiguous()
    return a.stride() == e.stride() or a.is_contiguous()


def compare_tensors(actual, expected, options: EvalOptions, chunk: int = 1 << 26) -> dict | None:
    """Values of two tensors of the same shape and dtype, compared on their device in chunks.
    None when they match; else the TrialFailure fields (message, errors, where)."""
    import torch

    dtype = str(expected.dtype).replace("torch.", "")
    n = expected.numel()
    if n == 0:
        return None
    a_flat = actual.reshape(-1)
    e_flat = expected.reshape(-1)
    exact = not (expected.is_floating_point() or expected.is_complex())
    atol = 0.0 if exact else options.atol.get(dtype, options.atol["float32"])
    rtol = 0.0 if exact else options.rtol.get(dtype, options.rtol["float32"])
    norm_tol = options.norm_tol.get(dtype, options.norm_tol["float32"])
    work = torch.float64 if expected.dtype in (torch.float64, torch.complex128) else torch.float32
    bad_count = 0
    new_nonfinite = 0
    max_abs = 0.0
    max_rel = 0.0
    err_sq = 0.0
    ref_sq = 0.0
    worst = (-math.inf, -1)  # (score, flat index)
    for lo in range(0, n, chunk):
        a = a_flat[lo : lo + chunk]
        e = e_flat[lo : lo + chunk]
        if exact:
            bad = a != e
            count = int(bad.sum())
            if count:
                bad_count += count
                if worst[1] < 0:
                    worst = (math.inf, lo + int(bad.nonzero()[0, 0]))
            continue
        if expected.is_complex():
            a, e = torch.view_as_real(a).to(work), torch.view_as_real(e).to(work)
        else:
            a, e = a.to(work), e.to(work)
        diff = (a - e).abs()
        tol = atol + rtol * e.abs()
        e_fin, a_fin = torch.isfinite(e), torch.isfinite(a)
        same_special = (torch.isnan(a) & torch.isnan(e)) | (~e_fin & ~torch.isnan(e) & (a == e))
        # where the reference is NaN or Inf only the same value passes
        bad = (~(diff <= tol) | ~e_fin) & ~same_special
        count = int(bad.sum())
        new_nonfinite += int((e_fin & ~a_fin).sum())
        both = e_fin & a_fin
        d = torch.where(both, diff, torch.zeros_like(diff))
        max_abs = max(max_abs, float(d.max()))
        nz = both & (e != 0)
        if bool(nz.any()):
            max_rel = max(max_rel, float((d[nz] / e[nz].abs()).max()))
        err_sq += float((d * d).sum())
        ref_sq += float(torch.where(e_fin, e * e, torch.zeros_like(e)).sum())
        if count:
            bad_count += count
            score = torch.where(bad, torch.nan_to_num(diff - tol, nan=math.inf), -math.inf)
            if not a_fin.all():
                score = torch.where(bad & ~a_fin & e_fin, torch.full_like(score, math.inf), score)
            s, idx = torch.max(score, dim=0) if score.dim() else (score, 0)
            if float(s) > worst[0] or worst[1] < 0:
                worst = (float(s), lo + int(idx))
    rel_l2 = math.sqrt(err_sq) / math.sqrt(ref_sq) if ref_sq > 0 else 0.0
    if bad_count == 0 and (exact or ref_sq == 0 or rel_l2 <= norm_tol):
        return None
    shape = tuple(expected.shape)
    info: dict[str, Any] = {
        "max_abs_err": max_abs,
        "max_rel_err": max_rel,
        "mismatches": bad_count,
        "total": n,
        "rel_l2_err": rel_l2,
    }
    if bad_count:
        flat = worst[1]
        index = _unravel(flat, shape) if expected.dim() else []
        exp_v = e_flat[flat].item() if not expected.is_complex() else abs(e_flat[flat].item())
        act_v = a_flat[flat].item() if not expected.is_complex() else abs(a_flat[flat].item())
        info.update(worst_index=index, expected=_num(exp_v), actual=_num(act_v))
        what = "differ" if not exact else "differ (compared exactly)"
        message = (
            f"{bad_count} of {n} elements {what}; worst at {index}: expected {exp_v:.6g}, got "
            f"{act_v:.6g}; max abs err {max_abs:.3g}, max rel err {max_rel:.3g}"
        )
        if not exact:
            message += f" (atol {atol:g}, rtol {rtol:g} for {dtype})"
        if new_nonfinite:
            message += (
                f"; {new_nonfinite} NaN/Inf where the reference is finite (outputs are filled "
                "with NaN before each run: elements the candidate never wrote show up this way)"
            )
    else:
        rms = math.sqrt(ref_sq / n)
        message = (
            f"every element is within atol/rtol, but the relative L2 error is {rel_l2:.3g} > "
            f"{norm_tol:g}: the outputs are small (rms {rms:.3g}) and the candidate's are not "
            "close to them (an all-zero output looks like this)"
        )
    info["message"] = message
    return info


def _num(v) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _unravel(flat: int, shape: tuple[int, ...]) -> list[int]:
    out = []
    for size in reversed(shape):
        out.append(flat % size)
        flat //= size
    return list(reversed(out))


# ====================================================================== memory facts


def _tensor_bytes(values) -> int:
    import torch

    return sum(t.numel() * t.element_size() for t in values if isinstance(t, torch.Tensor))


def _clone(values: list) -> list:
    import torch

    return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]


def _refill(buffers: list, fresh: list) -> None:
    import torch

    for b, f in zip(buffers, fresh, strict=False):
        if isinstance(b, torch.Tensor) and isinstance(f, torch.Tensor) and b.shape == f.shape:
            b.copy_(f)


def _span(t) -> tuple[int, int] | None:
    """(first byte, end byte) of the memory a tensor's elements occupy."""
    if t.numel() == 0:
        return None
    start = t.data_ptr()
    extent = sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride(), strict=True))
    return start, start + (extent + 1) * t.element_size()


def _overlap(outs: list, others: list) -> tuple[int, int] | None:
    import torch

    spans = [
        (j, _span(o)) for j, o in enumerate(others) if isinstance(o, torch.Tensor) and o.numel()
    ]
    for i, t in enumerate(outs):
        if not isinstance(t, torch.Tensor) or t.numel() == 0 or t.device.type == "meta":
            continue
        a = _span(t)
        for j, b in spans:
            if b is not None and a[0] < b[1] and b[0] < a[1]:
                return i, j
    return None


def _aliases(outs: list, inputs: list) -> tuple[int, int] | None:
    return _overlap(outs, inputs)


def _changed(before: list, after: list) -> int | None:
    import torch

    for i, (b, a) in enumerate(zip(before, after, strict=True)):
        if isinstance(b, torch.Tensor):
            if b.is_floating_point() or b.is_complex():
                same = torch.equal(b, a) or bool((torch.isnan(b) & torch.isnan(a) | (b == a)).all())
            else:
                same = torch.equal(b, a)
            if not same:
                return i
    return None


class _Poison:
    """Fills the CUDA caching allocator's free blocks with 0xFF bytes (NaN in fp32/fp16/bf16), so
    that an output the candidate allocates but never writes is NaN, not leftover values (such as
    an earlier result that happens to be right)."""

    def __init__(self, torch, device):
        self.torch = torch
        self.device = device
        self.reserved = 0

    def reserve(self, output_bytes: int, input_bytes: int) -> None:
        """Make sure the cache holds free blocks (large and small) for the candidate's outputs, so
        they come from poisoned memory rather than fresh cudaMalloc."""
        torch = self.torch
        free, _ = torch.cuda.mem_get_info(self.device)
        want = min(2 * output_bytes + input_bytes + (64 << 20), free // 4)
        held = [torch.empty(max(1, want), dtype=torch.uint8, device=self.device)]
        held += [torch.empty(512 << 10, dtype=torch.uint8, device=self.device) for _ in range(8)]
        held += [torch.empty(4096, dtype=torch.uint8, device=self.device) for _ in range(64)]
        del held
        self.reserved = 2 * output_bytes + input_bytes

    def fill(self, output_bytes: int, input_bytes: int) -> int:
        torch = self.torch
        if self.reserved < 2 * output_bytes + input_bytes or not self.reserved:
            self.reserve(output_bytes, input_bytes)
        index = self.device.index
        poisoned = 0
        for segment in torch.cuda.memory_snapshot():
            if segment.get("device", index) != index:
                continue
            address = segment["address"]
            for block in segment["blocks"]:
                start = block.get("address", address)
                if block["state"] == "inactive" and block["size"] > 0:
                    view = torch.as_tensor(_DeviceBytes(start, block["size"]), device=self.device)
                    view.fill_(0xFF)
                    poisoned += block["size"]
                address = start + block["size"]
        return poisoned


class _DeviceBytes:
    """A raw device range as an object torch.as_tensor can view (CUDA array interface)."""

    def __init__(self, pointer: int, size: int):
        self.__cuda_array_interface__ = {
            "shape": (size,),
            "typestr": "|u1",
            "data": (pointer, False),
            "strides": None,
            "version": 2,
        }


def _context_alive(torch, device) -> bool:
    """False after a sticky CUDA error (illegal address, trap): nothing can run any more."""
    try:
        torch.cuda.synchronize(device)
        probe = torch.ones(1, device=device)
        return float((probe + 1).item()) == 2.0
    except Exception:  # noqa: BLE001
        return False


# ====================================================================== the candidate's kernels

_LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\s*\([^)]*\)|__attribute__\s*\(\([^)]*\)\)")
_GLOBAL = re.compile(r"__global__\b[^;{}]*?\b([A-Za-z_]\w*)\s*\(")
_LIBRARY_NAMESPACES = ("_ZN2at", "_ZN3c10", "_ZN3cub", "_ZN7cutlass", "_ZN4cute", "_ZN6thrust",
                       "_ZN8pytorch", "_ZN5flash", "at::", "c10::", "cub::", "cutlass::", "void at::",
                       "void cub::", "void cutlass::", "void c10::")  # fmt: skip


def kernel_names_in(text: str) -> set[str]:
    """Names of the `__global__` functions declared in a source (CUDA, or Python holding it)."""
    return set(_GLOBAL.findall(_LAUNCH_BOUNDS.sub(" ", text)))


def is_own_kernel(kernel_name: str, own_names: set[str]) -> bool:
    """Is a traced kernel (mangled, demangled or extern "C" name) one the candidate declared?
    Kernels in torch's, CUB's or CUTLASS's namespaces never are."""
    if not own_names or kernel_name.startswith(_LIBRARY_NAMESPACES):
        return False
    if kernel_name in own_names:
        return True
    for name in own_names:
        if kernel_name.startswith("_Z"):
            if re.search(rf"(?<!\d){len(name)}{re.escape(name)}", kernel_name):
                return True
        elif re.match(rf"(?:void\s+)?(?:\w+::)*{re.escape(name)}\s*[(<]", kernel_name):
            return True
    return False


class _CompileHooks:
    """Wraps cudaforge.compile and torch's load_inline/load while a candidate loads, to see the
    CUDA sources and modules it compiles."""

    def __init__(self):
        self.sources: list[str] = []
        self.compiled_modules: list = []
        self.restore: list[tuple[object, str, object]] = []

    def install(self) -> None:
        targets = []
        with contextlib.suppress(ImportError):
            import cudaforge
            import cudaforge.cuda.kernel

            targets += [(cudaforge, "compile"), (cudaforge.cuda.kernel, "compile")]
        with contextlib.suppress(ImportError):
            import torch.utils.cpp_extension as ext

            targets += [(ext, "load_inline"), (ext, "load")]
        wrapped: dict[int, Callable] = {}
        for owner, name in targets:
            original = getattr(owner, name, None)
            if original is None:
                continue
            if id(original) not in wrapped:
                wrapped[id(original)] = self._wrap(original, name)
            self.restore.append((owner, name, original))
            setattr(owner, name, wrapped[id(original)])

    def _wrap(self, original: Callable, kind: str) -> Callable:
        hooks = self

        def wrapper(*args, **kwargs):
            if kind == "compile":
                source = args[0] if args else kwargs.get("source", "")
                hooks.sources.append(str(source))
                module = original(*args, **kwargs)
                hooks.compiled_modules.append(module)
                return module
            if kind == "load_inline":
                for key in ("cuda_sources", "cpp_sources"):
                    value = kwargs.get(key)
                    if value is None and key == "cpp_sources" and len(args) > 1:
                        value = args[1]
                    if value is None and key == "cuda_sources" and len(args) > 2:
                        value = args[2]
                    if isinstance(value, str):
                        hooks.sources.append(value)
                    elif value:
                        hooks.sources.extend(str(v) for v in value)
            if kind == "load":
                files = kwargs.get("sources", args[1] if len(args) > 1 else ())
                for path in [files] if isinstance(files, str) else list(files or ()):
                    with contextlib.suppress(OSError), open(path) as f:
                        hooks.sources.append(f.read())
            return original(*args, **kwargs)

        wrapper.__wrapped__ = original
        wrapper.__name__ = getattr(original, "__name__", kind)
        wrapper.__doc__ = getattr(original, "__doc__", None)
        return wrapper

    def kernel_names(self) -> set[str]:
        names: set[str] = set()
        for source in self.sources:
            names |= kernel_names_in(source)
        return names

    def remove(self) -> None:
        for owner, name, original in reversed(self.restore):
            setattr(owner, name, original)
        self.restore = []


# ====================================================================== CUPTI tracing


class _Tracer:
    """CUPTI activity records of one measurement, without the harness stream's kernels."""

    def __init__(self, run: _Evaluation):
        self.run = run
        self.active = False
        self.harness_stream_id = None
        self.reason = None
        try:
            from .. import _core
            from ..cuda import libs as _libs

            self.core = _core
            _libs.ensure("cupti")  # loaded on first use, like every CUDA library
        except ImportError as e:
            self.core, self.reason = None, f"the C core is not importable ({e})"
        except _core.LibraryNotFound as e:
            self.reason = f"libcupti could not be loaded ({_one_line(e)})"
        if self.core is not None and not hasattr(self.core, "timing_start"):
            self.reason = "this build of the C core has no CUPTI timing"
        if self.reason is None:
            self.calibrate()
        run.result.timing["cupti"] = self.reason or "on"

    def calibrate(self) -> None:
        """Which CUPTI stream id the harness stream has: trace one flush alone."""
        run = self.run
        run.sync()
        if not self._start():
            return
        run.prepare_run([], None, 0)
        run.sync()
        records = self._stop()
        streams = {r.get("stream") for r in records or ()}
        if len(streams) == 1:
            self.harness_stream_id = streams.pop()
        else:
            self.reason = f"could not tell the harness stream in CUPTI's records ({streams})"

    def _start(self) -> bool:
        try:
            self.core.timing_start()
            self.active = True
            return True
        except Exception as e:  # noqa: BLE001 - ProfilerError and friends: keep the reason
            reason = getattr(e, "reason", "") or type(e).__name__
            self.reason = f"CUPTI tracing unavailable ({reason}: {_one_line(e)})"
            self.run.result.timing["cupti"] = self.reason
            return False

    def _stop(self) -> list[dict] | None:
        import warnings

        if not self.active:
            return None
        self.active = False
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                records = self.core.timing_stop()
            except Exception as e:  # noqa: BLE001
                self.reason = f"CUPTI tracing failed: {_one_line(e)}"
                self.run.result.timing["cupti"] = self.reason
                return None
        for w in caught:
            self.run.result.notes.append(f"CUPTI: {w.message}")
        return records

    def start(self) -> None:
        if self.reason is None:
            self._start()

    def stop(self, who: str) -> list[dict] | None:
        records = self._stop()
        if records is None:
            return None
        ours = [r for r in records if r.get("stream") != self.harness_stream_id]
        self.summarize(ours, who)
        return ours

    def summarize(self, records: list[dict], who: str) -> None:
        r, runs = self.run.result, self.run.opts.traced_runs
        key = "cupti_busy_ms" if who == "candidate" else "reference_cupti_busy_ms"
        if not records:
            r.timing[key] = 0.0
            return
        spans = sorted((rec["start_ns"], rec["end_ns"]) for rec in records)
        busy, cur_start, cur_end = 0, spans[0][0], spans[0][1]
        for s, e in spans[1:]:
            if s > cur_end:
                busy += cur_end - cur_start
                cur_start, cur_end = s, e
            else:
                cur_end = max(cur_end, e)
        busy += cur_end - cur_start
        r.timing[key] = busy / runs / 1e6
        if key == "cupti_busy_ms":
            r.timing["cupti_streams"] = len({rec.get("stream") for rec in records})
            r.timing["cupti_records"] = len(records)


# ====================================================================== settings, tampering, L2


class _TorchSettings:
    """The global torch settings that change numerics or speed. The harness's values are applied
    before reference runs; a candidate that changes them gets a note and they are put back."""

    def __init__(self, torch, allow_tf32: bool):
        self.torch = torch
        self.original = self.read()
        self.wanted = dict(self.original)
        self.wanted.update({"cuda.matmul.allow_tf32": allow_tf32, "cudnn.allow_tf32": allow_tf32})
        if not allow_tf32:
            self.wanted["float32_matmul_precision"] = "highest"
        self.wanted["grad_enabled"] = False  # with autograd on, the reference would build graphs

    def read(self) -> dict[str, Any]:
        torch = self.torch
        return {
            "default_dtype": torch.get_default_dtype(),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cuda.matmul.allow_fp16_reduced_precision_reduction": (
                torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
            ),
            "cuda.matmul.allow_bf16_reduced_precision_reduction": (
                torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
            ),
            "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
            "cudnn.benchmark": torch.backends.cudnn.benchmark,
            "cudnn.deterministic": torch.backends.cudnn.deterministic,
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "grad_enabled": torch.is_grad_enabled(),
        }

    def changed(self) -> list[str]:
        now = self.read()
        return [
            f"{k}: {self.wanted[k]} -> {now[k]}" for k in self.wanted if now[k] != self.wanted[k]
        ]

    def restore(self) -> None:
        """Back to the values from before the evaluation. Grad mode is left to the no_grad()
        block the settings were read in: it was already off then, and the block restores it."""
        self.apply({k: v for k, v in self.original.items() if k != "grad_enabled"})

    def apply(self, values: dict[str, Any] | None = None) -> None:
        torch, w = self.torch, values or self.wanted
        now = self.read()
        if now == w:
            return
        setters = {
            "default_dtype": torch.set_default_dtype,
            "float32_matmul_precision": torch.set_float32_matmul_precision,
            "cuda.matmul.allow_tf32": lambda v: setattr(
                torch.backends.cuda.matmul, "allow_tf32", v
            ),
            "cuda.matmul.allow_fp16_reduced_precision_reduction": lambda v: setattr(
                torch.backends.cuda.matmul, "allow_fp16_reduced_precision_reduction", v
            ),
            "cuda.matmul.allow_bf16_reduced_precision_reduction": lambda v: setattr(
                torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction", v
            ),
            "cudnn.allow_tf32": lambda v: setattr(torch.backends.cudnn, "allow_tf32", v),
            "cudnn.benchmark": lambda v: setattr(torch.backends.cudnn, "benchmark", v),
            "cudnn.deterministic": lambda v: setattr(torch.backends.cudnn, "deterministic", v),
            "deterministic_algorithms": torch.use_deterministic_algorithms,
            "grad_enabled": torch.set_grad_enabled,
        }
        for key, value in w.items():
            if now[key] != value:
                setters[key](value)


def _namespaces(torch) -> list[tuple[str, object]]:
    import cudaforge.harness.problem
    import cudaforge.harness.results

    spaces: list[tuple[str, object]] = [
        ("torch", torch),
        ("torch.Tensor", torch.Tensor),
        ("torch._C", torch._C),
        ("torch._C._nn", torch._C._nn),
        ("torch._C._VariableFunctions", torch._C._VariableFunctions),
        ("torch.nn.functional", torch.nn.functional),
        ("torch.nn.init", torch.nn.init),
        ("torch.linalg", torch.linalg),
        ("torch.fft", torch.fft),
        ("torch.special", torch.special),
        ("torch.cuda", torch.cuda),
        ("torch.cuda.Event", torch.cuda.Event),
        ("torch.cuda.Stream", torch.cuda.Stream),
        ("torch.autograd.grad_mode", torch.autograd.grad_mode),
        ("time", time),
        ("statistics", statistics),
        ("math", math),
        ("builtins", builtins),
        ("threading", threading),
        ("cudaforge.harness.evaluate", sys.modules[__name__]),
        ("cudaforge.harness.problem", cudaforge.harness.problem),
        ("cudaforge.harness.results", cudaforge.harness.results),
        ("EvalResult", EvalResult),
        ("TrialFailure", TrialFailure),
    ]
    worker = sys.modules.get("cudaforge.harness.pool")
    if worker is not None:
        spaces.append(("cudaforge.harness.pool", worker))
    for name, value in vars(torch.nn).items():
        if isinstance(value, type) and issubclass(value, torch.nn.Module):
            spaces.append((f"torch.nn.{name}", value))
    return spaces


# rebound by torch itself (torch.set_default_dtype rebinds torch.Storage)
_REBOUND_BY_TORCH = {("torch", "Storage")}


def _fingerprint(torch) -> dict[tuple[str, str], int]:
    """id() of every callable in the namespaces a candidate could patch to fool the harness."""
    out = {}
    for space, obj in _namespaces(torch):
        try:
            items = list(vars(obj).items())
        except TypeError:
            continue
        for key, value in items:
            patchable = callable(value) and not isinstance(value, types.ModuleType)
            if patchable and (space, key) not in _REBOUND_BY_TORCH:
                out[(space, key)] = id(value)
    return out


def _fingerprint_diff(before: dict, after: dict) -> list[str]:
    changed = [f"{s}.{k}" for (s, k), v in before.items() if after.get((s, k)) != v]
    return sorted(changed)


class _PersistingL2:
    """The persisting-L2 limit and the timing stream's access-policy window (driver API via
    ctypes): a candidate that sets them keeps its data in L2 across the flush."""

    LIMIT = 0x06  # CU_LIMIT_PERSISTING_L2_CACHE_SIZE
    WINDOW = 1  # CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW (as a stream attribute)

    def __init__(self, device):
        import torch

        self.reason = None
        self.stream = torch.cuda.current_stream(device).cuda_stream
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            self.reason = f"libcuda.so.1 not loadable ({e})"
            return
        value = ctypes.c_size_t(0)
        status = self.lib.cuCtxGetLimit(ctypes.byref(value), self.LIMIT)
        if status != 0:
            self.reason = f"cuCtxGetLimit(PERSISTING_L2_CACHE_SIZE) failed with CUDA error {status}"
        self.baseline = value.value
        self.window_ok = True

    def check_and_reset(self) -> str | None:
        if self.reason:
            return None
        found = []
        value = ctypes.c_size_t(0)
        if self.lib.cuCtxGetLimit(ctypes.byref(value), self.LIMIT) == 0 and (
            value.value != self.baseline
        ):
            found.append(f"persisting-L2 limit {value.value} bytes")
            self.lib.cuCtxSetLimit(self.LIMIT, ctypes.c_size_t(self.baseline))
        if self.window_ok:
            raw = ctypes.create_string_buffer(64)
            status = self.lib.cuStreamGetAttribute(ctypes.c_void_p(self.stream), self.WINDOW, raw)
            if status != 0:
                self.window_ok = False  # not for this stream (the legacy default stream)
            else:
                num_bytes = struct.unpack_from("Q", raw.raw, 8)[0]
                if num_bytes:
                    found.append(f"access-policy window of {num_bytes} bytes on the stream")
                    cleared = ctypes.create_string_buffer(64)
                    self.lib.cuStreamSetAttribute(
                        ctypes.c_void_p(self.stream), self.WINDOW, cleared
                    )
        if found:
            self.lib.cuCtxResetPersistingL2Cache()
            return "; ".join(found)
        return None


def _datasheet_bandwidth(torch, device) -> tuple[float | None, str]:
    props = torch.cuda.get_device_properties(device)
    name = props.name
    for key in sorted(DATASHEET_BANDWIDTH, key=len, reverse=True):
        if key in name:
            return DATASHEET_BANDWIDTH[key], f"datasheet ({key})"
    clock = getattr(props, "memory_clock_rate", 0)  # kHz
    width = getattr(props, "memory_bus_width", 0)  # bits
    if clock and width:
        return 2.0 * clock * 1e3 * width / 8, "memory clock x bus width"
    return None, "unknown"


# ====================================================================== messages


def _one_line(e: BaseException, limit: int = 400) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _first(e: BaseException) -> str:
    line = getattr(e, "line", None)
    if line:
        return _one_line(line)
    return _one_line(str(e).splitlines()[0] if str(e) else type(e).__name__)


def _candidate_traceback(e: BaseException, filename: str) -> str:
    """The traceback without the harness's own frames."""
    frames = [
        f
        for f in traceback.extract_tb(e.__traceback__)
        if not f.filename.endswith(("cudaforge/harness/evaluate.py", "cudaforge/harness/pool.py"))
    ]
    lines = traceback.format_list(frames)
    lines += traceback.format_exception_only(type(e), e)
    return "".join(lines)[-8000:]


def options_dict(options: EvalOptions) -> dict[str, Any]:
    return asdict(options)
