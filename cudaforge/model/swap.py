"""Putting verified kernels into a model, and taking them out again.

A swap patches a module's `forward` on the instance (its class, parameters, state_dict keys and
hooks are untouched): for a "module" or "block" hot spot, the module's own forward; for a
"chain", the forward of the module whose code holds the chain, replaced by its traced graph in
which the chain's nodes became one call. `restore(model)` deletes those instance attributes.

Each call of a swapped site is checked against what was verified: the arguments the problem
specialized on, every input's shape, dtype, device and layout, the parameters' too, and the
training/eval mode of the modules whose behaviour depends on it. Any difference runs the original
PyTorch code instead, with a FallbackWarning the first time (the reason is in `.stats`).

The kernel runs as the custom op `cudaforge::hotspot(handle, inputs, params) -> outputs`, so
torch.compile, CUDA graphs and torch.export see one opaque op with a fake implementation (the
original run on fake tensors gives the output shapes). In eager mode, when no gradient is needed,
the candidate is called directly (the dispatcher's overhead is larger than a small kernel).
Autograd: backward recomputes the original op and differentiates it (so gradients are the
original's), or calls the candidate's own `backward` when it has one and it passed the gradient
check. A candidate's `backward(self, grad_outputs, inputs)` returns (gradients of the inputs, in
order; a dict of gradients of the parameters by their names in the problem).

Shadow checking (verify_every=N): call 1, N+1, 2N+1, ... also run the original and compare; a
kernel that drifts is switched off for good with a DriftWarning and the call returns the original's
result. Not done inside torch.compile (it would recompile on the counter) nor while a CUDA graph is
captured (the comparison synchronizes).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import inspect
import itertools
import linecache
import math
import sys
import types
import warnings
import weakref
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor, fx, nn

from ..errors import CudaforgeError, VerificationError
from ..harness.compare import aliases, tensor_difference
from ..harness.options import Tolerances, tolerance_of
from .codegen import TensorSpec, load_problem
from .sites import Site, rebuild_output
from .timing import time_call
from .tracing import fetch_attribute as _fetch


class FallbackWarning(UserWarning):
    """A swapped site ran the original code for a call it was not verified for."""


class DriftWarning(UserWarning):
    """A shadow check found a kernel's output different from the original's; it was switched
    off."""


class SwapError(CudaforgeError):
    """A candidate cannot be put into the model (the message says why)."""


# ---------------------------------------------------------------- the custom op

_swaps: weakref.WeakValueDictionary[int, SwappedHotspot] = weakref.WeakValueDictionary()
_handles = itertools.count(1)
_bypass_depth = 0  # > 0 while originals run (fake impl, recompute, checks): no kernels then


@contextlib.contextmanager
def bypassed():
    """Swapped sites run their original code inside this block."""
    global _bypass_depth
    _bypass_depth += 1
    try:
        yield
    finally:
        _bypass_depth -= 1


def _register(swap: SwappedHotspot) -> int:
    handle = next(_handles)
    _swaps[handle] = swap
    return handle


def _lookup(handle: int) -> SwappedHotspot:
    swap = _swaps.get(handle)
    if swap is None:
        raise SwapError(f"no swapped hot spot has handle {handle} (restored or garbage collected)")
    return swap


@torch.library.custom_op("cudaforge::hotspot", mutates_args=())
def hotspot(handle: int, inputs: list[Tensor], params: list[Tensor]) -> list[Tensor]:
    """Run swapped hot spot `handle`'s kernel on its inputs and parameters."""
    return _lookup(handle).run_kernel(list(inputs), list(params))


@hotspot.register_fake
def _hotspot_fake(handle, inputs, params):
    swap = _lookup(handle)
    with bypassed():
        outputs = swap.site.run_original(list(inputs), list(params))
    return [torch.empty_like(o, memory_format=torch.contiguous_format) for o in outputs]


def _hotspot_setup(ctx, inputs, output) -> None:
    handle, tensors, params = inputs
    ctx.handle = handle
    ctx.count = len(tensors)
    ctx.save_for_backward(*tensors, *params)


def _hotspot_backward(ctx, grads):
    saved = ctx.saved_tensors
    inputs, params = list(saved[: ctx.count]), list(saved[ctx.count :])
    input_grads, param_grads = _lookup(ctx.handle).gradients(list(grads), inputs, params)
    return None, input_grads, param_grads


