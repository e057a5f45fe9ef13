"""The verdict the pool assembles: what the reference process judged, held against what the
candidate's process claims. The candidate's own "ok" counts for nothing: status ok needs the
reference process's pass for every compared output (both calls of every trial, the trials on
extra sizes the problem can take, at least one checked timed run and the revalidations after
it); a failure the reference saw decides the status whatever the candidate's process says; a
claim of correct outputs that the reference never confirmed means that process no longer
follows the protocol, and the evaluation is reported as crashed."""

from __future__ import annotations

from .guards import GUARDS
from .options import EvalOptions
from .reference import Judgement
from .results import EvalResult, TrialFailure


class Verdict:
    """The reference process's judgements of one evaluation, as they arrive."""

    def __init__(self, options: EvalOptions):
        self.opts = options
        self.passed: set[tuple[str, int, int]] = set()  # (phase, index, call)
        self.timed_runs_checked = 0
        self.usable_extra: list[int] | None = None  # set once the reference has built them
        self.failure: TrialFailure | None = None
        self.input_failure: TrialFailure | None = None
        self.fired: dict[str, str] = {}
        self.error = ""
        self.broken = ""  # the candidate's process broke the protocol to the reference
        self.crossed = {"area": 0, "host": 0}  # how the judged outputs reached the reference
        self.area_refused = ""

    def record(self, phase: str, index: int, call: int, of: int, judgement: Judgement,
               via: str = "host") -> None:  # fmt: skip
        if via in self.crossed:
            self.crossed[via] += 1
        if judgement.passed:
            self.passed.add((phase, index, call))
            if phase == "timed_output":
                self.timed_runs_checked = max(self.timed_runs_checked, min(of, 64))
            return
        self.failure = self.failure or judgement.failure
        self.input_failure = self.input_failure or judgement.input_failure
        for guard, detail in judgement.fired.items():
            if guard in GUARDS:
                self.fired.setdefault(guard, detail)
        self.error = self.error or judgement.error

    def lent(self, why: str) -> None:
        """The reference process lent a device area (or, with `why`, did not)."""
        if why:
            self.area_refused = why

    def crossing_note(self) -> str:
        """How the outputs reached the reference process, for the result's notes."""
        area, host = self.crossed["area"], self.crossed["host"]
        if not area and not self.area_refused:
            return ""
        note = (f"outputs judged in the reference process: {area} from GPU memory it lent the "
                f"worker, {host} as host copies")  # fmt: skip
        if self.area_refused:
            note += f" (no device area: {self.area_refused})"
        return note

    # ------------------------------------------------------------------ what is missing

    def missing_correctness(self) -> list[str]:
        extra = self.usable_extra or []
        indexes = list(range(self.opts.trials)) + [self.opts.trials + j for j in extra]
        return [
            f"trial {t} call {c}"
            for t in indexes
            for c in (0, 1)
            if ("correctness", t, c) not in self.passed
        ]

    def missing_after_timing(self) -> list[str]:
        runs = sorted(i for p, i, _ in self.passed if p == "timed_output")
        if not runs:
            return ["every checked timed run"]
        count = max(self.timed_runs_checked, len(runs))
        missing = [f"checked timed run {k}" for k in range(count) if k not in runs]
        missing += [
            f"revalidation {j}"
            for j in range(min(2, count))
            if ("revalidation", j, 0) not in self.passed
        ]
        return missing

    # ------------------------------------------------------------------ the verdict

    def apply(self, result: EvalResult) -> None:
        """Make `result` (the candidate process's claim) say what the reference judged."""
        note = self.crossing_note()
        if note and note not in result.notes:
            result.notes.append(note)
        if self.broken:
            _crashed(result, f"the candidate's process broke the protocol to the reference "
                     f"process ({self.broken}); it was killed")  # fmt: skip
            return
        if result.status in ("timeout", "crashed"):
            if self.failure or self.input_failure or self.fired:
                result.correct = False
            return
        if self.error and result.status == "ok":
            result.status, result.error, result.correct = "runtime_error", self.error, False
            return
        if self.failure is not None or self.input_failure is not None or self.fired:
            self._apply_failure(result)
            return
        if result.correct or result.status == "ok":
            missing = self.missing_correctness()
            if result.status == "ok":
                missing += self.missing_after_timing()
            if missing:
                _crashed(result, "the candidate's process claimed correct outputs that the "
                         "reference process never judged (" + ", ".join(missing[:4])
                         + (", ..." if len(missing) > 4 else "") + "); it no longer follows "
                         "the protocol")  # fmt: skip
                return
        if result.candidate_ms and result.reference_ms:
            result.speedup = result.reference_ms / result.candidate_ms

    def _apply_failure(self, result: EvalResult) -> None:
        failure = self.failure or self.input_failure
        mine = result.failure
        already = all(g in result.guards for g in self.fired)
        if failure is None and result.status == "incorrect" and already:
            result.correct = False  # the candidate's process fired them as the reference did
            return
        for guard, detail in self.fired.items():
            if guard not in result.guards:
                result.guards.append(guard)
                result.guard_details[guard] = detail
            if guard in result.guards_passed:
                result.guards_passed.remove(guard)
        if failure is not None and mine is not None and mine.message == failure.message:
            result.correct = False  # the candidate's process said it as the reference did
            return
        result.correct = False
        result.speedup = None
        if failure is None:
            result.status = "incorrect"
            result.error = "failed guard(s) " + ", ".join(f"{g}: {d}" for g, d in
                                                          self.fired.items())  # fmt: skip
            return
        result.failure = failure
        if failure.phase == "correctness":
            result.status, result.error = "incorrect", failure.message
            return
        guard = "revalidation" if failure.phase == "revalidation" else "timed_output"
        if guard not in result.guards:
            result.guards.append(guard)
            result.guard_details[guard] = failure.message
        if guard in result.guards_passed:
            result.guards_passed.remove(guard)
        result.status, result.error = "rejected", f"{guard}: {failure.message}"


def _crashed(result: EvalResult, why: str) -> None:
    result.status = "crashed"
    result.correct = False
    result.speedup = None
    result.speedup_vs_compile = None
    result.error = why


__all__ = ["Verdict"]
