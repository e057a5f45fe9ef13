"""Build of cudaforge._core: C11 against the CPython C API, the CUDA headers and libcurl.

The CUDA libraries are not linked: the core opens them with dlopen at first use. Only their
headers are needed here, from $CUDA_HOME, /usr/local/cuda, or the nvidia-cuda-* wheels.
"""

import glob
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup

HEADERS = ("cuda.h", "nvrtc.h", "cupti.h", "cupti_profiler_host.h")


def header_dirs():
    roots = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"]
    found, missing = [], []
    candidates = [os.path.join(r, "include") for r in roots if r]
    for prefix in {sys.prefix, sys.base_prefix, os.environ.get("VIRTUAL_ENV", "")} - {""}:
        candidates += glob.glob(os.path.join(prefix, "lib", "python3*", "site-packages", "nvidia", "*", "include"))
    for path in sys.path:
        candidates += glob.glob(os.path.join(path, "nvidia", "*", "include"))
    for header in HEADERS:
        where = next((d for d in candidates if os.path.exists(os.path.join(d, header))), None)
        if where is None:
            missing.append(header)
        elif where not in found:
            found.append(where)
    if missing:
        sys.exit(
            f"cudaforge build: CUDA headers {', '.join(missing)} not found; install the CUDA toolkit "
            "(set CUDA_HOME) or `pip install 'nvidia-cuda-runtime==13.0.*' 'nvidia-cuda-nvrtc==13.0.*' "
            "'nvidia-cuda-cupti==13.0.*'`"
        )
    return found


def curl_flags():
    for tool in (["curl-config"], ["pkg-config", "libcurl"]):
        if not shutil.which(tool[0]):
            continue
        cflags = subprocess.run(tool + ["--cflags"], capture_output=True, text=True, check=False)
        libs = subprocess.run(tool + ["--libs"], capture_output=True, text=True, check=False)
        probe = subprocess.run(
            [os.environ.get("CC", "cc"), "-E", "-x", "c", "-", *cflags.stdout.split()],
            input="#include <curl/curl.h>\n", capture_output=True, text=True, check=False,
        )
        if cflags.returncode == 0 and libs.returncode == 0 and probe.returncode == 0:
            return cflags.stdout.split(), libs.stdout.split()
    sys.exit(
        "cudaforge build: libcurl development headers not found; install them "
        "(Debian/Ubuntu: apt-get install libcurl4-openssl-dev)"
    )


curl_cflags, curl_libs = curl_flags()
compile_args = ["-std=c11", "-Wall", "-Wextra", "-O2", "-fvisibility=hidden", *curl_cflags]
link_args = ["-ldl", *curl_libs]
if os.environ.get("CUDAFORGE_SANITIZE") == "1":
    compile_args += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-O1"]
    link_args += ["-fsanitize=address,undefined"]

setup(
    ext_modules=[
        Extension(
            "cudaforge._core",
            sources=sorted(glob.glob("csrc/*.c")),
            depends=["csrc/cudaforge.h"],
            include_dirs=["csrc", "csrc/shim", *header_dirs()],
            extra_compile_args=compile_args,
            extra_link_args=link_args,
        )
    ],
)
