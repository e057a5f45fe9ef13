"""torch.fx tracing that specializes on observed shapes: each op also runs on the values of a
captured call (kept in node.meta['value']), and a shape query answers with the observed value, so
a forward that slices with `x.size(1)` still traces. Hot spots read their chains and blocks from
these graphs."""

from __future__ import annotations

import contextlib
import re
from typing import Any

import torch
from torch import fx, nn

from .call_template import CallTemplate
from .capture import Call
from .codegen import NotExtractable, TensorSpec
from .regions import is_torch_leaf, is_torch_nn

NOT_OBSERVED = object()  # node.meta['value'] of a node whose value tracing did not see

_SHAPE_ATTRS = frozenset({"shape", "ndim", "dtype", "device", "is_cuda", "layout", "is_sparse"})
_SHAPE_METHODS = frozenset(
    {"size", "dim", "numel", "nelement", "stride", "is_contiguous", "element_size", "get_device",
     "is_floating_point", "is_complex", "ndimension"}
)  # fmt: skip


class _ShapedProxy(fx.Proxy):
    """A proxy that knows its observed value: shape queries answer with the observed values,
    so tracing specializes on them instead of failing."""

    def _observed(self):
        return self.node.meta.get("value", NOT_OBSERVED)

    def __getattr__(self, name: str):
        value = self.node.meta.get("value", NOT_OBSERVED)
        if isinstance(value, torch.Tensor):
            if name in _SHAPE_ATTRS:
                return getattr(value, name)
            if name in _SHAPE_METHODS:
                return getattr(value, name)
        return super().__getattr__(name)

    def __len__(self):
        value = self._observed()
        if value is NOT_OBSERVED:
            return super().__len__()
        return len(value)

    def __iter__(self):
        value = self._observed()
        if isinstance(value, (tuple, list, torch.Tensor)):
            return iter([self[i] for i in range(len(value))])
        return super().__iter__()


class ShapeTracer(fx.Tracer):
    """torch.fx tracing that also runs each op on the observed values (node.meta['value']).

    shallow=True: every direct child of the traced module is a leaf (a module's own code),
    except, with inline=True, a stateless one (no weights, buffers or children: an activation
    module of the model's own, such as Hugging Face's SiLUActivation), whose ops join the
    forward's so that a chain can fuse them; else torch.nn's own modules are leaves and the
    others are traced through. A node's meta['inside'] names the modules (paths below the traced
    one) whose code it came from."""

    proxy_buffer_attributes = True

    def __init__(self, shallow: bool, inline: bool = False):
        super().__init__()
        self.shallow = shallow
        self.inline = inline
        self.inputs: dict[str, Any] = {}
        self.constants: dict[str, torch.Tensor] = {}
        self.template: CallTemplate | None = None
        self._traced: nn.Module | None = None
        self._wrapper: nn.Module | None = None  # while tracing: the root fx sees

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        if m is self._traced:
            return False
        if self.shallow:
            return not (self.inline and is_stateless(m))
        return is_torch_leaf(m)

    def call_module(self, m: nn.Module, forward, args, kwargs):
        """A module the traced one does not hold is traced through, like a function: fx cannot
        name it. Such modules are functions a library wrapped in a module object at import (the
        `kernels` package, which transformers 5.25 installs, does so to Llama's
        apply_rotary_pos_emb, and every Hugging Face attention layer calling it failed to trace
        with "module is not installed as a submodule")."""
        try:
            self.path_of_module(m)
        except NameError:
            return forward(*args, **kwargs)
        return super().call_module(m, forward, args, kwargs)

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return _ShapedProxy(node, self)

    def create_arg(self, a: Any):
        if (
            isinstance(a, torch.Tensor)
            and not isinstance(a, nn.Parameter)
            and self.tensor_attrs.get(a) is None
            and not any(a is b for b in self._scope().buffers())
        ):
            for name, known in self.constants.items():
                if known is a:
                    node = self.create_node("get_attr", name, (), {})
                    node.meta["value"] = a
                    return node
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
            node.meta["value"] = self.inputs.get(name, self.inputs.get(base, NOT_OBSERVED))
        elif kind == "call_function" and target in _SPECIALIZATION_CHECKS:
            node.meta["value"] = None
        elif kind != "output":
            node.meta["value"] = self._run(node)
        return proxy

    def _scope(self) -> nn.Module:
        """What node targets are relative to: the wrapper while tracing, then the module."""
        return self._wrapper if self._wrapper is not None else self._traced

    def _run(self, node: fx.Node):
        def value_of(n: fx.Node):
            value = n.meta.get("value", NOT_OBSERVED)
            if value is NOT_OBSERVED:
                raise NotExtractable(f"no observed value for {n.name}")
            return value

        args = fx.node.map_arg(node.args, value_of)
        kwargs = fx.node.map_arg(node.kwargs, value_of)
        scope = self._scope()
        if node.op == "get_attr":
            if node.target in self.constants:
                return self.constants[node.target]
            with _real_calls():
                return fetch_attribute(scope, node.target)
        if _mutates_input(node, scope) and args and isinstance(args[0], torch.Tensor):
            args = (args[0].clone(), *args[1:])  # keep the observed value of the input intact
        # fx patches Module.__call__ while it traces; the observed run needs the real one
        with _real_calls():
            if node.op == "call_module":
                return scope.get_submodule(node.target)(*args, **kwargs)
            if node.op == "call_method":
                return getattr(args[0], node.target)(*args[1:], **kwargs)
            return node.target(*args, **kwargs)

    def trace_call(self, module: nn.Module, call: Call) -> fx.Graph:
        """Trace module's forward as it was called: the call's tensors become the graph's
        placeholders (self.template says where each sat, nested in tuples and keywords too),
        every other argument is specialized to its observed value. Works for a forward that
        takes *args or **kwargs: the observed call is traced, not the signature. A tensor the
        computation never reads is dropped from the placeholders ("unused" in the template)."""
        template, tensors = CallTemplate.of(module.forward, call.args, call.kwargs)
        names = template.names
        self.inputs = dict(zip(names, tensors))
        wrapper = _observed_call(module, template)
        self._traced = module
        self._wrapper = wrapper
        with torch.no_grad():  # observed values without autograd history
            graph = self.trace(wrapper)
        _strip_prefix(graph, _INNER + ".")
        self._wrapper = None
        _drop_specialization_asserts(graph)
        unused = set()
        for index, node in enumerate(n for n in graph.nodes if n.op == "placeholder"):
            node.meta["value"] = self.inputs[node.target]
            node.meta["argument"] = node.target
            if not node.users:
                unused.add(index)
        for node in [n for n in graph.nodes if n.op == "placeholder" and not n.users]:
            graph.erase_node(node)
        specs = [TensorSpec.of(t) for t in tensors]
        self.template = template.drop_inputs(unused, specs)
        self.inputs = {n: self.inputs[n] for n in self.template.names}
        return graph


