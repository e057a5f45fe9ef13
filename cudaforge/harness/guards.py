"""The guards of an evaluation and the machinery behind the ones that watch the process: the torch
settings put back after a candidate changes them, the fingerprint that shows tampering, the
persisting-L2 check (through the C core), the NaN poisoning of free GPU memory, and how a traced
kernel is told to be the candidate's own."""

from __future__ import annotations

import builtins
import contextlib
import math
import re
import statistics
import sys
import threading
import time
import types
from typing import Any

from .results import EvalResult, TrialFailure

GUARDS = {
    "output_aliases_input": "an output shares memory with an input (the reference's does not)",
    "output_reused": "a call returned memory that an earlier call's output still holds",
    "input_mutated": "the candidate changed an input (the reference does not)",
    "unwritten_output": "outputs are NaN-poisoned before each run, so unwritten elements fail",
    "tampering": "the candidate replaced functions of torch, the harness or the standard library",
    "no_own_kernels": "the candidate's GPU time is all PyTorch/library kernels, none of its own",
    "bandwidth_floor": "faster than moving its inputs and outputs through memory allows",
    "timed_output": "an output of a timed run was wrong (replayed, skipped or deferred work)",
    "revalidation": "after timing, an output on inputs it had not seen was wrong",
    "unmeasured_work": "GPU work ran outside the timed window (another stream, deferred)",
    "timing_mismatch": "the timed runs' event times are far below the GPU time CUPTI recorded "
    "for the candidate's kernels",
    "persisting_l2": "the candidate set a persisting-L2 limit or window (it was reset)",
}
CORRECTNESS_GUARDS = ("output_aliases_input", "output_reused", "input_mutated")

# the harness's own modules: a candidate that replaces one of their functions fools the verdict
HARNESS_MODULES = ("evaluate", "evaluation", "correctness", "timing", "compare", "options",
                   "guards", "tracer", "problem", "results", "reference", "host_copy", "wire",
                   "worker", "lifeline", "sandbox", "secrets", "stopping", "interleave",
                   "timed_sides", "graphs", "ties")  # fmt: skip


# ====================================================================== torch settings


class _TorchSettings:
    """The global torch settings that change numerics or speed. The harness's values are applied
    before reference runs; a candidate that changes them gets a note and they are put back."""

    def __init__(self, torch, allow_tf32: bool):
        self.torch = torch
        self.original = self.read()
        self.wanted = dict(self.original)
        self.wanted.update({"cuda.matmul.allow_tf32": allow_tf32, "cudnn.allow_tf32": allow_tf32})
        if not allow_tf32:
            self.wanted["float32_matmul_precision"] = "highest"
        self.wanted["grad_enabled"] = False  # with autograd on, the reference would build graphs

    def read(self) -> dict[str, Any]:
        torch = self.torch
        return {
            "default_dtype": torch.get_default_dtype(),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cuda.matmul.allow_fp16_reduced_precision_reduction": (
                torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
            ),
            "cuda.matmul.allow_bf16_reduced_precision_reduction": (
                torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
            ),
            "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
            "cudnn.benchmark": torch.backends.cudnn.benchmark,
            "cudnn.deterministic": torch.backends.cudnn.deterministic,
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "grad_enabled": torch.is_grad_enabled(),
        }

    def changed(self) -> list[str]:
        now = self.read()
        return [
            f"{k}: {self.wanted[k]} -> {now[k]}" for k in self.wanted if now[k] != self.wanted[k]
        ]

    def restore(self) -> None:
        """Back to the values from before the evaluation. Grad mode is left to the no_grad()
        block the settings were read in: it was already off then, and the block restores it."""
        self.apply({k: v for k, v in self.original.items() if k != "grad_enabled"})

    def apply(self, values: dict[str, Any] | None = None) -> None:
        torch, w = self.torch, values or self.wanted
        now = self.read()
        if now == w:
            return
        setters = {
            "default_dtype": torch.set_default_dtype,
            "float32_matmul_precision": torch.set_float32_matmul_precision,
            "cuda.matmul.allow_tf32": lambda v: setattr(
                torch.backends.cuda.matmul, "allow_tf32", v
            ),
            "cuda.matmul.allow_fp16_reduced_precision_reduction": lambda v: setattr(
                torch.backends.cuda.matmul, "allow_fp16_reduced_precision_reduction", v
            ),
            "cuda.matmul.allow_bf16_reduced_precision_reduction": lambda v: setattr(
                torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction", v
            ),
            "cudnn.allow_tf32": lambda v: setattr(torch.backends.cudnn, "allow_tf32", v),
            "cudnn.benchmark": lambda v: setattr(torch.backends.cudnn, "benchmark", v),
            "cudnn.deterministic": lambda v: setattr(torch.backends.cudnn, "deterministic", v),
            "deterministic_algorithms": torch.use_deterministic_algorithms,
            "grad_enabled": torch.set_grad_enabled,
        }
        for key, value in w.items():
            if now[key] != value:
                setters[key](value)


