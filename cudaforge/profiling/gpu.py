"""torch's view of the GPU that timing and profiling run on: torch with CUDA (or NoGPUError
saying why not), a device given as int / "cuda:1" / torch.device turned into its index, and
torch's primary context of that device made current before CUPTI or the driver API touch it.

The other profiling modules call these through the module (`gpu.require_torch()`), so a test
can stand in a fake GPU by patching this one place.
"""

from __future__ import annotations

from ..cuda import libs as _libs
from ..errors import NoGPUError


def require_torch():
    """The torch module, when it has CUDA and sees a GPU; else NoGPUError with the reason."""
    try:
        import torch
    except ImportError as exc:
        raise NoGPUError("timing and profiling need torch with CUDA") from exc
    if not torch.cuda.is_available():
        raise NoGPUError("no CUDA GPU is visible to torch")
    return torch


def device_index(device) -> int:
    """An int, None (the current device), "cuda:1" or a torch.device -> the device's index."""
    if isinstance(device, int):
        return device
    torch = require_torch()
    index = device if device is None else torch.device(device).index
    return torch.cuda.current_device() if index is None else index


def prepare(device: int) -> None:
    """torch's (primary) context of `device` exists and libcuda is loaded."""
    torch = require_torch()
    torch.cuda.init()
    torch.zeros(1, device=f"cuda:{device}")
    _libs.ensure("cuda")


__all__ = [
    "device_index",
    "prepare",
    "require_torch",
]
