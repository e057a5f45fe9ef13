"""Backward kernels for training: a hot spot's backward as a problem of its own.

A swapped hot spot without a backward of its own differentiates by recomputing the original
forward under autograd (cudaforge.model.hotspot_op), so in a training step it costs the kernel's
forward plus the original's forward and backward: slower than eager, however fast the kernel.
With training=True, optimize() therefore makes a second problem per hot spot, its backward:

    Model(*init).forward(*inputs, *grad_outputs) -> (grads of the floating-point inputs,
                                                     grads of the parameters)

computed by PyTorch's autograd in the reference. The Coder writes kernels for it like for any
problem and a worker verifies them the same way (the same harness, trials, tolerances, timing
against the reference). The reference recomputes the forward as the recompute path does, so
its speedup is the speedup over what the swap would otherwise run. A verified backward kernel is
given to the forward's swap as the candidate's `backward` (BackwardKernel), which the swap's
gradient check compares with autograd in this process before it is used.

The backward problem keeps the forward problem's text (its `Model` renamed `Forward`, its
`get_inputs` renamed `forward_inputs`), so that its parameters have the same names and are
drawn the same way; only problems cudaforge extracted are handled (a Model that names itself in
its body, as `super(Model, self)`, is refused).
"""

from __future__ import annotations

import inspect
import io
import re
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .codegen import NotExtractable, load_problem
from .hotspots import Hotspot, Skipped

SUFFIX = " (backward)"  # a backward hot spot's name is its forward's and this
KIND = "backward"


def backward_name(name: str) -> str:
    return name + SUFFIX


def forward_name(name: str) -> str:
    """The forward hot spot's name of a backward one's."""
    return name.removesuffix(SUFFIX)


@dataclass
class Interface:
    """What the backward problem takes and gives, worked out on the meta device."""

    inputs: list[str]  # the forward's argument names, in order
    input_float: list[bool]  # which inputs get a gradient
    input_specs: list[str]
    outputs: list[str]  # a name per floating-point output: its gradient's argument
    output_index: list[int]  # which of the forward's outputs those are
    output_specs: list[str]
    output_shapes: list[tuple[int, ...]]
    output_dtypes: list[torch.dtype]
    params: list[str]  # the parameters' names (named_parameters order)
    param_specs: list[str]


