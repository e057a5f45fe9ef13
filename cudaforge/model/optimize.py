"""The front door: `optimize(model, example_inputs)` and `apply_stored(model, example_inputs)`
(also named `load`).

optimize:
1. works on a deep copy of the model (inplace=True: on the model itself) and finds its hot spots
   on the example inputs (cudaforge.model.hotspots): one KernelBench problem each;
2. per hot spot, a kernel: from the store when one was verified for the same problem, GPU arch,
   dtype and shapes and it passes again in a worker now; else the Coder/Judge loop
   (cudaforge.agents.loop), each candidate evaluated in a worker process
   (cudaforge.harness.pool). Hot spots run side by side when the pool has several workers. A
   candidate that is correct and faster than the reference is stored the moment its evaluation
   says so;
3. swaps in the fastest such kernel of each hot spot, once it also passes the checks in this
   process (captured inputs and fresh ones, gradients with training=True) and is faster here
   (cudaforge.model.swap); the others keep the original code;
4. times the forward on the example inputs before and after, and compares the outputs.

Ctrl-C during step 2 stops the agents (a loop ends at its next evaluation); what was verified so
far is already stored and is swapped in; the result says it was interrupted. A second Ctrl-C
stops at once.

apply_stored does steps 1, 2 (store only, no LLM at all: a stored kernel is re-verified in a
worker on this GPU first), 3 and 4. The report of either, as text and as HTML, is made in
cudaforge.reporting.
"""

from __future__ import annotations

import copy
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..agents.resume import transcript_for
from ..errors import CudaforgeError
from ..harness.results import EvalResult
from ..reporting.formatting import times
from . import backward as bw
from . import remembered_search
from .compile_view import compiled_view
from .end_to_end import SITE_GRAPH_MODES, EndToEnd
from .hotspots import MAX_HOTSPOTS, MIN_SHARE, Hotspot
from .outcomes import HotspotOutcome, OptimizeResult, PhaseClock
from .progress import Progress
from .store import KernelStore
from .swap import restore, swap_in, swaps
from .swap_compare import compare, model_in_fp32
from .swap_errors import SwapError
from .swapped_hotspot import layout_notes, output_orders
from .timing import model_device, split_inputs

Evaluate = Callable[[str, str], EvalResult]


class _Interrupted(Exception):
    """Raised inside an agents loop to end it (Ctrl-C in the caller)."""


# ---------------------------------------------------------------- the run


def _gpu_arch(device: torch.device) -> str:
    if device.type != "cuda":
        return device.type
    from ..cuda.kernel import current_arch

    try:
        return current_arch(device.index if device.index is not None else 0)
    except CudaforgeError:
        major, minor = torch.cuda.get_device_capability(device)
        return f"sm_{major}{minor}"


def _gpu_text(device: torch.device) -> str:
    if device.type != "cuda":
        return "No GPU: candidates run on the CPU (torch code stands in for kernels)."
    try:
        from ..cli.doctor import gpu_facts

        return gpu_facts(device.index or 0)
    except Exception:  # noqa: BLE001 - the prompt then goes without the facts
        return ""


def _budget(budget) -> tuple[float | None, float | None]:
    """(dollars, seconds) of a budget: None, a number of USD, or {'dollars': .., 'seconds': ..}."""
    if budget is None:
        return None, None
    if isinstance(budget, (int, float)):
        return float(budget), None
    if isinstance(budget, dict):
        unknown = set(budget) - {"dollars", "seconds"}
        if unknown:
            raise ValueError(f"budget keys are 'dollars' and 'seconds', not {sorted(unknown)}")
        return budget.get("dollars"), budget.get("seconds")
    raise TypeError("budget is None, USD as a number, or {'dollars': ..., 'seconds': ...}")


@dataclass
class _Found:
    """The best verified kernel of one hot spot so far."""

    source: str
    result: EvalResult
    origin: str
    stored_id: int | None = None


