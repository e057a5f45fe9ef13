"""A model's hot spots, each turned into a standalone KernelBench-format problem.

1. `profile_model` runs a few forwards under torch.profiler with a range per module: time per
   module and per op (GPU time on a GPU, CPU time on the CPU).
2. The modules that take a fair share of that time have their first call captured (inputs,
   output), and three kinds of candidates are formed:
   - "module": a leaf torch.nn module (Linear, LayerNorm, Conv2d, MultiheadAttention, ...);
   - "chain": fusable ops in one module's own forward, found by tracing that module with
     torch.fx with its children as leaves: a matmul/conv/norm with its elementwise epilogue
     (Linear+GELU, Conv+BatchNorm+ReLU), an attention core (matmul, scale, mask, softmax,
     matmul), scaled_dot_product_attention with the views that feed it, elementwise runs;
   - "block": a whole module without weighted layers (a hand-written RMSNorm, GELU, attention
     core), traced through its children.
   Tracing specializes on the observed shapes (a shape query returns the observed value), so a
   forward that slices with `x.size(1)` still traces; the swapped code guards on those shapes.
   A module whose forward cannot be traced keeps its leaf modules as candidates.
3. Each candidate is timed on its captured inputs, identical problems (the same layer in every
   block) are merged, overlaps removed, and the largest are kept.

Weights. A problem holds no weight values: its `Model` builds the module(s) from their real
constructor arguments (or, for a raw parameter, a random tensor of its shape and dtype), so a
kernel is checked on fresh random weights in every trial and must be correct for any weights.
The captured weights are kept with the hot spot: `Hotspot.state_dict()` maps the problem's own
parameter names to them (`Model(*get_init_inputs()).load_state_dict(...)` reproduces the
module's output exactly; `find_hotspots` checks that), and `Hotspot.save(folder)` writes the
problem, the weights and the captured inputs to files. When swapped in, the kernel uses the
model's own parameter tensors. Buffers are structure as much as data (a causal mask), so a
small one is written into the problem, a triangular mask as `torch.tril(...)`, others random.
"""

from __future__ import annotations

import builtins
import contextlib
import inspect
import keyword
import math
import operator
import re
import statistics
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from ..errors import CudaforgeError
from ..harness.problem import problem_hash

MIN_SHARE = 0.02  # a hot spot takes at least this share of the model's time
MAX_HOTSPOTS = 8
MAX_HEAVY = 2  # matmuls/convs/attentions in one chain or block
MAX_BLOCK_NODES = 40
INLINE_BUFFER_ELEMENTS = 64  # buffers up to this size are written into the problem


class HotspotError(CudaforgeError):
    """The model cannot be handled: the message names what and why. Attribute: skipped, the
    candidates that were refused, each with its reason."""

    def __init__(self, message: str, skipped: Sequence[Skipped] = ()):
        super().__init__(message)
        self.skipped = list(skipped)


class NotExtractable(Exception):
    """One candidate cannot become a problem (the reason is the message)."""


# ---------------------------------------------------------------- inputs and timing


def split_inputs(example_inputs) -> tuple[tuple, dict]:
    """A tensor, a tuple/list of positional arguments, or a dict of keyword arguments ->
    (args, kwargs)."""
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, dict):
        return (), dict(example_inputs)
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    raise TypeError(
        "example_inputs must be a tensor, a tuple/list of positional arguments or a dict of "
        f"keyword arguments, not {type(example_inputs).__name__}"
    )


def model_device(model: nn.Module, args: Sequence = (), kwargs: dict | None = None):
    """The device the model runs on: its first parameter's, else its first tensor input's."""
    for tensor in list(model.parameters()) + list(model.buffers()):
        return tensor.device
    for value in list(args) + list((kwargs or {}).values()):
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


def _synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_call(
    fn: Callable[[], Any],
    device,
    *,
    min_reps: int = 5,
    max_reps: int = 100,
    target_ms: float = 60.0,
    warmup: int = 2,
) -> float:
    """Median time of one call of fn() in ms: CUDA events on a GPU, perf_counter on the CPU.
    Repeats until about target_ms of samples (between min_reps and max_reps)."""
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    _synchronize(device)
    samples: list[float] = []
    spent = 0.0
    while len(samples) < min_reps or (spent < target_ms and len(samples) < max_reps):
        if device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            began = time.perf_counter()
            fn()
            ms = (time.perf_counter() - began) * 1e3
        samples.append(ms)
        spent += ms
    return statistics.median(samples)


# ---------------------------------------------------------------- profile


@dataclass
class ModuleTime:
    path: str
    type: str
    calls: int  # per forward
    ms: float  # per forward, all calls, children included
    leaf: bool


@dataclass
class OpTime:
    name: str
    calls: int  # per forward
    ms: float  # self time per forward


@dataclass
class ModelProfile:
    """Where a forward spends its time. time_kind: 'cuda' (GPU time) or 'cpu' (CPU time)."""

    device: str
    time_kind: str
    forward_ms: float  # the whole forward as profiled (per forward)
    modules: dict[str, ModuleTime]
    ops: list[OpTime]

    def share(self, path: str) -> float:
        module = self.modules.get(path)
        if module is None or self.forward_ms <= 0:
            return 0.0
        return module.ms / self.forward_ms

    def table(self, top: int = 12) -> str:
        lines = [f"forward: {self.forward_ms:.4g} ms of {self.time_kind} time on {self.device}"]
        leaves = sorted((m for m in self.modules.values() if m.leaf), key=lambda m: -m.ms)
        lines.append("leaf modules:")
        for m in leaves[:top]:
            lines.append(
                f"  {m.path or '(root)'} [{m.type}] {m.ms:.4g} ms ({self.share(m.path):.1%}),"
                f" {m.calls} call{'s' if m.calls != 1 else ''}"
            )
        lines.append("ops (self time):")
        for op in self.ops[:top]:
            lines.append(f"  {op.name}: {op.ms:.4g} ms, {op.calls} calls")
        return "\n".join(lines)


_RANGE = "cudaforge.module:"


def profile_model(model: nn.Module, example_inputs, *, repeat: int = 3) -> ModelProfile:
    """Profile `repeat` forwards (after one warm-up) with a torch.profiler range per module."""
    args, kwargs = split_inputs(example_inputs)
    device = model_device(model, args, kwargs)
    on_gpu = device.type == "cuda"
    paths = {id(m): path for path, m in model.named_modules()}
    leaves = {path for path, m in model.named_modules() if not any(True for _ in m.children())}
    types_ = {path: type(m).__name__ for path, m in model.named_modules()}
    stack: list[Any] = []

    def enter(module, _args):
        scope = torch.autograd.profiler.record_function(_RANGE + paths.get(id(module), "?"))
        scope.__enter__()
        stack.append(scope)

    def leave(module, _args, _output):
        if stack:
            stack.pop().__exit__(None, None, None)

    handles = []
    for module in model.modules():
        handles.append(module.register_forward_pre_hook(enter))
        handles.append(module.register_forward_hook(leave))
    activities = [torch.profiler.ProfilerActivity.CPU]
    if on_gpu:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    try:
        with torch.no_grad():
            model(*args, **kwargs)
            _synchronize(device)
            with torch.profiler.profile(activities=activities) as prof:
                for _ in range(repeat):
                    model(*args, **kwargs)
                _synchronize(device)
    finally:
        for handle in handles:
            handle.remove()
        stack.clear()

    def span(event) -> float:  # microseconds
        if on_gpu:
            value = getattr(event, "device_time_total", None)
            if value is None:
                value = getattr(event, "cuda_time_total", 0.0)
            return float(value)
        return float(event.cpu_time_total)

    modules: dict[str, ModuleTime] = {}
    for event in prof.events():
        if not event.name.startswith(_RANGE):
            continue
        path = event.name[len(_RANGE) :]
        entry = modules.setdefault(
            path, ModuleTime(path, types_.get(path, "?"), 0, 0.0, path in leaves)
        )
        entry.calls += 1
        entry.ms += span(event) / 1e3
    for entry in modules.values():
        entry.calls = max(1, round(entry.calls / repeat))
        entry.ms /= repeat
    ops = []
    for avg in prof.key_averages():
        if avg.key.startswith(_RANGE) or avg.key.startswith("ProfilerStep"):
            continue
        if on_gpu:
            self_us = getattr(avg, "self_device_time_total", None)
            if self_us is None:
                self_us = getattr(avg, "self_cuda_time_total", 0.0)
        else:
            self_us = avg.self_cpu_time_total
        if self_us > 0:
            ops.append(OpTime(avg.key, max(1, round(avg.count / repeat)), self_us / 1e3 / repeat))
    ops.sort(key=lambda op: -op.ms)
    root = modules.get("")
    forward_ms = root.ms if root is not None else sum(op.ms for op in ops)
    return ModelProfile(str(device), "cuda" if on_gpu else "cpu", forward_ms, modules, ops)