def _spec(t: Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"


def _names_model(source: str) -> int:
    """How many times the code (not strings or comments) names `Model`."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return sum(1 for t in tokens if t.type == tokenize.NAME and t.string == "Model")


def _flat(outputs) -> list:
    return list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]


def interface(problem_source: str) -> Interface:
    """The forward problem's inputs, outputs and parameters, from a run on the meta device.
    Raises NotExtractable where there is nothing to differentiate or no meta run."""
    if _names_model(problem_source) != 1:
        raise NotExtractable("its Model names itself in its code (e.g. super(Model, self))")
    module = load_problem(problem_source)
    try:
        with torch.device("meta"):
            model = module.Model(*module.get_init_inputs())
            inputs = list(module.get_inputs())
            outputs = _flat(model(*inputs))
    except Exception as exc:  # noqa: BLE001 - any failure means no backward problem
        raise NotExtractable(f"its forward does not run on the meta device: {exc}") from None
    signature = inspect.signature(module.Model.forward)
    names = [p for p in signature.parameters if p != "self"]
    if len(names) != len(inputs) or any(
        signature.parameters[n].kind not in (inspect.Parameter.POSITIONAL_ONLY,
                                             inspect.Parameter.POSITIONAL_OR_KEYWORD)
        for n in names
    ):  # fmt: skip
        raise NotExtractable("its forward's arguments are not one plain name per input")
    is_float = [isinstance(x, Tensor) and x.is_floating_point() for x in inputs]
    index = [i for i, o in enumerate(outputs) if isinstance(o, Tensor) and o.is_floating_point()]
    params = list(model.named_parameters())
    if not index:
        raise NotExtractable("it has no floating-point output to differentiate")
    if not any(is_float) and not params:
        raise NotExtractable("it has no floating-point input or parameter to differentiate")
    taken = set(names)
    grads = []
    for i in index:
        base = "grad_out" if len(index) == 1 else f"grad_out{i}"
        while base in taken:
            base = "_" + base
        taken.add(base)
        grads.append(base)
    return Interface(
        inputs=names, input_float=is_float,
        input_specs=[_spec(x) if isinstance(x, Tensor) else repr(x) for x in inputs],
        outputs=grads, output_index=index,
        output_specs=[_spec(outputs[i]) for i in index],
        output_shapes=[tuple(outputs[i].shape) for i in index],
        output_dtypes=[outputs[i].dtype for i in index],
        params=[n for n, _ in params], param_specs=[_spec(p) for _, p in params],
    )  # fmt: skip


def backward_problem(problem_source: str) -> str:
    """The KernelBench problem of the backward of `problem_source`'s forward (see the module's
    docstring). Raises NotExtractable with the reason where it cannot be made."""
    face = interface(problem_source)
    text, classes = _rename(problem_source, "class Model(", "class Forward(")
    text, functions = _rename(text, "def get_inputs(", "def forward_inputs(")
    if not classes or not functions:
        raise NotExtractable("its source has no top-level class Model and def get_inputs")
    floats = [n for n, f in zip(face.inputs, face.input_float) if f]
    returned = [f"the gradient of input {n}, {s}" for n, s, f in
                zip(face.inputs, face.input_specs, face.input_float) if f]  # fmt: skip
    returned += [
        f"the gradient of parameter {n}, {s}" for n, s in zip(face.params, face.param_specs)
    ]
    taken = [f"{n}: {s}" for n, s in zip(face.inputs, face.input_specs)]
    taken += [f"{g}: the gradient of output {i}, {s}" for g, i, s in
              zip(face.outputs, face.output_index, face.output_specs)]  # fmt: skip
    lines = ["", "", "class Model(Forward):"]
    lines.append(
        '    """The backward of Forward above (a training step\'s backward through it). Given'
    )
    lines.append(
        "    Forward's inputs and the gradients of its outputs, it returns, in this order:"
    )
    lines += [f"    - {r}" for r in returned]
    lines.append("    It takes:")
    lines += [f"    - {t}" for t in taken]
    lines.append(
        "    The reference recomputes Forward with autograd; ModelNew may recompute what it"
    )
    lines.append(
        "    needs of the forward: only the inputs are kept from it. Parameters as in Forward"
    )
    lines.append('    (same names, same order of creation)."""')
    lines.append("")
    lines.append(f"    def forward(self, {', '.join(face.inputs + face.outputs)}):")
    lines.append("        with torch.enable_grad():")
    for n in floats:
        lines.append(f"            {n} = {n}.detach().requires_grad_(True)")
    lines.append(f"            outputs = Forward.forward(self, {', '.join(face.inputs)})")
    lines.append("            outputs = list(outputs) if isinstance(outputs, (tuple, list)) "
                 "else [outputs]")  # fmt: skip
    picked = ", ".join(f"outputs[{i}]" for i in face.output_index)
    lines.append(f"            wanted = [{', '.join(floats + ['*self.parameters()'])}]")
    lines.append(f"            found = torch.autograd.grad([{picked}], wanted, "
                 f"[{', '.join(face.outputs)}], allow_unused=True)")  # fmt: skip
    lines.append("        return tuple(torch.zeros_like(w) if g is None else g "
                 "for w, g in zip(wanted, found))")  # fmt: skip
    lines += ["", "", "def get_inputs():", "    return forward_inputs() + ["]
    for shape, dtype in zip(face.output_shapes, face.output_dtypes):
        lines.append(f"        torch.randn({tuple(shape)!r}, dtype={dtype}),")
    lines += ["    ]", ""]
    return text.rstrip() + "\n" + "\n".join(lines)


def backward_hotspot(hotspot: Hotspot) -> Hotspot:
    """The hot spot of `hotspot`'s backward: the same sites, the backward problem. Raises
    NotExtractable."""
    return Hotspot(
        name=backward_name(hotspot.name), kind=KIND, label=f"backward of {hotspot.label}",
        problem_source=backward_problem(hotspot.problem_source), sites=hotspot.sites,
    )  # fmt: skip


