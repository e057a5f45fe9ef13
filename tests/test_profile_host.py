"""profiling/ and profiler_host.c without a GPU: metric list parsing, offline validation through CUPTI's
profiler host API for GH100 (H100/H200), pass counts, and the occupancy calculator behind the
launch__* metrics."""

from __future__ import annotations

import functools
import os
from typing import ClassVar

import pytest

import cudaforge.profiling.l2_flush as l2
import cudaforge.profiling.profiler as prof
from cudaforge import _core
from cudaforge.cuda import libs as _libs
from cudaforge.profiling import gpu, timing
from cudaforge.profiling.metrics import (
    LAUNCH_METRICS,
    METRICS,
    base_metrics,
    check_metrics,
    parse_metrics,
)
from cudaforge.profiling.occupancy import H200_LIMITS, launch_metrics, occupancy
from cudaforge.profiling.roofline import roofline

# The paper's list as DESIGN.md writes it (ncu --metrics syntax, with one {a,b,...} group).
PAPER_SPEC = (
    "sm__cycles_active.avg, sm__warps_active.avg.pct_of_peak_sustained_active, "
    "launch__occupancy_limit_blocks, launch__occupancy_limit_registers, "
    "launch__occupancy_limit_shared_mem, launch__registers_per_thread, sm__inst_executed.sum, "
    "sm__inst_executed_pipe_fp32.avg.pct_of_peak_sustained_active, "
    "sm__inst_executed_pipe_tensor.avg.pct_of_peak_sustained_active, dram__bytes_read.sum, "
    "dram__bytes_write.sum, dram__throughput.avg.pct_of_peak_sustained_elapsed, "
    "dram__bytes.sum.per_second, gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed, "
    "l1tex__t_sector_hit_rate.pct, l1tex__throughput.avg.pct_of_peak_sustained_active, "
    "lts__t_sector_hit_rate.pct, lts__throughput.avg.pct_of_peak_sustained_active, "
    "smsp__warp_issue_stalled_{memory_dependency,short_scoreboard,long_scoreboard,barrier,"
    "branch_resolving}_per_warp_active.pct, smsp__sass_average_branch_targets_threads_uniform.pct"
)
MEMORY_DEPENDENCY = "smsp__warp_issue_stalled_memory_dependency_per_warp_active.pct"
FP32_PIPE = "sm__inst_executed_pipe_fp32.avg.pct_of_peak_sustained_active"


@functools.lru_cache(maxsize=1)
def host_api_missing() -> str | None:
    if "libasan" in os.environ.get("LD_PRELOAD", ""):
        # libcupti dlopens libnvperf_host with RTLD_DEEPBIND, which AddressSanitizer aborts on
        return "the profiler host API cannot run under AddressSanitizer (RTLD_DEEPBIND)"
    try:
        _libs.ensure("cupti")
        _core.profiler_supported_chips()
    except (_core.LibraryNotFound, _core.ProfilerError, OSError) as exc:
        return f"CUPTI's profiler host API (libcupti + libnvperf_host) cannot load: {exc}"
    return None


@pytest.fixture
def host_api():
    reason = host_api_missing()
    if reason:
        print(reason)
        pytest.skip(reason)


# ---------------------------------------------------------------- parsing (pure Python)


def test_paper_list_parses_to_the_24_metrics():
    names = parse_metrics(PAPER_SPEC)
    assert names == list(METRICS)
    assert len(set(names)) == 24
    assert MEMORY_DEPENDENCY in names and FP32_PIPE in names