# ---------------------------------------------------------------- capturing calls


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


# ---------------------------------------------------------------- tracing with observed shapes

_SHAPE_ATTRS = frozenset({"shape", "ndim", "dtype", "device", "is_cuda", "layout", "is_sparse"})
_SHAPE_METHODS = frozenset(
    {"size", "dim", "numel", "nelement", "stride", "is_contiguous", "element_size", "get_device",
     "is_floating_point", "is_complex", "ndimension"}
)  # fmt: skip


class _ShapedProxy(fx.Proxy):
    """A proxy that knows its observed value: shape queries answer with the observed values,
    so tracing specializes on them instead of failing."""

    def _observed(self):
        return self.node.meta.get("value", _MISSING)

    def __getattr__(self, name: str):
        value = self.node.meta.get("value", _MISSING)
        if isinstance(value, torch.Tensor):
            if name in _SHAPE_ATTRS:
                return getattr(value, name)
            if name in _SHAPE_METHODS:
                return getattr(value, name)
        return super().__getattr__(name)

    def __len__(self):
        value = self._observed()
        if value is _MISSING:
            return super().__len__()
        return len(value)

    def __iter__(self):
        value = self._observed()
        if isinstance(value, (tuple, list, torch.Tensor)):
            return iter([self[i] for i in range(len(value))])
        return super().__iter__()


_MISSING = object()


class _ShapeTracer(fx.Tracer):
    """torch.fx tracing that also runs each op on the observed values (node.meta['value']).

    shallow=True: every direct child of the traced module is a leaf (a module's own code);
    else torch.nn's own modules are leaves and the others are traced through."""

    proxy_buffer_attributes = True

    def __init__(self, shallow: bool):
        super().__init__()
        self.shallow = shallow
        self.inputs: dict[str, Any] = {}
        self.constants: dict[str, torch.Tensor] = {}
        self._traced: nn.Module | None = None

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        if self.shallow:
            return m is not self._traced
        return _is_torch_leaf(m)

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return _ShapedProxy(node, self)

    def create_arg(self, a: Any):
        if (
            isinstance(a, torch.Tensor)
            and not isinstance(a, nn.Parameter)
            and self.tensor_attrs.get(a) is None
            and not any(a is b for b in self._traced.buffers())
        ):
            for name, known in self.constants.items():
                if known is a:
                    return self.create_node("get_attr", name, (), {})
            name = f"_cf_constant_{len(self.constants)}"
            self.constants[name] = a
            node = self.create_node("get_attr", name, (), {})
            node.meta["value"] = a
            return node
        return super().create_arg(a)

    def create_proxy(self, kind, target, args, kwargs, name=None, type_expr=None, *rest, **kw):
        proxy = super().create_proxy(kind, target, args, kwargs, name, type_expr, *rest, **kw)
        node = proxy.node
        if kind == "placeholder":
            name = str(target)  # fx renames a specialized argument 'mask' to 'mask_1'
            base = re.sub(r"_\d+$", "", name)
            node.meta["value"] = self.inputs.get(name, self.inputs.get(base, _MISSING))
        elif kind == "call_function" and target in _SPECIALIZATION_CHECKS:
            node.meta["value"] = None
        elif kind != "output":
            node.meta["value"] = self._run(node)
        return proxy

    def _run(self, node: fx.Node):
        def value_of(n: fx.Node):
            value = n.meta.get("value", _MISSING)
            if value is _MISSING:
                raise NotExtractable(f"no observed value for {n.name}")
            return value

        args = fx.node.map_arg(node.args, value_of)
        kwargs = fx.node.map_arg(node.kwargs, value_of)
        if node.op == "get_attr":
            if node.target in self.constants:
                return self.constants[node.target]
            with _real_calls():
                return _fetch(self._traced, node.target)
        if _mutates_input(node, self._traced) and args and isinstance(args[0], torch.Tensor):
            args = (args[0].clone(), *args[1:])  # keep the observed value of the input intact
        # fx patches Module.__call__ while it traces; the observed run needs the real one
        with _real_calls():
            if node.op == "call_module":
                return self._traced.get_submodule(node.target)(*args, **kwargs)
            if node.op == "call_method":
                return getattr(args[0], node.target)(*args[1:], **kwargs)
            return node.target(*args, **kwargs)

    def trace_call(self, module: nn.Module, call: Call) -> fx.Graph:
        """Trace module's forward with the call's observed arguments; non-tensor arguments are
        specialized to their observed values."""
        self._traced = module
        signature = inspect.signature(type(module).forward)
        try:
            bound = signature.bind(module, *call.args, **call.kwargs)
        except TypeError as exc:
            raise NotExtractable(f"the captured call does not fit forward{signature}: {exc}")
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        arguments.pop(next(iter(signature.parameters)))
        for parameter in signature.parameters.values():
            if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                raise NotExtractable("forward takes *args or **kwargs")
        self.inputs = arguments
        concrete = {k: v for k, v in arguments.items() if not isinstance(v, torch.Tensor)}
        for key, value in arguments.items():
            if isinstance(value, torch.Tensor):
                continue
            if not _is_literal(value):
                raise NotExtractable(f"argument {key!r} is a {type(value).__name__}")
        with torch.no_grad():  # observed values without autograd history
            graph = self.trace(module, concrete_args=concrete or None)
        _drop_specialization_asserts(graph)
        for node in graph.nodes:
            if node.op == "placeholder":
                name = node.target
                base = name[:-2] if name.endswith("_1") and name[:-2] in arguments else name
                node.meta["value"] = arguments.get(base, node.meta.get("value", _MISSING))
                node.meta["argument"] = base
        return graph


def _real_calls():
    revert = getattr(torch.fx._symbolic_trace, "_maybe_revert_all_patches", None)
    return revert() if revert is not None else contextlib.nullcontext()


_SPECIALIZATION_CHECKS = {torch._assert, getattr(torch.fx._symbolic_trace, "_assert_is_none", None)}


def _drop_specialization_asserts(graph: fx.Graph) -> None:
    """Remove the checks fx adds for specialized arguments (the swap guards on them itself)."""
    checks = _SPECIALIZATION_CHECKS
    for node in reversed(list(graph.nodes)):
        if node.op == "call_function" and node.target in checks:
            inputs = node.all_input_nodes
            graph.erase_node(node)
            for source in inputs:
                if source.op == "call_function" and not source.users:
                    graph.erase_node(source)


