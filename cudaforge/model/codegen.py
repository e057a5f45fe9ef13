"""A hot spot's KernelBench problem as Python source: the `Model` that rebuilds its modules from
their real constructor arguments, its forward from a region graph, `get_inputs` and
`get_init_inputs`; the literals, names and tensor descriptions (`TensorSpec`) that go into it.

Weights. A problem holds no weight values: its `Model` builds the module(s) from their real
constructor arguments (or, for a raw parameter, a random tensor of its shape and dtype), so a
kernel is checked on fresh random weights in every trial and must be correct for any weights.
The captured weights are kept with the hot spot (`Hotspot.state_dict()`); when swapped in, the
kernel uses the model's own parameter tensors. Buffers are structure as much as data (a causal
mask), so a small one is written into the problem, a triangular mask as `torch.tril(...)`,
others random.
"""

from __future__ import annotations

import builtins
import inspect
import keyword
import math
import re
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from .regions import MODE_SENSITIVE_MODULES, is_torch_nn

INLINE_BUFFER_ELEMENTS = 64  # buffers up to this size are written into the problem


class NotExtractable(Exception):
    """One candidate cannot become a problem (the reason is the message)."""


# ---------------------------------------------------------------- constructor arguments


def is_literal(value) -> bool:
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device)):
        return True
    if isinstance(value, slice):
        return all(is_literal(v) for v in (value.start, value.stop, value.step))
    if isinstance(value, (tuple, list)):
        return all(is_literal(v) for v in value)
    return False


