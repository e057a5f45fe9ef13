"""Where the CUDA libraries are looked for, and loading them on first use.

Order (CUPTI_NOTES): already mapped in this process -> the env override -> the nvidia-* wheels on
sys.path -> $CUDA_HOME -> /usr/local/cuda -> the system loader path.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import sys
import threading

from .. import _core

SONAMES = {
    "cuda": ["libcuda.so.1", "libcuda.so"],
    "nvrtc": ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"],
    "cupti": ["libcupti.so.13", "libcupti.so.12", "libcupti.so"],
}
ENV = {"cuda": "CUDAFORGE_LIBCUDA", "nvrtc": "CUDAFORGE_LIBNVRTC", "cupti": "CUDAFORGE_LIBCUPTI"}
# Libraries that the main one opens by bare name: preloaded from the same folder (CUPTI_NOTES).
COMPANIONS = {
    "nvrtc": ["libnvrtc-builtins.so.13.*", "libnvrtc-builtins.so.12.*", "libnvrtc-builtins.so"],
    "cupti": ["libnvperf_host.so"],
}
_lock = threading.Lock()


def wheel_dirs() -> list[str]:
    """Library folders of the nvidia-* wheels found on sys.path."""
    out = []
    for path in sys.path:
        for pattern in ("nvidia/cu13/lib", "nvidia/cu12/lib", "nvidia/cuda_*/lib"):
            out += [d for d in sorted(glob.glob(os.path.join(path, pattern))) if os.path.isdir(d)]
    return out


def toolkit_dirs() -> list[str]:
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    out = []
    for root in filter(None, roots):
        for sub in ("lib64", "lib", "extras/CUPTI/lib64", "targets/x86_64-linux/lib"):
            d = os.path.join(root, sub)
            if os.path.isdir(d):
                out.append(d)
    return out


def candidates(kind: str) -> list[str]:
    """Paths to try for libcuda / libnvrtc / libcupti, in order."""
    names = SONAMES[kind]
    out = list(names)  # bare sonames: reused when already mapped (RTLD_NOLOAD in the core)
    env = os.environ.get(ENV[kind])
    if env:
        out.insert(0, env)
    if kind != "cuda":  # the driver's library comes with the driver, not a toolkit
        for d in wheel_dirs() + toolkit_dirs():
            out += [os.path.join(d, n) for n in names if os.path.exists(os.path.join(d, n))]
    else:
        out += [os.path.join(d, n) for d in ("/usr/local/nvidia/lib64", "/usr/lib/wsl/lib")
                for n in names if os.path.exists(os.path.join(d, n))]
    seen, unique = set(), []
    for c in out:
        if c not in seen:
            seen.add(c)
            unique.append(c)
    return unique


def _preload_companions(kind: str, lib_path: str) -> None:
    folder = os.path.dirname(lib_path)
    for pattern in COMPANIONS.get(kind, []):
        for path in sorted(glob.glob(os.path.join(folder, pattern))):
            if ".alt." not in path:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                return


def ensure(kind: str) -> str:
    """Load libcuda / libnvrtc / libcupti if not loaded yet; return its path.

    Raises LibraryNotFound saying where it looked and which environment variable names it."""
    loaded = _core.loaded_libraries()
    if kind in loaded:
        return loaded[kind]
    with _lock:
        paths = candidates(kind)
        first_file = next((p for p in paths if os.path.isabs(p)), None)
        if first_file is not None and kind in COMPANIONS:
            _preload_companions(kind, first_file)
        return _core.load_library(kind, paths)


@functools.lru_cache(maxsize=1)
def include_dirs() -> list[str]:
    """Header folders for NVRTC: cuda_fp16.h and friends, CCCL where present, and last
    cudaforge's own small C headers (stdint.h, cmath, cfloat, ...) that NVRTC does not ship."""
    out = []
    for path in sys.path:
        out += [d for d in glob.glob(os.path.join(path, "nvidia", "cu1[23]", "include"))]
    for root in filter(None, [os.environ.get("CUDA_HOME"), "/usr/local/cuda"]):
        inc = os.path.join(root, "include")
        if os.path.exists(os.path.join(inc, "cuda_fp16.h")):
            out.append(inc)
        if os.path.isdir(os.path.join(inc, "cccl")):
            out.append(os.path.join(inc, "cccl"))
    out.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "include"))
    seen = set()
    return [d for d in out if not (d in seen or seen.add(d))]
