"""A swapped kernel's inference calls replayed from CUDA graphs, one graph per set of tensor
addresses (`site_graphs(model)`; off unless asked for).

Each swapped call costs host time: the call's check, the kernel's own Python (its torch calls to
allocate and reshape, the launches), the layout copy. Where a model is paced by its host, that
time, not the kernel's, sets the pace: under torch.compile's default mode GPT-2's twelve swapped
attention calls took ~1.1 ms more host time per forward than the attention calls they replaced
(benchmarks/RESULTS.md, 2026-12-04), which spent the GPU time the kernel saved.

A replay issues the same work in one launch. A call is replayed when its inputs and parameters
are the tensors a graph was captured on: the same addresses, shapes, strides and dtypes (a
forward that allocates its activations in the same order, as a compiled or eager model does from
call to call, hands the same addresses each time). A set of addresses seen `sightings` times is
captured: the call runs as usual, the same call is captured on a side stream and replayed once,
and the replay's outputs must equal that call's (the swap's comparison) or graphs are off for the
site. At most `limit` graphs per site: a new one takes the place of the one replayed longest ago.

Where several sites follow one another, their addresses settle one site at a time. A site that
starts replaying stops asking the allocator for its outputs, so the tensors made after it land
elsewhere and the sites after it see new addresses: each waits for its own sightings again, and
the graphs captured on the old addresses are never replayed. In a model with N swapped sites in
a row all of them replay after about `sightings` x N forwards, and a site captures up to N
graphs on the way (the unused ones are the first to make room). A site whose graphs went unused
`MAX_UNUSED` times captures no more (its addresses keep moving): its calls run as usual, its
graphs so far stay.

A graph writes its outputs into memory of its own, and the next replay writes there again. So a
replay hands out new views of those outputs, and a call while any view of the last ones is still
held (the storage's use count says so) runs as usual instead: nothing a caller keeps is ever
overwritten. The graphs keep their outputs' and temporaries' memory until the swap is restored
or `site_graphs(model, False)`.

Calls that autograd records, calls made while a CUDA graph is being captured (torch.compile's
reduce-overhead mode, `cudaforge.graphed`, which replay the kernels themselves) and calls on
tensors that are not on a GPU run as usual.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..harness.evaluation import one_line
from ..harness.graphs import capture_call

LIMIT = 4  # graphs per site
SIGHTINGS = 3  # a set of addresses is captured at its third call (warm-up passes call once)
MAX_UNUSED = 32  # graphs dropped without a replay, after which a site captures no more


def address_key(tensors: list[Tensor]) -> tuple | None:
    """What a replay depends on: each tensor's address, shape, strides and dtype; None when one
    is not a CUDA tensor."""
    key = []
    for t in tensors:
        if not t.is_cuda:
            return None
        key.append((t.data_ptr(), t.shape, t.stride(), t.dtype))
    return tuple(key)


def capturing() -> bool:
    """True while the current stream is capturing a CUDA graph (another capture holds this call:
    torch.compile's reduce-overhead mode, cudaforge.graphed). Needs a CUDA build of torch: the
    caller checks first (here: a CUDA tensor)."""
    return torch.cuda.is_current_stream_capturing()


def use_count(t: Tensor) -> int:
    """How many tensors and storages hold t's memory."""
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


@dataclass
class _Graph:
    """One captured call: its graph, its outputs (written by every replay) and the use count of
    each output's memory when nothing but this holds it."""

    graph: Any
    outputs: list[Tensor]
    idle: list[int]
    used: int = 0  # the site's replay count at this graph's last replay (0: never replayed)

    def held(self) -> bool:
        """True while a caller still holds a view of the last outputs handed out."""
        return any(use_count(o) > n for o, n in zip(self.outputs, self.idle))

    def hand_out(self) -> list[Tensor]:
        return [o.detach() for o in self.outputs]  # new tensors on the same memory (cheapest)


@dataclass
class SiteGraphs:
    """The graphs of one swapped site. `run(inputs, tensors)` is its usual call (the kernel and
    the layout of its outputs); `compare(actual, expected)` -> problem or "" judges a first
    replay. Counts: replays, captures, held (calls that ran as usual because the last outputs
    were still held), dropped (graphs that made room for a newer one), unused (of those, the ones
    never replayed); `off_reason` says why graphs stopped, if they did, `full` why no more are
    captured."""

    run: Callable[[list[Tensor], list[Tensor]], list[Tensor]]
    compare: Callable[[list[Tensor], list[Tensor]], str]
    limit: int = LIMIT
    sightings: int = SIGHTINGS
    graphs: dict[tuple, _Graph] = field(default_factory=dict)
    seen: dict[tuple, int] = field(default_factory=dict)
    replays: int = 0
    captures: int = 0
    held: int = 0
    dropped: int = 0
    unused: int = 0
    off_reason: str = ""
    full: str = ""

    def __call__(self, inputs: list[Tensor], tensors: list[Tensor]) -> list[Tensor]:
        key = None if self.off_reason else address_key(inputs + tensors)
        if key is None or capturing():
            return self.run(inputs, tensors)
        found = self.graphs.get(key)
        if found is None:
            return self._unseen(key, inputs, tensors)
        if found.held():
            self.held += 1
            return self.run(inputs, tensors)
        found.graph.replay()
        self.replays += 1
        found.used = self.replays
        return found.hand_out()

    def _unseen(self, key: tuple, inputs: list[Tensor], tensors: list[Tensor]) -> list[Tensor]:
        outputs = self.run(inputs, tensors)
        if self.full:
            return outputs
        count = self.seen.pop(key, 0) + 1
        if count < self.sightings:
            if len(self.seen) >= 64 * self.limit:  # the sighting longest ago makes room
                del self.seen[next(iter(self.seen))]
            self.seen[key] = count  # last in the order: the most recent
            return outputs
        if len(self.graphs) >= self.limit and not self._make_room():
            self.seen[key] = count - 1  # its next call tries again
            return outputs
        self._capture(key, inputs, tensors, outputs)
        return outputs

    def _make_room(self) -> bool:
        """Drop the graph replayed longest ago (one never replayed first) whose outputs nobody
        holds; False when every one is held or too many went unused (self.full says so)."""
        free = [(g.used, key) for key, g in self.graphs.items() if not g.held()]
        if not free:
            return False
        used, key = min(free, key=lambda pair: pair[0])
        if used == 0 and self.unused + 1 >= MAX_UNUSED:
            self.full = (f"{self.unused + 1} of its graphs were never replayed: its tensors' "
                         "addresses keep moving; no more are captured")  # fmt: skip
            return False
        self.graphs.pop(key).graph.reset()
        self.dropped += 1
        if used == 0:
            self.unused += 1
        return True

    def _capture(self, key, inputs, tensors, expected: list[Tensor]) -> None:
        device = expected[0].device if expected else inputs[0].device
        try:
            graph, outputs = capture_call(torch, lambda: self.run(inputs, tensors), device,
                                          warmup=1)  # fmt: skip
            graph.replay()
            problem = self.compare(list(outputs), expected)
        except Exception as exc:  # noqa: BLE001 - any failure: this site runs as usual
            self.stop(f"its call cannot be captured in a CUDA graph: {type(exc).__name__}: "
                      f"{one_line(exc, 300)}")  # fmt: skip
            return
        if problem:
            graph.reset()
            self.stop(f"its replay differs from the call it was captured from: {problem}")
            return
        outputs = list(outputs)
        self.graphs[key] = _Graph(graph, outputs, [use_count(o) for o in outputs])
        self.captures += 1

    def stop(self, reason: str) -> None:
        """Graphs off for this site (their memory freed); its calls run as usual."""
        self.off_reason = reason
        self.release()

    def release(self) -> None:
        for captured in self.graphs.values():
            captured.graph.reset()
        self.graphs.clear()
        self.seen.clear()

    def output_bytes(self) -> int:
        """Bytes of the graphs' outputs: memory they keep (their temporaries come on top)."""
        return sum(o.untyped_storage().nbytes() for g in self.graphs.values() for o in g.outputs)

    def to_dict(self) -> dict[str, Any]:
        return {"graphs": len(self.graphs), "replays": self.replays, "captures": self.captures,
                "held": self.held, "dropped": self.dropped, "unused": self.unused,
                "output_bytes": self.output_bytes(), "off_reason": self.off_reason,
                "full": self.full}  # fmt: skip


def settle(call: Callable[[], Any], graphs: list[SiteGraphs], most: int = 200) -> int:
    """Run `call` (a forward) until none of `graphs` captured anything for twice the longest
    sightings in a row (sites in a row settle one after another), at most `most` times; how many
    calls it took."""
    quiet = 2 * max((g.sightings for g in graphs), default=1)
    calm = done = 0
    while done < most and calm < quiet:
        before = sum(g.captures for g in graphs)
        call()
        done += 1
        calm = calm + 1 if sum(g.captures for g in graphs) == before else 0
    return done


__all__ = [
    "LIMIT",
    "MAX_UNUSED",
    "SIGHTINGS",
    "SiteGraphs",
    "address_key",
    "capturing",
    "settle",
    "use_count",
]