def _fetch(module: nn.Module, target: str):
    value: Any = module
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _mutates_input(node: fx.Node, root: nn.Module) -> bool:
    if node.op == "call_method":
        return node.target.endswith("_") and not node.target.startswith("_")
    if node.op == "call_function":
        name = getattr(node.target, "__name__", "")
        return node.kwargs.get("inplace") is True or (
            name.endswith("_") and not name.startswith("_")
        )
    if node.op == "call_module":
        return getattr(root.get_submodule(node.target), "inplace", False) is True
    return False


# ---------------------------------------------------------------- what each node does

_HEAVY_MODULES = (
    nn.Linear, nn.Bilinear, nn.Conv1d, nn.Conv2d, nn.Conv3d,
    nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d,
)  # fmt: skip
_NORM_MODULES = tuple(
    getattr(nn, name)
    for name in ("LayerNorm", "GroupNorm", "RMSNorm", "InstanceNorm1d", "InstanceNorm2d",
                 "InstanceNorm3d", "LocalResponseNorm")
    if hasattr(nn, name)
)  # fmt: skip
_SOFTMAX_MODULES = (nn.Softmax, nn.LogSoftmax, nn.Softmin)
_ACTIVATION_MODULES = (
    nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.LeakyReLU, nn.ELU, nn.SELU,
    nn.CELU, nn.Mish, nn.Hardswish, nn.Hardsigmoid, nn.Hardtanh, nn.Softplus, nn.Softsign,
    nn.Tanhshrink, nn.LogSigmoid, nn.PReLU, nn.GLU,
)  # fmt: skip
_DROPOUT_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)
_TRANSPARENT_MODULES = (nn.Identity, nn.Flatten, nn.Unflatten)
_MODE_SENSITIVE_MODULES = (
    nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm, *_DROPOUT_MODULES,
    nn.MultiheadAttention, nn.RNNBase,
)  # fmt: skip

_MM_FUNCTIONS = {torch.matmul, torch.bmm, torch.mm, torch.addmm, torch.baddbmm, torch.einsum,
                 operator.matmul}  # fmt: skip
_WEIGHTED_FUNCTIONS = {F.linear, F.conv1d, F.conv2d, F.conv3d, F.bilinear}
_NORM_FUNCTIONS = {F.layer_norm, F.group_norm, F.normalize, F.instance_norm}
if hasattr(F, "rms_norm"):
    _NORM_FUNCTIONS.add(F.rms_norm)
_SOFTMAX_FUNCTIONS = {F.softmax, torch.softmax, F.log_softmax, torch.log_softmax, F.softmin}
_ATTENTION_FUNCTIONS = {F.scaled_dot_product_attention}
_ELEMENTWISE_NAMES = frozenset(
    ["add", "sub", "mul", "div", "truediv", "floordiv", "neg", "pos", "pow", "exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "reciprocal", "square", "abs", "sign", "tanh", "sigmoid", "relu", "relu6", "gelu", "silu", "mish", "elu", "selu", "celu", "leaky_relu", "hardswish", "hardsigmoid", "hardtanh", "softplus", "softsign", "logsigmoid", "erf", "erfc", "sin", "cos", "clamp", "clip", "clamp_min", "clamp_max", "where", "masked_fill", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not", "bitwise_and", "bitwise_or", "float", "half", "bfloat16", "double", "to", "type_as", "mean", "sum", "amax", "amin", "max", "min", "var", "std", "norm", "prod", "cat", "stack", "lerp", "addcmul", "addcdiv", "fma", "triu", "tril", "cumsum", "logsumexp"]
)  # fmt: skip
_VIEW_NAMES = frozenset(
    ["view", "reshape", "view_as", "reshape_as", "transpose", "permute", "contiguous", "flatten", "unflatten", "unsqueeze", "squeeze", "expand", "expand_as", "split", "chunk", "unbind", "t", "narrow", "select", "getitem", "movedim", "swapaxes"]
)  # fmt: skip


def _op_name(node: fx.Node, root: nn.Module) -> str:
    if node.op == "call_module":
        return type(root.get_submodule(node.target)).__name__
    if node.op == "call_method":
        return str(node.target)
    name = getattr(node.target, "__name__", str(node.target))
    return {"getattr": "getattr", "truediv": "div"}.get(name, name)


def _dropout_active(node: fx.Node) -> bool:
    p = node.kwargs.get("p", node.args[1] if len(node.args) > 1 else 0.5)
    training = node.kwargs.get("training", node.args[2] if len(node.args) > 2 else True)
    return bool(training) and p not in (0, 0.0)


def classify(node: fx.Node, root: nn.Module) -> str:
    """'view', 'ew' (elementwise or a reduction), 'norm', 'softmax', 'mm' (a matmul of
    activations), 'weighted' (a layer with weights), 'attention', 'random' (dropout in
    training mode, batch norm in training mode) or 'opaque'."""
    if node.op == "call_module":
        module = root.get_submodule(node.target)
        if not _is_torch_leaf(module):
            return "opaque"  # a module of the model's own (its code has its own candidates)
        if isinstance(module, _HEAVY_MODULES):
            return "weighted"
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            return "random" if module.training else "ew"
        if isinstance(module, _NORM_MODULES):
            return "norm"
        if isinstance(module, _SOFTMAX_MODULES):
            return "softmax"
        if isinstance(module, _ACTIVATION_MODULES):
            return "ew"
        if isinstance(module, _DROPOUT_MODULES):
            return "random" if module.training and module.p > 0 else "view"
        if isinstance(module, _TRANSPARENT_MODULES):
            return "view"
        if any(True for _ in module.parameters()):
            return "weighted"  # attention, embeddings, recurrent layers: layers with weights
        return "opaque"
    if node.op == "call_function":
        target = node.target
        if target in (F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout):
            return "random" if _dropout_active(node) else "view"
        if target is F.batch_norm:
            training = node.kwargs.get("training", node.args[5] if len(node.args) > 5 else False)
            return "random" if training else "ew"
        if target in _WEIGHTED_FUNCTIONS:
            return "weighted"
        if target in _MM_FUNCTIONS:
            return "mm"
        if target in _ATTENTION_FUNCTIONS:
            return "attention"
        if target in _NORM_FUNCTIONS:
            return "norm"
        if target in _SOFTMAX_FUNCTIONS:
            return "softmax"
        if target is getattr and len(node.args) > 1 and node.args[1] in ("T", "mT", "H", "mH"):
            return "view"
        name = getattr(target, "__name__", "")
        if name in ("rand", "randn", "rand_like", "randn_like", "randint", "bernoulli"):
            return "random"
        return _kind_by_name(name)
    if node.op == "call_method":
        name = str(node.target)
        if name in ("matmul", "bmm", "mm", "__matmul__"):
            return "mm"
        if name in ("softmax", "log_softmax"):
            return "softmax"
        if name in ("bernoulli_", "uniform_", "normal_", "random_"):
            return "random"
        return _kind_by_name(name)
    return "opaque"


def _kind_by_name(name: str) -> str:
    """A view, an elementwise op (in place or not), or opaque, by the function's name."""
    if name in _VIEW_NAMES:
        return "view"
    if name in _ELEMENTWISE_NAMES or name.rstrip("_") in _ELEMENTWISE_NAMES:
        return "ew"
    return "opaque"


_HEAVY_KINDS = ("mm", "weighted", "attention")


