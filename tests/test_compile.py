"""compile.c and kernel.py on the CPU: NVRTC compiles without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import cudaforge
from cudaforge.cuda import kernel
from cudaforge.errors import LibraryNotFound

ADD = r"""
extern "C" __global__ void add(const float* __restrict__ a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"""


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDAFORGE_CACHE_DIR", str(tmp_path / "cache"))
    kernel._memory_cache.clear()


def test_compile_gives_a_cubin_and_kernel_signatures():
    mod = cudaforge.compile(ADD, arch="sm_90")
    assert mod.image[:4] == b"\x7fELF"  # a cubin is an ELF image
    assert mod.kernels == ["add"]
    assert mod.signatures["add"].codes == "pppi"
    assert mod.signatures["add"].param_names == ["a", "b", "c", "n"]
    assert mod.resources["add"]["registers"] > 0
    assert mod.resources["add"]["spill_store_bytes"] == 0


def test_compile_error_carries_log_and_quotes_the_line():
    src = 'extern "C" __global__ void f(float* x) {\n    x[0] = undefined_name;\n}\n'
    with pytest.raises(cudaforge.CompileError) as info:
        cudaforge.compile(src, arch="sm_90", name="broken.cu")
    err = info.value
    assert err.line == 2
    assert "undefined_name" in err.log
    assert "broken.cu(2): error" in str(err)
    assert "x[0] = undefined_name;" in str(err)  # the failing line, quoted
    assert "--gpu-architecture=sm_90" in err.options
    assert isinstance(err, ValueError)


def test_rejected_option_is_a_compile_error():
    with pytest.raises(cudaforge.CompileError, match="-O3"):
        cudaforge.compile(ADD, arch="sm_90", options=["-O3"])


def test_empty_source_is_rejected():
    with pytest.raises(ValueError, match="non-empty"):
        cudaforge.compile("   ", arch="sm_90")


def test_cache_hit_from_memory_and_disk(tmp_path):
    first = cudaforge.compile(ADD, arch="sm_90")
    assert not first.cached
    assert cudaforge.compile(ADD, arch="sm_90").cached
    kernel._memory_cache.clear()
    from_disk = cudaforge.compile(ADD, arch="sm_90")
    assert from_disk.cached and from_disk.image == first.image
    # a different option or arch is a different entry
    assert not cudaforge.compile(ADD, arch="sm_80").cached
    assert not cudaforge.compile(ADD, arch="sm_90", options=["-DFOO=1"]).cached


def test_corrupt_cache_entry_is_recompiled(tmp_path):
    first = cudaforge.compile(ADD, arch="sm_90")
    files = list((tmp_path / "cache" / "kernels").rglob("*.bin"))
    assert len(files) == 1
    data = bytearray(files[0].read_bytes())
    data[-10] ^= 0xFF  # flip a byte of the cubin
    files[0].write_bytes(bytes(data))
    kernel._memory_cache.clear()
    again = cudaforge.compile(ADD, arch="sm_90")
    assert not again.cached
    assert again.image == first.image
    # and a truncated file
    files[0].write_bytes(files[0].read_bytes()[:20])
    kernel._memory_cache.clear()
    assert cudaforge.compile(ADD, arch="sm_90").image == first.image


def test_cache_files_are_never_torn(tmp_path):
    # concurrent writers of the same entry: each reader sees a whole file
    code = (
        "import cudaforge, sys\n"
        "src = sys.argv[1]\n"
        "for i in range(5):\n"
        "    m = cudaforge.compile(src, arch='sm_90')\n"
        "    assert m.image[:4] == b'\\x7fELF'\n"
    )
    env = dict(os.environ, CUDAFORGE_CACHE_DIR=str(tmp_path / "cache"))
    procs = [
        subprocess.Popen([sys.executable, "-c", code, ADD.replace("add", f"add{i % 2}")], env=env)
        for i in range(4)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    assert not list((tmp_path / "cache" / "kernels").rglob(".tmp-*"))


@pytest.mark.parametrize(
    "given, expected",
    [("sm_90a", "sm_90a"), ("90", "sm_90"), ((8, 0), "sm_80"), ("compute_90", "compute_90")],
)
def test_arch_names(given, expected):
    assert kernel.normalize_arch(given) == expected


def test_arch_that_nvrtc_cannot_target():
    with pytest.raises(ValueError, match="targets only"):
        kernel.normalize_arch("sm_52")
    with pytest.raises(ValueError, match="not like"):
        kernel.normalize_arch("hopper")


def test_arch_checks_load_nvrtc_in_a_fresh_process():
    # current_arch() (L2Flush's first call) and normalize_arch() may be a process's first use
    # of NVRTC: they load it, as compile() does
    code = "import cudaforge.cuda.kernel as k; print(k.normalize_arch('sm_90'))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0 and out.stdout.strip() == "sm_90", out.stderr[-1500:]


def test_compute_target_gives_ptx():
    mod = cudaforge.compile(ADD, arch="compute_90")
    assert b".entry add" in mod.image and mod.image.endswith(b"\0")


def test_name_expressions_for_templates():
    src = "template <typename T> __global__ void fill(T* x, T v) { x[threadIdx.x] = v; }\n"
    mod = cudaforge.compile(src, arch="sm_90", name_expressions=["fill<float>"])
    assert mod.lowered["fill<float>"].startswith("_Z")
    assert mod.kernels == []


def test_param_codes():
    assert kernel.param_code("const float* __restrict__ x") == ("p", "x")
    assert kernel.param_code("unsigned long long n") == ("L", "n")
    assert kernel.param_code("const int n") == ("i", "n")
    assert kernel.param_code("double alpha") == ("d", "alpha")
    assert kernel.param_code("__half h") == ("?", "h")
    src = 'extern "C" { __global__ void __launch_bounds__(128) k(float s, size_t n) {} }\n'
    sig = kernel.find_kernels(src)["k"]
    assert sig.codes == "fL"
    # a kernel without extern "C" is not exposed by name
    assert kernel.find_kernels("__global__ void g(int x) {}") == {}


def test_compile_without_gpu_and_no_arch_says_what_to_do(monkeypatch):
    if os.path.exists("/proc/driver/nvidia"):
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(cudaforge.NoGPUError, match="arch='sm_90'"):
        cudaforge.compile(ADD)


def test_import_and_compile_without_libcuda(tmp_path):
    code = (
        "import cudaforge\n"
        "m = cudaforge.compile(open(0).read(), arch='sm_90')\n"
        "try:\n"
        "    m.add\n"
        "except cudaforge.errors.LibraryNotFound as e:\n"
        "    print('LIBCUDA-MISSING', e.env_var)\n"
    )
    env = dict(
        os.environ, CUDAFORGE_LIBCUDA="/nonexistent/libcuda.so.1", CUDAFORGE_CACHE_DIR=str(tmp_path)
    )
    if os.path.exists("/proc/driver/nvidia"):
        pytest.skip("libcuda is present on this machine")
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=ADD,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "LIBCUDA-MISSING CUDAFORGE_LIBCUDA" in out.stdout


L2_CALLS = [
    ("persisting_l2_limit", ()),
    ("set_persisting_l2_limit", (1 << 20,)),
    ("stream_window_bytes", (0,)),
    ("clear_stream_window", (0,)),
    ("reset_persisting_l2", ()),
]


@pytest.mark.parametrize("name, args", L2_CALLS, ids=[n for n, _ in L2_CALLS])
def test_persisting_l2_calls_without_libcuda_name_the_library(name, args):
    if os.path.exists("/proc/driver/nvidia"):
        pytest.skip("libcuda is present on this machine")
    with pytest.raises(LibraryNotFound, match="libcuda") as info:
        getattr(cudaforge._core, name)(*args)
    assert info.value.env_var == "CUDAFORGE_LIBCUDA"


def test_persisting_l2_arguments_are_checked_before_the_driver():
    with pytest.raises(OverflowError):
        cudaforge._core.set_persisting_l2_limit(-1)
    with pytest.raises(TypeError, match="int handle"):
        cudaforge._core.stream_window_bytes("stream")
    with pytest.raises(TypeError, match="int handle"):
        cudaforge._core.clear_stream_window(None)


def test_doctor_without_gpu_exits_zero():
    out = subprocess.run(
        [sys.executable, "-m", "cudaforge", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["nvrtc"].startswith(("12.", "13."))
    assert "sm_90" in report["nvrtc_archs"]
    if not report["libraries"]["cuda"]:
        assert any(m.startswith("libcuda") for m in report["missing"])
    text = subprocess.run(
        [sys.executable, "-m", "cudaforge", "doctor"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert text.returncode == 0 and "NVRTC:" in text.stdout


def test_unknown_library_kind():
    with pytest.raises(ValueError, match="unknown library kind"):
        cudaforge._core.load_library("cudnn", [])


def test_c_standard_names_compile_without_includes():
    # NVRTC ships no C headers; cudaforge's prelude and headers give the common names
    src = r"""
#include <cstdint>
#include <cmath>
#include <cfloat>
#include <climits>
extern "C" __global__ void k(float* x, int64_t* y, uint32_t n) {
    x[0] = -INFINITY + FLT_MAX * 0.f + std::sqrt(x[1]) + (float)M_PI;
    y[0] = INT_MAX + (int64_t)n + std::int64_t(UINT8_MAX);
}
"""
    assert cudaforge.compile(src, arch="sm_90").signatures["k"].codes == "ppI"
    bare = 'extern "C" __global__ void k(float* x, int64_t n) { x[0] = INFINITY + FLT_MAX + n; }'
    assert cudaforge.compile(bare, arch="sm_90").signatures["k"].codes == "pl"


def test_default_arch_from_the_environment(monkeypatch):
    monkeypatch.setenv("CUDAFORGE_ARCH", "sm_80")
    assert cudaforge.compile(ADD).arch == "sm_80"
    monkeypatch.setenv("CUDAFORGE_ARCH", "sm_5")
    with pytest.raises(ValueError, match="not like"):
        cudaforge.compile(ADD)