class _Run(EndToEnd):
    def __init__(self, *, mode, model, example_inputs, targets, training, inplace, verify_every,
                 pool, evaluate, store, progress, min_share, max_hotspots, min_speedup,
                 tolerance, eval_options, profile=False, backward=None,
                 site_graphs=False):  # fmt: skip
        if site_graphs not in SITE_GRAPH_MODES or not isinstance(site_graphs, (bool, str)):
            raise ValueError(f"site_graphs must be False, True or 'auto', not {site_graphs!r}")
        self.mode = mode
        self.started = time.monotonic()
        self.args, self.kwargs = split_inputs(example_inputs)
        self.user_model = model
        self.model = model if inplace else copy.deepcopy(model)
        self.device = model_device(self.model, self.args, self.kwargs)
        self.arch = _gpu_arch(self.device)
        self.training = training
        self.backward = training if backward is None else bool(backward) and training
        self.verify_every = verify_every
        self.targets = targets
        self.min_share = min_share
        self.max_hotspots = max_hotspots
        self.min_speedup = min_speedup
        self.tolerance = tolerance
        self.progress = Progress(progress)
        self.store = _store(store)
        self.pool = pool
        self.eval_options = dict(eval_options or {})
        # the Judge's hardware metrics: every correct candidate is profiled on a GPU
        self.profile = profile and self.device.type == "cuda"
        self._evaluate = evaluate
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.found: dict[str, _Found] = {}
        self.outcomes: dict[str, HotspotOutcome] = {}
        self.reuse = True
        self.transcripts: Path | None = None  # optimize(transcripts=): one file per hot spot
        self.pair_bounds = None  # time_pair's intervals: (original's, optimized's) or None
        self.site_graphs, self.site_graphs_note, self.for_compile = site_graphs, "", False

    # ------------------------------------------------------------ evaluation in workers

    def evaluate(self, problem_source: str, candidate_source: str, hotspot=None) -> EvalResult:
        """The candidate checked and timed in a worker; for a forward hot spot, with its
        outputs in the model's layouts (EvalOptions.output_orders)."""
        if self._evaluate is not None:
            return self._evaluate(problem_source, candidate_source)
        options = dict(self.eval_options)
        if hotspot is not None and hotspot.kind != bw.KIND:
            options.setdefault("output_orders", output_orders(hotspot.sites[0]))
        options.setdefault("profile", self.profile)
        if self.device.type != "cuda":
            options.setdefault("device", "cpu")
        if self.pool is None:
            from ..harness.pool import default_pool

            self.pool = default_pool()
        return self.pool.evaluate(problem_source, candidate_source, **options)

    @property
    def parallel(self) -> int:
        if self._evaluate is not None:
            return 1
        return max(1, getattr(self.pool, "size", 1) or 1)

    def faster(self, result: EvalResult) -> bool:
        """Correct and faster than min_speedup; where the runs did not settle (a disturbed
        timing: harness.stopping.TimeSummary.settled), faster by more than twice the worse
        side's spread on top (a 6.7x kernel whose runs spread 20% is still faster). The time in
        this process decides the swap after this."""
        if not result.ok or result.speedup is None:
            return False
        noise = 0.0
        if (result.timing or {}).get("settled", True) is False:
            noise = 2 * max(result.candidate_spread or 0.0, result.reference_spread or 0.0)
        return result.speedup > self.min_speedup * (1 + noise)

    def note(self, hotspot: Hotspot, source: str, result: EvalResult, origin: str,
             transcript: str = "") -> None:  # fmt: skip
        """Record a verified, faster candidate: stored now, and the hot spot's best if fastest."""
        stored_id = None
        if self.store is not None and origin == "agents":
            stored_id = self.store.put(
                problem_source=hotspot.problem_source, arch=self.arch, dtype=hotspot.dtype,
                shapes=hotspot.shapes, source=source, result=result, transcript=transcript,
                label=hotspot.name,
            )  # fmt: skip
        with self.lock:
            best = self.found.get(hotspot.name)
            if best is None or (result.candidate_ms or math.inf) < (
                best.result.candidate_ms or math.inf
            ):
                self.found[hotspot.name] = _Found(source, result, origin, stored_id)

    # ------------------------------------------------------------ kernels for hot spots

    def from_store(self, hotspot: Hotspot, outcome: HotspotOutcome) -> bool:
        """The fastest stored kernel for this hot spot that passes again here; True if any."""
        if self.store is None:
            return False
        stored = self.store.find(hotspot.problem_hash, self.arch, hotspot.dtype, hotspot.shapes)
        for kernel in stored:
            if self.stop.is_set():
                return False
            result = self.evaluate(hotspot.problem_source, kernel.source, hotspot)
            outcome.candidates += 1
            if self.faster(result):
                self.note(hotspot, kernel.source, result, "store")
                self.found[hotspot.name].stored_id = kernel.id
                outcome.transcript = kernel.transcript
                self.progress.say(
                    f"{hotspot.name}: stored kernel #{kernel.id} passed again "
                    f"({result.speedup:.2f}x in the worker)"
                )
                return True
            self.progress.say(f"{hotspot.name}: stored kernel #{kernel.id} did not pass here "
                              f"({_one_line(result)}{', not faster' * result.ok}); skipped")
        return False

    def with_agents(self, hotspot: Hotspot, outcome: HotspotOutcome, agent_options) -> None:
        from ..agents.loop import run_loop
        from ..agents.transcript import default_transcript_path

        name = hotspot.name
        if self.transcripts is not None:  # one per hot spot, resumed by the next run
            name, path = transcript_for(self.transcripts, name, hotspot.problem_source)
            transcript = str(path)
        else:
            transcript = str(default_transcript_path(f"optimize-{hotspot.problem_hash[:10]}"))
        outcome.transcript = transcript
        counter = {"n": 0}

        def evaluate(problem_source: str, candidate_source: str) -> EvalResult:
            if self.stop.is_set():
                raise _Interrupted
            result = self.evaluate(problem_source, candidate_source, hotspot)
            counter["n"] += 1
            outcome.last_result = _one_line(result)
            if self.faster(result):
                self.note(hotspot, candidate_source, result, "agents", transcript)
            status = f"{result.speedup:.2f}x" if result.ok and result.speedup else result.status
            self.progress.say(f"{hotspot.name}: candidate {counter['n']}: {status}")
            if self.stop.is_set():
                raise _Interrupted
            return result

        options = dict(agent_options)
        deadline = options.pop("deadline", None)
        if deadline is not None:
            options["max_seconds"] = max(1.0, deadline - time.monotonic())
        try:
            loop = run_loop(
                hotspot.problem_source, evaluate, transcript=transcript, name=name,
                notes="" if hotspot.kind == bw.KIND else layout_notes(hotspot.sites[0]),
                **options,
            )  # fmt: skip
        except _Interrupted:
            outcome.candidates = counter["n"]
            return
        outcome.candidates = counter["n"]
        outcome.rounds = loop.rounds
        total = loop.usage.get("total")
        if total is not None:
            outcome.cost_usd = total.cost_usd
            outcome.llm_calls = total.calls
        if loop.stop_reason.startswith("llm_error"):
            outcome.detail = loop.stop_reason
        if loop.stop_reason == "waiting":
            outcome.waiting_for = list(loop.waiting_for)
            outcome.detail = f"waiting for {len(loop.waiting_for)} reply file(s)"
        self.recorded_best(hotspot, loop, counter, transcript)

    def recorded_best(self, hotspot: Hotspot, loop, counter, transcript: str) -> None:
        """A resumed loop's best kernel whose evaluation was recorded by an earlier run is
        evaluated again here before it counts (it passed on another machine, or another day)."""
        best = loop.best
        if best is None or not self.faster(best.result) or self.stop.is_set():
            return
        with self.lock:
            found = self.found.get(hotspot.name)
        if found is not None and found.source == best.source:
            return  # evaluated in this run
        result = self.evaluate(hotspot.problem_source, best.source, hotspot)
        counter["n"] += 1
        self.outcomes[hotspot.name].candidates = counter["n"]
        again = f"{result.speedup:.2f}x" if result.ok and result.speedup else result.status
        self.progress.say(f"{hotspot.name}: recorded best (round {best.round}) again: {again}")
        if self.faster(result):
            self.note(hotspot, best.source, result, "agents", transcript)

    def forge(self, hotspot: Hotspot, agent_options: dict | None) -> None:
        outcome = self.outcomes[hotspot.name]
        try:
            stored = self.reuse and self.from_store(hotspot, outcome)
            if not stored and agent_options is not None and not self.stop.is_set():
                self.with_agents(hotspot, outcome, agent_options)
        except _Interrupted:
            pass
        except Exception as exc:  # noqa: BLE001 - one hot spot's failure does not end the run
            outcome.status = "error"
            outcome.detail = f"{type(exc).__name__}: {exc}"
        found = self.found.get(hotspot.name)
        text = f"{found.result.speedup:.2f}x ({found.origin})" if found else "no faster kernel"
        self.progress.step(f"{hotspot.name}: {text}")

    def forge_all(self, hotspots: list[Hotspot], agent_options: dict | None) -> None:
        """Run forge() per hot spot on daemon threads, `parallel` at a time; Ctrl-C sets stop
        and returns without waiting for loops still inside an LLM call."""
        pending = list(hotspots)
        running: list[threading.Thread] = []
        try:
            while pending or running:
                running = [t for t in running if t.is_alive()]
                while pending and len(running) < self.parallel and not self.stop.is_set():
                    hotspot = pending.pop(0)
                    thread = threading.Thread(
                        target=self.forge, args=(hotspot, agent_options), daemon=True,
                        name=f"cudaforge-forge-{hotspot.problem_hash[:8]}",
                    )  # fmt: skip
                    thread.start()
                    running.append(thread)
                if self.stop.is_set() and not running:
                    break
                if running:
                    running[0].join(timeout=0.2)
        except KeyboardInterrupt:
            self.stop.set()
            self.progress.say(
                "interrupted: stopping the agents; verified kernels are kept (Ctrl-C again to "
                "stop at once)"
            )
            deadline = time.monotonic() + 5.0
            for thread in running:  # a loop between two evaluations ends quickly
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
        for hotspot in pending:
            self.outcomes[hotspot.name].status = "interrupted"

    # ------------------------------------------------------------ swapping

    def swap_all(self, hotspots: list[Hotspot]) -> None:
        for hotspot in hotspots:
            outcome = self.outcomes[hotspot.name]
            found = self.found.get(hotspot.name)
            if found is None:
                if outcome.status not in ("error", "interrupted"):
                    outcome.status = "interrupted" if self.stop.is_set() else "no_kernel"
                    if self.stop.is_set():
                        why = "stopped before a kernel was verified"
                    elif self.mode == "load":
                        why = "no stored kernel for this problem passed again here"
                    else:
                        why = "no candidate was correct and faster than the reference"
                    last = f" (last: {outcome.last_result})" if outcome.last_result else ""
                    outcome.detail = outcome.detail or why + last
                continue
            outcome.origin = found.origin
            outcome.stored_id = found.stored_id
            outcome.worker_result = found.result.to_dict()
            outcome.kernel_source = found.source
            if hotspot.kind == bw.KIND:
                continue  # settled below, with its forward
            found_backward = self.found.get(bw.backward_name(hotspot.name))
            backward = None if found_backward is None else (
                found_backward.source,
                self.outcomes[bw.backward_name(hotspot.name)].problem_source,
            )  # fmt: skip
            installed = []
            try:
                for i, site in enumerate(hotspot.sites):
                    swap = swap_in(
                        site, found.source, hotspot.problem_source, name=hotspot.name,
                        training=self.training, verify_every=self.verify_every,
                        tolerance=self.tolerance, timed=i == 0, backward=backward,
                    )  # fmt: skip
                    installed.append(swap)
                    outcome.checks.append(swap.check.to_dict())
            except (SwapError, CudaforgeError, RuntimeError) as exc:
                for swap in installed:
                    swap.uninstall()
                outcome.status = "refused"
                outcome.detail = f"{type(exc).__name__}: {exc}"
                continue
            first = installed[0].check
            outcome.before_ms, outcome.after_ms = first.original_ms, first.kernel_ms
            speedup = outcome.speedup
            if speedup is not None and speedup <= self.min_speedup:
                outcome.status = "slower_here"
                outcome.detail = (
                    f"{found.result.speedup:.2f}x in the worker but {speedup:.2f}x in this process"
                )
                if self.training and all(swap.use_backward_kernel for swap in installed):
                    for swap in installed:  # the backward kernel still wins in a training step
                        swap.forward_original = True
                    outcome.forward_original = True
                    outcome.detail += "; the original forward runs, with the backward kernel"
                    continue
                for swap in installed:
                    swap.uninstall()
                outcome.detail += "; the original is kept"
                continue
            outcome.status = "swapped"
        for hotspot in hotspots:
            found = self.found.get(hotspot.name)
            if hotspot.kind == bw.KIND and found is not None:
                forward = self.outcomes.get(bw.forward_name(hotspot.name))
                bw.settle(self.outcomes[hotspot.name], found.result, forward)

    # ------------------------------------------------------------ the whole thing

    def run(self, agent_options: dict | None) -> OptimizeResult:
        if swaps(self.model):  # kernels from an earlier run: start from the original code
            restore(self.model)
        self.progress.say(f"{self.mode}: profiling {type(self.model).__name__} on {self.device}")
        mark = PhaseClock()
        search = remembered_search.search(
            self.model, (*self.args,) if not self.kwargs else self.kwargs, store=self.store,
            use_remembered=self.mode == "load", say=self.progress.say, targets=self.targets,
            min_share=self.min_share, max_hotspots=self.max_hotspots,
        )  # fmt: skip
        hotspots = list(search)
        if self.backward:  # a backward problem per hot spot: backward kernels for training
            hotspots = bw.with_backward(hotspots, search.skipped)
        mark("search")
        for hotspot in hotspots:
            self.outcomes[hotspot.name] = HotspotOutcome(
                name=hotspot.name, kind=hotspot.kind, label=hotspot.label,
                sites=[s.path or "(root)" for s in hotspot.sites],
                problem_hash=hotspot.problem_hash, share=hotspot.share,
                problem_source=hotspot.problem_source,
                before_ms=hotspot.sites[0].ms if hotspot.kind != bw.KIND else None,
            )  # fmt: skip
        self.progress.say(search.summary())
        if agent_options is not None and agent_options.get("dollars") is not None:
            agent_options = dict(agent_options)
            agent_options["max_dollars"] = agent_options.pop("dollars") / len(hotspots)
        expected = self.forward()
        expected32 = self.forward32()
        before_ms = self.time_model()
        mark("reference")
        if self.pool is None and self._evaluate is None:
            from ..harness.pool import default_pool

            self.pool = default_pool()  # started now: its size sets how many hot spots run at once
        self.progress.start(len(hotspots), self.mode)
        try:
            self.forge_all(hotspots, agent_options)
        finally:
            self.progress.close()
        mark("kernels")
        self.swap_all(hotspots)
        mark("swap")
        after_ms = before_ms
        max_abs_err, match = 0.0, True
        if swaps(self.model):
            max_abs_err, match = self.check_outputs(self.forward(), expected, expected32)
            if not match:
                restore(self.model)
                for outcome in self.outcomes.values():
                    if outcome.status == "swapped":
                        outcome.status = "refused"
                        outcome.detail = (
                            "the model's output with all kernels differs from the original's "
                            f"(max abs error {max_abs_err:.3g}); every kernel was taken out"
                        )
            before_ms, after_ms = self.time_pair(before_ms)
            if match:
                before_ms, after_ms = self.keep_what_speeds_up(before_ms, after_ms)
        before_ms, after_ms = self.with_site_graphs(before_ms, after_ms, expected, expected32)
        gpu = swaps(self.model) and self.device.type == "cuda"
        after_gpu_ms = self.time_model(queued=True) if gpu else None
        for swap in swaps(self.model):
            swap.site.release()
        mark("end_to_end")
        result = OptimizeResult(
            model=self.model,
            hotspots=[self.outcomes[h.name] for h in hotspots],
            model_name=type(self.user_model).__name__,
            device=_device_text(self.device),
            arch=self.arch,
            before_ms=before_ms,
            after_ms=after_ms,
            max_abs_err=max_abs_err,
            outputs_match=match,
            interrupted=self.stop.is_set(),
            seconds=time.monotonic() - self.started,
            skipped=[str(s) for s in search.skipped],
            store=str(self.store.path) if self.store is not None else "",
            training=self.training,
            mode=self.mode,
            profile=search.profile.table(8),
            phase_seconds=mark.phases,
            after_gpu_ms=after_gpu_ms,
            before_interval=self.pair_bounds[0] if self.pair_bounds else None,
            after_interval=self.pair_bounds[1] if self.pair_bounds else None,
            site_graphs=self.site_graphs_note,
        )
        speedup = f"{result.speedup:.2f}x" if result.speedup else "n/a"
        self.progress.say(f"done: {len(result.swapped)} of {len(hotspots)} hot spot(s) swapped; "
                          f"end-to-end {speedup}")  # fmt: skip
        return result

    def forward(self):
        """One forward without autograd, with the random generators seeded (dropout in training
        mode draws the same masks before and after: swapped code draws no random numbers)."""
        devices = [self.device.index or 0] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            torch.manual_seed(0)
            return self.model(*self.args, **self.kwargs)

    def forward32(self):
        """The original model's outputs in fp32 (swap_compare.model_in_fp32), for the end-to-end
        check of a bf16/fp16 model; None where there is none."""
        try:
            return model_in_fp32(self.model, self.args, self.kwargs, self.device)
        except Exception as exc:  # noqa: BLE001 - then the tolerance table alone judges
            self.progress.say(f"no fp32 run of the model for the end-to-end check ({exc})")
            return None

    def check_outputs(self, got, expected, expected32=None) -> tuple[float, bool]:
        actual = [t for t in _leaves(got) if isinstance(t, torch.Tensor)]
        wanted = [t for t in _leaves(expected) if isinstance(t, torch.Tensor)]
        wanted32 = None
        if expected32 is not None:
            wanted32 = [t for t in _leaves(expected32) if isinstance(t, torch.Tensor)]
        worst, problem = compare(actual, wanted, _loose(self.tolerance, wanted), wanted32)
        return (worst.max_abs_err if worst else math.inf), not problem


