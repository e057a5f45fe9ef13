"""The reference's side of every comparison: the seeds each check draws its inputs from, the
reference Model rebuilt from the problem and the seed, its outputs on inputs regenerated from
those seeds, and the judgement of a candidate's outputs against them (outputs, and in the
trials the inputs after the call). In a pool this runs in the reference process, which never
imports a candidate (reference_process.py); run_evaluation alone runs it in its own process.

The seeds are a function of the options the pool sends to both sides, never of what the
candidate's process says: trial t draws from seed + t, the trials on extra sizes from
seed + 50 000 + j, checked timed run k from seed + 250 000 + k, revalidation j from
seed + 300 000 + j. The same seed on the same device gives the same inputs on both sides.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from .compare import changed_input, check_outputs, leaves
from .guards import _TorchSettings
from .options import EvalOptions
from .problem import Problem
from .results import TrialFailure

PHASES = ("correctness", "timed_output", "revalidation")


def check_seed(options: EvalOptions, phase: str, index: int) -> int:
    """The seed of check `index` of `phase` (for correctness, indexes past options.trials are
    the trials on options.extra_sizes)."""
    if phase == "correctness":
        extra = index - options.trials
        return options.seed + index if extra < 0 else options.seed + 50_000 + extra
    if phase == "timed_output":
        return options.seed + 250_000 + index
    if phase == "revalidation":
        return options.seed + 300_000 + index
    raise ValueError(f"no check phase {phase!r}; phases: {', '.join(PHASES)}")


@dataclasses.dataclass
class Judgement:
    """The verdict on one output: `failure` (its outputs differ), `input_failure` (the inputs
    after the call differ from the reference's, which changes them too), `fired` (guards:
    input_mutated), `error` (the reference itself failed)."""

    failure: TrialFailure | None = None
    input_failure: TrialFailure | None = None
    fired: dict[str, str] = dataclasses.field(default_factory=dict)
    error: str = ""

    @property
    def passed(self) -> bool:
        return not (self.failure or self.input_failure or self.fired or self.error)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Judgement:
        def failure(d):
            if not isinstance(d, dict):
                return None
            names = {f.name for f in dataclasses.fields(TrialFailure)}
            return TrialFailure(**{k: v for k, v in d.items() if k in names})

        return cls(
            failure=failure(data.get("failure")),
            input_failure=failure(data.get("input_failure")),
            fired={str(k): str(v) for k, v in (data.get("fired") or {}).items()},
            error=str(data.get("error") or ""),
        )


class ReferenceJudge:
    """The reference Model(s) of one evaluation and the judgement of the candidate's outputs.
    Never imports or runs a candidate."""

    def __init__(self, problem: Problem, options: EvalOptions, device):
        import torch

        self.torch = torch
        self.problem = problem
        self.opts = options
        self.device = device
        self.settings = _TorchSettings(torch, options.allow_tf32)
        self.models: dict[int, tuple[Problem, Any, Any]] = {}  # extra index (-1: main)
        self.usable_extra: list[int] = []
        self.skipped_extra: dict[int, str] = {}
        self._cache: dict[tuple, Any] = {}  # (phase, index) -> expected(); the last two
        self._cache32: dict[tuple, Any] = {}  # (phase, index) -> expected32(); the last two
        self.models32: dict[int, Any] = {}  # extra index (-1: main) -> the fp32 copy
        self.fp32_unavailable = ""  # why the reduced-precision rule could not be applied
        # a check's inputs and outputs over this many bytes are computed one check at a time,
        # never ahead: two cached and one prefetched of ReLU at its own size (6.4 GB a tensor)
        # took 54 GB beside the candidate's process, and the next allocation failed on the H200
        self.large_bytes: int | None = None
        if torch.device(device).type == "cuda":
            self.large_bytes = torch.cuda.get_device_properties(device).total_memory // 16

    def build(self) -> None:
        """The reference Model of the problem and of each extra size it can take (seeded like
        the candidate's side). Raises what building the main problem raises."""
        opts = self.opts
        module = self.problem.build_module()
        model = self.problem.make_model(self.device, opts.seed, module)
        self.models[-1] = (self.problem, module, model)
        for j, sizes in enumerate(opts.extra_sizes):
            try:
                problem = self.problem.with_sizes(**sizes)
                module = problem.build_module()
                model = problem.make_model(self.device, opts.seed, module)
                problem.init_inputs(opts.seed, self.device, module)
            except Exception as e:  # noqa: BLE001 - sizes the problem itself cannot take
                self.skipped_extra[j] = f"{type(e).__name__}: {e}"
                continue
            self.models[j] = (problem, module, model)
            self.usable_extra.append(j)

    def close(self) -> None:
        self.models.clear()
        self._cache.clear()
        self.models32.clear()
        self._cache32.clear()

    # ------------------------------------------------------------------ the reference's runs

    def _model_of(self, phase: str, index: int):
        extra = index - self.opts.trials if phase == "correctness" else -1
        if extra >= 0 and extra not in self.models:
            raise KeyError(f"trial {index}: no extra sizes {extra} the problem can take")
        return self.models[max(extra, -1)]

    def expected(self, phase: str, index: int):
        """(inputs before, inputs after, outputs) of the reference on check `index`'s inputs."""
        key = (phase, index)
        if key in self._cache:
            return self._cache[key]
        problem, module, model = self._model_of(phase, index)
        if self._large(self._entry_bytes(next(reversed(self._cache.values()), None))):
            self._cache.clear()  # large checks: the one before goes before this one is made
        seed = check_seed(self.opts, phase, index)
        base = problem.make_inputs(seed, self.device, module)
        inputs = [v.clone() if isinstance(v, self.torch.Tensor) else v for v in base]
        self.settings.apply()
        with self.torch.no_grad():
            out = model(*inputs)
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)
        while len(self._cache) >= 2:
            del self._cache[next(iter(self._cache))]  # the oldest
        self._cache[key] = (base, inputs, out)
        return base, inputs, out

    def next_check(self, phase: str, index: int, call: int) -> tuple[str, int] | None:
        """The check most likely to come after (phase, index, call), for prefetching: the next
        trial, timed run or revalidation. None after a first call (the second uses the same)."""
        if phase == "correctness" and call == 0:
            return None
        if phase == "correctness" and index + 1 >= self.opts.trials + len(self.usable_extra):
            return ("timed_output", 0)
        if phase == "correctness" and index + 1 >= self.opts.trials:
            return (
                "correctness",
                self.opts.trials + self.usable_extra[index + 1 - self.opts.trials],
            )
        return (phase, index + 1)

    def prefetch(self, phase: str, index: int, free_bytes: int | None = None) -> bool:
        """Compute expected() of a check ahead, while the candidate's process works, where one
        more set of the reference's inputs and outputs fits in `free_bytes` (None: no bound)
        three times over. False where it was not done (too large, or the reference failed)."""
        if (phase, index) in self._cache:
            return True
        one = next(iter(self._cache.values()), None)  # a check's entry: about what one more takes
        size = self._entry_bytes(one)
        if free_bytes is not None and 3 * size > free_bytes or self._large(size):
            return False
        try:
            self.expected(phase, index)
            self.expected32(phase, index)
        except Exception:  # noqa: BLE001 - judged (and said) when the check itself comes
            return False
        return True

    def _entry_bytes(self, entry) -> int:
        values = [] if entry is None else [*entry[0], *entry[1], *leaves(entry[2])]
        t = self.torch
        return sum(v.numel() * v.element_size() for v in values if isinstance(v, t.Tensor))

    def _large(self, size: int) -> bool:
        return self.large_bytes is not None and size > self.large_bytes

    def expected32(self, phase: str, index: int):
        """The reference's outputs from an fp32 run on check `index`'s inputs (its weights and
        bf16/fp16 inputs upcast), when some output is bf16/fp16; else None. None too, with
        `fp32_unavailable` saying why, when the reference cannot run in fp32: its outputs are
        then judged by the tolerance table alone."""
        torch = self.torch
        if not self.opts.fp32_reference or self.fp32_unavailable:
            return None
        key = (phase, index)
        if key in self._cache32:
            return self._cache32[key]
        _, _, out = self.expected(phase, index)
        reduced = (torch.bfloat16, torch.float16)
        if not any(isinstance(v, torch.Tensor) and v.dtype in reduced for v in leaves(out)):
            return None
        problem, module, model = self._model_of(phase, index)
        extra = index - self.opts.trials if phase == "correctness" else -1
        try:
            model32 = self.models32.get(max(extra, -1))
            if model32 is None:
                model32 = copy.deepcopy(model)
                if isinstance(model32, torch.nn.Module):
                    model32 = model32.float()
                self.models32[max(extra, -1)] = model32
            base = problem.make_inputs(check_seed(self.opts, phase, index), self.device, module)
            inputs = [
                v.float() if isinstance(v, torch.Tensor) and v.dtype in reduced else v for v in base
            ]
            self.settings.apply()
            with torch.no_grad():
                out32 = model32(*inputs)
        except Exception as e:  # noqa: BLE001 - a reference without an fp32 form
            self.fp32_unavailable = f"the reference does not run in fp32: {type(e).__name__}: {e}"
            return None
        got, want = leaves(out32), leaves(out)
        if len(got) != len(want) or any(
            isinstance(w, torch.Tensor) and (not isinstance(g, torch.Tensor) or g.shape != w.shape)
            for g, w in zip(got, want)
        ):
            self.fp32_unavailable = "the reference's fp32 run returns other outputs"
            return None
        while len(self._cache32) >= 2:
            del self._cache32[next(iter(self._cache32))]  # the oldest
        self._cache32[key] = out32
        return out32

    def output_bytes(self) -> int:
        """Bytes of the main problem's reference outputs (a bound for what a candidate sends)."""
        _, _, out = self.expected("correctness", 0)
        t = self.torch
        return sum(v.numel() * v.element_size() for v in leaves(out) if isinstance(v, t.Tensor))

    # ------------------------------------------------------------------ judging

    def judge(self, phase: str, index: int, call: int, out, inputs=None, *, facts=None,
              input_facts=None, of: int = 0) -> Judgement:  # fmt: skip
        """The verdict on the candidate's output `out` of check `index` of `phase` (`call` 1 is
        the second call of a trial), with `inputs` the candidate's inputs after the call."""
        opts = self.opts
        try:
            base, ref_inputs, expected = self.expected(phase, index)
        except Exception as e:  # noqa: BLE001 - the reference failing is said, not raised
            text = " ".join(str(e).split())[:400]
            return Judgement(error=f"the reference failed: {type(e).__name__}: {text}")
        seed = check_seed(opts, phase, index)
        if phase == "correctness":
            failure = check_outputs(out, expected, opts, trial=index, seed=seed, facts=facts,
                                    reference32=self.expected32(phase, index))  # fmt: skip
            label = self._label(index)
            if failure is not None:
                failure.message = failure.message.replace(
                    f"trial {index}", f"trial {index}{label}", 1
                )
                if call == 1:
                    failure.message = (
                        "second call: " + failure.message + " (the first call was right: "
                        "state kept between calls, or a non-deterministic result)"
                    )
                return Judgement(failure=failure)
            if inputs is None:
                return Judgement()
            return self._judge_inputs(index, seed, base, ref_inputs, inputs, input_facts)
        if phase == "timed_output":
            failure = check_outputs(out, expected, opts, trial=index, seed=None,
                                    phase="timed_output", facts=facts,
                                    reference32=self.expected32(phase, index))  # fmt: skip
            if failure is not None:
                failure.message = (
                    f"checked timed run {index + 1} of {of} (fresh inputs in a buffer it had "
                    f"been timed on): {failure.message}"
                )
            return Judgement(failure=failure)
        failure = check_outputs(out, expected, opts, trial=index, seed=seed, phase="revalidation",
                                facts=facts, reference32=self.expected32(phase, index))  # fmt: skip
        if failure is not None:
            failure.message = (
                f"after timing, on new values in a buffer it was timed on: {failure.message}"
            )
        return Judgement(failure=failure)

    def check(self, phase: str, index: int, call: int, out, inputs=None, of: int = 0) -> Judgement:
        """judge() in the candidate's own process (run_evaluation without a pool)."""
        return self.judge(phase, index, call, out, inputs, of=of)

    def _label(self, index: int) -> str:
        extra = index - self.opts.trials
        return f" with sizes {self.opts.extra_sizes[extra]}" if extra >= 0 else ""

    def _judge_inputs(self, index, seed, base, ref_inputs, inputs, input_facts) -> Judgement:
        """An input the candidate changed and the reference does not fires input_mutated; where
        the reference changes it too, they must end up the same."""
        if not isinstance(inputs, list) or len(inputs) != len(base):
            return Judgement(fired={"input_mutated": f"trial {index}: the inputs after the "
                                    "call are not the inputs it was given"})  # fmt: skip
        try:
            mutated = changed_input(base, inputs)
        except (TypeError, RuntimeError) as e:  # an input replaced by another kind of value
            return Judgement(fired={"input_mutated": f"trial {index}: an input came back as "
                                    f"something else ({type(e).__name__})"})  # fmt: skip
        if mutated is None:
            return Judgement()
        if changed_input(base, ref_inputs) is None:
            return Judgement(fired={"input_mutated": f"trial {index}: input {mutated} was changed "
                                    "by the candidate (the reference leaves it as it was)"})  # fmt: skip
        failure = check_outputs(inputs, ref_inputs, self.opts, trial=index, seed=seed,
                                facts=input_facts)  # fmt: skip
        if failure is not None:
            failure.message = "inputs after the call differ: " + failure.message
        return Judgement(input_failure=failure)


__all__ = ["PHASES", "Judgement", "ReferenceJudge", "check_seed"]
