"""`cudaforge doctor`: what this machine offers (driver, CUDA, NVRTC, CUPTI, GPUs, counter access)
and what is missing, as data and as text."""

from __future__ import annotations

import os
import platform
import sys

from .. import __version__, _core
from ..cuda import libs as _libs


def _try(fn):
    try:
        return fn(), None
    except Exception as exc:  # noqa: BLE001 - doctor reports every failure instead of raising
        if getattr(exc, "tried", None) is not None:
            tried = "; ".join(t.strip() for t in exc.tried)
            return None, f"not found (tried {tried}); set {exc.env_var} to its path"
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0]}"


def has_gpu() -> bool:
    """Whether torch is installed and sees a CUDA GPU."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def counters_readable() -> tuple[bool | None, str]:
    """Whether hardware counters can be read here, and why (NVreg_RestrictProfilingToAdminUsers)."""
    path = "/proc/driver/nvidia/params"
    try:
        with open(path) as f:
            params = f.read()
    except OSError:
        return None, f"{path} not readable (no NVIDIA driver here?)"
    admin_only = "RmProfilingAdminOnly: 1" in params
    if not admin_only:
        return True, "profiling is open to all users (RmProfilingAdminOnly: 0)"
    if os.geteuid() == 0:
        return True, "profiling is restricted to admins, and this process runs as root"
    return False, (
        "profiling is restricted to admins (NVreg_RestrictProfilingToAdminUsers=1): run as root or "
        "with CAP_PERFMON/CAP_SYS_ADMIN; feedback falls back to timing and static facts"
    )


def doctor() -> dict:
    """Collect what cudaforge can use on this machine. Never raises."""
    report: dict = {
        "cudaforge": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "libraries": {},
        "missing": [],
        "gpus": [],
    }
    try:
        import torch

        report["torch"] = torch.__version__
        report["torch_cuda"] = torch.version.cuda
    except ImportError:
        report["torch"] = None
        report["missing"].append("torch: not installed (pip install torch)")
    for kind in ("cuda", "nvrtc", "cupti"):
        path, err = _try(lambda k=kind: _libs.ensure(k))
        report["libraries"][kind] = path
        if err:
            report["missing"].append(f"lib{kind}: {err}")
    if report["libraries"]["cuda"]:
        version, err = _try(_core.driver_version)
        if version:
            report["driver_cuda"] = f"{version // 1000}.{version % 1000 // 10}"
        count, err = _try(_core.device_count)
        if err:
            report["missing"].append(f"GPU: {err}")
        for i in range(count or 0):
            info, err = _try(lambda i=i: _core.device_info(i))
            report["gpus"].append(info or {"ordinal": i, "error": err})
        if count == 0:
            report["missing"].append("GPU: the driver sees no CUDA device")
    if report["libraries"]["nvrtc"]:
        report["nvrtc"] = ".".join(map(str, _core.nvrtc_version()))
        report["nvrtc_archs"] = [f"sm_{a}" for a in _core.nvrtc_supported_archs()]
    if report["libraries"]["cupti"]:
        version, err = _try(_core.cupti_version)
        report["cupti_api"] = version
    readable, why = counters_readable()
    report["counters_readable"] = readable
    report["counters_reason"] = why
    report["include_dirs"] = _libs.include_dirs()
    from ..cuda.kernel import cache_dir

    report["cache_dir"] = str(cache_dir())
    return report


def format_report(report: dict) -> str:
    lines = [f"cudaforge {report['cudaforge']}  (Python {report['python']}, {report['platform']})"]
    lines.append(
        f"  torch:        {report.get('torch') or 'missing'}"
        + (f" (CUDA {report['torch_cuda']})" if report.get("torch_cuda") else "")
    )
    for kind, path in report["libraries"].items():
        lines.append(f"  lib{kind + ':':<11}{path or 'not found'}")
    if report.get("driver_cuda"):
        lines.append(f"  driver:       supports CUDA {report['driver_cuda']}")
    if report.get("nvrtc"):
        lines.append(
            f"  NVRTC:        {report['nvrtc']} (targets {', '.join(report['nvrtc_archs'])})"
        )
    if report.get("cupti_api"):
        lines.append(f"  CUPTI:        API version {report['cupti_api']}")
    for gpu in report["gpus"]:
        if "error" in gpu:
            lines.append(f"  GPU {gpu['ordinal']}:        {gpu['error']}")
            continue
        lines.append(
            f"  GPU {gpu['ordinal']}:        {gpu['name']}, compute capability "
            f"{gpu['cc_major']}.{gpu['cc_minor']}, {gpu['multiprocessors']} SMs, "
            f"{gpu['total_memory_bytes'] / 2**30:.0f} GiB, L2 {gpu['l2_bytes'] / 2**20:.0f} MiB"
        )
    if not report["gpus"]:
        lines.append("  GPU:          none (compiling with arch='sm_90' etc. still works)")
    readable = report["counters_readable"]
    lines.append(
        f"  counters:     {'readable' if readable else 'unknown' if readable is None else 'not readable'}"
        f" - {report['counters_reason']}"
    )
    lines.append(f"  cache:        {report['cache_dir']}")
    if report["missing"]:
        lines.append("missing:")
        lines += [f"  - {m}" for m in report["missing"]]
    return "\n".join(lines)


def gpu_facts(device: int = 0) -> str:
    """The target GPU in a few lines, for the agents' prompts; a note when there is none."""
    try:
        _libs.ensure("cuda")
        info = _core.device_info(device)
    except Exception as exc:  # noqa: BLE001 - no GPU: the prompt says so
        return f"No GPU visible on this machine ({type(exc).__name__}); kernels target sm_90 (H100/H200)."
    smem_kb = info["shared_bytes_per_block_optin"] // 1024
    return (
        f"{info['name']}: compute capability {info['cc_major']}.{info['cc_minor']}, "
        f"{info['multiprocessors']} SMs, {info['total_memory_bytes'] / 2**30:.0f} GiB, "
        f"L2 {info['l2_bytes'] / 2**20:.0f} MiB, up to {smem_kb} KiB shared memory per block "
        f"(opt-in), {info['registers_per_multiprocessor']} registers and "
        f"{info['max_threads_per_multiprocessor']} threads per SM, warp size {info['warp_size']}."
    )
