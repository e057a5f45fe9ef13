"""Theoretical occupancy of a launch, and the `launch__*` metrics Nsight Compute derives from it.

`occupancy()` gives the resident blocks per SM that each resource allows (blocks, warps,
registers, shared memory), the smallest of them and which resources set it, from the kernel's
registers, block size and shared memory and the GPU's limits (`_core.device_info()`, or
`H200_LIMITS` without a GPU); `launch_metrics()` turns that into ncu's `launch__*` values.
Pure arithmetic: no GPU needed.
"""

from __future__ import annotations

from dataclasses import dataclass

# Per compute capability major: (register allocation unit per warp, register sub-partitions per
# SM, shared memory allocation unit, shared memory the driver reserves per block). From the
# CUDA occupancy calculator (cuda_occupancy.h) for sm_80 .. sm_120.
_ALLOCATION = {7: (256, 4, 256, 0), 8: (256, 4, 128, 1024), 9: (256, 4, 128, 1024),
               10: (256, 4, 128, 1024), 12: (256, 4, 128, 1024)}  # fmt: skip

# H100/H200 (sm_90) limits, for use without a GPU (tests, recorded profiles).
H200_LIMITS: dict[str, int] = {
    "cc_major": 9,
    "cc_minor": 0,
    "multiprocessors": 132,
    "max_threads_per_multiprocessor": 2048,
    "max_blocks_per_multiprocessor": 32,
    "registers_per_multiprocessor": 65536,
    "shared_bytes_per_multiprocessor": 233472,
    "shared_bytes_per_block_optin": 232448,
    "warp_size": 32,
}


@dataclass
class Occupancy:
    """Theoretical occupancy of a launch: resident blocks per SM allowed by each resource
    (`limits`: blocks, warps, registers, shared_mem), the smallest of them, and which
    resources give it (`limiter`). `achieved_pct` is from sm__warps_active when measured."""

    blocks_per_sm: int
    warps_per_block: int
    theoretical_pct: float
    limits: dict[str, int]
    limiter: list[str]
    shared_config_bytes: int
    achieved_pct: float | None = None
    driver_blocks_per_sm: int | None = None  # cuOccupancyMaxActiveBlocksPerMultiprocessor


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def occupancy(
    registers: int,
    threads_per_block: int,
    shared_per_block: int,
    limits: dict[str, int] | None = None,
    shared_config: int | None = None,
) -> Occupancy:
    """Blocks per SM allowed by each resource for a kernel using `registers` per thread and
    `shared_per_block` bytes (static + dynamic) with `threads_per_block` threads.

    `limits` is `_core.device_info()` (default: H200); `shared_config` the shared memory carveout
    the driver chose for the launch (CUPTI's shared_executed), else the SM's maximum."""
    lim = dict(H200_LIMITS if limits is None else limits)
    reg_unit, partitions, smem_unit, reserved = _ALLOCATION.get(lim["cc_major"], _ALLOCATION[9])
    warp = lim.get("warp_size", 32)
    warps_per_block = max(1, -(-threads_per_block // warp))
    max_warps = lim["max_threads_per_multiprocessor"] // warp
    by_blocks = lim["max_blocks_per_multiprocessor"]
    by_warps = max_warps // warps_per_block
    if registers <= 0:
        by_regs = by_blocks
    else:
        per_warp = _round_up(registers * warp, reg_unit)
        warps_per_partition = (lim["registers_per_multiprocessor"] // partitions) // per_warp
        by_regs = (warps_per_partition * partitions) // warps_per_block
    per_block = _round_up(shared_per_block + reserved, smem_unit)
    config = shared_config or lim["shared_bytes_per_multiprocessor"]
    by_smem = config // per_block if per_block > 0 else by_blocks
    found = {"blocks": by_blocks, "warps": by_warps, "registers": by_regs, "shared_mem": by_smem}
    blocks = max(0, min(found.values()))
    limiter = [k for k in ("registers", "shared_mem", "warps", "blocks") if found[k] == blocks]
    return Occupancy(
        blocks_per_sm=blocks,
        warps_per_block=warps_per_block,
        theoretical_pct=100.0 * min(max_warps, blocks * warps_per_block) / max_warps,
        limits=found,
        limiter=limiter,
        shared_config_bytes=config,
    )


def launch_metrics(occ: Occupancy, registers: int) -> dict[str, float]:
    """The launch__* values Nsight Compute reports, from an Occupancy."""
    return {
        "launch__occupancy_limit_blocks": float(occ.limits["blocks"]),
        "launch__occupancy_limit_registers": float(occ.limits["registers"]),
        "launch__occupancy_limit_shared_mem": float(occ.limits["shared_mem"]),
        "launch__occupancy_limit_warps": float(occ.limits["warps"]),
        "launch__registers_per_thread": float(registers),
    }


__all__ = [
    "H200_LIMITS",
    "Occupancy",
    "launch_metrics",
    "occupancy",
]