# ---------------------------------------------------------------- regions (chains)


@dataclass
class _Region:
    nodes: list[fx.Node]  # in graph order
    output: fx.Node
    anchor: fx.Node


def _tensor_users(node: fx.Node) -> list[fx.Node]:
    return list(node.users)


def _is_tensor_node(node: fx.Node) -> bool:
    return isinstance(node.meta.get("value"), torch.Tensor)


def _inputs_of(node: fx.Node) -> list[fx.Node]:
    return [n for n in node.all_input_nodes if n.op not in ("get_attr",)]


def find_chains(graph: fx.Graph, root: nn.Module) -> list[_Region]:
    """Fusable regions in one traced forward (see the module docstring)."""
    order = {node: i for i, node in enumerate(graph.nodes)}
    kinds = {
        node: classify(node, root)
        for node in graph.nodes
        if node.op in ("call_module", "call_function", "call_method")
    }
    claimed: set[fx.Node] = set()
    regions: list[_Region] = []

    def fusable(node, allowed) -> bool:
        return node in kinds and node not in claimed and kinds[node] in allowed

    def grow(anchor: fx.Node) -> set[fx.Node]:
        region = {anchor}
        kind = kinds[anchor]
        if kind == "softmax":  # back through the scale and mask to the scores' matmul
            node = _primary(anchor)
            while node is not None and fusable(node, ("ew", "view")) and _users_in(node, region):
                region.add(node)
                node = _primary(node)
            if node is not None and fusable(node, ("mm",)) and _users_in(node, region):
                region.add(node)
        tail, matmul_after = anchor, kind == "softmax"
        while True:
            users = _tensor_users(tail)
            if len(users) != 1 or users[0] not in kinds or users[0] in claimed:
                break
            user = users[0]
            if kinds[user] in ("ew", "view"):
                pass
            elif matmul_after and kinds[user] == "mm":
                matmul_after = False
            else:
                break
            region.add(user)
            tail = user
        changed = True
        while changed:  # producers whose every user is already inside
            changed = False
            members = list(region)
            for node in members:
                for source in _inputs_of(node):
                    if source in region or not fusable(source, ("ew", "view")):
                        continue
                    if _users_in(source, region):
                        region.add(source)
                        changed = True
        return region

    anchors = sorted(
        (n for n, k in kinds.items() if k in ("attention", "softmax", "norm", "weighted", "mm")),
        key=lambda n: (
            ("attention", "softmax", "norm", "weighted", "mm").index(kinds[n]),
            order[n],
        ),
    )
    seeds = [n for n, k in kinds.items() if k == "ew"]
    for anchor in anchors + seeds:
        if anchor in claimed:
            continue
        region = _finish(grow(anchor), anchor, kinds, order)
        if region is None:
            continue
        compute = [n for n in region.nodes if kinds[n] != "view"]
        if kinds[anchor] == "ew" and len(compute) < 3:
            continue  # a short elementwise run is not worth a kernel
        if len(compute) == 1 and anchor.op == "call_module":
            continue  # the module on its own is already a candidate
        claimed.update(region.nodes)
        regions.append(region)
    return regions


def _primary(node: fx.Node) -> fx.Node | None:
    for arg in node.args:
        if isinstance(arg, fx.Node) and _is_tensor_node(arg):
            return arg
    return None


def _users_in(node: fx.Node, region: set[fx.Node]) -> bool:
    return bool(node.users) and all(user in region for user in node.users)


def _finish(region: set[fx.Node], anchor, kinds, order) -> _Region | None:
    """Trim trailing views and check the region: one tensor output, no path that leaves the
    region and comes back, in-place ops only on its own values, at most MAX_HEAVY heavy ops."""
    while True:
        outputs = [n for n in region if any(u not in region for u in n.users)]
        if len(outputs) != 1:
            return None
        output = outputs[0]
        if output is anchor or kinds[output] != "view" or len(region) == 1:
            break
        trimmed = region - {output}
        if len([n for n in trimmed if any(u not in trimmed for u in n.users)]) != 1:
            break
        region = trimmed
    if not _is_tensor_node(output):
        return None
    if sum(kinds[n] in _HEAVY_KINDS for n in region) > MAX_HEAVY:
        return None
    if any(kinds[n] in ("random", "opaque") for n in region):
        return None
    for node in region:
        if node.op != "call_module" and _mutates_first_arg_outside(node, region):
            return None
    if _leaves_and_returns(region, order):
        return None
    nodes = sorted(region, key=order.__getitem__)
    return _Region(nodes, output, anchor)


def _mutates_first_arg_outside(node: fx.Node, region: set[fx.Node]) -> bool:
    name = str(node.target) if node.op == "call_method" else getattr(node.target, "__name__", "")
    inplace = node.kwargs.get("inplace") is True or (
        name.endswith("_") and not name.startswith("_")
    )
    first = node.args[0] if node.args else None
    return inplace and isinstance(first, fx.Node) and first not in region


def _leaves_and_returns(region: set[fx.Node], order) -> bool:
    """True when a value outside the region depends on the region and feeds it (a cycle once
    the region is one call)."""
    inputs = {s for n in region for s in n.all_input_nodes if s not in region}
    start = min(order[n] for n in region)
    frontier = [u for n in region for u in n.users if u not in region]
    seen: set[fx.Node] = set()
    while frontier:
        node = frontier.pop()
        if node in seen or node.op == "output":
            continue
        seen.add(node)
        if node in inputs:
            return True
        frontier.extend(u for u in node.users if u not in region and order[u] > start)
    return False


# ---------------------------------------------------------------- constructor arguments


def _is_torch_nn(cls: type) -> bool:
    module = getattr(cls, "__module__", "") or ""
    return module.startswith(("torch.nn.", "torch.ao.nn."))


def _is_torch_leaf(module: nn.Module) -> bool:
    """A torch.nn module other than a container: one call in a traced graph, one candidate."""
    containers = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
    return _is_torch_nn(type(module)) and not isinstance(module, containers)


def _is_literal(value) -> bool:
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device)):
        return True
    if isinstance(value, slice):
        return all(_is_literal(v) for v in (value.start, value.stop, value.step))
    if isinstance(value, (tuple, list)):
        return all(_is_literal(v) for v in value)
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
    if not _is_torch_nn(cls) or getattr(nn, cls.__name__, None) is not cls:
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
        if not _is_literal(value):
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
    if not module.training and isinstance(module, _MODE_SENSITIVE_MODULES):
        suffix += ".eval()"  # as observed; a new module starts in training mode
    return f"nn.{cls.__name__}({', '.join(parts)}){suffix}", arguments


def _dtype_of(module: nn.Module) -> torch.dtype | None:
    for tensor in list(module.parameters()) + list(module.buffers()):
        if tensor.is_floating_point():
            return tensor.dtype
    return None


# ---------------------------------------------------------------- problem sources


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


def _input_source(tensor: torch.Tensor) -> str:
    """Source that makes a random tensor like `tensor` (shape, dtype, layout)."""
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


def _sanitize(name: str) -> str:
    text = re.sub(r"\W", "_", name.replace(".", "_")).strip("_") or "m"
    if text[0].isdigit():
        text = "m_" + text
    if keyword.iskeyword(text) or text in ("forward", "training"):
        text += "_"
    return text


def _argument_name(name: str, taken: set[str]) -> str:
    text = _sanitize(name.lstrip("_"))
    if text.startswith("m_") or text in ("input_1", "input"):
        text = "x"
    if hasattr(builtins, text):
        text = "x" if text == "input" else text + "_"
    return _unique(text, taken)