# ====================================================================== tampering


def _namespaces(torch) -> list[tuple[str, object]]:
    spaces: list[tuple[str, object]] = [
        ("torch", torch),
        ("torch.Tensor", torch.Tensor),
        ("torch._C", torch._C),
        ("torch._C._nn", torch._C._nn),
        ("torch._C._VariableFunctions", torch._C._VariableFunctions),
        ("torch.nn.functional", torch.nn.functional),
        ("torch.nn.init", torch.nn.init),
        ("torch.linalg", torch.linalg),
        ("torch.fft", torch.fft),
        ("torch.special", torch.special),
        ("torch.cuda", torch.cuda),
        ("torch.cuda.Event", torch.cuda.Event),
        ("torch.cuda.Stream", torch.cuda.Stream),
        ("torch.autograd.grad_mode", torch.autograd.grad_mode),
        ("time", time),
        ("statistics", statistics),
        ("math", math),
        ("builtins", builtins),
        ("threading", threading),
        ("EvalResult", EvalResult),
        ("TrialFailure", TrialFailure),
    ]
    spaces += _package_namespaces()
    for name, value in vars(torch.nn).items():
        if isinstance(value, type) and issubclass(value, torch.nn.Module):
            spaces.append((f"torch.nn.{name}", value))
    return spaces


def _package_namespaces() -> list[tuple[str, object]]:
    """Every loaded module of the cudaforge package, and every class defined in one: a candidate
    that replaces a method of the harness's classes fools the verdict as much as one that
    replaces a module's function."""
    spaces: list[tuple[str, object]] = []
    for name, module in sorted(sys.modules.items()):
        if not (name == "cudaforge" or name.startswith("cudaforge.")) or module is None:
            continue
        spaces.append((name, module))
        for key, value in list(vars(module).items()):
            if isinstance(value, type) and getattr(value, "__module__", None) == name:
                spaces.append((f"{name}.{key}", value))
    return spaces


def _patchable(value) -> bool:
    if isinstance(value, types.ModuleType):
        return False
    return callable(value) or isinstance(value, (property, staticmethod, classmethod))


# rebound by torch itself (torch.set_default_dtype rebinds torch.Storage)
_REBOUND_BY_TORCH = {("torch", "Storage")}


def _fingerprint(torch) -> dict[tuple[str, str], int]:
    """id() of every callable in the namespaces a candidate could patch to fool the harness."""
    out = {}
    for space, obj in _namespaces(torch):
        try:
            items = list(vars(obj).items())
        except TypeError:
            continue
        for key, value in items:
            if _patchable(value) and (space, key) not in _REBOUND_BY_TORCH:
                out[(space, key)] = id(value)
    return out


def _fingerprint_diff(before: dict, after: dict) -> list[str]:
    changed = [f"{s}.{k}" for (s, k), v in before.items() if after.get((s, k)) != v]
    return sorted(changed)


# ====================================================================== persisting L2

_L2_CALLS = ("persisting_l2_limit", "set_persisting_l2_limit", "stream_window_bytes",
             "clear_stream_window", "reset_persisting_l2")  # fmt: skip


class _PersistingL2:
    """The persisting-L2 limit and the timing stream's access-policy window, read and reset
    through the C core: a candidate that sets them keeps its data in L2 across the flush."""

    def __init__(self, device):
        import torch

        self.reason = None
        self.stream = torch.cuda.current_stream(device).cuda_stream
        self.baseline = 0
        self.window_ok = True
        try:
            from .. import _core
            from ..errors import CudaforgeError
        except ImportError as e:
            self.reason = f"the C core is not importable ({e})"
            return
        # CudaError on a failed call; its base also covers a libcuda that does not load
        self.core, self.error = _core, CudaforgeError
        missing = [name for name in _L2_CALLS if not hasattr(_core, name)]
        if missing:
            self.reason = f"this build of the C core has no persisting-L2 calls ({missing[0]})"
            return
        try:
            self.baseline = _core.persisting_l2_limit()
        except CudaforgeError as e:
            self.reason = f"cuCtxGetLimit(PERSISTING_L2_CACHE_SIZE) failed: {e}"

    def check_and_reset(self) -> str | None:
        if self.reason:
            return None
        core, found = self.core, []
        try:
            limit = core.persisting_l2_limit()
        except self.error:
            limit = self.baseline
        if limit != self.baseline:
            found.append(f"persisting-L2 limit {limit} bytes")
            with contextlib.suppress(self.error):
                core.set_persisting_l2_limit(self.baseline)
        if self.window_ok:
            try:
                num_bytes = core.stream_window_bytes(self.stream)
            except self.error:
                self.window_ok = False  # not for this stream (the legacy default stream)
                num_bytes = 0
            if num_bytes:
                found.append(f"access-policy window of {num_bytes} bytes on the stream")
                with contextlib.suppress(self.error):
                    core.clear_stream_window(self.stream)
        if found:
            with contextlib.suppress(self.error):
                core.reset_persisting_l2()
            return "; ".join(found)
        return None