def _one_line(result: EvalResult) -> str:
    if result.ok:
        return f"correct, {times(result.speedup, 'n/a')}"
    error = result.error.splitlines()[0][:160] if result.error else ""
    return result.status + (f": {error}" if error else "")


def _loose(tolerance, tensors) -> float | None:
    """Errors of several kernels add up through a model: the end-to-end check allows 10x."""
    if tolerance is not None:
        return tolerance * 10
    dtypes = {t.dtype for t in tensors}
    return 1e-1 if dtypes & {torch.float16, torch.bfloat16} else 1e-3


def _leaves(value) -> list:
    from torch.utils._pytree import tree_leaves

    return tree_leaves(value)


def _device_text(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} ({device})"
    return str(device)


def _store(store) -> KernelStore | None:
    if store is False:
        return None
    if store is None or store is True:
        return KernelStore()
    if isinstance(store, KernelStore):
        return store
    return KernelStore(Path(store))


# ---------------------------------------------------------------- public API


def optimize(
    model: nn.Module,
    example_inputs,
    *,
    llm="openai:o3",
    judge=None,
    budget=None,
    targets: Sequence[str] | Callable | None = None,
    training: bool = False,
    inplace: bool = False,
    verify_every: int = 0,
    rounds: int = 10,
    pool=None,
    progress: bool = True,
    evaluate: Evaluate | None = None,
    store=None,
    reuse: bool = True,
    min_share: float = MIN_SHARE,
    max_hotspots: int = MAX_HOTSPOTS,
    min_speedup: float = 1.0,
    tolerance: float | None = None,
    candidates: int = 1,
    eval_options: dict | None = None,
    cluster: str | None = None,
    profile: bool = True,
    transcripts: str | Path | None = None,
    backward: bool | None = None,
    for_compile: bool = False,
    site_graphs: bool | str = False,
) -> OptimizeResult:
    """Make `model` faster on inputs like `example_inputs` with verified kernels for its hot spots.

    llm, judge: the Coder's and the Judge's models ('openai:o3', 'anthropic:...', 'scripted:',
    'replay:PATH', or a cudaforge.agents.providers.Provider); judge defaults to llm. budget: USD for the whole
    run (split evenly over the hot spots), or {'dollars': .., 'seconds': ..}. targets: module
    paths, class names, kinds ('module', 'chain', 'block') or label text to limit the hot spots
    to (or a predicate on a Hotspot). training: keep autograd right and check gradients at swap
    time; also a backward problem per hot spot, whose verified kernel replaces the recompute of
    the original in the backward pass (backward=False: none; see cudaforge.model.backward).
    inplace: patch `model` itself instead of an optimized deep copy (cudaforge.restore undoes
    either). verify_every: shadow-check one call in N against the original. rounds: Coder
    rounds per hot spot. pool: a cudaforge.WorkerPool (default: the process-wide one); hot spots
    run in parallel over its workers. progress: tqdm or plain lines on stderr.

    evaluate(problem_source, candidate_source) -> EvalResult replaces the worker evaluation
    (tests, a remote harness). store: a KernelStore, a path, or False (default: the cache dir's).
    reuse: take stored kernels that pass again before asking the agents. min_speedup: a kernel
    must be faster than this (worker and in-process). tolerance: atol = rtol of the in-process
    checks (default per dtype). candidates: parallel lanes per agents loop. eval_options: more
    options for cudaforge.harness.evaluate (trials, timed_runs, ...). profile: on a GPU, profile
    every correct candidate so that the Judge reads its hardware metrics (False: timing only;
    eval_options' "profile" wins). transcripts: a folder for the agents' transcripts, one
    `<hot spot>.jsonl` each (default: a new file per run in the cache dir); a run given a folder
    of an earlier run of the same model resumes each hot spot's loop where it stopped, recorded
    replies and evaluations replayed, and evaluates the best recorded kernel again before it
    counts. With `file:DIR?wait=0` a hot spot whose reply is not written yet stops with its
    prompt files in `.waiting_for` (result.waiting_for lists all); run again once they are
    answered. cluster: "ray" evaluates on a Ray cluster when no pool is given (a
    cudaforge.RayPool on the cluster RAY_ADDRESS names, or a local instance; closed at the end).
    for_compile: find and verify the hot spots as torch.compile runs the model, for
    `torch.compile(result.model)`: Hugging Face attention masks are built as under compile
    (cudaforge.model.compile_view); eager calls then run the original code at those sites.
    site_graphs: replay the swapped sites' inference calls from CUDA graphs (site_graphs(); GPU,
    not with training): True turns them on, "auto" keeps them only where the model is faster
    with them beyond the noise; result.site_graphs says what was done and why.

    Raises HotspotError when the model cannot be handled (the message says what and why)."""
    if cluster not in (None, "ray"):
        raise ValueError(f"cluster must be None or 'ray', not {cluster!r}")
    dollars, seconds = _budget(budget)
    run = _Run(
        mode="optimize", model=model, example_inputs=example_inputs, targets=targets,
        training=training, inplace=inplace, verify_every=verify_every, pool=pool,
        evaluate=evaluate, store=store, progress=progress, min_share=min_share,
        max_hotspots=max_hotspots, min_speedup=min_speedup, tolerance=tolerance,
        eval_options=eval_options, profile=profile, backward=backward, site_graphs=site_graphs,
    )  # fmt: skip
    from ..agents.providers import Provider, get_provider

    # made once, before any work: a missing API key fails here, not after the profiling
    coder = get_provider(llm, role="coder")
    if judge is None and isinstance(llm, Provider):
        judge_provider = coder
    else:
        judge_provider = get_provider(llm if judge is None else judge, role="judge")
    agent_options: dict[str, Any] = {"coder": coder, "judge": judge_provider, "rounds": rounds,
                                     "candidates": candidates, "gpu": _gpu_text(run.device)}
    if seconds is not None:
        agent_options["deadline"] = time.monotonic() + seconds
    if dollars is not None:
        agent_options["dollars"] = dollars  # split over the hot spots once they are known
    run.reuse = reuse
    if transcripts is not None:
        run.transcripts = Path(transcripts)
        run.transcripts.mkdir(parents=True, exist_ok=True)
    if cluster is None or pool is not None:
        return _run_in_view(run, agent_options, for_compile)
    from ..harness.ray_pool import RayPool

    with RayPool() as ray_pool:
        run.pool = ray_pool
        return _run_in_view(run, agent_options, for_compile)