def with_backward(hotspots: Sequence[Hotspot], skipped: list[Skipped]) -> list[Hotspot]:
    """The hot spots and each one's backward hot spot, where one can be made; for the others, the
    reason joins `skipped`."""
    found = list(hotspots)
    for hotspot in hotspots:
        try:
            found.append(backward_hotspot(hotspot))
        except NotExtractable as exc:
            path = hotspot.sites[0].path if hotspot.sites else ""
            skipped.append(
                Skipped(path, backward_name(hotspot.label), f"no backward problem: {exc}")
            )
    return found


def settle(outcome, result, forward) -> None:
    """A backward hot spot's outcome once its forward's swap is done: 'swapped' where a site of
    the forward's uses the kernel (it passed the gradient check there; the forward may run its
    original code, where its kernel was slower here), else 'refused' with why.
    Its times are the worker's (the backward runs only in a training step)."""
    outcome.before_ms, outcome.after_ms = result.reference_ms, result.candidate_ms
    if forward is None or not (forward.status == "swapped" or forward.forward_original):
        outcome.status = "refused"
        status = forward.status if forward is not None else "not found"
        outcome.detail = f"its forward's kernel is not swapped ({status})"
        return
    used = sum(1 for check in forward.checks if check.get("backward_kernel"))
    refused = [
        c["backward_kernel_refused"] for c in forward.checks if c.get("backward_kernel_refused")
    ]
    if used:
        outcome.status = "swapped"
        outcome.detail = f"used at {used} of {len(forward.checks)} site(s)"
        if refused:
            outcome.detail += f"; refused at others: {refused[0]}"
        return
    outcome.status = "refused"
    outcome.detail = refused[0] if refused else "the forward's swap did not check gradients"


class BackwardKernel:
    """A verified backward problem's ModelNew as a swapped candidate's `backward(grad_outputs,
    inputs)`: (gradients of the inputs, None where an input gets none; gradients of the
    parameters by their names in the problem). Not an nn.Module, so that setting it on the
    candidate does not register the backward's parameters (the same live tensors) twice."""

    def __init__(self, model: nn.Module, face: Interface, output_specs: Sequence):
        self.model = model
        self.face = face
        self.output_specs = list(output_specs)

    def __call__(self, grad_outputs, inputs):
        grads = []
        for i in self.face.output_index:
            g = grad_outputs[i] if i < len(grad_outputs) else None
            if g is None:  # an output the loss did not use
                spec = self.output_specs[i]
                g = torch.zeros(spec.shape, dtype=spec.dtype, device=spec.device)
            grads.append(g)
        found = iter(_flat(self.model(*inputs, *grads)))
        input_grads = [next(found) if f else None for f in self.face.input_float]
        return input_grads, {name: next(found) for name in self.face.params}


def attach_backward(swap, source: str, problem_source: str) -> None:
    """Give a swap's candidate the verified backward kernel `source` of `problem_source` (the
    backward problem). The swap's gradient check then compares it with autograd before it is
    used. A kernel that does not build is not used; why is said in the swap's check."""
    from .candidate import build_candidate
    from .swap_errors import SwapError

    try:
        face = interface(_forward_part(problem_source))
        model = build_candidate(source, problem_source, swap.site)
    except (SwapError, NotExtractable) as exc:
        swap.check.backward_kernel_refused = f"the backward kernel does not build: {exc}"
        return
    object.__setattr__(swap.candidate, "backward",
                       BackwardKernel(model, face, swap.site.output_specs))  # fmt: skip


def _forward_part(backward_source: str) -> str:
    """The forward problem a backward problem was made from (its first part, names restored)."""
    head = backward_source.split("\n\n\nclass Model(Forward):", 1)[0]
    head, _ = _rename(head, "class Forward(", "class Model(")
    return _rename(head, "def forward_inputs(", "def get_inputs(")[0] + "\n"


def _rename(text: str, old: str, new: str) -> tuple[str, int]:
    """`old` replaced by `new` where it starts a line, once: (text, 1 or 0)."""
    return re.subn("^" + re.escape(old), new, text, count=1, flags=re.MULTILINE)


__all__ = [
    "KIND",
    "SUFFIX",
    "BackwardKernel",
    "attach_backward",
    "backward_hotspot",
    "backward_name",
    "backward_problem",
    "forward_name",
    "interface",
    "settle",
    "with_backward",
]