def test_parse_accepts_lists_whitespace_and_drops_repeats():
    assert parse_metrics("a__b.sum  c__d.avg,a__b.sum\n e__f.pct") == [
        "a__b.sum",
        "c__d.avg",
        "e__f.pct",
    ]
    assert parse_metrics(["x__y.sum", " x__y.sum ", "z__w.{min,max}"]) == [
        "x__y.sum",
        "z__w.min",
        "z__w.max",
    ]
    assert parse_metrics("") == []


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("dram__bytes.sum, bad name!", "name!"),
        ("a__b.{sum,avg", "unbalanced"),
        ("a__b.sum}", "unbalanced"),
        ("dram__bytes..sum", "dram__bytes..sum"),
    ],
)
def test_parse_rejects_malformed_names_by_name(spec, needle):
    with pytest.raises(ValueError, match=needle.replace(".", r"\.")):
        parse_metrics(spec)


def test_parse_rejects_non_strings():
    with pytest.raises(TypeError):
        parse_metrics(["a__b.sum", 3])


# ---------------------------------------------------------------- host API: GH100


def test_gh100_plan_for_the_paper_list(host_api):
    plan = check_metrics(METRICS, "GH100")
    assert plan.chip == "GH100"
    assert plan.launch == [m for m in METRICS if m.startswith("launch__")]
    assert len(plan.launch) == 4
    # the two names GH100 lacks: one stands in, one has no equivalent; none silently dropped
    assert plan.substitutes == {
        FP32_PIPE: "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active"
    }
    assert list(plan.unavailable) == [MEMORY_DEPENDENCY]
    assert "long_scoreboard" in plan.unavailable[MEMORY_DEPENDENCY]
    accounted = set(plan.collect) | set(plan.launch) | set(plan.unavailable) | set(plan.substitutes)
    assert set(METRICS) <= accounted
    assert len(plan.collect) == 19
    # measured on the H200 (CUPTI_NOTES: offline pass counts matched the device): 6 passes
    assert plan.passes == 6


def test_unknown_metrics_are_reported_by_name_not_dropped(host_api):
    p = _core.Profiler(
        [
            "dram__bytes_read.sum",
            "foo__bar.sum",
            "dram__bytes.sum.bogus",
            "launch__registers_per_thread",
            "dram__bytes_read",  # known base metric, but without a rollup it cannot be collected
            "dram__bytes_read.sum",  # repeated: collected once
        ],
        chip="GH100",
    )
    assert p.metrics == ("dram__bytes_read.sum",)
    assert set(p.unsupported) == {
        "foo__bar.sum",
        "dram__bytes.sum.bogus",
        "launch__registers_per_thread",
        "dram__bytes_read",
    }
    assert "no metric 'foo__bar' on chip GH100" in p.unsupported["foo__bar.sum"]
    assert "suffix '.sum.bogus'" in p.unsupported["dram__bytes.sum.bogus"]
    assert "not a hardware counter" in p.unsupported["launch__registers_per_thread"]
    assert p.passes == 1
    assert p.device is None and p.chip == "GH100"


def test_pass_counts_grow_with_the_list(host_api):
    one = _core.Profiler(["dram__bytes_read.sum"], chip="GH100").passes
    many = _core.Profiler(
        ["dram__bytes_read.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed"],
        chip="GH100",
    ).passes
    assert one == 1
    assert many > one
    assert _core.Profiler([], chip="GH100").passes == 0


def test_base_metrics_properties_and_submetrics(host_api):
    p = _core.Profiler([], chip="GH100")
    base = p.base_metrics()
    assert set(base) == {"counter", "ratio", "throughput"}
    everything = {m for names in base.values() for m in names}
    assert {"dram__bytes_read", "sm__inst_executed_pipe_fma", "dram__throughput"} <= everything
    assert "sm__inst_executed_pipe_fp32" not in everything
    assert p.base_metrics("throughput") == base["throughput"]
    assert base_metrics("GH100") == base
    props = p.properties("dram__throughput.avg.pct_of_peak_sustained_elapsed")
    assert props["dim_unit"] == "percent" and props["type"] == "throughput"
    assert ".avg.pct_of_peak_sustained_elapsed" in p.submetrics("dram__throughput")
    with pytest.raises(KeyError, match="foo__bar"):
        p.properties("foo__bar.sum")
    with pytest.raises(ValueError, match="type must be"):
        p.base_metrics("bogus")