def _run_in_view(run: _Run, agent_options: dict | None, for_compile: bool) -> OptimizeResult:
    """run.run(agent_options), inside compile_view's compiled_view() for for_compile."""
    run.for_compile = for_compile
    if not for_compile:
        return run.run(agent_options)
    with compiled_view() as changed:
        if not changed:
            run.progress.say("for_compile: no transformers masking to change; eager and "
                             "torch.compile make the same calls here")  # fmt: skip
        result = run.run(agent_options)
    for swap in swaps(result.model):
        swap.compile_only = True
    return result


def apply_stored(
    model: nn.Module,
    example_inputs,
    *,
    targets: Sequence[str] | Callable | None = None,
    training: bool = False,
    inplace: bool = False,
    verify_every: int = 0,
    pool=None,
    progress: bool = True,
    evaluate: Evaluate | None = None,
    store=None,
    min_share: float = MIN_SHARE,
    max_hotspots: int = MAX_HOTSPOTS,
    min_speedup: float = 1.0,
    tolerance: float | None = None,
    eval_options: dict | None = None,
    backward: bool | None = None,
    for_compile: bool = False,
    site_graphs: bool | str = False,
) -> OptimizeResult:
    """Re-apply stored kernels to `model`, with no LLM at all: find the hot spots again, take the
    fastest stored kernel of each (same problem, GPU arch, dtype and shapes) that passes again in
    a worker on this GPU and in this process, and swap it in. Same options as optimize()."""
    run = _Run(
        mode="load", model=model, example_inputs=example_inputs, targets=targets,
        training=training, inplace=inplace, verify_every=verify_every, pool=pool,
        evaluate=evaluate, store=store, progress=progress, min_share=min_share,
        max_hotspots=max_hotspots, min_speedup=min_speedup, tolerance=tolerance,
        eval_options=eval_options, backward=backward, site_graphs=site_graphs,
    )  # fmt: skip
    if run.store is None:
        raise ValueError("apply_stored() needs a store (store=False leaves nothing to apply)")
    return _run_in_view(run, None, for_compile)


load = apply_stored  # the name it had first


__all__ = ["apply_stored", "load", "optimize"]
