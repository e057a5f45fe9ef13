"""cudaforge: LLM agents write CUDA kernels for a PyTorch model's hot ops; each kernel is proven
against the PyTorch reference on the GPU before it is used.

Imports on any machine: the CUDA libraries are loaded on first use.
"""

from __future__ import annotations

import importlib

from .cuda.kernel import CompiledModule, compile, synchronize
from .errors import (
    CompileError,
    CudaError,
    CudaforgeError,
    ExtraNotInstalled,
    HTTPError,
    KernelFault,
    LibraryNotFound,
    LLMError,
    NeedsKeyError,
    NoGPUError,
    ProfilerError,
    VerificationError,
)
from .harness.evaluate import evaluate
from .harness.problem import Problem
from .harness.results import EvalResult
from .profiling.profiler import profile

__version__ = "0.1.0"

# name -> module that defines it; imported on first use so that `import cudaforge` stays light
# (evaluate, Problem and profile are imported eagerly: each shares its name with its module, and
# an eager import keeps the package attribute the function rather than the submodule)
_LAZY = {
    "WorkerPool": "harness.pool",
    "RayPool": "harness.ray_pool",
    "optimize": "model.optimize",
    "load": "model.optimize",
    "restore": "model.swap",
    "doctor": "cli.doctor",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'cudaforge' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "CompileError",
    "CompiledModule",
    "CudaError",
    "CudaforgeError",
    "EvalResult",
    "ExtraNotInstalled",
    "HTTPError",
    "KernelFault",
    "LLMError",
    "LibraryNotFound",
    "NeedsKeyError",
    "NoGPUError",
    "Problem",
    "ProfilerError",
    "RayPool",
    "VerificationError",
    "WorkerPool",
    "compile",
    "doctor",
    "evaluate",
    "load",
    "optimize",
    "profile",
    "restore",
    "synchronize",
]