hotspot.register_autograd(_hotspot_backward, setup_context=_hotspot_setup)


# ---------------------------------------------------------------- comparing outputs


def tolerances(dtype: torch.dtype, tolerance: float | None = None) -> tuple[float, float, float]:
    """(atol, rtol, relative L2 bound) for dtype, from the harness's one tolerance table; a float
    `tolerance` sets atol = rtol (the bound then 10x it, never below the table's)."""
    return tolerance_of(Tolerances.uniform(tolerance), dtype)


@dataclass
class Difference:
    """How far one output is from the expected one."""

    index: int
    max_abs_err: float
    max_rel_err: float
    rel_l2: float
    message: str = ""


def compare(actual: Sequence[Tensor], expected: Sequence[Tensor], tolerance=None):
    """(worst Difference, problem or '') of outputs against the expected ones, by the harness's
    definition of a correct value (cudaforge.harness.compare)."""
    if len(actual) != len(expected):
        return None, f"{len(actual)} outputs, expected {len(expected)}"
    tables = Tolerances.uniform(tolerance)
    worst = Difference(-1, 0.0, 0.0, 0.0)
    for i, (a, e) in enumerate(zip(actual, expected)):
        if not isinstance(a, Tensor):
            return None, f"output {i} is a {type(a).__name__}, not a tensor"
        if a.shape != e.shape or a.dtype != e.dtype or a.device != e.device:
            return None, (
                f"output {i} is {a.dtype}{list(a.shape)} on {a.device}, expected "
                f"{e.dtype}{list(e.shape)} on {e.device}"
            )
        found = tensor_difference(a.detach(), e.detach(), tables)
        if found.nonfinite:  # NaN or Inf where the expected value is finite
            found.max_abs_err = found.max_rel_err = found.rel_l2_err = math.inf
        if found.max_abs_err > worst.max_abs_err or worst.index < 0:
            worst = Difference(i, found.max_abs_err, found.max_rel_err, found.rel_l2_err)
        if not found.ok:
            worst = Difference(
                i, found.max_abs_err, found.max_rel_err, found.rel_l2_err, found.message
            )
            return worst, f"output {i}: {found.message}"
    return worst, ""


# ---------------------------------------------------------------- candidates


def build_candidate(source: str, problem_source: str, site: Site) -> nn.Module:
    """Instantiate a candidate's ModelNew like the problem's Model and bind it to the site's live
    parameters and buffers (by the problem's names). Raises SwapError."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    name = f"cudaforge_swapped_{digest}"
    filename = f"<cudaforge kernel {digest}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    module = sys.modules.get(name)
    if module is None:
        module = types.ModuleType(name, "a verified cudaforge candidate")
        module.__file__ = filename
        sys.modules[name] = module  # pickling and dataclasses look classes up there
        try:
            exec(compile(source, filename, "exec"), module.__dict__)  # noqa: S102
        except Exception as exc:
            sys.modules.pop(name, None)
            raise SwapError(f"the candidate does not load: {type(exc).__name__}: {exc}") from exc
    model_new = getattr(module, "ModelNew", None)
    if model_new is None:
        raise SwapError("the candidate defines no ModelNew")
    problem = load_problem(problem_source)
    device = _site_device(site)
    try:
        with torch.device(device):
            candidate = model_new(*problem.get_init_inputs())
    except Exception as exc:
        raise SwapError(f"ModelNew(...) failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(candidate, nn.Module):
        raise SwapError("ModelNew(...) is not an nn.Module")
    if not site.module.training:
        candidate.eval()
    bind(candidate, site.problem_keys, site.tensors)
    return candidate


def _site_device(site: Site) -> torch.device:
    for tensor in list(site.inputs) + list(site.tensors):
        return tensor.device
    return torch.device("cpu")


def bind(candidate: nn.Module, keys: Sequence[str], tensors: Sequence[Tensor]) -> None:
    """Make the candidate's parameters/buffers named `keys` the given (live) tensors."""
    for key, tensor in zip(keys, tensors):
        path, _, name = key.rpartition(".")
        try:
            owner = candidate.get_submodule(path) if path else candidate
        except AttributeError:
            raise SwapError(f"ModelNew has no submodule {path!r} (for {key!r})") from None
        if name in owner._parameters:
            slot, table = owner._parameters[name], owner._parameters
            value = tensor if isinstance(tensor, nn.Parameter) else nn.Parameter(tensor, False)
        elif name in owner._buffers:
            slot, table, value = owner._buffers[name], owner._buffers, tensor
        else:
            raise SwapError(
                f"ModelNew has no parameter or buffer {key!r} (it must create them like Model)"
            )
        if slot is not None and tuple(slot.shape) != tuple(tensor.shape):
            raise SwapError(
                f"ModelNew's {key!r} has shape {tuple(slot.shape)}, the model's {tuple(tensor.shape)}"
            )
        table[name] = value