def test_offline_profiler_refuses_to_profile_and_bad_arguments(host_api):
    p = _core.Profiler(["dram__bytes_read.sum"], chip="GH100")
    with pytest.raises(ValueError, match="offline"):
        p.profile(lambda: None)
    with pytest.raises(ValueError, match="NOT_A_CHIP"):
        _core.Profiler(["dram__bytes_read.sum"], chip="NOT_A_CHIP")
    with pytest.raises(TypeError, match="list of names"):
        _core.Profiler("dram__bytes_read.sum", chip="GH100")
    with pytest.raises(TypeError, match="must be str"):
        _core.Profiler([b"dram__bytes_read.sum"], chip="GH100")
    assert "GH100" in _core.profiler_supported_chips()


def test_timing_needs_a_start():
    with pytest.raises(RuntimeError, match="without timing_start"):
        _core.timing_stop()
    stats = _core.timing_stats()
    assert (
        stats["active"] is False
        and stats["dropped"] == stats["dropped_by_cupti"] + stats["dropped_over_limit"]
    )


# ---------------------------------------------------------------- occupancy (launch__*)


@pytest.mark.parametrize(
    ("regs", "threads", "smem", "blocks", "pct", "limiter"),
    [
        (32, 256, 0, 8, 100.0, {"registers", "warps"}),  # 64 warps: full
        (64, 1024, 0, 1, 50.0, {"registers"}),  # 2048 regs/warp: 32 warps/SM
        (38, 256, 0, 6, 75.0, {"registers"}),  # 38*32 rounds up to 1280 per warp
        (16, 128, 48 * 1024, 4, 25.0, {"shared_mem"}),  # (48 KB + 1 KB reserved) per block
        (16, 32, 0, 32, 50.0, {"blocks"}),  # tiny blocks: the 32 blocks/SM limit
        (255, 256, 0, 1, 12.5, {"registers"}),  # 8192 regs per warp: 8 warps
        (255, 512, 0, 0, 0.0, {"registers"}),  # over 65536 registers per block: no launch
    ],
)
def test_occupancy_matches_the_cuda_calculator(regs, threads, smem, blocks, pct, limiter):
    occ = occupancy(regs, threads, smem)
    assert occ.blocks_per_sm == blocks
    assert occ.theoretical_pct == pytest.approx(pct)
    assert set(occ.limiter) == limiter


def test_occupancy_uses_the_driver_carveout():
    # with an 8 KB carveout chosen by the driver, 1 KB reserved per block allows 8 blocks
    occ = occupancy(16, 64, 0, shared_config=8 * 1024)
    assert occ.limits["shared_mem"] == 8
    assert occ.shared_config_bytes == 8192


def test_launch_metrics_names_and_values():
    occ = occupancy(64, 1024, 0)
    values = launch_metrics(occ, 64)
    assert set(values) == set(LAUNCH_METRICS)
    assert values["launch__registers_per_thread"] == 64
    assert values["launch__occupancy_limit_registers"] == 1
    assert values["launch__occupancy_limit_blocks"] == 32


def test_roofline_bound_and_rates():
    ceilings = {"dram_bytes_per_s": 4e12, "fp32_flops_per_s": 5e13, "bf16_tensor_flops_per_s": 6e14}
    copy = roofline(1e-4, ceilings, dram_bytes=3.6e8)
    assert copy.bandwidth == pytest.approx(3.6e12)
    assert copy.bandwidth_pct == pytest.approx(90.0)
    assert copy.bound == "memory" and copy.flop_rate is None
    mm = roofline(1e-3, ceilings, dram_bytes=1.2e7, flops=2e10)
    assert mm.intensity == pytest.approx(2e10 / 1.2e7)
    assert mm.bound == "compute"
    assert mm.flop_pct == pytest.approx(40.0)
    assert roofline(1e-3, ceilings, 1e6, 1e6, tensor=True).flop_ceiling == "bf16_tensor"


