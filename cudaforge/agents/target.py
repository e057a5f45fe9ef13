"""What the Coder can use on the target that `cudaforge.compile` builds for, as one line of text.

`target_text("sm_90a", "NVIDIA H200")` -> "sm_90a (NVIDIA H200, compute capability 9.0: wgmma,
TMA and thread-block clusters are available; ...)". It fills the contract's `{target}` (the
prompts/contract.txt placeholder), so that a Coder asked for wgmma knows NVRTC builds for a target
that has it and does not fall back to load_inline. target_text is pure text (no GPU, no CUDA
library); this_machine_target asks the C core which GPU this machine has.

Without a GPU the target is $CUDAFORGE_ARCH, else sm_90a: the H200's, the GPU this project
benchmarks on, so that prompts rendered on a machine without a GPU are the ones its candidates
will be built for there.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from .. import _core
from ..cuda.kernel import current_arch
from ..errors import NoGPUError

_ARCH = re.compile(r"^(sm|compute)_(\d+)(\d)([af]?)$")

# Shared memory one block may use (KB), by compute capability, once it opts in above 48 KB.
SHARED_KB_PER_BLOCK: dict[tuple[int, int], int] = {
    (7, 0): 96, (7, 2): 96, (7, 5): 64,
    (8, 0): 163, (8, 6): 99, (8, 7): 163, (8, 9): 99,
    (9, 0): 227, (10, 0): 227, (10, 3): 227, (12, 0): 99,
}  # fmt: skip


def target_text(arch: str, gpu_name: str | None = None) -> str:
    """The NVRTC target `arch` ('sm_90a', 'sm_80', 'compute_90') on `gpu_name`, with what its
    kernels can use, in one line. Raises ValueError for a name that is not a target."""
    match = _ARCH.match(arch.strip().lower())
    if match is None:
        raise ValueError(f"arch {arch!r} is not like 'sm_90a', 'sm_80' or 'compute_90'")
    kind, major, minor, suffix = match[1], int(match[2]), int(match[3]), match[4]
    cc = (major, minor)
    name = match[0]
    newest = _newest_features(cc, suffix if kind == "sm" else "")
    older = _older_features(cc)
    said = f"{', '.join(newest[:-1])} and {newest[-1]}" if len(newest) > 1 else "".join(newest)
    text = f"{name} ({gpu_name + ', ' if gpu_name else ''}compute capability {major}.{minor}"
    if said:
        text += f": {said} are available"
    details = []
    if older:
        details.append("also " + ", ".join(older))
    if cc == (9, 0) and suffix != "a":
        details.append("wgmma needs sm_90a, which this target is not")
    if kind == "compute":
        details.append("PTX that the driver compiles at load, so no arch-specific (a) features")
    shared = SHARED_KB_PER_BLOCK.get(cc)
    if shared is not None:
        details.append(f"up to {shared} KB of shared memory per block")
    return text + "".join(f"; {d}" for d in details) + ")"


def _newest_features(cc: tuple[int, int], suffix: str) -> list[str]:
    """What this generation adds, named the way CUDA programmers ask for it."""
    if cc == (9, 0):
        return ["wgmma", "TMA", "thread-block clusters"] if suffix == "a" else [
            "TMA", "thread-block clusters"
        ]  # fmt: skip
    if cc[0] in (10, 11) and suffix in ("a", "f"):
        return ["tcgen05 (tensor memory)", "TMA", "thread-block clusters"]
    if cc >= (9, 0):
        return ["TMA", "thread-block clusters"]
    if cc >= (8, 0):
        return ["cp.async", "bf16/tf32 tensor cores (mma.sync)"]
    if cc >= (7, 0):
        return ["fp16 tensor cores (mma.sync, wmma)"]
    return []


def _older_features(cc: tuple[int, int]) -> list[str]:
    """What earlier generations brought that this one keeps (newest first)."""
    out = []
    if cc >= (9, 0):
        out += ["mma.sync tensor cores (fp16, bf16, tf32, fp8)", "cp.async"]
    elif cc >= (8, 9):
        out.append("fp8 tensor cores (mma.sync)")
    return out


DEFAULT_ARCH = "sm_90a"  # the H200's target (module docstring)


@dataclass(frozen=True)
class Target:
    """What cudaforge.compile builds for here. on_gpu: found on this machine's GPU, not assumed."""

    arch: str
    gpu_name: str | None = None
    on_gpu: bool = False

    @property
    def text(self) -> str:
        return target_text(self.arch, self.gpu_name)


def this_machine_target() -> Target:
    """The target of this machine's current GPU (cudaforge.cuda.kernel.current_arch), else
    $CUDAFORGE_ARCH or sm_90a (module docstring)."""
    try:
        arch = current_arch()
        name = _core.device_info(0)["name"]
    except (NoGPUError, _core.CudaError):
        return Target(os.environ.get("CUDAFORGE_ARCH") or DEFAULT_ARCH)
    return Target(arch, name, on_gpu=True)


__all__ = ["DEFAULT_ARCH", "SHARED_KB_PER_BLOCK", "Target", "target_text", "this_machine_target"]
