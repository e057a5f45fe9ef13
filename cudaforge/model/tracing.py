"""torch.fx tracing that specializes on observed shapes: each op also runs on the values of a
captured call (kept in node.meta['value']), and a shape query answers with the observed value, so
a forward that slices with `x.size(1)` still traces. Hot spots read their chains and blocks from
these graphs."""

from __future__ import annotations

import contextlib
import inspect
import re
from typing import Any

import torch
from torch import fx, nn

from .capture import Call
from .codegen import NotExtractable, is_literal
from .regions import is_torch_leaf

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
        return is_torch_leaf(m)

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
            node.meta["value"] = self.inputs.get(name, self.inputs.get(base, NOT_OBSERVED))
        elif kind == "call_function" and target in _SPECIALIZATION_CHECKS:
            node.meta["value"] = None
        elif kind != "output":
            node.meta["value"] = self._run(node)
        return proxy

    def _run(self, node: fx.Node):
        def value_of(n: fx.Node):
            value = n.meta.get("value", NOT_OBSERVED)
            if value is NOT_OBSERVED:
                raise NotExtractable(f"no observed value for {n.name}")
            return value

        args = fx.node.map_arg(node.args, value_of)
        kwargs = fx.node.map_arg(node.kwargs, value_of)
        if node.op == "get_attr":
            if node.target in self.constants:
                return self.constants[node.target]
            with _real_calls():
                return fetch_attribute(self._traced, node.target)
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
            if not is_literal(value):
                raise NotExtractable(f"argument {key!r} is a {type(value).__name__}")
        with torch.no_grad():  # observed values without autograd history
            graph = self.trace(module, concrete_args=concrete or None)
        _drop_specialization_asserts(graph)
        for node in graph.nodes:
            if node.op == "placeholder":
                name = node.target
                base = name[:-2] if name.endswith("_1") and name[:-2] in arguments else name
                node.meta["value"] = arguments.get(base, node.meta.get("value", NOT_OBSERVED))
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


__all__ = ["NOT_OBSERVED", "ShapeTracer", "fetch_attribute"]