def test_min_bytes_of_nested_tensors():
    torch = pytest.importorskip("torch")
    a = torch.zeros(10, dtype=torch.float32)
    b = torch.zeros(3, 4, dtype=torch.float16)
    assert prof.min_bytes_of(a, [b, (a,)], "not a tensor") == 40 + 24 + 40


def test_package_exports_the_profile_function():
    import cudaforge

    assert cudaforge.profile is prof.profile
    with pytest.raises(TypeError, match="zero-argument callable"):
        prof.profile(42)


# ---------------------------------------------------------------- profile_forward's assembly


class _FakeEvent:
    def __init__(self, **_):
        pass

    def record(self, stream=None):
        pass

    def elapsed_time(self, other):
        return 0.5


class _FakeCuda:
    Event = _FakeEvent

    @staticmethod
    def is_available():
        return True

    @staticmethod
    def current_device():
        return 0

    @staticmethod
    def device(index):
        import contextlib

        return contextlib.nullcontext()

    @staticmethod
    def synchronize(device=None):
        pass

    @staticmethod
    def current_stream(device=None):
        return None


class _FakeTorch:
    cuda = _FakeCuda


def _record(name, corr, regs, grid, block, duration):
    return {
        "name": name, "start_ns": 1000 * corr, "end_ns": 1000 * corr + duration,
        "duration_ns": duration, "stream": 7, "correlation_id": corr, "device": 0, "context": 1,
        "grid": grid, "block": block, "registers": regs, "static_shared": 0,
        "dynamic_shared": 0, "shared_executed": 0, "local_bytes": 0,
    }  # fmt: skip


class _FakeProfiler:
    named = True
    refuse = None

    def __init__(self, collect, device=0):
        if _FakeProfiler.refuse:
            raise _FakeProfiler.refuse
        self.collect, self.chip, self.passes = list(collect), "GH100", 6
        self.replays = []
        self.last_run = {"names_note": None if self.named else "kernel names unavailable: test"}

    kept: ClassVar[list[bool]] = []
    enabled: ClassVar[list[bool]] = []  # the real one's last_run["reused_enabled"], when set

    def profile(self, fn, max_kernels=256, replay="kernel", keep=False, before=None):
        if keep:
            self.last_run["reused_enabled"] = bool(_FakeProfiler.enabled)
            _FakeProfiler.enabled.append(True)
        for _ in range(self.passes if replay == "user" else 1):
            if before is not None:
                before()
            fn()
        self.replays.append(replay)
        _FakeProfiler.kept.append(keep)
        names = ["add", "matmul", "add"]
        out = []
        for i, name in enumerate(names):
            metrics = {m: float(10 * i + 1) for m in self.collect}
            metrics["dram__throughput.avg.pct_of_peak_sustained_elapsed"] = (
                90.0 if name == "add" else 5.0
            )
            out.append({"range": i, "name": name if self.named else None, "metrics": metrics})
        return out


class _FakeCore:
    def __init__(self):
        self.calls = 0
        self.ProfilerError = _core.ProfilerError

    def timing_start(self):
        pass

    def timing_stop(self):
        out = []
        for it in range(10):
            base = 10 * it
            out += [
                _record("add", base + 1, 16, (4096, 1, 1), (256, 1, 1), 20_000),
                _record("matmul", base + 2, 40, (64, 64, 1), (16, 16, 1), 300_000),
                _record("add", base + 3, 16, (4096, 1, 1), (256, 1, 1), 22_000),
            ]
        return out

    def timing_stats(self):
        return {"dropped": 0}

    def device_info(self, device=0):
        return dict(H200_LIMITS, name="NVIDIA H200 (fake)")

    @staticmethod
    def Profiler(metrics, chip=None, device=0):  # stands in for the type
        if chip is not None:  # offline plans go to the real host API
            return _core.Profiler(metrics, chip=chip)
        return _FakeProfiler(metrics, device)


