"""Finding Nsight Compute for the benchmarks that compare against it."""

from __future__ import annotations

import glob
import shutil

NCU_PATTERNS = (
    "/usr/local/cuda/bin/ncu",
    "/usr/local/cuda/nsight-compute*/ncu",
    "/opt/nvidia/nsight-compute/*/ncu",
    "/usr/local/NVIDIA-Nsight-Compute*/ncu",
)


def find_ncu(given: str | None = None) -> str | None:
    """`given`, else ncu on PATH, else the newest of the usual install places; None if absent."""
    if given:
        return given
    found = shutil.which("ncu")
    if found:
        return found
    for pattern in NCU_PATTERNS:
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    return None
