"""What a swap raises and warns: SwapError when a candidate cannot be put into the model, and the
two warnings a swapped site gives while the model runs (a call that ran the original code, a
kernel switched off after a shadow check)."""

from __future__ import annotations

from ..errors import CudaforgeError


class FallbackWarning(UserWarning):
    """A swapped site ran the original code for a call it was not verified for."""


class DriftWarning(UserWarning):
    """A shadow check found a kernel's output different from the original's; it was switched
    off."""


class SwapError(CudaforgeError):
    """A candidate cannot be put into the model (the message says why)."""


__all__ = ["DriftWarning", "FallbackWarning", "SwapError"]