def _snake(name: str) -> str:
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


# ---------------------------------------------------------------- sites and hot spots


@dataclass
class Site:
    """One place in the model where a hot spot's computation runs.

    kind 'module'/'block': `module`'s whole forward; kind 'chain': some nodes of `module`'s own
    forward (the owner). `root` runs the original computation (see run_original) with the live
    parameters `tensors`, named `root_keys` in root and `problem_keys` in the problem's Model.
    `template` maps a call's arguments to the problem's inputs: ('input', i) for the i-th
    tensor input, ('const', value) for a value the problem specialized on."""

    path: str
    kind: str
    label: str
    module: nn.Module
    root: nn.Module
    root_keys: list[str | None]
    problem_keys: list[str]
    tensors: list[torch.Tensor]
    template: list[tuple[str, Any]]
    kw_template: dict[str, tuple[str, Any]]
    inputs: list[torch.Tensor]
    input_specs: list[TensorSpec]
    outputs: list[torch.Tensor]
    output_specs: list[TensorSpec]
    structure: Any  # how the original returns its tensors: 'tensor' or a tuple of slots
    calls: int = 1
    ms: float | None = None  # one call of the original, measured on the captured inputs
    node_names: list[str] = field(default_factory=list)  # chain: the owner graph's nodes
    graph: fx.Graph | None = None  # chain: the owner's traced graph
    external: list[str] = field(default_factory=list)  # chain: the nodes it takes, in order
    output_name: str = ""  # chain: the node whose value it returns
    constants: dict[str, torch.Tensor] = field(default_factory=dict)  # chain: traced constants
    owner_arguments: list[tuple[str, Any]] = field(default_factory=list)  # chain: owner's call
    owner_training: bool = False

    def release(self) -> None:
        """Drop the captured tensors (inputs, outputs, observed values in the traced graph);
        what a swap needs afterwards (specs, structure, the graph itself) stays."""
        self.inputs = []
        self.outputs = []
        if self.graph is not None:
            for node in self.graph.nodes:
                node.meta.pop("value", None)

    def arguments(self, inputs: Sequence[torch.Tensor]) -> tuple[tuple, dict]:
        """The call arguments of the original for the problem's tensor inputs."""

        def fill(slot):
            return inputs[slot[1]] if slot[0] == "input" else slot[1]

        return tuple(fill(s) for s in self.template), {
            k: fill(s) for k, s in self.kw_template.items()
        }

    def run_original(self, inputs: Sequence[torch.Tensor], tensors=None) -> list[torch.Tensor]:
        """The original computation on the problem's inputs -> its output tensors, in the
        problem's order; `tensors` replaces the parameters (torch.func.functional_call)."""
        args, kwargs = self.arguments(inputs)
        if tensors is None:
            output = self.root(*args, **kwargs)
        else:
            swapped = {k: t for k, t in zip(self.root_keys, tensors) if k is not None}
            output = torch.func.functional_call(self.root, swapped, args, kwargs, strict=False)
        return flatten_output(output, self.structure)


def flatten_output(output, structure) -> list[torch.Tensor]:
    if structure == "tensor":
        return [output]
    return [output[i] for i, slot in enumerate(structure) if slot == "tensor"]


def rebuild_output(tensors: Sequence[torch.Tensor], structure):
    """The original's return value from the problem's output tensors."""
    if structure == "tensor":
        return tensors[0]
    it = iter(tensors)
    values = [next(it) if slot == "tensor" else slot[1] for slot in structure]
    return tuple(values)


def _structure_of(output) -> Any:
    if isinstance(output, torch.Tensor):
        return "tensor"
    if isinstance(output, (tuple, list)) and not hasattr(output, "_fields"):
        slots = []
        for value in output:
            if isinstance(value, torch.Tensor):
                slots.append("tensor")
            elif value is None or _is_literal(value):
                slots.append(("const", value))
            else:
                raise NotExtractable(f"returns a {type(value).__name__} inside its output")
        if "tensor" not in slots:
            raise NotExtractable("returns no tensor")
        return tuple(slots)
    raise NotExtractable(f"returns a {type(output).__name__}, not a tensor or tuple of tensors")


@dataclass
class Hotspot:
    """A problem and the sites that share it (the same layer in every block)."""

    name: str
    kind: str
    label: str
    problem_source: str
    sites: list[Site]
    share: float = 0.0  # of the model's forward time, all sites together

    @property
    def problem_hash(self) -> str:
        return problem_hash(self.problem_source)

    @property
    def ms(self) -> float:
        """Time of every call of every site per forward (ms)."""
        return sum((s.ms or 0.0) * s.calls for s in self.sites)

    @property
    def dtype(self) -> str:
        dtypes = sorted({str(s.dtype).replace("torch.", "") for s in self.sites[0].input_specs})
        return ",".join(dtypes) or "none"

    @property
    def shapes(self) -> list[list[int]]:
        return [list(s.shape) for s in self.sites[0].input_specs]

    def state_dict(self, site: int = 0) -> dict[str, torch.Tensor]:
        """The captured weights under the problem's parameter names."""
        chosen = self.sites[site]
        return {k: t.detach() for k, t in zip(chosen.problem_keys, chosen.tensors)}

    def inputs(self, site: int = 0) -> list[torch.Tensor]:
        """The captured inputs of one site, in the problem's order."""
        return list(self.sites[site].inputs)

    def save(self, folder: str | Path) -> Path:
        """Write problem.py, weights.pt (state_dict()) and inputs.pt (inputs()) to folder."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "problem.py").write_text(self.problem_source)
        torch.save({k: v.cpu() for k, v in self.state_dict().items()}, folder / "weights.pt")
        torch.save([t.cpu() for t in self.inputs()], folder / "inputs.pt")
        return folder

    def __repr__(self) -> str:
        return (
            f"Hotspot({self.name!r}, kind={self.kind!r}, sites={len(self.sites)}, "
            f"ms={self.ms:.4g}, share={self.share:.1%})"
        )


@dataclass
class Skipped:
    path: str
    what: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path or '(root)'} ({self.what}): {self.reason}"


@dataclass
class Candidate:
    site: Site
    source: str


def load_problem(source: str) -> types.ModuleType:
    """Execute a problem source as a module (Model, get_inputs, get_init_inputs)."""
    module = types.ModuleType("cudaforge_problem")
    exec(compile(source, "<cudaforge problem>", "exec"), module.__dict__)  # noqa: S102
    return module


# ---------------------------------------------------------------- building candidates


class _Holder(nn.Module):
    """The modules and tensors a region uses, under the names its problem gives them; shares
    them with the model."""


def _unique(name: str, taken: set[str]) -> str:
    base, i = name, 1
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    taken.add(name)
    return name


def _region_site(
    path: str, owner: nn.Module, graph: fx.Graph, region: _Region, constants: dict, calls: int
) -> Candidate:
    """A chain of `owner`'s traced forward -> its site and problem."""
    members = set(region.nodes)
    holder = _Holder()
    taken: set[str] = set()
    names: dict[str, str] = {}
    external: list[fx.Node] = []
    attributes: list[fx.Node] = []
    for node in region.nodes:
        for source in node.all_input_nodes:
            if source in members:
                continue
            if source.op == "get_attr":
                if source not in attributes:
                    attributes.append(source)
            elif source not in external:
                external.append(source)
    for node in region.nodes:
        if node.op == "call_module" and node.target not in names:
            child = owner.get_submodule(node.target)
            names[node.target] = _module_name(node.target, child, taken)
            holder.add_module(names[node.target], child)
    for node in attributes:
        if node.target in names:
            continue
        value = constants[node.target] if node.target in constants else _fetch(owner, node.target)
        if isinstance(value, nn.Module):
            raise NotExtractable(f"uses the module {node.target} as a value")
        label = node.target.replace("_cf_constant_", "constant_")
        names[node.target] = _unique(_sanitize(label), taken)
        if isinstance(value, nn.Parameter):
            holder.register_parameter(names[node.target], value)
        else:
            holder.register_buffer(names[node.target], value)
    for node in external:
        if node.meta.get("value", _MISSING) is _MISSING:
            raise NotExtractable(f"no observed value for {node.name}")
        value = node.meta["value"]
        if not isinstance(value, torch.Tensor) and not _is_literal(value):
            raise NotExtractable(f"takes a {type(value).__name__} ({node.name})")

    def build(problem: bool) -> tuple[fx.Graph, list]:
        out = fx.Graph()
        env: dict[fx.Node, Any] = {}
        template = []
        count = 0
        argument_names: set[str] = set()
        for node in external:
            value = node.meta["value"]
            if isinstance(value, torch.Tensor):
                env[node] = out.placeholder(_argument_name(node.name, argument_names))
                template.append(("input", count))
                count += 1
            elif problem:
                env[node] = value
            else:
                env[node] = out.placeholder(_argument_name(node.name, argument_names))
                template.append(("const", value))
        for node in attributes:
            env[node] = out.get_attr(names[node.target])
        for node in region.nodes:
            env[node] = _copy_node(out, node, env, names)
        out.output(env[region.output])
        return out, template

    problem_graph, _ = build(True)
    runtime_graph, template = build(False)
    ops = [_op_name(n, owner) for n in region.nodes if classify(n, owner) != "view"]
    label = " -> ".join(ops) if ops else _op_name(region.anchor, owner)
    inputs = [n.meta["value"] for n in external if isinstance(n.meta["value"], torch.Tensor)]
    output = region.output.meta["value"]
    runtime = fx.GraphModule(holder, runtime_graph)
    site = _make_site(
        path, "chain", label, owner, runtime, holder, template, {}, inputs, output, calls
    )
    site.node_names = [n.name for n in region.nodes]
    site.graph = graph
    site.external = [n.name for n in external]
    site.output_name = region.output.name
    site.constants = dict(constants)
    site.owner_training = owner.training
    source = _source_for(holder, problem_graph, f"cudaforge hot spot (chain): {label}", inputs)
    return Candidate(site, source)


