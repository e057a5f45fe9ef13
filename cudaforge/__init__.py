"""cudaforge: LLM agents write CUDA kernels for a PyTorch model's hot ops; each kernel is proven
against the PyTorch reference on the GPU before it is used.

Imports on any machine: the CUDA libraries are loaded on first use. The four exceptions here are
the ones a user catches; every other one is in cudaforge.errors, whose docstring says why.
"""

from __future__ import annotations

import importlib

from . import errors
from .cuda.kernel import CompiledModule, compile, synchronize
from .errors import CompileError, CudaforgeError, LLMError, NoGPUError
from .harness.evaluate import evaluate
from .harness.problem import Problem
from .harness.results import EvalResult
from .profiling.profiler import profile

__version__ = "0.1.0"

# name -> where it is defined, imported on first use: these pull in torch, the agents or Ray, and
# `import cudaforge` stays light. forge is the Coder/Judge loop (agents.loop.run_loop); load is
# the older name of apply_stored (apply a model's stored kernels).
_LAZY = {
    "LoopResult": "agents.loop.LoopResult",
    "OptimizeResult": "model.optimize.OptimizeResult",
    "RayPool": "harness.ray_pool.RayPool",
    "WorkerPool": "harness.pool.WorkerPool",
    "apply_stored": "model.optimize.apply_stored",
    "choose_under_compile": "model.under_compile.choose_under_compile",
    "doctor": "cli.doctor.doctor",
    "forge": "agents.loop.run_loop",
    "graphed": "model.graphed.graphed",
    "load": "model.optimize.load",
    "optimize": "model.optimize.optimize",
    "restore": "model.swap.restore",
    "site_graphs": "model.swap.site_graphs",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'cudaforge' has no attribute {name!r}")
    module, _, attribute = _LAZY[name].rpartition(".")
    value = getattr(importlib.import_module(f".{module}", __name__), attribute)
    globals()[name] = value
    return value


__all__ = [
    "CompileError",
    "CompiledModule",
    "CudaforgeError",
    "EvalResult",
    "LLMError",
    "LoopResult",
    "NoGPUError",
    "OptimizeResult",
    "Problem",
    "RayPool",
    "WorkerPool",
    "apply_stored",
    "choose_under_compile",
    "compile",
    "doctor",
    "errors",
    "evaluate",
    "forge",
    "graphed",
    "load",
    "optimize",
    "profile",
    "restore",
    "site_graphs",
    "synchronize",
]
