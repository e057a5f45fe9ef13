"""timing.c, the profiler_*.c files and profiling/ on the GPU (the H200; root, so counters are readable).

Run: pytest -m gpu tests/test_profile_gpu.py -v -s   (-s shows which coexistence case happened)
"""

from __future__ import annotations

import gc
import json
import statistics
import subprocess
import sys
import textwrap
import warnings

import pytest

import cudaforge
import cudaforge.profiling.l2_flush as l2
import cudaforge.profiling.profiler as prof
from cudaforge import _core
from cudaforge.cuda import libs as _libs
from cudaforge.profiling.feedback import format_profile
from cudaforge.profiling.metrics import METRICS, check_metrics
from cudaforge.profiling.roofline import measure_ceilings
from cudaforge.profiling.timing import time_forward

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

KERNELS = r"""
extern "C" __global__ void copy4(const float4* __restrict__ x, float4* __restrict__ y, long long n4) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n4) y[i] = x[i];
}

extern "C" __global__ void add(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

extern "C" __global__ void accumulate(const float* a, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] += a[i];
}

extern "C" __global__ void gelu_tanh(const float* x, float* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        y[i] = 0.5f * v * (1.f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
    }
}

// one thread per output, no tiling: bound by the SM's load and FMA issue, not by DRAM
extern "C" __global__ void matmul_naive(const float* A, const float* B, float* C, int n) {
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < n && col < n) {
        float acc = 0.f;
        for (int k = 0; k < n; k++) acc += A[row * n + k] * B[k * n + col];
        C[row * n + col] = acc;
    }
}
"""

SM_THROUGHPUT = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
DRAM = "dram__throughput.avg.pct_of_peak_sustained_elapsed"


@pytest.fixture(scope="module")
def mod():
    _libs.ensure("cuda")
    _libs.ensure("cupti")  # the _core timing/profiler calls below need libcupti loaded
    return cudaforge.compile(KERNELS)