def _copy_node(graph: fx.Graph, node: fx.Node, env: dict, names: dict[str, str]) -> fx.Node:
    """node, copied into graph with its inputs mapped through env; a module call is renamed
    to the holder's name for that module."""
    if node.op != "call_module":
        return graph.node_copy(node, lambda n: env[n])
    args = fx.node.map_arg(node.args, lambda n: env[n])
    kwargs = fx.node.map_arg(node.kwargs, lambda n: env[n])
    target = names[node.target]
    return graph.create_node("call_module", target, args, kwargs, name=target)


def _module_name(target: str, module: nn.Module, taken: set[str]) -> str:
    """A holder name for a called module: its attribute path, or 'conv2d_0' for a numbered
    child of a Sequential."""
    text = _sanitize(target)
    if text.startswith("m_") and target.split(".")[-1].isdigit():
        text = f"{_snake(type(module).__name__)}_{target.split('.')[-1]}"
    return _unique(text, taken)


def _make_site(path, kind, label, module, root, holder, template, kw_template, inputs, output,
               calls) -> Site:  # fmt: skip
    structure = _structure_of(output)
    outputs = [t for t in flatten_output(output, structure)]
    keys, tensors = [], []
    for name, tensor in list(holder.named_parameters(remove_duplicate=False)) + list(
        holder.named_buffers(remove_duplicate=False)
    ):
        keys.append(name)
        tensors.append(tensor)
    root_names = {id(t): n for n, t in _named_tensors(root)}
    root_keys = [root_names.get(id(t)) for t in tensors]  # None: made by the forward itself
    return Site(
        path=path, kind=kind, label=label, module=module, root=root, root_keys=root_keys,
        problem_keys=keys, tensors=tensors, template=template, kw_template=kw_template,
        inputs=list(inputs), input_specs=[TensorSpec.of(t) for t in inputs], outputs=outputs,
        output_specs=[TensorSpec.of(t) for t in outputs], structure=structure, calls=calls,
    )  # fmt: skip


def _named_tensors(module: nn.Module):
    yield from module.named_parameters(remove_duplicate=False)
    yield from module.named_buffers(remove_duplicate=False)


def _source_for(holder: nn.Module, graph: fx.Graph, label: str, inputs: list[torch.Tensor]) -> str:
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


def _module_site(path: str, module: nn.Module, call: Call) -> Candidate:
    """A leaf torch.nn module, called as observed -> its site and problem."""
    cls = type(module)
    holder = _Holder()
    child = _snake(cls.__name__)
    holder.add_module(child, module)
    signature = inspect.signature(type(module).forward)
    try:
        bound = signature.bind(module, *call.args, **call.kwargs)
    except TypeError as exc:
        raise NotExtractable(f"the captured call does not fit forward{signature}: {exc}")
    graph = fx.Graph()
    inputs: list[torch.Tensor] = []
    template: list[tuple[str, Any]] = []
    kw_template: dict[str, tuple[str, Any]] = {}
    taken: set[str] = set()

    def slot(name: str, value):
        if isinstance(value, torch.Tensor):
            inputs.append(value)
            return ("input", len(inputs) - 1), graph.placeholder(_argument_name(name, taken))
        if not _is_literal(value):
            raise NotExtractable(f"argument {name!r} is a {type(value).__name__}")
        return ("const", value), value

    args, kwargs = [], {}
    for i, value in enumerate(call.args):
        name = list(bound.arguments)[i + 1] if i + 1 < len(bound.arguments) else f"arg{i}"
        entry, arg = slot(_sanitize(name), value)
        template.append(entry)
        args.append(arg)
    for key, value in call.kwargs.items():
        entry, arg = slot(_sanitize(key), value)
        kw_template[key] = entry
        kwargs[key] = arg
    called = graph.call_module(child, tuple(args), kwargs)
    structure = _structure_of(call.output)
    if structure == "tensor":
        graph.output(called)
    else:
        picks = [
            graph.call_function(operator.getitem, (called, i))
            for i, s in enumerate(structure)
            if s == "tensor"
        ]
        graph.output(picks[0] if len(picks) == 1 else tuple(picks))
    site = _make_site(
        path, "module", cls.__name__, module, module, holder, template, kw_template, inputs,
        call.output, call.count,
    )  # fmt: skip
    label = f"cudaforge hot spot (module): {cls.__name__}"
    return Candidate(site, _source_for(holder, graph, label, inputs))