# ---------------------------------------------------------------- a swapped site


@dataclass
class SwapStats:
    """Counts since the swap. fallbacks: calls that ran the original; reason: the last why."""

    kernel_calls: int = 0
    fallbacks: int = 0
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
    original_ms: float | None = None
    kernel_ms: float | None = None
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


def _same_constant(a, b) -> bool:
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return False
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return type(a) is type(b) and bool(a == b) or (a is b)
    except Exception:  # noqa: BLE001
        return False


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
        self.check = SwapCheck()
        self.original_forward = None  # module/block: the forward it replaced
        self.previous = None  # module/block: an instance forward that was there before
        self.owner_forward: OwnerForward | None = None  # chain
        self._fast_ready: bool | None = None  # prepared at the first call
        self.handle = _register(self)

    @property
    def __code__(self):  # torch.export reads the forward's code object for its messages
        return _code_of(self.original_forward)

    @property
    def __signature__(self):
        return _signature_of(self.original_forward)

    def __repr__(self) -> str:
        state = "on" if self.enabled else f"off ({self.off_reason})"
        return f"SwappedHotspot({self.name!r}, {state}, calls={self.stats.kernel_calls})"

    def __deepcopy__(self, memo):
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            if key == "candidate":
                continue
            setattr(new, key, copy.deepcopy(value, memo))
        # a candidate may hold compiled kernels that do not copy: it is rebuilt on the copy's
        # tensors at its first call (the copied model is not complete yet here)
        new.candidate = None
        new._fast_ready = None
        new.handle = _register(new)
        return new

    # ------------------------------------------------------------ calls

    def original(self, *args, **kwargs):
        """The original computation for a call."""
        if self.site.kind == "chain":
            return self.site.root(*args, **kwargs)
        return self.original_forward(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        if _bypass_depth:
            return self.original(*args, **kwargs)
        if self.enabled and not torch.compiler.is_compiling():
            # eager fast path: the verified call, no autograd wanted, the candidate called directly
            inputs = self._fast_match(args, kwargs)
            if inputs is not None and not (torch.is_grad_enabled() and self._wants_grad(inputs)):
                return self._fast_run(inputs, args, kwargs)
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
        if compiling or needs_grad or not _plain(inputs):
            outputs = torch.ops.cudaforge.hotspot(self.handle, inputs, tensors)
        else:
            outputs = self.run_kernel(inputs, tensors)
        if not compiling:
            self.stats.kernel_calls += 1
            every = self.verify_every
            shadow = every and (self.stats.kernel_calls - 1) % every == 0 and not _capturing()
            if shadow and not self._shadow_check(inputs, tensors, outputs):
                return self.original(*args, **kwargs)
        return rebuild_output(outputs, self.site.structure)

    def _prepare_fast(self) -> None:
        """What _fast_match compares, precomputed: (shape, dtype, device index, layout) per
        input and parameter, and where each parameter lives in its module."""
        site = self.site
        simple = not site.kw_template and len(site.template) == len(site.input_specs)
        self._simple = simple and all(
            kind == "input" and index == i for i, (kind, index) in enumerate(site.template)
        )
        self._inputs_fast = [
            (torch.Size(s.shape), s.dtype, _device_index(s.device), s.contiguous, s.stride)
            for s in site.input_specs
        ]
        self._params_fast = [
            (torch.Size(s.shape), s.dtype, _device_index(s.device)) for s in self.param_specs
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
        if self.candidate is None:
            self.run_kernel(list(inputs), self.bound)  # builds it (a deep copy's first call)
        output = self.candidate(*inputs)
        if isinstance(output, Tensor):
            outputs = [output if output.is_contiguous() else output.contiguous()]
        else:
            outputs = [o if o.is_contiguous() else o.contiguous() for o in output]
        self.stats.kernel_calls += 1
        every = self.verify_every
        shadow = every and (self.stats.kernel_calls - 1) % every == 0 and not _capturing()
        if shadow and not self._shadow_check(list(inputs), self.bound, outputs):
            return self.original(*args, **kwargs)
        return rebuild_output(outputs, self.site.structure)

    def _match(self, args, kwargs) -> tuple[list[Tensor] | None, str]:
        site = self.site
        if len(args) != len(site.template) or kwargs.keys() != site.kw_template.keys():
            return None, "called with other arguments than the verified call"
        inputs: list[Any] = [None] * len(site.input_specs)
        pairs = list(zip(args, site.template))
        pairs += [(kwargs[key], slot) for key, slot in site.kw_template.items()]
        for value, (kind, expected) in pairs:
            if kind == "input":
                if not isinstance(value, Tensor):
                    return None, f"input {expected} is a {type(value).__name__}"
                inputs[expected] = value
            elif not _same_constant(value, expected):
                return None, f"an argument is {value!r} (verified with {expected!r})"
        for index, (tensor, spec) in enumerate(zip(inputs, site.input_specs)):
            why = spec.mismatch(tensor)
            if why:
                return None, f"input {index} is {why}"
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
        if not self.warned:
            self.warned = True
            warnings.warn(
                f"cudaforge: {self.name}: {reason}; running the original PyTorch code for such "
                "calls (this warning is shown once per hot spot)",
                FallbackWarning,
                stacklevel=4,
            )

    def run_kernel(self, inputs: list[Tensor], tensors: list[Tensor]) -> list[Tensor]:
        """The candidate on these inputs and parameters -> contiguous output tensors."""
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
        outputs = [output] if isinstance(output, Tensor) else list(output)
        return [o if o.is_contiguous() else o.contiguous() for o in outputs]

    def _shadow_check(self, inputs, tensors, outputs) -> bool:
        with torch.no_grad(), bypassed():
            expected = self.site.run_original(inputs, self._original_tensors(tensors))
        self.stats.shadow_checks += 1
        _, problem = compare([o.detach() for o in outputs], expected, self.tolerance)
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


def _code_of(forward):
    code = getattr(forward, "__code__", None)
    return code if code is not None else _code_of.__code__


def _signature_of(forward):
    try:
        return inspect.signature(forward)
    except (TypeError, ValueError):
        return inspect.Signature(
            [
                inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
                inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD),
            ]
        )


def _device_index(device: torch.device) -> int | None:
    """Tensor.get_device()'s answer for this device (-1 on the CPU); None: another kind."""
    if device.type == "cpu":
        return -1
    if device.type == "cuda":
        return device.index if device.index is not None else torch.cuda.current_device()
    return None


def _capturing() -> bool:
    """True while a CUDA graph is being captured (a comparison would synchronize)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _plain(tensors: Sequence[Tensor]) -> bool:
    return all(type(t) in (Tensor, nn.Parameter) for t in tensors)


def recompute_gradients(site: Site, grads, inputs, params, trainable=None):
    """Backward by recomputing the original with autograd: (input grads, parameter grads).
    trainable[i] False: params[i] is a buffer (no gradient)."""
    trainable = trainable if trainable is not None else [True] * len(params)
    with torch.enable_grad(), bypassed():
        ins = [_leaf(t) for t in inputs]
        ps = [_leaf(t) if train else t.detach() for t, train in zip(params, trainable)]
        outputs = site.run_original(ins, ps)
        pairs = [
            (o, g if g is not None else torch.zeros_like(o))
            for o, g in zip(outputs, grads)
            if isinstance(o, Tensor) and o.requires_grad
        ]
        wanted = [t for t in ins + ps if t.requires_grad]
        found = (
            torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs],
                                allow_unused=True)
            if pairs and wanted
            else [None] * len(wanted)
        )  # fmt: skip
    it = iter(found)
    every = [next(it) if t.requires_grad else None for t in ins + ps]
    return every[: len(ins)], every[len(ins) :]


def _leaf(t: Tensor) -> Tensor:
    leaf = t.detach()
    if leaf.is_floating_point() or leaf.is_complex():
        leaf.requires_grad_(True)
    return leaf


class _SiteCall(nn.Module):
    """The call of a swapped chain inside its owner's rewritten graph."""

    def __init__(self, swap: SwappedHotspot):
        super().__init__()
        self.swap = swap

    def forward(self, *args):
        return self.swap(*args)


class OwnerForward:
    """The forward of a module whose code holds swapped chains: its traced graph with each chain
    replaced by one call, run when the module is called as it was traced (same argument shapes,
    dtypes and devices, same non-tensor arguments, same mode), else its original forward."""

    def __init__(self, owner: nn.Module, site: Site):
        self.owner = owner
        self.previous = owner.__dict__.get("forward")
        self.original_forward = owner.forward
        self.graph = site.graph
        self.constants = dict(site.constants)
        self.arguments = list(site.owner_arguments)
        self.training = site.owner_training
        self.swaps: list[SwappedHotspot] = []
        self.module: fx.GraphModule | None = None
        self.warned = False

    @property
    def __code__(self):
        return _code_of(self.original_forward)

    @property
    def __signature__(self):
        return _signature_of(self.original_forward)

    def add(self, swap: SwappedHotspot) -> None:
        if swap.site.graph is not self.graph:
            raise SwapError(f"{swap.name}: traced from another call of {swap.site.path}")
        self.swaps.append(swap)
        swap.owner_forward = self
        self._rebuild()

    def remove(self, swap: SwappedHotspot) -> None:
        if swap in self.swaps:
            self.swaps.remove(swap)
            swap.owner_forward = None
        if self.swaps:
            self._rebuild()
        else:
            self.uninstall()

    def uninstall(self) -> None:
        if self.owner.__dict__.get("forward") is self:
            if self.previous is None:
                del self.owner.__dict__["forward"]
            else:
                object.__setattr__(self.owner, "forward", self.previous)
        for swap in self.swaps:
            swap.owner_forward = None
        self.swaps = []

    def _rebuild(self) -> None:
        graph = fx.Graph()
        copies: dict[fx.Node, fx.Node] = {}
        result = graph.graph_copy(self.graph, copies)
        graph.output(result)
        by_name = {old.name: new for old, new in copies.items()}
        root: dict[str, Any] = {}
        for index, swap in enumerate(self.swaps):
            site = swap.site
            target = f"cudaforge_hotspot_{index}"
            last = by_name[site.output_name]
            with graph.inserting_after(last):
                call = graph.call_module(target, tuple(by_name[n] for n in site.external))
            last.replace_all_uses_with(call, delete_user_cb=lambda user, c=call: user is not c)
            for name in reversed(site.node_names):
                node = by_name[name]
                if node.users:
                    raise SwapError(f"{swap.name}: node {name} is still used after the swap")
                graph.erase_node(node)
            by_name[site.output_name] = call
            root[target] = _SiteCall(swap)
        for node in graph.nodes:
            node.meta.pop("value", None)  # observed values: not needed any more
            if node.op in ("get_attr", "call_module") and node.target not in root:
                if node.target in self.constants:
                    root[node.target] = self.constants[node.target]
                else:
                    root[node.target] = _fetch(self.owner, node.target)
        graph.lint()
        self.module = fx.GraphModule(root, graph, class_name=f"{type(self.owner).__name__}Swapped")

    def __call__(self, *args, **kwargs):
        if not _bypass_depth:
            values, reason = self._match(args, kwargs)
            if values is not None:
                return self.module(*values)
            if not torch.compiler.is_compiling():
                for swap in self.swaps:
                    swap.fell_back(f"its module was called differently ({reason})")
        return self.original_forward(*args, **kwargs)

    def _match(self, args, kwargs):
        if self.owner.training != self.training:
            return None, "in the other training/eval mode"
        if len(args) + len(kwargs) != len(self.arguments):
            return None, "with other arguments"
        values = list(args)
        for name, _ in self.arguments[len(args) :]:
            if name not in kwargs:
                return None, f"without argument {name!r}"
            values.append(kwargs[name])
        for value, (name, (kind, expected)) in zip(values, self.arguments):
            if kind == "tensor":
                if not isinstance(value, Tensor):
                    return None, f"{name} is not a tensor"
                if value.shape != expected.shape or value.dtype != expected.dtype:
                    return None, f"{name} is {value.dtype}{list(value.shape)}"
                if value.device != expected.device:
                    return None, f"{name} is on {value.device}"
            elif not _same_constant(value, expected):
                return None, f"{name} = {value!r}"
        return values, ""


# ---------------------------------------------------------------- checks at swap time


def random_like(tensors: Sequence[Tensor], seed: int) -> list[Tensor]:
    """Fresh random tensors with the same shapes, dtypes, devices and strides."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    made = []
    for t in tensors:
        if t.is_floating_point():
            values = torch.randn(t.shape, generator=generator, dtype=torch.float32)
        elif t.dtype == torch.bool:
            values = torch.rand(t.shape, generator=generator) < 0.5
        else:
            low = int(t.min()) if t.numel() else 0
            high = int(t.max()) + 1 if t.numel() else 1
            values = torch.randint(low, max(high, low + 1), t.shape, generator=generator)
        out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
        out.copy_(values.to(t.dtype))
        made.append(out)
    return made


def verify(swap: SwappedHotspot, *, trials: int = 3, tolerance: float | None = None) -> SwapCheck:
    """Check the bound candidate against the original on the captured inputs and trials - 1
    sets of fresh random ones; raises VerificationError with the first difference."""
    site = swap.site
    check = swap.check
    sets = [list(site.inputs)] + [random_like(site.inputs, seed) for seed in range(1, trials)]
    for trial, inputs in enumerate(sets):
        with torch.no_grad(), bypassed():
            expected = site.run_original(inputs)
        with torch.no_grad():
            try:
                actual = swap.run_kernel(inputs, list(site.tensors))
            except Exception as exc:
                raise VerificationError(
                    f"{swap.name}: the kernel raised on trial {trial}: {type(exc).__name__}: {exc}",
                    trial=trial,
                ) from exc
        if aliases(actual, list(inputs) + list(site.tensors)):
            raise VerificationError(f"{swap.name}: an output shares memory with an input", trial)
        worst, problem = compare(actual, expected, tolerance)
        if problem:
            raise VerificationError(
                f"{swap.name}: trial {trial}: {problem}",
                trial=trial,
                max_abs_err=worst.max_abs_err if worst else float("nan"),
                index=worst.index if worst else None,
            )
        if worst is not None and worst.index >= 0:
            check.max_abs_err = max(check.max_abs_err, worst.max_abs_err)
            check.max_rel_err = max(check.max_rel_err, worst.max_rel_err)
            check.rel_l2 = max(check.rel_l2, worst.rel_l2)
    dtype = site.output_specs[0].dtype if site.output_specs else torch.float32
    check.atol, check.rtol, _ = tolerances(dtype, tolerance)
    check.trials = len(sets)
    return check


def check_gradients(swap: SwappedHotspot, *, tolerance: float | None = None) -> SwapCheck:
    """Gradients through the swapped op (recompute, or the candidate's backward) against the
    original's autograd on the captured inputs, for random output gradients. A backward kernel
    that disagrees is not used (said in .backward_kernel_refused); a recompute that disagrees
    raises VerificationError."""
    site = swap.site
    check = swap.check
    generator = torch.Generator(device="cpu").manual_seed(1234)
    grads = [
        torch.randn(spec.shape, generator=generator).to(spec.dtype).to(spec.device)
        for spec in site.output_specs
    ]

    def leaves():
        ins = [_leaf(t.detach().clone()) for t in site.inputs]
        ps = [
            _leaf(t.detach().clone()) if train else t.detach().clone()
            for t, train in zip(site.tensors, swap.trainable)
        ]
        return ins, ps

    def grads_of(outputs, wanted):
        pairs = [(o, g) for o, g in zip(outputs, grads) if o.requires_grad]
        if not pairs:
            return [None] * len(wanted)
        return torch.autograd.grad(
            [o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True
        )

    ins, ps = leaves()
    wanted = [t for t in ins + ps if t.requires_grad]
    with torch.enable_grad(), bypassed():
        expected = grads_of(site.run_original(ins, ps), wanted)

    def through_op():
        ins2, ps2 = leaves()
        wanted2 = [t for t in ins2 + ps2 if t.requires_grad]
        with torch.enable_grad():
            outputs = torch.ops.cudaforge.hotspot(swap.handle, ins2, ps2)
            return grads_of(outputs, wanted2)

    def differs(actual) -> tuple[float, str]:
        worst = 0.0
        for i, (a, e) in enumerate(zip(actual, expected)):
            if a is None and e is None:
                continue
            a = torch.zeros_like(e) if a is None else a
            e = torch.zeros_like(a) if e is None else e
            diff, problem = compare([a], [e], tolerance)
            if problem:
                return math.inf, f"gradient {i}: {problem}"
            worst = max(worst, diff.max_abs_err if diff else 0.0)
        return worst, ""

    if hasattr(swap.candidate, "backward") and callable(swap.candidate.backward):
        swap.use_backward_kernel = True
        try:
            worst, problem = differs(through_op())
        except Exception as exc:  # noqa: BLE001
            worst, problem = math.inf, f"{type(exc).__name__}: {exc}"
        if problem:
            swap.use_backward_kernel = False
            check.backward_kernel_refused = problem
        else:
            check.backward_kernel = True
    if not swap.use_backward_kernel:
        worst, problem = differs(through_op())
        if problem:
            raise VerificationError(f"{swap.name}: gradient check: {problem}")
    check.gradient_checked = True
    check.gradient_max_abs_err = worst
    return check


def measure(swap: SwappedHotspot, target_ms: float = 25.0) -> SwapCheck:
    """Time the original and the kernel on the captured inputs (ms, no grad), alternating the
    two so that a change of machine load hits both."""
    site = swap.site
    device = _site_device(site)
    tensors = list(site.tensors)
    original, kernel = [], []
    with torch.no_grad():
        for _ in range(3):
            with bypassed():
                original.append(
                    time_call(lambda: site.run_original(site.inputs), device, target_ms=target_ms)
                )
            kernel.append(
                time_call(
                    lambda: swap.run_kernel(site.inputs, tensors), device, target_ms=target_ms
                )
            )
    swap.check.original_ms = min(original)
    swap.check.kernel_ms = min(kernel)
    return swap.check


def swap_in(
    site: Site,
    source: str,
    problem_source: str,
    *,
    name: str = "",
    training: bool = False,
    verify_every: int = 0,
    tolerance: float | None = None,
    trials: int = 3,
    install: bool = True,
) -> SwappedHotspot:
    """Build the candidate for a site, verify it (and its gradients when training), time it and
    install it. Raises SwapError or VerificationError, leaving the model untouched."""
    candidate = build_candidate(source, problem_source, site)
    swap = SwappedHotspot(
        site, candidate, name=name, source=source, problem_source=problem_source,
        verify_every=verify_every, tolerance=tolerance,
    )  # fmt: skip
    verify(swap, trials=trials, tolerance=tolerance)
    if training:
        check_gradients(swap, tolerance=tolerance)
    measure(swap)
    if install:
        swap.install()
    return swap


# ---------------------------------------------------------------- the model level


def swaps(model: nn.Module) -> list[SwappedHotspot]:
    """The swapped hot spots installed in a model."""
    found: list[SwappedHotspot] = []
    for module in model.modules():
        current = module.__dict__.get("forward")
        if isinstance(current, SwappedHotspot):
            found.append(current)
        elif isinstance(current, OwnerForward):
            found.extend(current.swaps)
    return found


def stats(model: nn.Module) -> dict[str, dict[str, Any]]:
    """Per swapped hot spot: kernel calls, fallbacks, shadow checks, whether on, the last reason."""
    found: dict[str, dict[str, Any]] = {}
    for swap in swaps(model):
        key, n = swap.name, 1
        while key in found:
            n += 1
            key = f"{swap.name} #{n}"
        found[key] = {
            **swap.stats.to_dict(),
            "enabled": swap.enabled,
            "off_reason": swap.off_reason,
        }
    return found


def restore(model: nn.Module) -> nn.Module:
    """Undo every swap in `model` (its original forwards come back); returns the model."""
    for module in model.modules():
        current = module.__dict__.get("forward")
        if isinstance(current, (SwappedHotspot, OwnerForward)):
            current.uninstall()
    return model


__all__ = [
    "DriftWarning",
    "FallbackWarning",
    "OwnerForward",
    "SwapCheck",
    "SwapError",
    "SwapStats",
    "SwappedHotspot",
    "build_candidate",
    "bypassed",
    "check_gradients",
    "compare",
    "hotspot",
    "measure",
    "restore",
    "stats",
    "swap_in",
    "swaps",
    "verify",
]
