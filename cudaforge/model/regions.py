"""What each op of a traced forward does, and the fusable regions among them.

`classify` names a node's kind: a view, an elementwise op or reduction, a norm, a softmax, a
matmul of activations, a layer with weights, an attention, a random op, or opaque. `find_chains`
grows regions around anchors: a matmul/conv/norm with its elementwise epilogue (Linear+GELU,
Conv+BatchNorm+ReLU), an attention core (matmul, scale, mask, softmax, matmul),
scaled_dot_product_attention with the views that feed it, runs of elementwise ops. A region has
one tensor output and can become one call.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import fx, nn

MAX_HEAVY = 2  # matmuls/convs/attentions in one chain or block
MAX_BLOCK_NODES = 40
# a layer (a module with weighted layers extracted whole): a Llama decoder layer has 8 heavy ops
# (q, k, v, o, attention, gate, up, down) and about 60 others
MAX_LAYER_HEAVY = 8
MAX_LAYER_NODES = 160


def is_torch_nn(cls: type) -> bool:
    module = getattr(cls, "__module__", "") or ""
    return module.startswith(("torch.nn.", "torch.ao.nn."))


def is_torch_leaf(module: nn.Module) -> bool:
    """A torch.nn module other than a container: one call in a traced graph, one candidate."""
    containers = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
    return is_torch_nn(type(module)) and not isinstance(module, containers)


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
DROPOUT_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)
TRANSPARENT_MODULES = (nn.Identity, nn.Flatten, nn.Unflatten)
MODE_SENSITIVE_MODULES = (
    nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm, *DROPOUT_MODULES,
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


def op_name(node: fx.Node, root: nn.Module) -> str:
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
        if not is_torch_leaf(module):
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
        if isinstance(module, DROPOUT_MODULES):
            return "random" if module.training and module.p > 0 else "view"
        if isinstance(module, TRANSPARENT_MODULES):
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


HEAVY_KINDS = ("mm", "weighted", "attention")


# ---------------------------------------------------------------- regions (chains)


@dataclass
class Region:
    nodes: list[fx.Node]  # in graph order
    output: fx.Node
    anchor: fx.Node


def _tensor_users(node: fx.Node) -> list[fx.Node]:
    return list(node.users)


def _is_tensor_node(node: fx.Node) -> bool:
    return isinstance(node.meta.get("value"), torch.Tensor)


def _inputs_of(node: fx.Node) -> list[fx.Node]:
    return [n for n in node.all_input_nodes if n.op not in ("get_attr",)]


def find_chains(graph: fx.Graph, root: nn.Module) -> list[Region]:
    """Fusable regions in one traced forward (see the module docstring)."""
    order = {node: i for i, node in enumerate(graph.nodes)}
    kinds = {
        node: classify(node, root)
        for node in graph.nodes
        if node.op in ("call_module", "call_function", "call_method")
    }
    claimed: set[fx.Node] = set()
    regions: list[Region] = []

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


def _finish(region: set[fx.Node], anchor, kinds, order) -> Region | None:
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
    if sum(kinds[n] in HEAVY_KINDS for n in region) > MAX_HEAVY:
        return None
    if any(kinds[n] in ("random", "opaque") for n in region):
        return None
    for node in region:
        if node.op != "call_module" and _mutates_first_arg_outside(node, region):
            return None
    if _leaves_and_returns(region, order):
        return None
    nodes = sorted(region, key=order.__getitem__)
    return Region(nodes, output, anchor)


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


__all__ = [
    "DROPOUT_MODULES",
    "HEAVY_KINDS",
    "MAX_BLOCK_NODES",
    "MAX_HEAVY",
    "MAX_LAYER_HEAVY",
    "MAX_LAYER_NODES",
    "MODE_SENSITIVE_MODULES",
    "TRANSPARENT_MODULES",
    "Region",
    "classify",
    "find_chains",
    "is_torch_leaf",
    "is_torch_nn",
    "op_name",
]
