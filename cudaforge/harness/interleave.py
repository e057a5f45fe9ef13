"""The order of timed runs: a fixed count of one side's runs (the old rule, sides one after the
other), or the sides' runs interleaved until the stopping rule holds for every side.

Interleaved, run n of the sides goes A, B for even n and B, A for odd n (A B B A A B ...), so a
clock or thermal drift that is linear in time reaches every side with the same mean, and the
ratio of their medians is unbiased where timing one side after the other is not. Each run is
queued (`queue`) and read later (`read`): the runs of one block are read after the next block is
queued, so that on a GPU the host never waits for an empty queue and every run finds the GPU as
busy as the one before it. The sides run the same number of times: a side that met the rule
keeps running until the others do (its interval only tightens), which keeps the alternation.

Pure Python: a side is any object with `queue(index) -> handle` and `read(handle) -> ms`
(timing.py's CUDA-event and wall-clock sides; the tests' simulated clock)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .stopping import StoppingRule

BLOCK = 8  # runs per side queued before the previous block is read, at most
BLOCK_S = 0.002  # s of queued work that keeps a GPU busy while the host reads the block before


def block_for(seconds_per_round: float) -> int:
    """Runs per side in a block: enough that a block holds BLOCK_S of work (one round of every
    side takes `seconds_per_round`), 1 to BLOCK. Long forwards get small blocks, so the runs
    stop soon after the rule is met."""
    if not seconds_per_round > 0:
        return BLOCK
    return max(1, min(BLOCK, -int(-BLOCK_S // seconds_per_round)))


class TimedSide(Protocol):
    def queue(self, index: int) -> Any:
        """Start run `index` (0, 1, ...) of this side; a handle for read()."""

    def read(self, handle: Any) -> float:
        """The ms of a queued run, waiting for it if needed."""


def time_fixed(side: TimedSide, runs: int) -> list[float]:
    """`runs` runs of one side, all queued, then read: ms per run."""
    handles = [side.queue(i) for i in range(runs)]
    return [side.read(h) for h in handles]


def time_interleaved(
    sides: Sequence[TimedSide],
    rule: StoppingRule,
    *,
    clock: Callable[[], float] = time.perf_counter,
    block: int = BLOCK,
    short_ms: float | None = None,
) -> tuple[list[list[float]], list[str]]:
    """Interleave the sides' runs (module docstring) until `rule` is met by every side, the
    budget (rule.budget_s per side, on `clock`, seconds) is spent, or rule.max_runs ran; never
    fewer than rule.min_runs each, whatever the budget.
    short_ms: stop once min_runs ran when a side's median is under it ("short": such forwards
    are timed as CUDA-graph replays, which then decide; the eager runs are only reported).
    Returns the ms of each side's runs and each side's stop reason ("precision" for a side whose
    interval met the rule, else why the runs ended)."""
    if not sides:
        raise ValueError("no sides to time")
    if block < 1:
        raise ValueError(f"block must be >= 1, not {block}")
    times: list[list[float]] = [[] for _ in sides]
    pending: list[tuple[int, Any]] = []
    started = clock()
    budget = rule.budget_s * len(sides)
    queued, reason, next_check = 0, "", rule.min_runs
    while not reason:
        current = []
        for _ in range(min(block, rule.max_runs - queued)):
            order = range(len(sides)) if queued % 2 == 0 else range(len(sides) - 1, -1, -1)
            current += [(k, sides[k].queue(queued)) for k in order]
            queued += 1
        for k, handle in pending:
            times[k].append(sides[k].read(handle))
        pending = current
        done = len(times[0])
        if queued >= rule.max_runs:
            reason = "max_runs"
        elif done >= rule.min_runs and clock() - started >= budget:
            reason = "budget"
        elif done >= rule.min_runs and short_ms is not None and any(
            statistics.median(t) < short_ms for t in times
        ):
            reason = "short"
        elif done >= next_check:
            if all(rule.met(t) for t in times):
                reason = "precision"
            next_check = done + max(block, done // 8)
    for k, handle in pending:
        times[k].append(sides[k].read(handle))
    if reason == "precision":
        return times, ["precision"] * len(sides)
    return times, ["precision" if rule.met(t) else reason for t in times]


__all__ = ["BLOCK", "BLOCK_S", "TimedSide", "block_for", "time_fixed", "time_interleaved"]