_INNER = "observed"


class _ObservedCall(nn.Module):
    """The module called as observed: forward(*tensors) fills the call template and calls it.
    fx traces this (its forward's parameters are the tensor inputs' names)."""

    def __init__(self, module: nn.Module, template: CallTemplate):
        super().__init__()
        self.add_module(_INNER, module)
        self.template = template

    def call_observed(self, tensors):
        args, kwargs = self.template.fill(tensors)
        return getattr(self, _INNER)(*args, **kwargs)


def _observed_call(module: nn.Module, template: CallTemplate) -> _ObservedCall:
    """An _ObservedCall whose forward takes one parameter per tensor input, by name."""
    names = template.names
    listed = "".join(f"{n}, " for n in names)
    source = f"def forward(self, {listed}):\n    return self.call_observed(({listed}))\n"
    namespace: dict[str, Any] = {}
    exec(compile(source, "<cudaforge observed call>", "exec"), namespace)  # noqa: S102
    cls = type("ObservedCall", (_ObservedCall,), {"forward": namespace["forward"]})
    return cls(module, template)


def _strip_prefix(graph: fx.Graph, prefix: str) -> None:
    """Targets relative to the traced module instead of its wrapper."""
    for node in graph.nodes:
        if node.op in ("get_attr", "call_module") and str(node.target).startswith(prefix):
            node.target = node.target[len(prefix) :]
            node._rename(node.target.replace(".", "_"))
        stack = node.meta.get("nn_module_stack") or {}
        paths = [str(v[0]) for v in stack.values() if isinstance(v, tuple) and v]
        inside = [p[len(prefix) :] for p in paths if p.startswith(prefix)]
        node.meta["inside"] = [
            p for p in inside if not (node.op == "call_module" and p == node.target)
        ]


def is_stateless(module: nn.Module) -> bool:
    """A module of the model's own with no weights, buffers or children: a function."""
    if is_torch_nn(type(module)) or next(module.children(), None) is not None:
        return False
    return next(module.parameters(), None) is None and next(module.buffers(), None) is None


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


def fetch_attribute(module: nn.Module, target: str):
    """The value at a dotted path below `module` ('block.attn.bias')."""
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


__all__ = ["NOT_OBSERVED", "ShapeTracer", "fetch_attribute", "is_stateless"]
