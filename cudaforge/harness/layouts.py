"""Outputs in the layout their caller keeps them in (EvalOptions.output_orders).

A hot spot's output in a model can be a view with a layout of its own: SDPA's output is a
(B, H, L, D) view of (B, L, H, D) memory, a channels_last chain's output is NHWC memory. A kernel
that writes another layout gets its output copied into the model's after every call
(cudaforge.model's swap). With output_orders, the candidate's timed forward includes that copy,
so the time the harness reports is what the model will pay."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..profiling.measurements import LAYOUT_COPY_MARK

Order = tuple[int, ...]  # the dimensions, outermost first, of the memory an output lives in


def copy_note(i: int, have: tuple, want: tuple) -> str:
    """The result's note for an output copied into the caller's layout (the Judge's
    measurements text shows it: profiling.measurements)."""
    return (f"output {i} came back with strides {have}; {LAYOUT_COPY_MARK} {want}, so every "
            "call copied it there, and the times include it")  # fmt: skip


def strides_of(shape: Sequence[int], order: Order) -> tuple[int, ...]:
    """The strides of a tensor of `shape` laid out with its dimensions in `order` in memory."""
    strides = [0] * len(shape)
    step = 1
    for d in reversed(order):
        strides[d] = step
        step *= max(1, shape[d])
    return tuple(strides)


def same_layout(shape: Sequence[int], have: Sequence[int], want: Sequence[int]) -> bool:
    """Strides that address the same memory for this shape (dimensions of size 1 aside)."""
    return all(n == 1 or a == b for n, a, b in zip(shape, have, want))


def check_orders(orders: Any) -> tuple[Order | None, ...] | None:
    """output_orders as given (None, or a sequence of None or permutations of range(n)) ->
    tuples; TypeError for another type, ValueError for an entry that is not a permutation."""
    if orders is None:
        return None
    if isinstance(orders, (str, bytes)) or not isinstance(orders, Sequence):
        raise TypeError("output_orders must be a sequence, one entry per output")
    checked: list[Order | None] = []
    for i, order in enumerate(orders):
        if order is None:
            checked.append(None)
            continue
        dims = tuple(order) if isinstance(order, Sequence) else ()
        if not dims or sorted(dims) != list(range(len(dims))):
            raise ValueError(f"output_orders[{i}] must be a permutation of 0..n-1, got {order!r}")
        checked.append(tuple(int(d) for d in dims))
    return tuple(checked)


def in_orders(candidate: Callable, orders: Sequence[Order | None],
              on_copy: Callable[[int, tuple, tuple], None] | None = None) -> Callable:  # fmt: skip
    """`candidate` whose outputs are returned in their orders' layouts: an output of matching
    rank in another layout is copied into a new tensor laid out so (in the timed forward too).
    on_copy(output index, its strides, the strides wanted) on each copy."""
    import torch

    def laid(i: int, out: Any) -> Any:
        order = orders[i] if i < len(orders) else None
        if order is None or not isinstance(out, torch.Tensor) or out.dim() != len(order):
            return out
        want = strides_of(out.shape, order)
        if same_layout(out.shape, out.stride(), want):
            return out
        if on_copy is not None:
            on_copy(i, tuple(out.stride()), want)
        return torch.empty_strided(out.shape, want, dtype=out.dtype, device=out.device).copy_(out)

    def call(*args: Any) -> Any:
        out = candidate(*args)
        if isinstance(out, torch.Tensor):
            return laid(0, out)
        if isinstance(out, (tuple, list)):
            return type(out)(laid(i, o) for i, o in enumerate(out))
        return out

    return call


__all__ = ["check_orders", "copy_note", "in_orders", "same_layout", "strides_of"]
