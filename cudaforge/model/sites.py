"""Sites: the places in a model where a hot spot's computation runs, each with the problem that
stands for it.

Three kinds of candidates are formed from a captured call:
- "module": a leaf torch.nn module (Linear, LayerNorm, Conv2d, MultiheadAttention, ...);
- "chain": fusable ops in one module's own forward, traced with its children as leaves
  (cudaforge.model.regions says which);
- "block": a whole module without weighted layers (a hand-written RMSNorm, GELU, attention
  core), traced through its children.
Each becomes a `Site` (what the swap needs to run and replace it) and a problem source, and
`check_problem` proves that the problem's Model, given the captured weights, reproduces the
site's output on the captured inputs.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn

from .call_template import CallTemplate
from .capture import Call
from .codegen import (
    NotExtractable,
    TensorSpec,
    argument_name,
    is_literal,
    load_problem,
    problem_source,
    python_name,
    snake_case,
    unique_name,
)
from .regions import (
    HEAVY_KINDS,
    MAX_BLOCK_NODES,
    MAX_HEAVY,
    MAX_LAYER_HEAVY,
    MAX_LAYER_NODES,
    Region,
    classify,
    find_chains,
    op_name,
)
from .tracing import NOT_OBSERVED, ShapeTracer, fetch_attribute


@dataclass
class Site:
    """One place in the model where a hot spot's computation runs.

    kind 'module'/'block': `module`'s whole forward; kind 'chain': some nodes of `module`'s own
    forward (the owner). `root` runs the original computation (see run_original) with the live
    parameters `tensors`, named `root_keys` in root and `problem_keys` in the problem's Model.
    `call` maps a call's arguments to the problem's inputs (cudaforge.model.call_template:
    which argument is the i-th tensor input, which values the problem specialized on)."""

    path: str
    kind: str
    label: str
    module: nn.Module
    root: nn.Module
    root_keys: list[str | None]
    problem_keys: list[str]
    tensors: list[torch.Tensor]
    call: CallTemplate
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
    owner_call: CallTemplate | None = None  # chain: how the owner was called
    owner_specs: list[TensorSpec] = field(default_factory=list)  # chain: the owner's inputs
    owner_training: bool = False
    inlined: list[str] = field(default_factory=list)  # chain: stateless modules whose ops it has
    ops: int = 0  # block/layer: its ops other than views

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
        return self.call.fill(inputs)

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
            elif value is None or is_literal(value):
                slots.append(("const", value))
            else:
                raise NotExtractable(f"returns a {type(value).__name__} inside its output")
        if "tensor" not in slots:
            raise NotExtractable("returns no tensor")
        return tuple(slots)
    raise NotExtractable(f"returns a {type(output).__name__}, not a tensor or tuple of tensors")


@dataclass
class Candidate:
    """A site and the problem source that stands for it, before the problem is checked."""

    site: Site
    source: str


# ---------------------------------------------------------------- building candidates


class _Holder(nn.Module):
    """The modules and tensors a region uses, under the names its problem gives them; shares
    them with the model."""


def _region_site(
    path: str, owner: nn.Module, graph: fx.Graph, region: Region, constants: dict, calls: int
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
        value = (
            constants[node.target]
            if node.target in constants
            else fetch_attribute(owner, node.target)
        )
        if isinstance(value, nn.Module):
            raise NotExtractable(f"uses the module {node.target} as a value")
        _hold_attribute(holder, node.target, value, names, taken)
    for node in external:
        if node.meta.get("value", NOT_OBSERVED) is NOT_OBSERVED:
            raise NotExtractable(f"no observed value for {node.name}")
        value = node.meta["value"]
        if not isinstance(value, torch.Tensor) and not is_literal(value):
            raise NotExtractable(f"takes a {type(value).__name__} ({node.name})")

    def build(problem: bool) -> tuple[fx.Graph, CallTemplate]:
        out = fx.Graph()
        env: dict[fx.Node, Any] = {}
        slots: list[tuple] = []
        tensor_names: list[str] = []
        argument_names: set[str] = set()
        for node in external:
            value = node.meta["value"]
            if isinstance(value, torch.Tensor):
                env[node] = out.placeholder(argument_name(node.name, argument_names))
                slots.append(("input", len(tensor_names)))
                tensor_names.append(env[node].name)
            elif problem:
                env[node] = value
            else:
                env[node] = out.placeholder(argument_name(node.name, argument_names))
                slots.append(("const", value))
        for node in attributes:
            env[node] = out.get_attr(names[node.target])
        for node in region.nodes:
            env[node] = _copy_node(out, node, env, names)
        out.output(env[region.output])
        return out, CallTemplate(tuple(slots), {}, tensor_names)

    problem_graph, _ = build(True)
    runtime_graph, template = build(False)
    ops = [op_name(n, owner) for n in region.nodes if classify(n, owner) != "view"]
    label = " -> ".join(ops) if ops else op_name(region.anchor, owner)
    inputs = [n.meta["value"] for n in external if isinstance(n.meta["value"], torch.Tensor)]
    output = region.output.meta["value"]
    runtime = fx.GraphModule(holder, runtime_graph)
    site = _make_site(path, "chain", label, owner, runtime, holder, template, inputs, output, calls)
    site.node_names = [n.name for n in region.nodes]
    site.inlined = sorted({p for n in region.nodes for p in n.meta.get("inside", ())})
    site.graph = graph
    site.external = [n.name for n in external]
    site.output_name = region.output.name
    site.constants = dict(constants)
    site.owner_training = owner.training
    source = problem_source(holder, problem_graph, f"cudaforge hot spot (chain): {label}", inputs)
    return Candidate(site, source)


def _hold_attribute(holder: nn.Module, target: str, value, names: dict[str, str], taken: set[str]):
    """Registers a get_attr's value on the problem's holder (a parameter stays a parameter),
    under a free Python name that `names[target]` then gives."""
    label = target.replace("_cf_constant_", "constant_")
    names[target] = unique_name(python_name(label), taken)
    if isinstance(value, nn.Parameter):
        holder.register_parameter(names[target], value)
    else:
        holder.register_buffer(names[target], value)


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
    text = python_name(target)
    if text.startswith("m_") and target.split(".")[-1].isdigit():
        text = f"{snake_case(type(module).__name__)}_{target.split('.')[-1]}"
    return unique_name(text, taken)


def _make_site(path, kind, label, module, root, holder, call, inputs, output,
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
        problem_keys=keys, tensors=tensors, call=call,
        inputs=list(inputs), input_specs=[TensorSpec.of(t) for t in inputs], outputs=outputs,
        output_specs=[TensorSpec.of(t) for t in outputs], structure=structure, calls=calls,
    )  # fmt: skip


def _named_tensors(module: nn.Module):
    yield from module.named_parameters(remove_duplicate=False)
    yield from module.named_buffers(remove_duplicate=False)


def module_site(path: str, module: nn.Module, call: Call) -> Candidate:
    """A leaf torch.nn module, called as observed -> its site and problem."""
    cls = type(module)
    holder = _Holder()
    child = snake_case(cls.__name__)
    holder.add_module(child, module)
    signature = inspect.signature(type(module).forward)
    try:
        signature.bind(module, *call.args, **call.kwargs)
    except TypeError as exc:
        raise NotExtractable(f"the captured call does not fit forward{signature}: {exc}")
    template, inputs = CallTemplate.of(module.forward, call.args, call.kwargs)
    graph = fx.Graph()
    taken: set[str] = set()
    placeholders = [graph.placeholder(argument_name(n, taken)) for n in template.names]
    args, kwargs = template.fill(placeholders)
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
        path, "module", cls.__name__, module, module, holder, template, inputs,
        call.output, call.count,
    )  # fmt: skip
    label = f"cudaforge hot spot (module): {cls.__name__}"
    return Candidate(site, problem_source(holder, graph, label, inputs))


def block_site(path: str, module: nn.Module, call: Call) -> Candidate:
    """A module traced through its children (torch.nn's own modules stay calls), as called ->
    its site and problem: kind "block" without weighted layers and at most MAX_HEAVY heavy ops
    (a hand-written norm, GELU, attention core), kind "layer" otherwise (an attention or decoder
    layer with its projections) up to MAX_LAYER_HEAVY heavy ops and MAX_LAYER_NODES ops."""
    tracer = ShapeTracer(shallow=False)
    try:
        graph = tracer.trace_call(module, call)
    except NotExtractable:
        raise
    except Exception as exc:  # noqa: BLE001 (fx raises many kinds)
        raise NotExtractable(f"torch.fx cannot trace it: {error_line(exc)}") from None
    kinds = [
        classify(n, module)
        for n in graph.nodes
        if n.op in ("call_module", "call_function", "call_method")
    ]
    if not kinds or all(k == "view" for k in kinds):
        raise NotExtractable("does no computation")
    if "random" in kinds:
        raise NotExtractable("is random in this mode (dropout or batch norm in training)")
    calls = [n for n in graph.nodes if n.op.startswith("call") and classify(n, module) != "view"]
    if len(calls) == 1 and calls[0].op == "call_module":
        raise NotExtractable(f"only calls {calls[0].target} (a candidate of its own)")
    heavy = sum(k in HEAVY_KINDS for k in kinds)
    kind = "layer" if "weighted" in kinds or heavy > MAX_HEAVY else "block"
    if kind == "block" and len(kinds) > MAX_BLOCK_NODES:
        raise NotExtractable(f"too large for one kernel ({len(kinds)} ops)")
    if kind == "layer" and (heavy > MAX_LAYER_HEAVY or len(kinds) > MAX_LAYER_NODES):
        raise NotExtractable(
            f"too large for one problem ({heavy} matmuls/convolutions/attentions, {len(kinds)} "
            f"ops; at most {MAX_LAYER_HEAVY} and {MAX_LAYER_NODES})"
        )
    output_node = next(n for n in graph.nodes if n.op == "output")
    _check_same(output_node, call.output)
    holder = _Holder()
    taken: set[str] = set()
    argument_names: set[str] = set()
    names: dict[str, str] = {}
    problem_graph = fx.Graph()
    env: dict[fx.Node, Any] = {}
    inputs: list[torch.Tensor] = []
    for node in graph.nodes:
        if node.op == "placeholder":
            argument = node.meta.get("argument", node.target)
            env[node] = problem_graph.placeholder(argument_name(argument, argument_names))
            inputs.append(node.meta["value"])
        elif node.op == "get_attr":
            value = (
                tracer.constants[node.target]
                if node.target in tracer.constants
                else fetch_attribute(module, node.target)
            )
            if isinstance(value, nn.Module):
                raise NotExtractable(f"uses the module {node.target} as a value")
            _hold_attribute(holder, node.target, value, names, taken)
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
    ops = [op_name(n, module) for n in graph.nodes if n.op.startswith("call")]
    if kind == "block":
        label = f"{type(module).__name__} ({', '.join(dict.fromkeys(ops))})"
    else:
        heavy_ops = [op_name(n, module) for n in graph.nodes
                     if n.op.startswith("call") and classify(n, module) in HEAVY_KINDS]  # fmt: skip
        label = f"{type(module).__name__} [{', '.join(dict.fromkeys(heavy_ops))}]"
    site = _make_site(
        path, kind, label, module, module, holder, tracer.template, inputs, call.output,
        call.count,
    )  # fmt: skip
    site.ops = len(calls)
    source = problem_source(
        holder, problem_graph, f"cudaforge hot spot ({kind}): {type(module).__name__}", inputs
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
    traced = fx.node.map_arg(output_node.args[0], lambda n: n.meta.get("value", NOT_OBSERVED))
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


def error_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def chain_sites(path: str, owner: nn.Module, call: Call) -> tuple[list[Candidate], list[str]]:
    """The fusable chains of `owner`'s own forward, as called; its stateless child modules (a
    model's own activation functions) traced into it where that works, else left as calls."""
    for inline in (True, False):
        tracer = ShapeTracer(shallow=True, inline=inline)
        try:
            graph = tracer.trace_call(owner, call)
            break
        except NotExtractable:
            if inline:
                continue
            raise
        except Exception as exc:  # noqa: BLE001
            if inline:
                continue
            raise NotExtractable(f"torch.fx cannot trace its forward: {error_line(exc)}") from None
    random = any(
        classify(n, owner) == "random"
        for n in graph.nodes
        if n.op in ("call_module", "call_function", "call_method")
    )
    if not random:  # with dropout active the traced run draws other numbers than the real one
        _check_same(next(n for n in graph.nodes if n.op == "output"), call.output)
    owner_specs = [TensorSpec.of(v) for v in tracer.inputs.values()]
    found, refused = [], []
    for region in find_chains(graph, owner):
        try:
            candidate = _region_site(path, owner, graph, region, tracer.constants, call.count)
        except NotExtractable as exc:
            refused.append(f"{op_name(region.anchor, owner)} chain: {exc}")
            continue
        candidate.site.owner_call = tracer.template
        candidate.site.owner_specs = owner_specs
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
        raise NotExtractable(f"its generated problem does not run: {error_line(exc)}") from None
    got_list = [got] if isinstance(got, torch.Tensor) else list(got)
    if not _same_values(got_list, site.outputs):
        raise NotExtractable("its generated problem does not reproduce the module's output")


__all__ = [
    "Candidate",
    "Site",
    "block_site",
    "chain_sites",
    "check_problem",
    "error_line",
    "flatten_output",
    "module_site",
    "rebuild_output",
]
