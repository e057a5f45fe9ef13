"""The end-to-end side of optimize(): the user's model and the optimized copy timed side by side,
and the kernels taken out while the model is slower with them than without."""

from __future__ import annotations

import statistics

import torch
from torch import nn

from ..harness.stopping import compare_times, median_interval
from . import backward as bw
from .swap import swaps
from .timing import call_samples, time_calls

# the user's model and the optimized copy timed side by side: enough calls for the medians'
# intervals (6 at least), about 0.1 s of each
PAIR_MIN_REPS = 12
PAIR_TARGET_MS = 100.0


class EndToEnd:
    """Methods of optimize's run (optimize._Run) that time the whole model: it has model,
    user_model, args, kwargs, device, min_speedup, outcomes and pair_bounds."""

    def time_model(self, queued: bool = False, against: nn.Module | None = None):
        """ms per forward of the model; with `against`: (its ms, the model's), interleaved, and
        the 95% intervals of both medians in self.pair_bounds (None with too few samples)."""
        if against is None:
            with torch.no_grad():
                return time_calls([lambda: self.model(*self.args, **self.kwargs)], self.device,
                                  queued=queued)[0]  # fmt: skip
        with torch.no_grad():
            samples = call_samples(
                [lambda m=m: m(*self.args, **self.kwargs) for m in (against, self.model)],
                self.device, queued=queued, min_reps=PAIR_MIN_REPS, target_ms=PAIR_TARGET_MS,
            )  # fmt: skip
        bounds = [median_interval(taken) for taken in samples]
        self.pair_bounds = None if None in bounds else tuple(bounds)
        return tuple(statistics.median(taken) for taken in samples)

    def time_pair(self, before_ms: float) -> tuple[float, float]:
        """(original, optimized) ms per forward: the user's model and the optimized copy timed
        interleaved, so that drift hits both (the original's time from before the search can be
        minutes old); in place, `before_ms` and the model timed now (no intervals then)."""
        self.pair_bounds = None
        if self.user_model is not self.model:
            return self.time_model(against=self.user_model)
        return before_ms, self.time_model()

    def slower_with_kernels(self, before_ms: float, after_ms: float) -> bool:
        """Whether the model with its kernels is slower than the original (min_speedup scales
        the bar; 0: never). With the pair's intervals, only beyond them: where the host's speed
        moves while a host-paced forward is timed (on the H200 eager ResNet-50's host time went
        from 4.5 to 8.2 ms and back within 20 s in a process doing nothing else, RESULTS.md),
        the two medians of a tie differ by a few percent either way, and a kernel taken out on
        such a coin toss is lost. Without intervals: slower by more than 1%."""
        if self.min_speedup <= 0:
            return False
        if self.pair_bounds is None:
            return after_ms * self.min_speedup > before_ms * 1.01
        before, after = self.pair_bounds
        scaled = tuple(t * self.min_speedup for t in after)
        return compare_times(after_ms * self.min_speedup, scaled, before_ms, before) == "slower"

    def keep_what_speeds_up(self, before_ms: float, after_ms: float) -> tuple[float, float]:
        """While the model with its kernels is slower than without (slower_with_kernels), take
        out the hot spot whose kernel gained least in this process and time both again
        (time_pair). A kernel faster on its own can make the model slower (host work where the
        forward is launch-bound, a layout conversion). Returns (original, optimized) ms with
        what is left."""
        while self.slower_with_kernels(before_ms, after_ms):
            # a backward kernel runs only in a training step, which this forward does not time
            swapped = [o for o in self.outcomes.values()
                       if o.status == "swapped" and o.kind != bw.KIND]  # fmt: skip
            if not swapped:
                break
            least = min(swapped, key=lambda o: o.speedup or 0.0)
            for swap in swaps(self.model):
                if swap.name == least.name:
                    swap.uninstall()
            least.status = "slower_here"
            least.detail = (
                f"{least.speedup or 0:.2f}x on its own in this process, but the model took "
                f"{after_ms:.3g} ms with it and {before_ms:.3g} ms before"
                f"{_beyond(self.pair_bounds)}; taken out"
            )
            if not swaps(self.model):
                self.pair_bounds = None  # they were of the model with kernels
                return before_ms, before_ms
            before_ms, after_ms = self.time_pair(before_ms)
        return before_ms, after_ms


def _beyond(bounds) -> str:
    """How far apart the pair's intervals were, for a kernel taken out on them."""
    if bounds is None:
        return ""
    (lo, hi), (alo, ahi) = bounds
    return f" (95% intervals {alo:.3g}-{ahi:.3g} and {lo:.3g}-{hi:.3g} ms)"


__all__ = ["PAIR_MIN_REPS", "PAIR_TARGET_MS", "EndToEnd"]
