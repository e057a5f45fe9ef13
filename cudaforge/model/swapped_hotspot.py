"""A swapped hot spot: a verified kernel in place of one site, its state (on or off, the counts
since the swap, the evidence from swap time) and its forward.

Each call is checked against what was verified: the arguments the problem specialized on, every
input's shape, dtype, device and layout, the parameters' too, and the training/eval mode of the
modules whose behaviour depends on it. Any difference runs the original PyTorch code instead, with
a FallbackWarning the first time (the reason is in `.stats`). In eager mode, when no gradient is
needed, the candidate is called directly (the dispatcher's overhead is larger than a small
kernel), and a call that autograd records goes through hotspot_op.EagerHotspot, an
autograd.Function; under torch.compile, and for calls only the full check accepts, through the
custom op (cudaforge.model.hotspot_op).

Shadow checking (verify_every=N): call 1, N+1, 2N+1, ... also run the original and compare; a
kernel that drifts is switched off for good with a DriftWarning and the call returns the original's
result. Not done inside torch.compile (it would recompile on the counter) nor while a CUDA graph is
captured (the comparison synchronizes).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor, fx, nn

from .candidate import build_candidate
from .codegen import TensorSpec, device_index
from .compile_view import in_compiled_view
from .hotspot_op import EagerHotspot, bypassed, bypassing, recompute_gradients, register
from .owner_forward import OwnerForward, forward_code, forward_signature
from .site_graphs import LIMIT, SIGHTINGS, SiteGraphs, capturing
from .sites import Site, rebuild_output
from .swap_compare import compare, original_in_fp32
from .swap_errors import DriftWarning, FallbackWarning, SwapError
from .tracing import fetch_attribute as _fetch


@dataclass
class SwapStats:
    """Counts since the swap. fallbacks: calls that ran the original; reason: the last why."""

    kernel_calls: int = 0
    op_calls: int = 0  # runs of the custom ops' Python (torch.compile; none in a graph replay)
    fallbacks: int = 0
    grad_originals: int = 0  # calls autograd recorded, run as the original (no backward kernel)
    shadow_checks: int = 0
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SwapCheck:
    """Evidence from swap time: trials on the captured inputs (trial 0) and fresh random ones,
    the worst error seen, the gradient check, and the in-process timing (ms)."""

    trials: int = 0
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    rel_l2: float = 0.0
    atol: float = 0.0
    rtol: float = 0.0
    gradient_checked: bool = False
    gradient_max_abs_err: float | None = None
    backward_kernel: bool = False
    backward_kernel_refused: str = ""
    original_ms: float | None = None  # queued behind a busy GPU: its own time, as in a forward
    kernel_ms: float | None = None
    original_alone_ms: float | None = None  # called alone on an idle GPU: launch overhead in
    kernel_alone_ms: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def speedup(self) -> float | None:
        if self.original_ms and self.kernel_ms:
            return self.original_ms / self.kernel_ms
        return None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "speedup": self.speedup}


_MODE_MODULES = (
    nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm,
    nn.modules.dropout._DropoutNd, nn.MultiheadAttention, nn.RNNBase,
)  # fmt: skip


def _mode_modules(site: Site) -> list[nn.Module]:
    """Modules whose training flag changes what the verified code computes."""
    found = [site.module]
    if site.kind == "chain":
        called = [
            _fetch(site.module, n.target) for n in _chain_nodes(site) if n.op == "call_module"
        ]
    else:
        called = list(site.module.modules())
    found += [m for m in called if isinstance(m, _MODE_MODULES) and m is not site.module]
    return found


def _chain_nodes(site: Site) -> list[fx.Node]:
    names = set(site.node_names)
    return [n for n in site.graph.nodes if n.name in names] if site.graph is not None else []


class SwappedHotspot:
    """A verified kernel in place of one site (installed as the module's forward, or called by
    its owner's rewritten forward for a chain). Calling it runs the kernel when the call matches
    what was verified, else the original."""

    def __init__(
        self,
        site: Site,
        candidate: nn.Module,
        *,
        name: str = "",
        source: str = "",
        problem_source: str = "",
        verify_every: int = 0,
        tolerance: float | None = None,
    ):
        self.site = site
        self.candidate = candidate
        self.name = name or f"{site.path or 'model'}: {site.label}"
        self.source = source
        self.problem_source = problem_source
        self.verify_every = int(verify_every or 0)
        self.tolerance = tolerance
        self.bound = list(site.tensors)
        self.param_specs = [TensorSpec.of(t) for t in site.tensors]
        self.trainable = [isinstance(t, nn.Parameter) for t in site.tensors]  # not buffers
        self.modes = [(m, m.training) for m in _mode_modules(site)]
        self.enabled = True
        self.off_reason = ""
        self.stats = SwapStats()
        self.warned = False
        self.use_backward_kernel = False
        # True: the kernel's forward lost in this process but its backward kernel won; calls
        # that autograd records run the original forward and the backward kernel, others the
        # original alone
        self.forward_original = False
        # True (swapped with training=True): calls that autograd records run the original
        # unless the backward kernel is used
        self.original_under_grad = False
        # False: while torch.compile traces the model, the original code runs instead, for
        # Inductor to fuse (under_compile.choose_under_compile decides)
        self.under_compile = True
        # True (optimize(for_compile=True)): verified on the calls torch.compile's graph makes
        # (compile_view); an eager call that differs runs the original without a warning
        self.compile_only = False
        self.check = SwapCheck()
        self.original_forward = None  # module/block: the forward it replaced
        self.previous = None  # module/block: an instance forward that was there before
        self.owner_forward: OwnerForward | None = None  # chain
        self._fast_ready: bool | None = None  # prepared at the first call
        self._output_strides: list[tuple[int, ...]] | None = None  # _laid_out's, at first use
        self.graphs: SiteGraphs | None = None  # use_graphs(): inference calls from CUDA graphs
        self.handle = register(self)

    @property
    def __code__(self):  # torch.export reads the forward's code object for its messages
        return forward_code(self.original_forward)

    @property
    def __signature__(self):
        return forward_signature(self.original_forward)

    def __repr__(self) -> str:
        state = "on" if self.enabled else f"off ({self.off_reason})"
        return f"SwappedHotspot({self.name!r}, {state}, calls={self.stats.kernel_calls})"

    def __deepcopy__(self, memo):
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            if key in ("candidate", "graphs"):
                continue
            setattr(new, key, copy.deepcopy(value, memo))
        # a candidate may hold compiled kernels that do not copy: it is rebuilt on the copy's
        # tensors at its first call (the copied model is not complete yet here)
        new.candidate = None
        new._fast_ready = None
        new.graphs = None  # graphs hold this model's memory: the copy captures its own
        if self.graphs is not None:
            new.use_graphs(limit=self.graphs.limit, sightings=self.graphs.sightings)
        new.handle = register(new)
        return new

    # ------------------------------------------------------------ calls

    def original(self, *args, **kwargs):
        """The original computation for a call."""
        if self.site.kind == "chain":
            return self.site.root(*args, **kwargs)
        return self.original_forward(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        if bypassing() or (not self.under_compile and torch.compiler.is_compiling()):
            return self.original(*args, **kwargs)
        if self.enabled and not torch.compiler.is_compiling():
            # eager fast path: the verified call, no autograd wanted, the candidate called directly
            inputs = self._fast_match(args, kwargs)
            if inputs is not None:
                if not (torch.is_grad_enabled() and self._wants_grad(inputs)):
                    if self.forward_original:
                        return self.original(*args, **kwargs)
                    return self._fast_run(inputs, args, kwargs)
                if self.original_under_grad and not self.use_backward_kernel:
                    self.stats.grad_originals += 1  # see the same case below
                    return self.original(*args, **kwargs)
                if _plain(inputs):
                    return self._fast_grad_run(list(inputs), args, kwargs)
        inputs, reason = self._match(args, kwargs) if self.enabled else (None, self.off_reason)
        tensors = None
        if inputs is not None:
            tensors, reason = self._tensors()
        if reason:
            self.fell_back(reason)
            return self.original(*args, **kwargs)
        compiling = torch.compiler.is_compiling()
        needs_grad = torch.is_grad_enabled() and (
            any(t.requires_grad for t in inputs) or any(t.requires_grad for t in tensors)
        )
        if (
            needs_grad
            and self.original_under_grad
            and not self.use_backward_kernel
            and not compiling
        ):
            # swapped for training without a backward kernel: the backward pass would recompute
            # the original, so a training step would cost the kernel's forward on top of eager's;
            # the original runs, recorded by autograd as in eager
            self.stats.grad_originals += 1
            return self.original(*args, **kwargs)
        if self.forward_original and not needs_grad:
            return self.original(*args, **kwargs)
        if compiling and not needs_grad:  # the op with less host time per call
            outputs = torch.ops.cudaforge.hotspot_infer(self.handle, inputs, tensors)
        elif compiling or needs_grad or not _plain(inputs):
            outputs = torch.ops.cudaforge.hotspot(self.handle, inputs, tensors)
        else:
            outputs = self.run_kernel(inputs, tensors)
        if compiling:
            return rebuild_output(outputs, self.site.structure)
        return self._counted(inputs, tensors, outputs, args, kwargs)

    def _prepare_fast(self) -> None:
        """What _fast_match compares, precomputed: (shape, dtype, device index, layout) per
        input and parameter, and where each parameter lives in its module."""
        site = self.site
        self._simple = site.call.plain
        self._inputs_fast = [
            (torch.Size(s.shape), s.dtype, device_index(s.device), s.contiguous, s.stride)
            for s in site.input_specs
        ]
        self._params_fast = [
            (torch.Size(s.shape), s.dtype, device_index(s.device)) for s in self.param_specs
        ]
        slots = []
        for key, tensor in zip(site.root_keys, self.bound):
            slot = None
            if site.kind != "chain" and key is not None:
                path, _, name = key.rpartition(".")
                owner = site.root.get_submodule(path) if path else site.root
                table = owner._parameters if name in owner._parameters else owner._buffers
                slot = (table, name)
            slots.append((slot, tensor))
        self._slots = slots
        self._fast_ready = all(x[2] is not None for x in self._inputs_fast + self._params_fast)

    def _fast_match(self, args, kwargs):
        """The inputs when the call is exactly the verified one (else None: the full check
        then says why)."""
        if not self._fast_ready:
            if self._fast_ready is None:
                self._prepare_fast()
            if not self._fast_ready:
                return None
        if kwargs or not self._simple or len(args) != len(self._inputs_fast):
            return None
        for t, (shape, dtype, device, contiguous, stride) in zip(args, self._inputs_fast):
            if type(t) is not Tensor or t.dtype is not dtype or t.shape != shape:
                return None
            if t.get_device() != device:
                return None
            if not (t.is_contiguous() if contiguous else t.stride() == stride):
                return None
        for (slot, bound), (shape, dtype, device) in zip(self._slots, self._params_fast):
            if slot is not None and slot[0].get(slot[1]) is not bound:
                return None  # replaced: the full check looks at the new one
            if bound.dtype is not dtype or bound.shape != shape or bound.get_device() != device:
                return None
        for module, training in self.modes:
            if module.training is not training:
                return None
        return args

    def _wants_grad(self, inputs) -> bool:
        return any(t.requires_grad for t in inputs) or any(t.requires_grad for t in self.bound)

    def _fast_run(self, inputs, args, kwargs):
        if self.graphs is not None:
            outputs = self.graphs(list(inputs), self.bound)
            return self._counted(list(inputs), self.bound, outputs, args, kwargs)
        if self.candidate is None:
            self.run_kernel(list(inputs), self.bound)  # builds it (a deep copy's first call)
        output = self.candidate(*inputs)
        outputs = self._laid_out([output] if isinstance(output, Tensor) else list(output))
        return self._counted(list(inputs), self.bound, outputs, args, kwargs)

    def _fast_grad_run(self, inputs, args, kwargs):
        """A verified call that autograd records, in eager mode: EagerHotspot, not the custom
        op (the same forward and backward, less host time per call)."""
        outputs = list(EagerHotspot.apply(self, len(inputs), *inputs, *self.bound))
        return self._counted(inputs, self.bound, outputs, args, kwargs)

    def _counted(self, inputs, tensors, outputs, args, kwargs):
        """A kernel call's outputs as the original returns them, counted; on a shadow-check
        call (verify_every), the original's result instead where the kernel drifted."""
        self.stats.kernel_calls += 1
        every = self.verify_every
        shadow = every and (self.stats.kernel_calls - 1) % every == 0 and not _capturing()
        if shadow and not self._shadow_check(inputs, tensors, outputs):
            return self.original(*args, **kwargs)
        return rebuild_output(outputs, self.site.structure)

    def _match(self, args, kwargs) -> tuple[list[Tensor] | None, str]:
        site = self.site
        inputs, why = site.call.match(args, kwargs, site.input_specs)
        if inputs is None:
            return None, why
        for module, training in self.modes:
            if module.training != training:
                mode = "training" if module.training else "eval"
                return None, f"{type(module).__name__} is in {mode} mode (verified in the other)"
        return inputs, ""

    def _tensors(self) -> tuple[list[Tensor] | None, str]:
        """The site's parameters as they are now (a module may have had them replaced)."""
        site = self.site
        if site.kind == "chain":
            tensors = self.bound
        else:
            tensors = [
                _fetch(site.root, key) if key is not None else bound
                for key, bound in zip(site.root_keys, self.bound)
            ]
        for key, tensor, spec in zip(site.problem_keys, tensors, self.param_specs):
            if not isinstance(tensor, Tensor):
                return None, f"parameter {key} is gone"
            why = spec.mismatch(tensor)
            if why:
                return None, f"parameter {key} is {why}"
        return tensors, ""

    def fell_back(self, reason: str) -> None:
        if torch.compiler.is_compiling():
            return
        self.stats.fallbacks += 1
        self.stats.reason = reason
        if not self.warned and not (self.compile_only and not in_compiled_view()):
            self.warned = True
            warnings.warn(
                f"cudaforge: {self.name}: {reason}; running the original PyTorch code for such "
                "calls (this warning is shown once per hot spot)",
                FallbackWarning,
                stacklevel=4,
            )

    def run_kernel(self, inputs: list[Tensor], tensors: list[Tensor]) -> list[Tensor]:
        """The candidate on these inputs and parameters -> output tensors laid out as the
        original's (_laid_out)."""
        if self.forward_original:
            with torch.no_grad(), bypassed():
                outputs = self.site.run_original(inputs, self._original_tensors(tensors))
            taken = {t.untyped_storage().data_ptr() for t in list(inputs) + list(tensors)}
            # the custom op's outputs may not alias its inputs
            return [o.clone() if o.untyped_storage().data_ptr() in taken else o for o in outputs]
        candidate = self.candidate
        if candidate is None:
            candidate = self.candidate = build_candidate(
                self.source, self.problem_source, self.site
            )
            self.bound = list(self.site.tensors)
            self._fast_ready = None
        if len(tensors) == len(self.bound) and all(a is b for a, b in zip(tensors, self.bound)):
            output = candidate(*inputs)
        else:
            swapped = dict(zip(self.site.problem_keys, tensors))
            output = torch.func.functional_call(candidate, swapped, tuple(inputs), strict=False)
        return self._laid_out([output] if isinstance(output, Tensor) else list(output))

    def run_inference(self, inputs: list[Tensor], tensors: list[Tensor]) -> list[Tensor]:
        """run_kernel for a call that autograd does not record: replayed from a CUDA graph
        where use_graphs() is on and the call's tensors were captured (cudaforge.model.
        site_graphs)."""
        if self.graphs is not None:
            return self.graphs(inputs, tensors)
        return self.run_kernel(inputs, tensors)

    def use_graphs(self, on: bool = True, *, limit: int | None = None,
                   sightings: int | None = None) -> None:  # fmt: skip
        """Inference calls replayed from CUDA graphs (on), or not (off: their memory is freed).
        limit: graphs at most; sightings: calls with the same tensors before one is captured
        (ValueError unless both are at least 1)."""
        for name, value in (("limit", limit), ("sightings", sightings)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"site graphs: {name} must be a whole number >= 1, got {value!r}")
        if self.graphs is not None:
            self.graphs.release()
            self.graphs = None
        if on:
            self.graphs = SiteGraphs(
                self.run_kernel, self._replay_problem,
                limit=LIMIT if limit is None else limit,
                sightings=SIGHTINGS if sightings is None else sightings,
            )  # fmt: skip

    def _replay_problem(self, actual: list[Tensor], expected: list[Tensor]) -> str:
        return compare(actual, expected, self.tolerance)[1]

    def _laid_out(self, outputs: list[Tensor]) -> list[Tensor]:
        """Each output in the memory layout of the original's (output_layout): a channels_last
        output stays channels_last. Forcing every output contiguous copied a ResNet chain's
        64x256x56x56 output on the H200 (its kernel read 0.41 ms in the model against 0.07 ms
        in the worker) and handed NCHW tensors to the layers after it."""
        specs = self.site.output_specs
        if self._output_strides is None:  # once per swap: this runs on every kernel call
            self._output_strides = [output_layout(spec) for spec in specs]
        laid = []
        for i, o in enumerate(outputs):
            fits = i < len(specs) and tuple(o.shape) == specs[i].shape
            want = self._output_strides[i] if fits else None
            if want is None:
                laid.append(o if o.is_contiguous() else o.contiguous())
            elif o.stride() == want:
                laid.append(o)
            else:
                laid.append(torch.empty_strided(o.shape, want, dtype=o.dtype,
                                                device=o.device).copy_(o))  # fmt: skip
        return laid

    def _shadow_check(self, inputs, tensors, outputs) -> bool:
        with torch.no_grad(), bypassed():
            expected = self.site.run_original(inputs, self._original_tensors(tensors))
            expected32 = original_in_fp32(self.site, inputs, expected, tensors)
        self.stats.shadow_checks += 1
        _, problem = compare([o.detach() for o in outputs], expected, self.tolerance, expected32)
        if not problem:
            return True
        self.enabled = False
        self.off_reason = f"switched off after a shadow check: {problem}"
        self.stats.reason = self.off_reason
        warnings.warn(
            f"cudaforge: {self.name}: the kernel drifted from the original ({problem}); it is "
            "switched off and the original PyTorch code runs from now on",
            DriftWarning,
            stacklevel=4,
        )
        return False

    def _original_tensors(self, tensors):
        same = all(a is b for a, b in zip(tensors, self.bound))
        return None if same else tensors

    # ------------------------------------------------------------ autograd

    def gradients(self, grads, inputs, params):
        """Gradients of the inputs and parameters for the outputs' gradients `grads`."""
        if self.use_backward_kernel:
            return self._kernel_gradients(grads, inputs, params)
        return recompute_gradients(self.site, grads, inputs, params, self.trainable)

    def _kernel_gradients(self, grads, inputs, params):
        with torch.no_grad():
            input_grads, param_grads = self.candidate.backward(list(grads), list(inputs))
        input_grads = list(input_grads)
        by_name = dict(param_grads or {})
        return input_grads, [by_name.get(key) for key in self.site.problem_keys]

    # ------------------------------------------------------------ installing

    def install(self) -> None:
        site = self.site
        if site.kind == "chain":
            owner = site.module
            current = owner.__dict__.get("forward")
            if isinstance(current, SwappedHotspot):
                raise SwapError(f"{site.path or 'the model'} is already swapped as a whole")
            if not isinstance(current, OwnerForward):
                current = OwnerForward(owner, site)
                object.__setattr__(owner, "forward", current)
            current.add(self)
            return
        module = site.module
        current = module.__dict__.get("forward")
        if isinstance(current, (SwappedHotspot, OwnerForward)):
            raise SwapError(
                f"{site.path or 'the model'} is already swapped; cudaforge.restore(model) first"
            )
        self.previous = current
        self.original_forward = module.forward
        object.__setattr__(module, "forward", self)

    def uninstall(self) -> None:
        if self.graphs is not None:
            self.graphs.release()
        site = self.site
        if site.kind == "chain":
            if self.owner_forward is not None:
                self.owner_forward.remove(self)
            return
        module = site.module
        if module.__dict__.get("forward") is self:
            if self.previous is None:
                del module.__dict__["forward"]
            else:
                object.__setattr__(module, "forward", self.previous)


def output_layout(spec) -> tuple[int, ...]:
    """The strides an output like the original's gets: the original's own where they are dense
    and non-overlapping (channels_last, say), else contiguous (torch.empty_like's
    preserve_format rule, which the custom op's fake outputs follow too)."""
    meta = torch.empty_strided(spec.shape, spec.stride, dtype=spec.dtype, device="meta")
    return tuple(torch.empty_like(meta).stride())


def output_orders(site) -> tuple | None:
    """Per output of the site, the dimensions (outermost first) of the memory the model keeps
    it in where that is not contiguous, else None; None when every output is contiguous. The
    harness's EvalOptions.output_orders: a kernel's output in another layout is copied after
    every call (_laid_out), and the timed forward then includes that copy."""
    orders = []
    for spec in site.output_specs:
        shape, kept = tuple(spec.shape), output_layout(spec)
        order = tuple(sorted(range(len(shape)), key=lambda d: -kept[d]))
        orders.append(None if order == tuple(range(len(shape))) else order)
    return tuple(orders) if any(o is not None for o in orders) else None


def layout_notes(site) -> str:
    """For the prompts (run_loop's notes): each output the model keeps in a layout other than
    contiguous (output_orders), and how to allocate it so."""
    lines = []
    for i, (spec, order) in enumerate(zip(site.output_specs, output_orders(site) or ())):
        if order is None:
            continue
        shape = tuple(spec.shape)
        memory = tuple(shape[d] for d in order)
        back = tuple(order.index(d) for d in range(len(shape)))
        dtype = str(spec.dtype).replace("torch.", "")
        lines.append(
            f"- Output {i}, {dtype}{list(shape)}, is kept with strides {output_layout(spec)}, as "
            f"the reference's own output is. An output in another layout is copied into that one "
            f"after every call in the model (the harness times that copy as part of the call): "
            f"allocate it as torch.empty({memory}, ...).permute{back} and write it in place."
        )
    return "\n".join(lines)


def _capturing() -> bool:
    """True while a CUDA graph is being captured (a comparison would synchronize)."""
    return torch.cuda.is_available() and capturing()


def _plain(tensors: Sequence[Tensor]) -> bool:
    return all(type(t) in (Tensor, nn.Parameter) for t in tensors)


__all__ = ["SwapCheck", "SwapStats", "SwappedHotspot"]
