"""The exception hierarchy of cudaforge.

The library errors are created by the C core (csrc/errors.c) and re-exported here; the errors that
only Python raises subclass CudaforgeError. Each carries its evidence as attributes.

Four of them are also at the top (`cudaforge.X`): the ones a user catches around `compile`,
`evaluate`, `optimize` and the forge loop, each because there is something to do about it:

- CudaforgeError: the base of every error here; one `except` around any cudaforge call.
- CompileError: NVRTC rejected a kernel source; the author fixes the source (.log, .line).
- NoGPUError: the call needs a GPU and none is usable here; the caller skips or takes the CPU path.
- LLMError: the Coder's or the Judge's model cannot be used (no key: its NeedsKeyError, an HTTP
  failure, an unusable reply); the caller retries later or keeps the stored kernels.

The others stay here only (`cudaforge.errors.X`), all CudaforgeErrors: each is handled where it
is raised (an evaluation reports a CudaError or a wrong output in its result, a provider turns an
HTTPError into an LLMError, profiling falls back to timing on a ProfilerError, optimize skips a
kernel that fails its VerificationError checks), or asks for a change of setup, not of the call
(LibraryNotFound, ExtraNotInstalled), or leaves nothing in this process to go on with
(KernelFault: the CUDA context is dead).
"""

from __future__ import annotations

from ._core import (
    CompileError,
    CudaError,
    CudaforgeError,
    HTTPError,
    KernelFault,
    LibraryNotFound,
    ProfilerError,
)


class LLMError(CudaforgeError):
    """A model's reply could not be used (provider error, malformed reply). Attribute: provider."""

    def __init__(self, message: str, provider: str = "", status: int | None = None):
        super().__init__(message)
        self.provider = provider
        self.status = status


class NeedsKeyError(LLMError):
    """A provider needs an API key that was not given. Attribute: env_var."""

    def __init__(self, message: str, provider: str = "", env_var: str = ""):
        super().__init__(message, provider)
        self.env_var = env_var


class VerificationError(CudaforgeError):
    """A candidate's output differs from the reference. Attributes: trial, max_abs_err, index."""

    def __init__(
        self, message: str, trial: int = -1, max_abs_err: float = float("nan"), index=None
    ):
        super().__init__(message)
        self.trial = trial
        self.max_abs_err = max_abs_err
        self.index = index


class NoGPUError(CudaforgeError):
    """A GPU is needed for this call and none is usable; the message says why."""


class ExtraNotInstalled(CudaforgeError, ImportError):
    """A feature needs an optional dependency that is not installed. Attributes: name (the
    missing module), extra (the cudaforge extra that brings it), hint (the command to run)."""

    def __init__(self, name: str, extra: str, feature: str):
        self.extra = extra
        self.hint = f"pip install cudaforge[{extra}]"
        super().__init__(
            f"{feature} needs the '{name}' package, which is not installed here; "
            f"install it with: {self.hint}",
            name=name,
        )


__all__ = [
    "CompileError",
    "CudaError",
    "CudaforgeError",
    "ExtraNotInstalled",
    "HTTPError",
    "KernelFault",
    "LLMError",
    "LibraryNotFound",
    "NeedsKeyError",
    "NoGPUError",
    "ProfilerError",
    "VerificationError",
]