@pytest.fixture(scope="module")
def copy_case(mod):
    n = 1 << 26  # 256 MB in, 256 MB out: far past the 50 MB L2
    x = torch.randn(n, device="cuda")
    y = torch.empty_like(x)
    n4 = n // 4

    def forward():
        mod.copy4(((n4 + 255) // 256,), (256,), (x, y, n4))

    return forward, x, y


@pytest.fixture(scope="module")
def matmul_case(mod):
    n = 1024  # 4 MB per matrix: the operands stay in L2
    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    c = torch.empty(n, n, device="cuda")

    def forward():
        mod.matmul_naive((n // 16, n // 16), (16, 16), (a, b, c, n))

    return forward, a, b, c


def test_timing_gives_one_record_per_launch(mod):
    n = 1 << 22
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    c = torch.empty_like(a)
    launches = 7
    mod.add(((n + 255) // 256,), (256,), (a, b, c, n))  # loads the module
    torch.cuda.synchronize()
    host_before = _core.timing_clock_ns()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    _core.timing_start()
    start.record()
    for _ in range(launches):
        mod.add(((n + 255) // 256,), (256,), (a, b, c, n))
    end.record()
    records = [r for r in _core.timing_stop() if r["name"] == "add"]
    assert len(records) == launches
    assert all(r["duration_ns"] > 0 and r["end_ns"] > r["start_ns"] for r in records)
    ids = [r["correlation_id"] for r in records]
    assert ids == sorted(ids) and len(set(ids)) == launches
    attrs = mod.add.attributes()
    for r in records:
        assert r["grid"] == ((n + 255) // 256, 1, 1) and r["block"] == (256, 1, 1)
        # CUPTI (like ncu's launch__registers_per_thread) gives the registers allocated per
        # thread, the compiler's count rounded up to the allocation unit of 8 (seen on the H200)
        assert r["registers"] == -(-attrs["registers_per_thread"] // 8) * 8
        assert r["static_shared"] == attrs["static_shared_bytes"] and r["dynamic_shared"] == 0
        assert r["start_ns"] >= host_before  # our CLOCK_MONOTONIC clock
    # the kernel times fit inside the CUDA-event time of the whole loop
    total_ms = sum(r["duration_ns"] for r in records) / 1e6
    events_ms = start.elapsed_time(end)
    assert 0 < total_ms <= 1.05 * events_ms + 0.01, (total_ms, events_ms)
    # each launch moves 12 bytes per element: no faster than the H200's 4.8 TB/s (datasheet)
    assert all(r["duration_ns"] * 1e-9 >= 12 * n / 4.8e12 for r in records)
    assert _core.timing_stats()["dropped"] == 0


def test_kernel_records_agree_with_the_hardware_duration(mod):
    # 131072 blocks of 256 threads. CUPTI times CONCURRENT_KERNEL records by instrumenting the
    # kernel before Blackwell, which read such kernels up to 9% long on the H200; the default
    # (KERNEL records) must agree with the Range Profiler's gpu__time_duration, as ncu reads it.
    n = 1 << 25
    x = torch.randn(n, device="cuda")
    y = torch.empty_like(x)
    flush = l2.l2_flush(0)

    def launch():
        mod.gelu_tanh(((n + 255) // 256,), (256,), (x, y, n))

    launch()
    torch.cuda.synchronize()

    def traced_us(serial):
        _core.timing_start(serial=serial)
        for i in range(20):
            flush(i)
            launch()
        records = [r for r in _core.timing_stop() if r["name"] == "gelu_tanh"]
        assert len(records) == 20
        return statistics.median(r["duration_ns"] for r in records) / 1e3

    kernel, concurrent = traced_us(True), traced_us(False)
    profiler = _core.Profiler(["gpu__time_duration.sum"], device=0)
    try:
        hardware = statistics.median(
            profiler.profile(launch, replay="user", keep=True, names=False, before=flush)[0][
                "metrics"
            ]["gpu__time_duration.sum"]
            / 1e3
            for _ in range(10)
        )
    finally:
        _core.profiler_release()
    print(f"gelu_tanh: KERNEL records {kernel:.2f} us, CONCURRENT_KERNEL {concurrent:.2f} us, "
          f"gpu__time_duration {hardware:.2f} us")  # fmt: skip
    assert abs(kernel / hardware - 1) < 0.03, (kernel, hardware, concurrent)


def test_records_past_the_limit_are_counted_not_lost(mod):
    n = 1 << 16
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    c = torch.empty_like(a)
    _core.timing_start(max_records=5)
    for _ in range(20):
        mod.add(((n + 255) // 256,), (256,), (a, b, c, n))
    with pytest.warns(RuntimeWarning, match="lost 15 kernel records"):
        records = _core.timing_stop()
    assert len(records) == 5
    stats = _core.timing_stats()
    assert stats["dropped_over_limit"] == 15 and stats["dropped"] == 15


def test_range_profiler_names_ranges_and_calls_fn_once(mod, matmul_case):
    n = 1 << 20
    a = torch.randn(n, device="cuda")
    c = torch.zeros(n, device="cuda")
    mm, *_ = matmul_case
    calls = []

    def forward():
        calls.append(1)
        mod.accumulate(((n + 255) // 256,), (256,), (a, c, n))
        mm()
        mod.accumulate(((n + 255) // 256,), (256,), (a, c, n))

    profiler = _core.Profiler(
        ["gpu__time_duration.sum", "dram__bytes_read.sum", SM_THROUGHPUT], device=0
    )
    assert profiler.passes > 1  # sm__throughput needs several: replayed inside each launch
    ranges = profiler.profile(forward)
    assert len(calls) == 1 and profiler.last_run["calls"] == 1
    assert [r["name"] for r in ranges] == ["accumulate", "matmul_naive", "accumulate"]
    assert [r["range"] for r in ranges] == [0, 1, 2]
    assert all(r["metrics"]["gpu__time_duration.sum"] > 0 for r in ranges)
    # kernel replay restores memory between passes: each accumulate ran once in effect
    torch.testing.assert_close(c, 2 * a)


def test_memory_bound_copy_vs_compute_bound_matmul(mod, copy_case, matmul_case):
    metrics = list(METRICS) + [SM_THROUGHPUT]
    kernels = {"copy4": mod.copy4, "matmul_naive": mod.matmul_naive}
    forward, x, _y = copy_case
    copy = prof.profile_forward(
        forward,
        metrics=metrics,
        kernels=kernels,
        resources=mod.resources,
        min_bytes=2 * x.numel() * 4,
    )
    assert copy.reason is None, copy.reason
    kc = next(k for k in copy.kernels if k.name == "copy4")
    mm_forward, *_ = matmul_case
    matmul = prof.profile_forward(
        mm_forward, metrics=metrics, kernels=kernels, resources=mod.resources, flops=2 * 1024**3
    )
    km = next(k for k in matmul.kernels if k.name == "matmul_naive")
    print(f"\ncopy4: DRAM {kc.metrics[DRAM]:.1f}%, SM {kc.metrics[SM_THROUGHPUT]:.1f}%")
    print(f"matmul_naive: DRAM {km.metrics[DRAM]:.1f}%, SM {km.metrics[SM_THROUGHPUT]:.1f}%")
    assert kc.metrics[DRAM] >= 70 and kc.metrics[SM_THROUGHPUT] <= 40
    assert km.metrics[SM_THROUGHPUT] >= 60 and km.metrics[DRAM] <= 30
    # static facts agree with the function attributes and the driver's occupancy calculator
    for k, fn in ((kc, mod.copy4), (km, mod.matmul_naive)):
        attrs = fn.attributes()
        assert k.registers_per_thread == attrs["registers_per_thread"]
        assert k.metrics["launch__registers_per_thread"] == k.registers_allocated
        assert k.registers_allocated == -(-attrs["registers_per_thread"] // 8) * 8
        assert k.occupancy.driver_blocks_per_sm == k.occupancy.blocks_per_sm
        assert k.spill_store_bytes == 0
    assert set(kc.unavailable) == {"smsp__warp_issue_stalled_memory_dependency_per_warp_active.pct"}
    assert kc.substitutes  # the fp32 pipe value comes from the FMA pipes on GH100
    assert kc.roofline.bandwidth_pct > 60 and km.roofline.flop_rate > 0
    text = format_profile(copy)
    assert "memory-bound" in text
    assert "compute-bound" in format_profile(matmul)


def test_profile_degrades_to_timing_and_static_facts(mod, copy_case, monkeypatch):
    forward, *_ = copy_case

    def no_counters(device, collect):
        err = _core.ProfilerError("cuptiRangeProfilerEnable failed: (simulated) no rights")
        err.reason = "insufficient_privileges"
        raise err

    monkeypatch.setattr(prof, "_profiler", no_counters)
    result = prof.profile_forward(forward, kernels={"copy4": mod.copy4})
    assert result.reason.startswith("insufficient_privileges")
    k = next(k for k in result.kernels if k.name == "copy4")
    assert (
        k.time_ms > 0 and k.registers_per_thread == mod.copy4.attributes()["registers_per_thread"]
    )
    assert set(k.metrics) == {m for m in METRICS if m.startswith("launch__")}
    assert DRAM in k.unavailable and "insufficient_privileges" in k.unavailable[DRAM]
    assert "Hardware metrics unavailable (insufficient_privileges" in format_profile(result)


def test_profile_problem_and_candidate(mod):
    n = 1 << 20

    class AddModel(torch.nn.Module):
        def forward(self, a, b):
            c = torch.empty_like(a)
            mod.add(((n + 255) // 256,), (256,), (a, b, c, n))
            return c

    result = cudaforge.profile([torch.randn(n), torch.randn(n)], AddModel())
    assert result.min_bytes == 3 * n * 4
    assert [k.name for k in result.kernels] == ["add"]
    assert result.kernels[0].metrics[DRAM] > 0


def test_ceilings_are_measured_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDAFORGE_CACHE_DIR", str(tmp_path))
    first = measure_ceilings()
    assert (tmp_path / "ceilings.json").exists()
    assert 1e12 < first["dram_bytes_per_s"] < 1e13  # H200: ~4 TB/s of 4.8 peak
    assert 1e13 < first["fp32_flops_per_s"] < first["bf16_tensor_flops_per_s"]
    assert measure_ceilings() == first


COEXIST = textwrap.dedent(
    r"""
    import json, torch, cudaforge
    from cudaforge import _core
    from cudaforge.cuda import libs as _libs
    from cudaforge.profiling.timing import time_forward
    src = '''extern "C" __global__ void add(const float* a, const float* b, float* c, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) c[i] = a[i] + b[i]; }'''
    mod = cudaforge.compile(src)
    n = 1 << 24
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    c = torch.empty_like(a)
    fwd = lambda: mod.add(((n + 255) // 256,), (256,), (a, b, c, n))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
        for _ in range(3):
            fwd(); (a * 2).sum()
        torch.cuda.synchronize()
    seen = any(e.name == "add" for e in p.events())
    out = {"torch_profiler_saw_add": seen}
    try:
        t = time_forward(fwd, iterations=10)
        add = next(k for k in t.kernels if k.name == "add")
        out.update(timing="works", kernel_us=add.mean_us, event_us=t.forward_ms * 1e3,
                   timing_reason=t.reason)
    except _core.ProfilerError as e:
        out.update(timing="refused", reason=e.reason, message=str(e))
    try:
        r = _core.Profiler(["dram__bytes_read.sum"], device=0).profile(fwd)
        out.update(metrics="works", dram_read=r[0]["metrics"]["dram__bytes_read.sum"])
    except _core.ProfilerError as e:
        out.update(metrics="refused", metrics_reason=e.reason, metrics_message=str(e))
    print(json.dumps(out))
    """
)


def test_coexistence_with_torch_profiler():
    """torch.profiler (Kineto) first, then ours, in a fresh process: either works (with sane
    kernel times: Kineto's timestamp callback is replaced by ours) or is refused with reason
    'another_subscriber' and a message that names the other client."""
    run = subprocess.run(
        [sys.executable, "-c", COEXIST], check=False, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    print("\ncoexistence:", out)
    assert out["torch_profiler_saw_add"]
    if out["timing"] == "works":
        assert out["timing_reason"] is None
        # 192 MB moved: ~50 us at H200 bandwidth; the event time bounds the kernel time
        assert 0.5 * out["event_us"] < out["kernel_us"] <= 1.05 * out["event_us"], out
    else:
        assert out["reason"] == "another_subscriber", out
        assert "another CUPTI client" in out["message"]
    if out["metrics"] == "works":
        assert out["dram_read"] >= 2 * (1 << 24) * 4 * 0.9
    else:
        assert out["metrics_reason"] == "another_subscriber", out
        assert "another CUPTI client" in out["metrics_message"]


def test_profile_while_timing_is_refused_or_named(mod, copy_case):
    forward, *_ = copy_case
    profiler = _core.Profiler(["dram__bytes_read.sum"], device=0)
    _core.timing_start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ranges = profiler.profile(forward)
    finally:
        _core.timing_stop()
    # the ranges are still measured; only their names are missing, and last_run says why
    assert len(ranges) == 1 and ranges[0]["name"] is None
    assert "timing_start() is running" in profiler.last_run["names_note"]


def test_user_replay_calls_fn_once_per_pass_and_agrees_with_kernel_replay(mod, matmul_case):
    mm, *_ = matmul_case
    calls = []

    def forward():
        calls.append(1)
        mm()

    names = ["gpu__time_duration.sum", "sm__inst_executed.sum", SM_THROUGHPUT, DRAM]
    profiler = _core.Profiler(names, device=0)
    by_kernel = profiler.profile(forward, replay="kernel")
    kernel_calls = len(calls)
    by_user = profiler.profile(forward, replay="user")
    assert kernel_calls == 1 and len(calls) - kernel_calls == profiler.passes > 1
    assert profiler.last_run["replay"] == "user" and profiler.last_run["calls"] == profiler.passes
    assert [r["name"] for r in by_user] == [r["name"] for r in by_kernel] == ["matmul_naive"]
    # instruction counts agree (0.17% apart on the H200: the passes are separate runs);
    # throughput percentages within a few points
    k, u = by_kernel[0]["metrics"], by_user[0]["metrics"]
    assert u["sm__inst_executed.sum"] == pytest.approx(k["sm__inst_executed.sum"], rel=0.01)
    assert abs(u[SM_THROUGHPUT] - k[SM_THROUGHPUT]) < 5
    with pytest.raises(ValueError, match="replay must be"):
        profiler.profile(forward, replay="app")


def test_unnamed_profile_and_pass_timing(mod, matmul_case):
    """names=False skips the naming trace (names None, the reason stated); last_run splits the
    pass loop into start / call / sync / stop, which together stay within the pass phase."""
    mm, *_ = matmul_case
    profiler = _core.Profiler(["gpu__time_duration.sum", SM_THROUGHPUT], device=0)
    ranges = profiler.profile(mm, replay="user", names=False)
    run = profiler.last_run
    assert len(ranges) == 1 and ranges[0]["name"] is None
    assert "names=False" in run["names_note"]
    parts = run["pass_seconds"]
    assert set(parts) == {"before", "start", "call", "sync", "stop"}
    assert all(v >= 0 for v in parts.values())
    assert 0 < sum(parts.values()) <= run["seconds"]["passes"] * 1.01
    with pytest.raises(TypeError):
        profiler.profile(mm, names="yes please", bogus=1)


def test_kept_range_profiler_is_reused_and_released(mod, matmul_case):
    """keep=True leaves the Range Profiler enabled and configured: the next keep=True call of the
    same Profiler with the same replay reuses it, with the same counts; another replay or another
    Profiler sets up its own (one configured again for other metrics gave NaNs on the H200);
    timing still works meanwhile, and release ends it."""
    mm, *_ = matmul_case
    _core.profiler_release()
    profiler = _core.Profiler(["gpu__time_duration.sum", "sm__inst_executed.sum"], device=0)
    inst = "sm__inst_executed.sum"
    first = profiler.profile(mm, replay="user", keep=True)
    assert profiler.last_run["reused_enabled"] is False
    for _ in range(2):
        again = profiler.profile(mm, replay="user", keep=True)
        assert profiler.last_run["reused_enabled"] is True
        assert again[0]["metrics"][inst] == pytest.approx(first[0]["metrics"][inst], rel=0.01)
    assert set(profiler.last_run["setup_seconds"]) == {"counter_data", "set_config", "trace"}
    kernel = profiler.profile(mm, replay="kernel", keep=True)
    assert profiler.last_run["reused_enabled"] is False
    assert kernel[0]["metrics"][inst] == pytest.approx(first[0]["metrics"][inst], rel=0.01)
    # a new Profiler reads counter availability, which needs the kept one gone
    other = _core.Profiler([DRAM], device=0)
    assert other.profile(mm, replay="kernel", keep=True)[0]["metrics"][DRAM] > 0
    assert other.last_run["reused_enabled"] is False
    back = profiler.profile(mm, replay="user", keep=True)
    assert profiler.last_run["reused_enabled"] is False
    assert back[0]["metrics"][inst] == pytest.approx(first[0]["metrics"][inst], rel=0.01)
    timing = time_forward(mm, iterations=3)
    assert [k.name for k in timing.kernels] == ["matmul_naive"]
    assert _core.profiler_release() is True
    assert _core.profiler_release() is False
    profiler.profile(mm, replay="user")
    assert profiler.last_run["reused_enabled"] is False


def test_before_runs_once_per_pass_outside_the_ranges(mod):
    """profile(before=...) runs before every pass, and what it launches (here an L2 flush) is
    not profiled; the add after the flush reads its 8 MB of inputs from DRAM."""
    n = 1 << 20
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    c = torch.empty_like(a)
    calls = []
    flush = l2.l2_flush(0)

    def before():
        calls.append(1)
        flush()

    def forward():
        mod.add(((n + 255) // 256,), (256,), (a, b, c, n))

    profiler = _core.Profiler(check_metrics(METRICS, "GH100").collect, device=0)
    ranges = profiler.profile(forward, replay="user", before=before)
    assert profiler.passes >= 2 and len(calls) == profiler.passes
    assert [r["name"] for r in ranges] == ["add"]
    assert ranges[0]["metrics"]["dram__bytes_read.sum"] == pytest.approx(2 * 4 * n, rel=0.1)
    assert profiler.last_run["pass_seconds"]["before"] > 0
    result = prof.profile_forward(forward, metrics=["dram__bytes_read.sum"], ceilings=False)
    assert result.l2_flushed and result.reason is None


@pytest.mark.parametrize("method", sorted(l2.L2_FLUSH_METHODS))
def test_the_l2_flush_leaves_few_dirty_lines(mod, method):
    """After the flush, an add whose 4 MB output fits in the L2 reads its 8 MB of inputs from
    DRAM and writes back almost nothing (a write-only flush would leave ~60 MB of dirty lines to
    write back; ncu's flush leaves none; the read method left up to 18 KB on the H200)."""
    n = 1 << 20
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    c = torch.empty_like(a)
    flush = l2.l2_flush(0, method)
    assert flush.method == method
    default = l2.l2_flush(0)  # discard compiles for every GPU of sm_80 on
    assert default.method == l2.L2_FLUSH_METHOD == "discard" and default.fallback is None
    assert l2.l2_flush("cuda:0", method) is flush
    assert l2.l2_flush(torch.device("cuda", 0), method) is flush

    def forward():
        mod.add(((n + 255) // 256,), (256,), (a, b, c, n))

    profiler = _core.Profiler(["dram__bytes_write.sum", "dram__bytes_read.sum"], device=0)
    try:
        # The first profile after the Range Profiler is enabled is left out: on the H200 its add
        # wrote 6.1 MB back (CUPTI's first Start, after the flush, leaves dirty lines of its own),
        # the next four 8.4-12.5 KB (21:07 UTC).
        runs = [profiler.profile(forward, replay="user", keep=True, names=False,
                                 before=flush)[0]["metrics"] for _ in range(6)][1:]  # fmt: skip
    finally:
        _core.profiler_release()
    written = [m["dram__bytes_write.sum"] for m in runs]
    read = [m["dram__bytes_read.sum"] for m in runs]
    print(f"{method} flush: bytes written back {written}, read {read}")
    # discard: none written back (0 B in all five on the H200, 02:59 UTC); read: up to 25 KB
    assert max(written) < (4 << 10 if method == "discard" else 64 << 10), runs
    assert min(read) == pytest.approx(2 * 4 * n, rel=0.05), runs


def test_the_default_flush_is_discard_in_a_fresh_process():
    # the flush may be a worker's first NVRTC compile (a candidate built with load_inline)
    code = (
        "import cudaforge.profiling.l2_flush as p; f = p.l2_flush(0); print(f.method, f.fallback)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0 and out.stdout.split() == ["discard", "None"], out.stderr[-1500:]


def test_no_profiler_is_made_while_a_profile_runs(mod, matmul_case):
    """Making a Profiler reads counter availability, which needs the kept Range Profiler gone:
    while a profile() is using it, the new Profiler is refused and the running profile ends well."""
    mm, *_ = matmul_case
    profiler = _core.Profiler(["sm__inst_executed.sum"], device=0)
    refused = []

    def fn():
        try:
            _core.Profiler([DRAM], device=0)
        except RuntimeError as e:
            refused.append(str(e))
        mm()

    ranges = profiler.profile(fn, replay="user", keep=True)
    assert refused and "a profile() is running" in refused[0]
    assert ranges[0]["metrics"]["sm__inst_executed.sum"] > 0
    assert _core.profiler_release() is True


def test_trace_names_survive_module_reuse():
    """CUPTI names records by function handle: a module unloaded and the next one loaded at the
    same handle got the old kernel's name (on the H200 a transpose was reported as 'relu').
    Modules are retired late, so 24 modules in a row each keep their own names."""
    x = torch.zeros(1024, device="cuda")
    seen = []
    for i in range(24):
        name = f"fill_{i}"
        src = f'extern "C" __global__ void {name}(float* x) {{ x[threadIdx.x] = {i}.0f; }}'
        compiled = cudaforge.compile(src)
        _core.timing_start()
        compiled.kernel(name)((1,), (32,), (x,))
        seen.append([r["name"] for r in _core.timing_stop()])
        assert x[0].item() == i
        del compiled
        gc.collect()
    assert seen == [[f"fill_{i}"] for i in range(24)]
