"""The first call of chosen modules during one forward, captured: arguments, output (detached
copies) and the number of calls per forward. Hot spots are built and checked on these."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class Call:
    """The first call of a module during one forward: arguments, output (detached copies) and
    how many times it was called."""

    args: tuple
    kwargs: dict
    output: Any
    count: int = 1


def _detached(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_detached(v) for v in value)
    if isinstance(value, list):
        return [_detached(v) for v in value]
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    return value


def capture_calls(model: nn.Module, args, kwargs, paths: Sequence[str]) -> dict[str, Call]:
    """Run one forward (no grad) recording the first call of each module in `paths`."""
    modules = dict(model.named_modules())
    calls: dict[str, Call] = {}
    pending: dict[str, tuple] = {}
    handles = []

    def make_hooks(path):
        def before(module, a, k):
            if path in calls:
                calls[path].count += 1
            elif path not in pending:
                pending[path] = (_detached(a), _detached(k))

        def after(module, a, k, output):
            if path in pending and path not in calls:
                a_, k_ = pending.pop(path)
                calls[path] = Call(a_, k_, _detached(output))

        return before, after

    for path in paths:
        before, after = make_hooks(path)
        handles.append(modules[path].register_forward_pre_hook(before, with_kwargs=True))
        handles.append(modules[path].register_forward_hook(after, with_kwargs=True))
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return calls


__all__ = ["Call", "capture_calls"]
