"""The roofline: this GPU's measured ceilings and one kernel's line against them.

`measure_ceilings()` measures the achievable DRAM bandwidth and FLOP rates once per GPU and
caches them on disk; `roofline()` places one kernel run (its time, DRAM bytes, FLOPs) against
them: bandwidth and FLOP rate as % of the ceilings, arithmetic intensity, and which one bounds it.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..cuda.kernel import cache_dir
from . import gpu


def _write_json_atomic(path: str, data: Any) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _gpu_key(device: int) -> str:
    torch = gpu.require_torch()
    props = torch.cuda.get_device_properties(device)
    uuid = str(getattr(props, "uuid", "")) or f"pci{getattr(props, 'pci_bus_id', device)}"
    return f"{props.name}|{uuid}|{props.total_memory}"


def _best_ms(torch, fn: Callable[[], Any], repeats: int) -> float:
    fn()
    torch.cuda.synchronize()
    best = math.inf
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end))
    return best


def _copy_ms(torch, n: int) -> float:
    src = torch.empty(n, dtype=torch.float32, device="cuda").fill_(1.0)
    dst = torch.empty_like(src)
    return _best_ms(torch, lambda: dst.copy_(src), 10)


def _matmul_ms(torch, m: int) -> tuple[float, float]:
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        a = torch.randn(m, m, device="cuda")
        b = torch.randn(m, m, device="cuda")
        fp32_ms = _best_ms(torch, lambda: a @ b, 5)
        a16, b16 = a.bfloat16(), b.bfloat16()
        return fp32_ms, _best_ms(torch, lambda: a16 @ b16, 10)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32


def measure_ceilings(device: int | None = None, *, refresh: bool = False) -> dict[str, Any]:
    """This GPU's achievable DRAM bandwidth (a 1 GiB device copy: bytes read + written per s)
    and FLOP rates (8192^3 matmuls: fp32 without TF32, bf16 on tensor cores), measured once per
    GPU and cached in <cache dir>/ceilings.json ($CUDAFORGE_CACHE_DIR or ~/.cache/cudaforge)."""
    torch = gpu.require_torch()
    device = gpu.device_index(device)
    key = _gpu_key(device)
    path = str(cache_dir() / "ceilings.json")
    try:
        with open(path) as f:
            cache = json.load(f)
    except (OSError, ValueError):
        cache = {}
    if not refresh and key in cache:
        return cache[key]
    with torch.cuda.device(device):
        n = 1 << 28  # 1 GiB of fp32
        copy_ms = _copy_ms(torch, n)
        m = 8192
        fp32_ms, bf16_ms = _matmul_ms(torch, m)
        torch.cuda.empty_cache()
    ceilings = {
        "device": torch.cuda.get_device_name(device),
        "dram_bytes_per_s": 2 * 4 * n / (copy_ms / 1e3),
        "fp32_flops_per_s": 2 * m**3 / (fp32_ms / 1e3),
        "bf16_tensor_flops_per_s": 2 * m**3 / (bf16_ms / 1e3),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "method": "1 GiB fp32 device copy (read+write bytes); 8192^3 matmul fp32 (TF32 off), bf16",
    }
    cache[key] = ceilings
    _write_json_atomic(path, cache)
    return ceilings


@dataclass
class Roofline:
    """One kernel against the GPU's measured ceilings. `dram_bytes` from the counters (read +
    write), `flops` from the caller; rates over the kernel's GPU time."""

    time_s: float
    dram_bytes: float | None
    bandwidth: float | None  # bytes/s
    bandwidth_pct: float | None  # of the measured copy bandwidth
    flops: float | None
    flop_rate: float | None
    flop_pct: float | None  # of the measured fp32 (or bf16 tensor) matmul rate
    flop_ceiling: str  # which FLOP ceiling: "fp32" or "bf16_tensor"
    intensity: float | None  # FLOP per DRAM byte
    ridge: float  # intensity where the two ceilings meet
    bound: str | None  # "memory", "compute", or None when unknown


def roofline(
    time_s: float,
    ceilings: dict[str, Any],
    dram_bytes: float | None = None,
    flops: float | None = None,
    tensor: bool = False,
) -> Roofline:
    """A roofline line for one kernel run of `time_s` seconds."""
    ceiling_name = "bf16_tensor" if tensor else "fp32"
    peak_flops = ceilings[f"{ceiling_name}_flops_per_s"]
    peak_bw = ceilings["dram_bytes_per_s"]
    bw = dram_bytes / time_s if dram_bytes is not None and time_s > 0 else None
    rate = flops / time_s if flops is not None and time_s > 0 else None
    intensity = flops / dram_bytes if flops is not None and dram_bytes else None
    ridge = peak_flops / peak_bw
    bound = None
    if intensity is not None:
        bound = "memory" if intensity < ridge else "compute"
    elif bw is not None:
        bound = "memory" if bw / peak_bw >= 0.5 else None
    return Roofline(
        time_s=time_s,
        dram_bytes=dram_bytes,
        bandwidth=bw,
        bandwidth_pct=100.0 * bw / peak_bw if bw is not None else None,
        flops=flops,
        flop_rate=rate,
        flop_pct=100.0 * rate / peak_flops if rate is not None else None,
        flop_ceiling=ceiling_name,
        intensity=intensity,
        ridge=ridge,
        bound=bound,
    )


__all__ = [
    "Roofline",
    "measure_ceilings",
    "roofline",
]