def _literal(value) -> str:
    """Python source for a literal value."""
    if isinstance(value, float):
        if math.isinf(value):
            return "float('inf')" if value > 0 else "float('-inf')"
        if math.isnan(value):
            return "float('nan')"
        return repr(value)
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, torch.device):
        return f"torch.device({str(value)!r})"
    if isinstance(value, torch.Size):
        return f"torch.Size({_literal(list(value))})"
    if isinstance(value, tuple):
        inner = ", ".join(_literal(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    return repr(value)


# init arguments that are not stored under their own name
_INIT_SPECIAL: dict[tuple[type, str], Callable[[nn.Module], Any]] = {
    (nn.MultiheadAttention, "bias"): lambda m: m.in_proj_bias is not None,
    (nn.MultiheadAttention, "add_bias_kv"): lambda m: m.bias_k is not None,
    (nn.Embedding, "_freeze"): lambda m: not m.weight.requires_grad,
}
_INIT_SKIP = {"device", "dtype", "_weight", "_freeze", "init"}


def init_arguments(module: nn.Module) -> list[tuple[str, Any]]:
    """The constructor arguments that rebuild a torch.nn module, read back from its attributes
    and checked by rebuilding it on the meta device. Raises NotExtractable."""
    cls = type(module)
    if not is_torch_nn(cls) or getattr(nn, cls.__name__, None) is not cls:
        raise NotExtractable(
            f"{cls.__module__}.{cls.__qualname__} is not a torch.nn module, so its constructor "
            "arguments cannot be read back"
        )
    found: list[tuple[str, Any]] = []
    for name, parameter in list(inspect.signature(cls.__init__).parameters.items())[1:]:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        special = _INIT_SPECIAL.get((cls, name))
        if special is not None:
            value = special(module)
        elif name in _INIT_SKIP:
            continue
        elif hasattr(module, name):
            value = getattr(module, name)
            if isinstance(value, torch.Tensor) or value is None and parameter.default is True:
                value = value is not None  # bias=True stores the bias parameter (or None)
        elif parameter.default is not parameter.empty:
            continue
        else:
            raise NotExtractable(f"{cls.__name__}: cannot read back init argument {name!r}")
        if isinstance(value, torch.Size):
            value = tuple(value)
        if not is_literal(value):
            raise NotExtractable(f"{cls.__name__}: init argument {name!r} is not a literal")
        found.append((name, value))
    _check_rebuild(module, found)
    return found


def _check_rebuild(module: nn.Module, arguments) -> None:
    cls = type(module)
    try:
        with torch.device("meta"):
            rebuilt = cls(**dict(arguments))
    except Exception as exc:  # noqa: BLE001 (any failure means: cannot rebuild)
        raise NotExtractable(f"{cls.__name__}{dict(arguments)} does not rebuild: {exc}") from None
    want = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in rebuilt.state_dict().items()}
    if want != got:
        raise NotExtractable(
            f"{cls.__name__} rebuilt from {dict(arguments)} has other weights: {got} != {want}"
        )


def _constructor(module: nn.Module, hoist: bool) -> tuple[str, list[tuple[str, Any]]]:
    """'nn.Linear(in_features, out_features, bias=bias)' (hoist: names, given to Model's
    __init__) or with the values written in; plus the arguments."""
    arguments = init_arguments(module)
    cls = type(module)
    parameters = inspect.signature(cls.__init__).parameters
    parts = []
    for name, value in arguments:
        text = name if hoist else _literal(value)
        positional = parameters[name].default is parameters[name].empty
        parts.append(text if positional else f"{name}={text}")
    dtype = _dtype_of(module)
    suffix = f".to({dtype})" if dtype is not None and dtype != torch.float32 else ""
    if not module.training and isinstance(module, MODE_SENSITIVE_MODULES):
        suffix += ".eval()"  # as observed; a new module starts in training mode
    return f"nn.{cls.__name__}({', '.join(parts)}){suffix}", arguments


def _dtype_of(module: nn.Module) -> torch.dtype | None:
    for tensor in list(module.parameters()) + list(module.buffers()):
        if tensor.is_floating_point():
            return tensor.dtype
    return None


# ---------------------------------------------------------------- problem sources


def device_index(device) -> int | None:
    """Tensor.get_device()'s answer for tensors on this device (-1 on the CPU); None: another
    kind. A swap's fast checks compare it instead of device objects."""
    device = torch.device(device)
    if device.type == "cpu":
        return -1
    if device.type == "cuda":
        return device.index if device.index is not None else torch.cuda.current_device()
    return None


@dataclass
class TensorSpec:
    """What a tensor looked like when it was verified."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    stride: tuple[int, ...]
    contiguous: bool

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorSpec:
        return cls(
            tuple(tensor.shape), tensor.dtype, tensor.device, tuple(tensor.stride()),
            tensor.is_contiguous(),
        )  # fmt: skip

    def mismatch(self, tensor: torch.Tensor) -> str:
        """'' when `tensor` matches, else what differs."""
        if tensor.shape != self.shape:
            return f"shape {tuple(tensor.shape)} (verified: {self.shape})"
        if tensor.dtype != self.dtype:
            return f"dtype {tensor.dtype} (verified: {self.dtype})"
        if tensor.device != self.device:
            return f"device {tensor.device} (verified: {self.device})"
        if self.contiguous and not tensor.is_contiguous():
            return "a non-contiguous tensor (verified: contiguous)"
        if not self.contiguous and tuple(tensor.stride()) != self.stride:
            return f"strides {tuple(tensor.stride())} (verified: {self.stride})"
        return ""

    def describe(self) -> str:
        dtype = str(self.dtype).replace("torch.", "")
        layout = "" if self.contiguous else f" strides {list(self.stride)}"
        return f"{dtype}{list(self.shape)}{layout}"


def _structured_source(tensor: torch.Tensor) -> str | None:
    """Source for an input that is structure, not data, as observed: position ids (an arange
    along the last dimension), a causal mask (triangular, bool or additive), else None."""
    if tensor.dim() < 1 or tensor.numel() == 0 or not tensor.is_contiguous():
        return None
    size = _literal(tuple(tensor.shape))
    data = tensor.detach()
    last = tensor.shape[-1]
    if not (data.dtype.is_floating_point or data.dtype == torch.bool):
        steps = torch.arange(last, device=data.device, dtype=data.dtype)
        if torch.equal(data, steps.expand_as(data)):
            return f"torch.arange({last}{_dtype_keyword(data.dtype)}).expand({size}).contiguous()"
        return None
    if tensor.dim() < 2:
        return None
    rows = tensor.shape[-2]
    for maker in ("tril", "triu"):
        pattern = getattr(torch, maker)(
            torch.ones(rows, last, dtype=torch.bool, device=data.device)
        )
        made = f"torch.{maker}(torch.ones(({rows}, {last}), dtype=torch.bool))"
        if data.dtype == torch.bool:
            if torch.equal(data, pattern.expand_as(data)):
                return f"{made}.expand({size}).contiguous()"
            continue
        # an additive mask: 0 where attention is allowed, one large negative value elsewhere
        masked = data[~pattern.expand_as(data)]
        if masked.numel() == 0 or not bool((data[pattern.expand_as(data)] == 0).all()):
            continue
        fill = float(masked.flatten()[0])
        if fill < -1e4 and bool((masked == fill).all()):
            dt = _dtype_keyword(data.dtype)
            return (f"torch.zeros(({rows}, {last}){dt}).masked_fill(~{made}, {_literal(fill)})"
                    f".expand({size}).contiguous()")  # fmt: skip
    return None


def _input_source(tensor: torch.Tensor) -> str:
    """Source that makes a random tensor like `tensor` (shape, dtype, layout); an input that is
    structure (position ids, a causal mask) as observed."""
    structured = _structured_source(tensor)
    if structured is not None:
        return structured
    dtype = tensor.dtype
    shape = list(tensor.shape)
    layout = ""
    if not tensor.is_contiguous() and tensor.dim() > 1:
        order = sorted(range(tensor.dim()), key=lambda d: (-tensor.stride(d), d))
        inverse = [order.index(d) for d in range(tensor.dim())]
        probe = torch.empty([shape[d] for d in order], device="meta").permute(inverse)
        if probe.stride() != tensor.stride():
            raise NotExtractable(f"an input with strides {tensor.stride()} (a strided view)")
        shape = [shape[d] for d in order]
        layout = f".permute({', '.join(map(str, inverse))})"
    size = _literal(tuple(shape))
    if dtype.is_floating_point or dtype.is_complex:
        made = f"torch.randn({size}{_dtype_keyword(dtype)})"
    elif dtype == torch.bool:
        made = f"(torch.rand({size}) < 0.5)"
    else:
        low = min(0, int(tensor.min().item())) if tensor.numel() else 0
        high = max(int(tensor.max().item()) + 1, low + 1) if tensor.numel() else 2
        made = f"torch.randint({low}, {high}, {size}{_dtype_keyword(dtype)})"
    return made + layout


def _dtype_keyword(dtype: torch.dtype) -> str:
    return "" if dtype == torch.float32 else f", dtype={dtype}"


def _to(dtype: torch.dtype) -> str:
    return "" if dtype == torch.float32 else f".to({dtype})"


def _tensor_source(tensor: torch.Tensor, name: str) -> str:
    """Source for a parameter's or buffer's initial value in a problem (see the module doc)."""
    shape = tuple(tensor.shape)
    dims = _literal(shape)
    dtype = tensor.dtype
    dt = "" if dtype == torch.float32 else f", dtype={dtype}"
    data = tensor.detach()
    if not isinstance(tensor, nn.Parameter):
        if data.numel() <= INLINE_BUFFER_ELEMENTS:
            values = data.cpu().tolist()
            return f"torch.tensor({_literal(values)}, dtype={dtype})"
        if data.dim() >= 2:
            ones = torch.ones(data.shape[-2:], dtype=dtype, device=data.device)
            for maker in ("tril", "triu"):
                pattern = getattr(torch, maker)(ones).expand_as(data)
                if torch.equal(data, pattern):
                    return f"torch.{maker}(torch.ones({dims}{dt}))"
    if dtype.is_floating_point:
        mean = float(data.float().mean()) if data.numel() else 0.0
        shift = round(mean, 1)
        offset = f" + {shift!r}" if shift else ""
        return f"(torch.randn({dims}) * 0.1{offset}){_to(dtype)}"
    if dtype == torch.bool:
        return f"torch.rand({dims}) < 0.5"
    high = int(data.max().item()) + 1 if data.numel() else 2
    return f"torch.randint(0, {max(high, 1)}, {dims}{dt})"


def python_name(name: str) -> str:
    text = re.sub(r"\W", "_", name.replace(".", "_")).strip("_") or "m"
    if text[0].isdigit():
        text = "m_" + text
    if keyword.iskeyword(text) or text in ("forward", "training"):
        text += "_"
    return text


def argument_name(name: str, taken: set[str]) -> str:
    text = python_name(name.lstrip("_"))
    if text.startswith("m_") or text in ("input_1", "input"):
        text = "x"
    if hasattr(builtins, text):
        text = "x" if text == "input" else text + "_"
    return unique_name(text, taken)


def snake_case(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


_FX_NOISE = re.compile(r";  (?:\w+ = )+None$", re.MULTILINE)


def _forward_source(graph: fx.Graph) -> str:
    """The forward of a region graph as Python source (fx codegen, tidied for readers)."""
    code = graph.python_code("self")
    text = "\n".join(line.rstrip() for line in _FX_NOISE.sub("", code.src).splitlines())
    text = text.strip("\n")
    for name in re.findall(r"torch\._C\._nn\.(\w+)", text):
        if getattr(F, name, None) is getattr(torch._C._nn, name):
            text = text.replace(f"torch._C._nn.{name}(", f"torch.nn.functional.{name}(")
    for name, value in code.globals.items():
        if not re.search(rf"\b{re.escape(name)}\b", text):
            continue
        if name in ("torch", "inf", "nan", "device"):
            continue
        if getattr(builtins, name, None) is value:
            continue
        raise NotExtractable(f"the forward refers to {name} ({value!r}), which a problem lacks")
    return text


def _problem_text(
    label: str,
    init_params: list[str],
    init_lines: list[str],
    forward: str,
    inputs: list[torch.Tensor],
    init_values: list[Any],
) -> str:
    header = ["import torch", "import torch.nn as nn"]
    if re.search(r"\b(inf|nan)\b", forward):
        header.append("from math import inf, nan")
    if re.search(r"\bdevice\(", forward):
        header.append("from torch import device")
    signature = ", ".join(["self", *init_params])
    body = "".join(f"\n        {line}" for line in init_lines)
    forward_lines = "\n".join(f"    {line}" if line else "" for line in forward.splitlines())
    made = ",\n".join(f"        {_input_source(t)}" for t in inputs)
    shapes = ", ".join(TensorSpec.of(t).describe() for t in inputs)
    return (
        "\n".join(header)
        + f'\n\n\nclass Model(nn.Module):\n    """{label}. Observed inputs: {shapes}."""\n\n'
        f"    def __init__({signature}):\n        super().__init__(){body}\n\n"
        f"{forward_lines}\n\n\ndef get_inputs():\n    return [\n{made},\n    ]\n\n\n"
        f"def get_init_inputs():\n    return {_literal(list(init_values))}\n"
    )


def unique_name(name: str, taken: set[str]) -> str:
    base, i = name, 1
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    taken.add(name)
    return name


def problem_source(
    holder: nn.Module, graph: fx.Graph, label: str, inputs: list[torch.Tensor]
) -> str:
    """The KernelBench problem of a region: `holder`'s modules rebuilt from their constructor
    arguments, its parameters and buffers made anew, `graph` as the forward."""
    children = list(holder.named_children())
    tensors = list(holder._parameters.items()) + list(holder._buffers.items())
    init_params: list[str] = []
    init_values: list[Any] = []
    lines: list[str] = []
    hoist = len(children) == 1 and not tensors
    for name, child in children:
        ctor, arguments = _constructor(child, hoist)
        if hoist:
            init_params = [a for a, _ in arguments]
            init_values = [v for _, v in arguments]
        lines.append(f"self.{name} = {ctor}")
    for name, tensor in holder._parameters.items():
        lines.append(f"self.{name} = nn.Parameter({_tensor_source(tensor, name)})")
    for name, tensor in holder._buffers.items():
        lines.append(f"self.register_buffer({name!r}, {_tensor_source(tensor, name)})")
    return _problem_text(label, init_params, lines, _forward_source(graph), inputs, init_values)


def load_problem(source: str) -> types.ModuleType:
    """Execute a problem source as a module (Model, get_inputs, get_init_inputs)."""
    module = types.ModuleType("cudaforge_problem")
    exec(compile(source, "<cudaforge problem>", "exec"), module.__dict__)  # noqa: S102
    return module


__all__ = [
    "NotExtractable",
    "TensorSpec",
    "argument_name",
    "device_index",
    "init_arguments",
    "is_literal",
    "load_problem",
    "problem_source",
    "python_name",
    "snake_case",
    "unique_name",
]