def _block_site(path: str, module: nn.Module, call: Call) -> Candidate:
    """A module without weighted layers, traced through its children -> its site and problem."""
    tracer = _ShapeTracer(shallow=False)
    try:
        graph = tracer.trace_call(module, call)
    except NotExtractable:
        raise
    except Exception as exc:  # noqa: BLE001 (fx raises many kinds)
        raise NotExtractable(f"torch.fx cannot trace it: {_first_line(exc)}") from None
    kinds = [
        classify(n, module)
        for n in graph.nodes
        if n.op in ("call_module", "call_function", "call_method")
    ]
    if not kinds or all(k == "view" for k in kinds):
        raise NotExtractable("does no computation")
    if "weighted" in kinds:
        raise NotExtractable("has weighted layers (its leaves and chains are the candidates)")
    if "random" in kinds:
        raise NotExtractable("is random in this mode (dropout or batch norm in training)")
    if sum(k in _HEAVY_KINDS for k in kinds) > MAX_HEAVY or len(kinds) > MAX_BLOCK_NODES:
        raise NotExtractable("too large for one kernel")
    output_node = next(n for n in graph.nodes if n.op == "output")
    _check_same(output_node, call.output)
    holder = _Holder()
    taken: set[str] = set()
    names: dict[str, str] = {}
    problem_graph = fx.Graph()
    env: dict[fx.Node, Any] = {}
    inputs: list[torch.Tensor] = []
    template: list[tuple[str, Any]] = []
    kw_template: dict[str, tuple[str, Any]] = {}
    positional = len(call.args)
    for node in graph.nodes:
        if node.op == "placeholder":
            value = node.meta.get("value", _MISSING)
            argument = node.meta.get("argument", node.target)
            if isinstance(value, torch.Tensor):
                env[node] = problem_graph.placeholder(_argument_name(argument, set()))
                inputs.append(value)
                entry = ("input", len(inputs) - 1)
            else:
                env[node] = value
                entry = ("const", value)
            index = list(inspect.signature(type(module).forward).parameters).index(argument) - 1
            if index < positional:
                template.append(entry)
            elif argument in call.kwargs:
                kw_template[argument] = entry
        elif node.op == "get_attr":
            value = (
                tracer.constants[node.target]
                if node.target in tracer.constants
                else _fetch(module, node.target)
            )
            label = node.target.replace("_cf_constant_", "constant_")
            names[node.target] = _unique(_sanitize(label), taken)
            if isinstance(value, nn.Parameter):
                holder.register_parameter(names[node.target], value)
            else:
                holder.register_buffer(names[node.target], value)
            env[node] = problem_graph.get_attr(names[node.target])
        elif node.op == "output":
            structure = _structure_of(call.output)
            leaves = _output_leaves(node.args[0], structure)
            mapped = [env[n] for n in leaves]
            problem_graph.output(mapped[0] if len(mapped) == 1 else tuple(mapped))
        else:
            if node.op == "call_module" and node.target not in names:
                child = module.get_submodule(node.target)
                names[node.target] = _module_name(node.target, child, taken)
                holder.add_module(names[node.target], child)
            env[node] = _copy_node(problem_graph, node, env, names)
    ops = [_op_name(n, module) for n in graph.nodes if n.op.startswith("call")]
    label = f"{type(module).__name__} ({', '.join(dict.fromkeys(ops))})"
    site = _make_site(
        path, "block", label, module, module, holder, template, kw_template, inputs,
        call.output, call.count,
    )  # fmt: skip
    source = _source_for(
        holder, problem_graph, f"cudaforge hot spot (block): {type(module).__name__}", inputs
    )
    return Candidate(site, source)


def _output_leaves(value, structure) -> list[fx.Node]:
    if structure == "tensor":
        if not isinstance(value, fx.Node):
            raise NotExtractable("its traced output is not one value")
        return [value]
    if not isinstance(value, (tuple, list)) or len(value) != len(structure):
        raise NotExtractable("its traced output has another structure than its real output")
    return [v for v, s in zip(value, structure) if s == "tensor"]


def _check_same(output_node: fx.Node, real_output) -> None:
    """The traced graph must compute what the module returned (else tracing went wrong)."""
    traced = fx.node.map_arg(output_node.args[0], lambda n: n.meta.get("value", _MISSING))
    if not _same_values(traced, real_output):
        raise NotExtractable("its traced graph does not reproduce its output")


