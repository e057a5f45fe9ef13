"""The shape of an observed call: which of its arguments are tensors (the problem's inputs), which
are values the extraction specializes on (flags, None, sizes), and how tuples of tensors (a
Hugging Face layer's rotary (cos, sin)) nest. A module whose forward takes *args or **kwargs is
traced, extracted and swapped from this, not from its signature.

A slot says what one argument was: ("input", i) the i-th tensor input, ("const", value) a value
the problem specialized on, ("seq", "tuple"|"list", slots) a tuple or list of slots, ("unused",
TensorSpec) a tensor the computation never reads (a swap still wants one like it).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .codegen import NotExtractable, TensorSpec, is_literal, python_name, unique_name


def same_constant(a, b) -> bool:
    """Whether a call's non-tensor argument a is the traced/verified one b (NaN equals NaN)."""
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return False
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return type(a) is type(b) and bool(a == b) or (a is b)
    except Exception:  # noqa: BLE001
        return False


def _refusal(name: str, value) -> str:
    kind = type(value).__name__
    if "cache" in kind.lower():
        return (
            f"argument {name!r} is a {kind} (a key/value cache); call the model with "
            "use_cache=False to extract it"
        )
    return f"argument {name!r} is a {kind}"


class CallTemplate:
    """An observed call as slots (see the module docstring), with one name per tensor input."""

    def __init__(self, args: tuple, kwargs: dict[str, Any], names: list[str]):
        self.args = args
        self.kwargs = kwargs
        self.names = names  # per tensor input, a Python name ('position_embeddings_0')

    @classmethod
    def of(cls, forward, args: Sequence, kwargs: dict) -> tuple[CallTemplate, list[Tensor]]:
        """The template of forward(*args, **kwargs) and its tensor inputs, in order. Raises
        NotExtractable for an argument that is neither a tensor, a literal, nor a tuple or list
        of those (a cache object, a module, a dict)."""
        tensors: list[Tensor] = []
        names: list[str] = []
        taken: set[str] = set()

        def slot(name: str, value):
            if isinstance(value, Tensor):
                tensors.append(value)
                names.append(_unique(python_name(name), taken))
                return ("input", len(tensors) - 1)
            if isinstance(value, (tuple, list)) and not hasattr(value, "_fields"):
                if not any(isinstance(v, Tensor) for v in _flat(value)):
                    if is_literal(value):
                        return ("const", value)
                    raise NotExtractable(_refusal(name, value))
                inner = tuple(slot(f"{name}_{i}", v) for i, v in enumerate(value))
                return ("seq", type(value).__name__, inner)
            if is_literal(value):
                return ("const", value)
            raise NotExtractable(_refusal(name, value))

        positional = _positional_names(forward, len(args))
        arg_slots = tuple(slot(n, v) for n, v in zip(positional, args))
        kw_slots = {key: slot(key, value) for key, value in kwargs.items()}
        return cls(arg_slots, kw_slots, names), tensors

    # ------------------------------------------------------------ using it

    def slots(self):
        """Every slot, nested ones included."""
        stack = [*self.args, *self.kwargs.values()]
        while stack:
            s = stack.pop()
            yield s
            if s[0] == "seq":
                stack.extend(s[2])

    def fill(self, inputs: Sequence[Tensor]) -> tuple[tuple, dict]:
        """The call's (args, kwargs) with `inputs` as its tensor inputs."""
        return tuple(fill_slot(s, inputs) for s in self.args), {
            k: fill_slot(s, inputs) for k, s in self.kwargs.items()
        }

    def drop_inputs(self, unused: set[int], specs: Sequence[TensorSpec]) -> CallTemplate:
        """The template with the inputs in `unused` turned into ("unused", spec) slots and the
        others renumbered."""
        kept = [i for i in range(len(self.names)) if i not in unused]
        renumber = {old: new for new, old in enumerate(kept)}

        def rewrite(s):
            if s[0] == "input":
                return ("unused", specs[s[1]]) if s[1] in unused else ("input", renumber[s[1]])
            if s[0] == "seq":
                return ("seq", s[1], tuple(rewrite(x) for x in s[2]))
            return s

        return CallTemplate(
            tuple(rewrite(s) for s in self.args),
            {k: rewrite(s) for k, s in self.kwargs.items()},
            [self.names[i] for i in kept],
        )

    def match(self, args: Sequence, kwargs: dict, specs: Sequence[TensorSpec] | None = None):
        """(tensor inputs, '') when a call has the template's structure, constants and (with
        `specs`) input shapes, dtypes, devices and layouts; else (None, why)."""
        if len(args) != len(self.args) or kwargs.keys() != self.kwargs.keys():
            return None, "called with other arguments than the verified call"
        inputs: list[Any] = [None] * len(self.names)
        pairs = list(zip(args, self.args)) + [(kwargs[k], s) for k, s in self.kwargs.items()]
        while pairs:
            value, s = pairs.pop()
            kind = s[0]
            if kind == "input":
                if not isinstance(value, Tensor):
                    return None, f"input {s[1]} is a {type(value).__name__}"
                inputs[s[1]] = value
            elif kind == "unused":
                if not isinstance(value, Tensor) or s[1].mismatch(value):
                    return None, "an argument the kernel ignores is another tensor than verified"
            elif kind == "seq":
                if type(value).__name__ != s[1] or len(value) != len(s[2]):
                    return None, f"an argument is a {type(value).__name__} of another length"
                pairs.extend(zip(value, s[2]))
            elif not same_constant(value, s[1]):
                return None, f"an argument is {_short(value)} (verified with {_short(s[1])})"
        if specs is not None:
            for index, (tensor, spec) in enumerate(zip(inputs, specs)):
                why = spec.mismatch(tensor)
                if why:
                    return None, f"input {index} is {why}"
        return inputs, ""

    @property
    def plain(self) -> bool:
        """True when the call is its tensor inputs in order, positionally, and nothing else."""
        return not self.kwargs and all(
            s[0] == "input" and s[1] == i for i, s in enumerate(self.args)
        ) and len(self.args) == len(self.names)  # fmt: skip

    def describe(self) -> dict[str, Any]:
        """JSON-able: each argument as 'tensor i', a literal's repr, or a list of those."""

        def show(s):
            if s[0] == "input":
                return f"tensor {s[1]}"
            if s[0] == "unused":
                return f"ignored {s[1].describe()}"
            if s[0] == "seq":
                return [show(x) for x in s[2]]
            return repr(s[1])

        return {"args": [show(s) for s in self.args],
                "kwargs": {k: show(s) for k, s in self.kwargs.items()}}  # fmt: skip


def fill_slot(s, inputs: Sequence[Tensor]):
    kind = s[0]
    if kind == "input":
        return inputs[s[1]]
    if kind == "seq":
        made = [fill_slot(x, inputs) for x in s[2]]
        return made if s[1] == "list" else tuple(made)
    if kind == "unused":
        spec = s[1]
        return torch.zeros(spec.shape, dtype=spec.dtype, device=spec.device)
    return s[1]


def _flat(value):
    for v in value:
        if isinstance(v, (tuple, list)):
            yield from _flat(v)
        else:
            yield v


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _unique(name: str, taken: set[str]) -> str:
    """unique_name, and never `self` or `forward` (the generated forward's own names)."""
    return unique_name(name + "_" if name in ("self", "forward") else name, taken)


def _positional_names(forward, count: int) -> list[str]:
    """A name for each positional argument: its parameter's, else arg0, arg1, ..."""
    names: list[str] = []
    try:
        parameters = list(inspect.signature(forward).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    if parameters and parameters[0].name == "self":
        parameters = parameters[1:]
    for parameter in parameters:
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            names.append(parameter.name)
    names = names[:count]
    return names + [f"arg{i}" for i in range(len(names), count)]


__all__ = ["CallTemplate", "fill_slot", "same_constant"]