@pytest.fixture
def fake_gpu(monkeypatch, host_api):
    fake = _FakeCore()
    monkeypatch.setattr(gpu, "require_torch", lambda: _FakeTorch)
    monkeypatch.setattr(gpu, "prepare", lambda device: None)
    monkeypatch.setattr(prof, "_core", fake)
    monkeypatch.setattr(timing, "_core", fake)
    monkeypatch.setattr(prof, "_profilers", {})
    fake.flushes = []
    monkeypatch.setattr(
        prof, "l2_flush", lambda device, method=None: lambda: fake.flushes.append(device)
    )
    _FakeProfiler.named, _FakeProfiler.refuse, _FakeProfiler.kept = True, None, []
    _FakeProfiler.enabled = []
    return fake


CEILINGS = {"dram_bytes_per_s": 4e12, "fp32_flops_per_s": 5e13, "bf16_tensor_flops_per_s": 6e14}


def test_workers_keep_the_range_profiler_enabled(fake_gpu, monkeypatch):
    monkeypatch.setattr(prof, "KEEP_ENABLED", True)  # what cudaforge.harness.pool sets
    first = prof.profile_forward(lambda: None, ceilings=False)
    # the first profile after enabling is done twice (CUPTI's own DRAM writes), later ones once
    assert _FakeProfiler.kept == [True, True]
    assert first.profile_phases["first_profile_after_enable"] > 0
    second = prof.profile_forward(lambda: None, ceilings=False)
    assert _FakeProfiler.kept == [True, True, True]
    assert "first_profile_after_enable" not in second.profile_phases
    prof.profile_forward(lambda: None, ceilings=False, keep_enabled=False)
    assert _FakeProfiler.kept == [True, True, True, False]


@pytest.mark.parametrize("named", [True, False])
def test_profile_forward_assembles_kernels(fake_gpu, named):
    _FakeProfiler.named = named
    calls = []
    result = prof.profile_forward(
        lambda: calls.append(1), ceilings=CEILINGS, min_bytes=4_000_000, flops={"matmul": 2e9}
    )
    assert len(calls) == 2 + 10 + 6  # warm-up, timed iterations, one call per profiler pass
    assert _FakeProfiler.kept[-1] is False  # the user's process does not keep it enabled
    assert fake_gpu.flushes == [0] * 6 and result.l2_flushed  # the L2 flushed before each pass
    assert result.reason is None and result.chip == "GH100" and result.passes == 6
    assert [k.name for k in result.kernels] == ["matmul", "add"]  # by time per forward
    matmul, add = result.kernels
    assert add.launches == 2 and add.total_ms == pytest.approx(0.042)
    assert add.time_ms == pytest.approx(0.021)
    assert matmul.share == pytest.approx(0.3 / 0.342)
    assert (
        matmul.registers_per_thread == 40 and matmul.metrics["launch__registers_per_thread"] == 40
    )
    assert matmul.occupancy.blocks_per_sm == 6
    dram = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
    assert add.metrics[dram] == 90.0 and matmul.metrics[dram] == 5.0
    fp32 = "sm__inst_executed_pipe_fp32.avg.pct_of_peak_sustained_active"
    assert fp32 in add.metrics and add.substitutes[fp32].startswith("sm__inst_executed_pipe_fma")
    assert list(add.unavailable) == [
        "smsp__warp_issue_stalled_memory_dependency_per_warp_active.pct"
    ]
    assert "launch__occupancy_limit_warps" not in add.metrics  # not asked for
    assert matmul.roofline.flops == 2e9 and matmul.roofline.bound is not None
    assert result.min_time_ms == pytest.approx(1.0e-3)
    again = prof.ForwardProfile.from_json(result.to_json())
    assert again == result