# ====================================================================== NaN poisoning


class _Poison:
    """Fills the CUDA caching allocator's free blocks with 0xFF bytes (NaN in fp32/fp16/bf16), so
    that an output the candidate allocates but never writes is NaN, not leftover values (such as
    an earlier result that happens to be right)."""

    def __init__(self, torch, device):
        self.torch = torch
        self.device = device
        self.reserved = 0

    def reserve(self, output_bytes: int, input_bytes: int) -> None:
        """Make sure the cache holds free blocks (large and small) for the candidate's outputs, so
        they come from poisoned memory rather than fresh cudaMalloc."""
        torch = self.torch
        free, _ = torch.cuda.mem_get_info(self.device)
        want = min(2 * output_bytes + input_bytes + (64 << 20), free // 4)
        held = [torch.empty(max(1, want), dtype=torch.uint8, device=self.device)]
        held += [torch.empty(512 << 10, dtype=torch.uint8, device=self.device) for _ in range(8)]
        held += [torch.empty(4096, dtype=torch.uint8, device=self.device) for _ in range(64)]
        del held
        self.reserved = 2 * output_bytes + input_bytes

    def fill(self, output_bytes: int, input_bytes: int) -> int:
        torch = self.torch
        if self.reserved < 2 * output_bytes + input_bytes or not self.reserved:
            self.reserve(output_bytes, input_bytes)
        index = self.device.index
        poisoned = 0
        for segment in torch.cuda.memory_snapshot():
            if segment.get("device", index) != index:
                continue
            address = segment["address"]
            for block in segment["blocks"]:
                start = block.get("address", address)
                if block["state"] == "inactive" and block["size"] > 0:
                    view = torch.as_tensor(DeviceBytes(start, block["size"]), device=self.device)
                    view.fill_(0xFF)
                    poisoned += block["size"]
                address = start + block["size"]
        return poisoned


class DeviceBytes:
    """A raw device range as an object torch.as_tensor can view (CUDA array interface)."""

    def __init__(self, pointer: int, size: int):
        self.__cuda_array_interface__ = {
            "shape": (size,),
            "typestr": "|u1",
            "data": (pointer, False),
            "strides": None,
            "version": 2,
        }


# ====================================================================== the candidate's kernels

_LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\s*\([^)]*\)|__attribute__\s*\(\([^)]*\)\)")
_GLOBAL = re.compile(r"__global__\b[^;{}]*?\b([A-Za-z_]\w*)\s*\(")
_LIBRARY_NAMESPACES = ("_ZN2at", "_ZN3c10", "_ZN3cub", "_ZN7cutlass", "_ZN4cute", "_ZN6thrust",
                       "_ZN8pytorch", "_ZN5flash", "at::", "c10::", "cub::", "cutlass::", "void at::",
                       "void cub::", "void cutlass::", "void c10::")  # fmt: skip


def kernel_names_in(text: str) -> set[str]:
    """Names of the `__global__` functions declared in a source (CUDA, or Python holding it)."""
    return set(_GLOBAL.findall(_LAUNCH_BOUNDS.sub(" ", text)))


def is_own_kernel(kernel_name: str, own_names: set[str]) -> bool:
    """Is a traced kernel (mangled, demangled or extern "C" name) one the candidate declared?
    Kernels in torch's, CUB's or CUTLASS's namespaces never are."""
    if not own_names or kernel_name.startswith(_LIBRARY_NAMESPACES):
        return False
    if kernel_name in own_names:
        return True
    for name in own_names:
        if kernel_name.startswith("_Z"):
            if re.search(rf"(?<!\d){len(name)}{re.escape(name)}", kernel_name):
                return True
        elif re.match(rf"(?:void\s+)?(?:\w+::)*{re.escape(name)}\s*[(<]", kernel_name):
            return True
    return False
