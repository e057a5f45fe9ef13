"""The phases of an evaluation that prove a candidate right: loading the reference and the
candidate (with its compile hooks and the state fingerprint), the correctness trials (outputs,
aliasing, reuse, inputs changed, extra sizes) and the revalidation after timing on values the
candidate has not seen, in the buffers it was timed on."""

from __future__ import annotations

import linecache
import sys
import types

from .compare import aliases, leaves, overlap
from .evaluation import Evaluation, cloned, one_line, refill, tensor_bytes
from .guards import CORRECTNESS_GUARDS, _fingerprint, kernel_names_in
from .layouts import copy_note, in_orders
from .options import reduced_precision_bound, tolerance_of
from .problem import _seeded
from .reference import ReferenceJudge, check_seed
from .results import TrialFailure
from .tracer import _CompileHooks


class CorrectnessPhases(Evaluation):
    """load(), correctness() and revalidation() of an evaluation."""

    # ------------------------------------------------------------------ load

    def load(self) -> None:
        torch, r, opts = self.torch, self.result, self.opts
        try:
            self.ref_module = self.problem.build_module()
            self.reference = self.problem.make_model(self.device, opts.seed, self.ref_module)
        except Exception as e:  # noqa: BLE001 - a broken problem is reported, not raised
            self.stop("load_error", f"the problem failed to build: {one_line(e)}")
        if getattr(sys.modules.get("__main__"), "NEVER_RUNS_CANDIDATES", False):
            raise RuntimeError("this process judges candidates and never runs one")
        self.hooks = _CompileHooks()
        self.hooks.install()
        if self.judge is None:  # no reference process: the reference's side runs here
            self.judge = ReferenceJudge(self.problem, opts, self.device)
            self.judge.build()
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
        self.candidate = self.in_callers_layout(candidate)
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

    def in_callers_layout(self, candidate):
        """The candidate as its caller runs it: with output_orders, its outputs copied into
        the caller's layouts where they are in others (harness.layouts)."""
        orders = self.opts.output_orders
        if not orders:
            return candidate

        def on_copy(i: int, have: tuple, want: tuple) -> None:
            if i not in self.copied_outputs:  # once per output, the extra sizes' calls too
                self.copied_outputs.add(i)
                self.result.notes.append(copy_note(i, have, want))

        return in_orders(candidate, orders, on_copy)

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
                               f"({one_line(e)})")  # fmt: skip
                continue
            try:
                with _seeded(opts.seed), self.torch.device(self.device):
                    candidate = self.model_new(*init)
                if hasattr(candidate, "to"):
                    candidate = candidate.to(self.device)
            except Exception as e:  # noqa: BLE001
                self.fail_from_exception(e, where="init")
            self.trial(opts.trials + j, opts.seed + 50_000 + j, problem, module, reference,
                       self.in_callers_layout(candidate), f" with sizes {sizes}")  # fmt: skip
        r.correct = True
        r.tolerances = self.tolerances_used
        why = getattr(self.judge, "fp32_unavailable", "")
        if isinstance(why, str) and why:
            r.notes.append(f"bf16/fp16 outputs judged by the tolerance table alone: {why}")
        self.passed_guard(*CORRECTNESS_GUARDS)
        if self.cuda:
            self.passed_guard("unwritten_output")

    def trial(self, trial, seed, problem, module, reference, candidate, label: str) -> None:
        """One trial: the candidate twice (each on its own clone of fresh inputs, on a poisoned
        allocator), then the reference on another clone; outputs, aliasing, reuse, inputs."""
        torch, r = self.torch, self.result
        main = not label
        base = problem.make_inputs(seed, self.device, module)
        if main:
            self.input_bytes = tensor_bytes(base)
        runs = [cloned(base), cloned(base)]
        outs = []
        for j in range(2):
            self.poison_now()
            out = self.call(candidate, runs[j], "candidate")
            self.sync()
            outs.append(out)
        ref_inputs = cloned(base)
        self.settings.apply()
        ref_out = self.call(reference, ref_inputs, "reference")
        self.sync("reference")
        if main:
            self.output_bytes = tensor_bytes(leaves(ref_out))
        self.dtypes_seen = (self.dtypes_seen or set()) | {
            str(t.dtype).replace("torch.", "")
            for t in leaves(ref_out)
            if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())
        }
        # the verdicts on the outputs and on the inputs after each call: the reference's side
        # (the reference process, in a pool), on inputs it regenerates from the same seed
        judged = []
        for j, out in enumerate(outs):
            judgement = self.judge.check("correctness", trial, j, out, runs[j])
            if judgement.error:
                self.stop("runtime_error", judgement.error)
            if judgement.failure is not None:
                self.incorrect(judgement.failure)
            judged.append(judgement)
        ref_aliases = aliases(leaves(ref_out), ref_inputs)
        for j, out in enumerate(outs):
            hit = aliases(leaves(out), runs[j])
            if hit and not ref_aliases:
                self.fire("output_aliases_input", f"trial {trial}: output {hit[0]} shares "
                          f"memory with input {hit[1]}")  # fmt: skip
        # an output that is the model's own state (a parameter, a buffer) is the same memory
        # on every call for the reference too
        state = []
        if isinstance(reference, torch.nn.Module):
            state = [*reference.parameters(), *reference.buffers()]
        reused = overlap(leaves(outs[1]), leaves(outs[0]))
        if reused and not overlap(leaves(ref_out), state):
            self.fire("output_reused", f"trial {trial}: the second call's output {reused[0]} "
                      f"is memory of the first call's output {reused[1]} (a cached result)")  # fmt: skip
        for judgement in judged:
            for guard, detail in judgement.fired.items():
                self.fire(guard, detail)
            if judgement.input_failure is not None:
                self.incorrect(judgement.input_failure)
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
            atol, rtol, norm_tol = tolerance_of(self.opts, dtype)
            out.update(
                {f"{dtype}.atol": atol, f"{dtype}.rtol": rtol, f"{dtype}.norm_tol": norm_tol}
            )
            bound = reduced_precision_bound(self.opts, dtype)
            judge = getattr(self, "judge", None)
            fp32 = self.opts.fp32_reference and not getattr(judge, "fp32_unavailable", "")
            if bound is not None and fp32:  # judged against the fp32 reference instead
                out.update({f"{dtype}.ref_error_multiple": bound[0],
                            f"{dtype}.ref_error_floor_ulps": bound[1]})  # fmt: skip
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

    # ------------------------------------------------------------------ revalidation

    def revalidation(self) -> None:
        opts = self.opts
        buffers = getattr(self, "timed_buffers", None) or []
        previous = None
        for j in range(min(2, len(buffers)) or 0):
            seed = check_seed(opts, "revalidation", j)
            fresh = self.problem.make_inputs(seed, self.device, self.ref_module)
            refill(buffers[j], fresh)  # same pointers the candidate was timed on
            if self.cuda:
                self.sync()
            self.poison_now()
            out = self.call(self.candidate, buffers[j], "candidate")
            self.sync()
            if previous is not None:
                reused = overlap(leaves(out), leaves(previous))
                if reused:
                    self.fire("output_reused", "after timing: a call returned the memory of the "
                              "previous call's output")  # fmt: skip
            judgement = self.judge.check("revalidation", j, 0, out)
            if judgement.error:
                self.stop("runtime_error", judgement.error)
            if judgement.failure is not None:
                self.incorrect(judgement.failure)
            previous = out
        self.timed_buffers = None
        self.passed_guard("revalidation")