def test_profile_forward_without_counters(fake_gpu):
    err = _core.ProfilerError("cuptiRangeProfilerEnable failed: (test)")
    err.reason = "insufficient_privileges"
    _FakeProfiler.refuse = err
    result = prof.profile_forward(lambda: None, ceilings=False)
    assert result.reason.startswith("insufficient_privileges")
    assert [k.name for k in result.kernels] == ["matmul", "add"]
    for k in result.kernels:
        assert set(k.metrics) == {m for m in METRICS if m.startswith("launch__")}
        dram = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
        assert "insufficient_privileges" in k.unavailable[dram]
        assert k.roofline is None


def test_profile_keywords_parse_before_the_device_check(host_api):
    """profile()'s keywords (names, keep) are parsed in C before anything touches a GPU: an
    offline Profiler refuses with its own reason, not an argument error."""
    p = _core.Profiler(["dram__bytes_read.sum"], chip="GH100")
    for kw in ({}, {"keep": True}, {"names": False, "keep": True, "replay": "user", "before": len}):
        with pytest.raises(ValueError, match="offline"):
            p.profile(lambda: None, max_kernels=3, **kw)
    with pytest.raises(TypeError):
        p.profile(lambda: None, keep=True, bogus=1)
    with pytest.raises(TypeError, match="before must be None or callable"):
        p.profile(lambda: None, before=3)
    assert _core.profiler_release() is False  # nothing was enabled


def test_the_l2_discard_kernel_compiles_for_sm80_up_and_is_refused_below():
    # L2Flush's "discard" method needs discard.global.L2 (sm_80+)
    import cudaforge
    from cudaforge.errors import CompileError

    mod = cudaforge.compile(l2.L2_DISCARD_SOURCE, arch="sm_90a", name="l2_discard.cu")
    assert mod.kernels == ["cudaforge_l2_discard"]
    with pytest.raises(CompileError, match="discard"):
        cudaforge.compile(l2.L2_DISCARD_SOURCE, arch="sm_75", name="l2_discard.cu")
    with pytest.raises(ValueError, match="method must be one of"):
        l2.L2Flush(0, method="invalidate")


def test_the_default_flush_falls_back_to_reads_where_discard_does_not_compile(monkeypatch):
    from cudaforge.errors import CompileError

    made = []

    class FakeFlush:
        def __init__(self, device, method):
            if method == "discard":
                raise CompileError("ptxas: discard.global.L2 requires sm_80 or higher")
            made.append((device, method))
            self.method, self.fallback = method, None

    monkeypatch.setattr(l2, "L2Flush", FakeFlush)
    monkeypatch.setattr(l2, "_l2_flushes", {})
    flush = l2.l2_flush(3)
    assert flush.method == "read" and made == [(3, "read")]
    assert "discard flush unavailable" in flush.fallback and "sm_80" in flush.fallback
    assert l2.l2_flush(3) is flush and l2.l2_flush(3, "read") is flush  # made once
    with pytest.raises(CompileError):  # asked for by name: no fallback
        l2.l2_flush(3, "discard")
    assert made == [(3, "read")]


def test_the_default_flush_is_the_one_asked_for_by_name(monkeypatch):
    made = []

    class FakeFlush:
        def __init__(self, device, method):
            made.append((device, method))
            self.method, self.fallback = method, None

    monkeypatch.setattr(l2, "L2Flush", FakeFlush)
    monkeypatch.setattr(l2, "_l2_flushes", {})
    assert l2.l2_flush(0) is l2.l2_flush(0, l2.L2_FLUSH_METHOD) is l2.l2_flush(0)
    other = "read" if l2.L2_FLUSH_METHOD != "read" else "discard"
    assert l2.l2_flush(0, other).method == other and l2.l2_flush(1).method == "discard"
    assert made == [(0, "discard"), (0, other), (1, "discard")]  # one buffer set per kind
