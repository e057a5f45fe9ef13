"""The end-to-end side of optimize(): the user's model and the optimized copy timed side by side,
the kernels taken out while the model is slower with them than without, and the swapped sites'
CUDA graphs (optimize(site_graphs=...)) kept where they make it faster."""

from __future__ import annotations

import statistics

import torch
from torch import nn

from ..harness.evaluation import one_line
from ..harness.stopping import compare_times, median_interval
from . import backward as bw
from .site_graphs import settle
from .swap import GraphSwitch, swaps
from .timing import call_samples, time_calls

# the user's model and the optimized copy timed side by side: enough calls for the medians'
# intervals (6 at least), about 0.1 s of each
PAIR_MIN_REPS = 12
PAIR_TARGET_MS = 100.0
SITE_GRAPH_MODES = (False, True, "auto")
GRAPH_DEVICE_TYPES = ("cuda",)  # where CUDA graphs are captured (the CPU tests stand one in)


class EndToEnd:
    """Methods of optimize's run (optimize._Run) that time the whole model: it has model,
    user_model, args, kwargs, device, min_speedup, outcomes, pair_bounds, training, for_compile,
    site_graphs, site_graphs_note, progress, forward() and check_outputs()."""

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

    def with_site_graphs(self, before_ms, after_ms, expected, expected32) -> tuple[float, float]:
        """optimize(site_graphs=True or "auto"): the swapped sites' inference calls replayed from
        CUDA graphs (cudaforge.model.site_graphs), settled over forwards of the example inputs,
        the model's outputs checked with them; "auto" keeps them only when the model is faster
        with them than without beyond both medians' 95% intervals (timed interleaved, with the
        user's model where it is a copy). A failure turns them off and says why. Sets
        site_graphs_note; returns (original, optimized) ms."""
        if not self.site_graphs:
            return before_ms, after_ms
        found = swaps(self.model)
        why_not = _no_site_graphs(self, found)
        if why_not:
            self.site_graphs_note = why_not
            return before_ms, after_ms
        switch = GraphSwitch(found)
        if self.for_compile:  # captured on the tensors of torch.compile's calls, when they come
            self.site_graphs_note = "site graphs: on (asked for), captured under torch.compile"
            return before_ms, after_ms
        try:
            return self._try_site_graphs(switch, before_ms, after_ms, expected, expected32)
        except Exception as exc:  # noqa: BLE001 - the model keeps its kernels, without graphs
            why = f"off: {type(exc).__name__}: {one_line(exc, 300)}"
            return self._no_graphs(switch, before_ms, after_ms, why)

    def _try_site_graphs(self, switch, before_ms, after_ms, expected, expected32):
        """with_site_graphs' settling, check and timing of the graphs `switch` made."""
        own = switch.graphs

        def switched(on: bool):
            def call():
                switch.set(on)
                return self.model(*self.args, **self.kwargs)

            return call

        fns = [switched(False), switched(True)]
        if self.user_model is not self.model:
            fns.insert(0, lambda: self.user_model(*self.args, **self.kwargs))
        if self.site_graphs is True:
            fns = fns[-1:]
        self.progress.say(f"site graphs: {len(own)} site(s) capture their calls until they settle")
        with torch.no_grad():
            # in the order they are timed: the allocator then hands the same addresses
            forwards = settle(lambda: [fn() for fn in fns], own)
        error, match = self.check_outputs(self.forward(), expected, expected32)
        replaying = sum(1 for g in own if g.replays and not g.off_reason)
        kept_mb = sum(g.output_bytes() for g in own) / 2**20
        done = (f"{replaying} of {len(own)} sites replay after {forwards} forwards, their outputs "
                f"keep {kept_mb:.3g} MiB")  # fmt: skip
        if not match:
            return self._no_graphs(switch, before_ms, after_ms, "off: the model's output with them "
                                   f"differs from the original's (max abs error {error:.3g})")  # fmt: skip
        if self.site_graphs is True:
            self.site_graphs_note = f"site graphs: on (asked for); {done}"
            return before_ms, after_ms
        with torch.no_grad():
            samples = call_samples(fns, self.device, min_reps=PAIR_MIN_REPS,
                                   target_ms=PAIR_TARGET_MS)  # fmt: skip
        switch.set(True)
        medians = [statistics.median(taken) for taken in samples]
        bounds = [median_interval(taken) for taken in samples]
        without, with_graphs = medians[-2:]
        timed = f"{without:.3g} ms per forward without, {with_graphs:.3g} ms with"
        if None not in bounds[-2:]:
            (lo, hi), (wlo, whi) = bounds[-2:]
            timed += f" (95% intervals {lo:.3g}-{hi:.3g} and {wlo:.3g}-{whi:.3g} ms)"
        faster = compare_times(with_graphs, bounds[-1], without, bounds[-2]) == "faster"
        kept = len(medians) - (1 if faster else 2)  # the optimized model's timing that stands
        if len(medians) == 3:  # the user's model timed beside it: a new pair
            before_ms, pair = medians[0], (bounds[0], bounds[kept])
            self.pair_bounds = None if None in pair else pair
        if len(medians) == 3 or faster:
            after_ms = medians[kept]
        if not faster:
            return self._no_graphs(switch, before_ms, after_ms, f"off: not faster with them "
                                   f"({timed}); {done}")  # fmt: skip
        self.site_graphs_note = f"site graphs: on, faster with them ({timed}); {done}"
        return before_ms, after_ms

    def _no_graphs(self, switch, before_ms, after_ms, why: str) -> tuple[float, float]:
        switch.release()
        self.site_graphs_note = f"site graphs: {why}"
        return before_ms, after_ms


def _no_site_graphs(run, found) -> str:
    """Why optimize(site_graphs=...) is not tried on this run ("" when it is)."""
    if not found:
        return "site graphs: none, no kernel was swapped in"
    if run.training:
        return "site graphs: not for training=True (a training step is recorded by autograd)"
    if run.device.type not in GRAPH_DEVICE_TYPES:
        return f"site graphs: none on {run.device.type} (CUDA graphs need a GPU)"
    if run.for_compile and run.site_graphs == "auto":
        return ("site graphs: not timed for for_compile=True (its sites run under torch.compile):"
                " pass site_graphs=True, or time torch.compile of the result with and without "
                "cudaforge.site_graphs(result.model)")  # fmt: skip
    return ""


def _beyond(bounds) -> str:
    """How far apart the pair's intervals were, for a kernel taken out on them."""
    if bounds is None:
        return ""
    (lo, hi), (alo, ahi) = bounds
    return f" (95% intervals {alo:.3g}-{ahi:.3g} and {lo:.3g}-{hi:.3g} ms)"


__all__ = ["PAIR_MIN_REPS", "PAIR_TARGET_MS", "EndToEnd"]