def _same_values(a, b) -> bool:
    """The same computation's results: same structure, shapes and dtypes, values equal up to
    the rounding of vectorized math (a missing weight or a wrong argument is off by far more)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return (
            a.shape == b.shape
            and a.dtype == b.dtype
            and torch.allclose(a.float(), b.float(), rtol=1e-3, atol=1e-3, equal_nan=True)
        )
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same_values(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_values(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return False
    try:
        return a is b or bool(a == b)
    except Exception:  # noqa: BLE001 - values that cannot be compared are not the same
        return False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _chain_sites(path: str, owner: nn.Module, call: Call) -> tuple[list[Candidate], list[str]]:
    tracer = _ShapeTracer(shallow=True)
    try:
        graph = tracer.trace_call(owner, call)
    except NotExtractable:
        raise
    except Exception as exc:  # noqa: BLE001
        raise NotExtractable(f"torch.fx cannot trace its forward: {_first_line(exc)}") from None
    random = any(
        classify(n, owner) == "random"
        for n in graph.nodes
        if n.op in ("call_module", "call_function", "call_method")
    )
    if not random:  # with dropout active the traced run draws other numbers than the real one
        _check_same(next(n for n in graph.nodes if n.op == "output"), call.output)
    arguments = []
    for name, value in tracer.inputs.items():
        if isinstance(value, torch.Tensor):
            arguments.append((name, ("tensor", TensorSpec.of(value))))
        else:
            arguments.append((name, ("const", value)))
    found, refused = [], []
    for region in find_chains(graph, owner):
        try:
            candidate = _region_site(path, owner, graph, region, tracer.constants, call.count)
        except NotExtractable as exc:
            refused.append(f"{_op_name(region.anchor, owner)} chain: {exc}")
            continue
        candidate.site.owner_arguments = arguments
        found.append(candidate)
    return found, refused


# ---------------------------------------------------------------- checking a problem


def check_problem(candidate: Candidate, device=None) -> None:
    """The problem's Model, with the captured weights, must reproduce the site's output on the
    captured inputs. Raises NotExtractable."""
    site = candidate.site
    try:
        module = load_problem(candidate.source)
        device = device or (site.inputs[0].device if site.inputs else torch.device("cpu"))
        with torch.device(device):
            model = module.Model(*module.get_init_inputs())
        wanted = model.state_dict()
        weights = {k: t for k, t in zip(site.problem_keys, site.tensors) if k in wanted}
        missing = set(wanted) - set(weights)
        if missing:
            raise NotExtractable(f"its problem has weights the model lacks: {sorted(missing)}")
        model.load_state_dict(weights, strict=True)
        module.get_inputs()  # it must run too
        with torch.no_grad():
            got = model(*site.inputs)
    except Exception as exc:  # noqa: BLE001
        raise NotExtractable(f"its generated problem does not run: {_first_line(exc)}") from None
    got_list = [got] if isinstance(got, torch.Tensor) else list(got)
    if not _same_values(got_list, site.outputs):
        raise NotExtractable("its generated problem does not reproduce the module's output")


# ---------------------------------------------------------------- the search


@dataclass
class HotspotSearch:
    """What find_hotspots found: hot spots (largest first), refused candidates with reasons,
    the profile, and the measured forward time (ms)."""

    hotspots: list[Hotspot]
    skipped: list[Skipped]
    profile: ModelProfile
    forward_ms: float

    def __iter__(self):
        return iter(self.hotspots)

    def __len__(self) -> int:
        return len(self.hotspots)

    def __getitem__(self, index):
        return self.hotspots[index]

    def summary(self) -> str:
        lines = [f"forward: {self.forward_ms:.4g} ms; {len(self.hotspots)} hot spot(s)"]
        for h in self.hotspots:
            where = ", ".join(s.path or "(root)" for s in h.sites[:3])
            more = f" +{len(h.sites) - 3}" if len(h.sites) > 3 else ""
            lines.append(f"  {h.name}: {h.ms:.4g} ms ({h.share:.1%}) at {where}{more}")
        if self.skipped:
            lines.append("not candidates:")
            lines += [f"  {s}" for s in self.skipped]
        return "\n".join(lines)


def _overlaps(a: Site, b: Site) -> bool:
    def inside(inner: str, outer: str) -> bool:
        return outer == "" or inner == outer or inner.startswith(outer + ".")

    if a.kind == "chain" and b.kind == "chain" and a.path == b.path:
        return bool(set(a.node_names) & set(b.node_names))
    if a.kind == "chain" and b.kind == "chain":
        return False
    # a patched module (module/block) overlaps whatever lies inside it, and a chain that calls it
    for x, y in ((a, b), (b, a)):
        if x.kind != "chain" and inside(y.path, x.path):
            return True
        if x.kind != "chain" and y.kind == "chain":
            owner_children = {f"{y.path}.{n}" if y.path else n for n in _called_modules(y)}
            if any(inside(x.path, c) or inside(c, x.path) for c in owner_children):
                return True
    return False


def _called_modules(site: Site) -> list[str]:
    if site.graph is None:
        return []
    names = set(site.node_names)
    return [n.target for n in site.graph.nodes if n.name in names and n.op == "call_module"]


def _matches_target(hotspot: Hotspot, targets) -> bool:
    if callable(targets):
        return bool(targets(hotspot))
    for target in targets:
        for site in hotspot.sites:
            if site.path == target or site.path.startswith(target + "."):
                return True
            if target in (type(site.module).__name__, hotspot.kind) and site.kind != "chain":
                return True
            if target == hotspot.kind or target in hotspot.label:
                return True
    return False


def find_hotspots(
    model: nn.Module,
    example_inputs,
    *,
    targets: Sequence[str] | Callable[[Hotspot], bool] | None = None,
    min_share: float = MIN_SHARE,
    max_hotspots: int = MAX_HOTSPOTS,
    profile: ModelProfile | None = None,
) -> HotspotSearch:
    """Profile the model, form candidates, time them, keep the largest non-overlapping ones.

    targets: only hot spots at these module paths (or below), of these module class names,
    kinds ('module', 'chain', 'block') or with this text in their label; or a predicate.
    Raises HotspotError (naming what and why) when the forward fails or nothing qualifies."""
    args, kwargs = split_inputs(example_inputs)
    device = model_device(model, args, kwargs)
    try:
        profile = profile or profile_model(model, (*args,) if not kwargs else kwargs)
    except Exception as exc:
        raise HotspotError(
            f"{type(model).__name__} does not run on the example inputs: {_first_line(exc)}"
        ) from exc
    if kwargs and args:
        raise HotspotError("pass example inputs as a tuple of arguments or a dict, not both")
    with torch.no_grad():
        forward_ms = time_call(lambda: model(*args, **kwargs), device, target_ms=40.0)
    modules = dict(model.named_modules())
    floor = min_share / 2 if targets is None else 0.0
    wanted = [p for p in modules if profile.share(p) >= floor or (targets and p in profile.modules)]
    calls = capture_calls(model, args, kwargs, wanted)
    skipped: list[Skipped] = []
    candidates: list[Candidate] = []
    for path in wanted:
        module = modules[path]
        call = calls.get(path)
        if call is None:
            continue
        what = type(module).__name__
        is_leaf = not any(True for _ in module.children())
        try:
            if _is_torch_leaf(module):
                if isinstance(module, (*_TRANSPARENT_MODULES, *_DROPOUT_MODULES)):
                    continue
                if getattr(module, "inplace", False) is True:
                    skipped.append(Skipped(path, what, "works in place on its input"))
                    continue
                candidates.append(_module_site(path, module, call))
                continue
            if not isinstance(module, (nn.ModuleList, nn.ModuleDict)):
                try:
                    candidates.append(_block_site(path, module, call))
                except NotExtractable as exc:
                    if is_leaf:
                        raise
                    if "weighted" not in str(exc) and "too large" not in str(exc):
                        skipped.append(Skipped(path, what + " as a block", str(exc)))
            if not is_leaf:
                found, refused = _chain_sites(path, module, call)
                candidates += found
                skipped += [Skipped(path, what, reason) for reason in refused]
        except NotExtractable as exc:
            skipped.append(Skipped(path, what, str(exc)))
    # merge identical problems, check each problem once, time each site
    groups: dict[str, Hotspot] = {}
    for candidate in candidates:
        key = problem_hash(candidate.source)
        if key not in groups:
            try:
                check_problem(candidate, device)
            except NotExtractable as exc:
                skipped.append(Skipped(candidate.site.path, candidate.site.label, str(exc)))
                continue
            groups[key] = Hotspot(
                name=candidate.site.label, kind=candidate.site.kind, label=candidate.site.label,
                problem_source=candidate.source, sites=[],
            )  # fmt: skip
        groups[key].sites.append(candidate.site)
    for hotspot in groups.values():
        first = hotspot.sites[0]
        with torch.no_grad():
            first.ms = time_call(lambda s=first: s.run_original(s.inputs), device, target_ms=20)
        for site in hotspot.sites[1:]:
            site.ms = first.ms
        hotspot.share = min(1.0, hotspot.ms / forward_ms) if forward_ms > 0 else 0.0
    # Where candidates overlap, the fusion wins (a block over the chains in it, a chain over its
    # modules): it covers the same work, and timings of tiny modules are too noisy to decide.
    kind_rank = {"block": 0, "chain": 1, "module": 2}
    ranked = sorted(groups.values(), key=lambda h: (kind_rank[h.kind], -h.ms))
    if targets is not None:
        ranked = [h for h in ranked if _matches_target(h, targets)]
    else:
        ranked = [h for h in ranked if h.share >= min_share]
    chosen: list[Hotspot] = []
    taken: list[Site] = []
    for hotspot in ranked:
        sites = [s for s in hotspot.sites if not any(_overlaps(s, t) for t in taken)]
        if not sites:
            continue
        hotspot.sites = sites
        hotspot.share = min(1.0, hotspot.ms / forward_ms) if forward_ms > 0 else 0.0
        chosen.append(hotspot)
        taken += sites
    chosen = sorted(chosen, key=lambda h: -h.ms)[:max_hotspots]
    _name(chosen)
    if not chosen:
        why = "; ".join(str(s) for s in skipped[:8]) or "no module takes enough of the time"
        raise HotspotError(
            f"no hot spot found in {type(model).__name__}"
            + (f" matching targets={targets!r}" if targets is not None else "")
            + f" (min_share={min_share:g}): {why}",
            skipped,
        )
    return HotspotSearch(chosen, skipped, profile, forward_ms)


def _name(hotspots: list[Hotspot]) -> None:
    """Readable, unique names: the first site's path and the label."""
    seen: dict[str, int] = {}
    for hotspot in hotspots:
        site = hotspot.sites[0]
        base = f"{site.path or 'model'}: {hotspot.label}"
        count = seen.get(base, 0)
        seen[base] = count + 1
        hotspot.name = base if count == 0 else f"{base} #{count + 1}"


__all__ = [
    "Call",
    "Hotspot",
    "HotspotError",
    "HotspotSearch",
    "ModelProfile",
    "NotExtractable",
    "Site",
    "Skipped",
    "TensorSpec",
    "capture_calls",
    "check_problem",
    "classify",
    "find_chains",
    "find_hotspots",
    "init_arguments",
    "load_problem",
    "profile_model",
    "rebuild_output",
    "split_inputs",
    "time_call",
]
