"""cudaforge.WorkerPool on the CPU: a segfault, an abort or a hang ends with the worker replaced and
a result saying what happened; the pool carries on; evaluations run in parallel; the caller's
process never runs a candidate; close() leaves no process behind."""

from __future__ import annotations

import os
import time

import pytest

from cudaforge.harness.pool import WorkerPool
from cudaforge.harness.problem import Problem

FAST = {"trials": 2, "timed_runs": 4, "warmup": 1, "input_sets": 2}

RELU = Problem.from_source(
    """
import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)
def get_inputs():
    return [torch.randn(8, 64)]
def get_init_inputs():
    return []
""",
    name="relu",
)


def candidate(forward_first_line: str = "", module_line: str = "", init_line: str = "") -> str:
    return f"""
import os, time, ctypes, torch
{module_line}
class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        {init_line or "pass"}
    def forward(self, x):
        {forward_first_line or "pass"}
        return torch.relu(x)
"""


GOOD = candidate()


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # a zombie still answers kill(0) until its parent reaps it; it is dead once its other
        # threads are too (waitpid reports it only then)
        try:
            with open(f"/proc/{pid}/stat") as f:
                zombie = f.read().split()[2] == "Z"
            if zombie and len(os.listdir(f"/proc/{pid}/task")) <= 1:
                return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def _pids_running(argument: str) -> list[int]:
    """Host pids of the processes whose command line holds `argument`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if argument.encode() in f.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                pass
    return found


def _live_pids_among(pids) -> list[int]:
    return [pid for pid in pids if not _gone(pid, within=5.0)]


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(2, device="cpu", timeout=3, compile_timeout=20) as p:
        yield p


@pytest.mark.parametrize(
    "line,signal_name",
    [("ctypes.string_at(0)", "SIGSEGV"), ("os.abort()", "SIGABRT"), ("os._exit(3)", "exit code 3")],
)
def test_a_dying_worker_is_replaced_and_the_next_evaluation_is_fine(pool, line, signal_name):
    restarts, pids = pool.restarts, set(pool.pids())
    r = pool.evaluate(RELU, candidate(line), **FAST)
    assert r.status == "crashed" and signal_name in r.error, r.error
    assert "replaced" in r.error and r.problem_hash == RELU.hash and r.compiled
    if signal_name == "SIGSEGV":
        # faulthandler's dump names the candidate's line
        assert "Segmentation fault" in r.error and "<candidate" in r.error
    assert pool.restarts == restarts + 1
    assert pool.evaluate(RELU, GOOD, **FAST).ok
    # issue 17: a worker runs one candidate, so every evaluation replaces its worker (the
    # assertion "one new worker, the other carried on" no longer holds); the crashed process
    # is gone and a fresh worker waits in every slot
    assert len(pool.pids()) == pool.size and not _live_pids_among(pids - set(pool.pids()))


def test_a_hang_times_out_and_the_worker_is_replaced(pool):
    started = time.monotonic()
    r = pool.evaluate(RELU, candidate("while True: pass"), **FAST)
    elapsed = time.monotonic() - started
    assert r.status == "timeout" and "within 3 s while running" in r.error
    assert r.compiled and 3 <= elapsed < 10
    assert pool.evaluate(RELU, GOOD, **FAST).ok


def test_a_hang_while_loading_uses_the_compile_timeout(pool):
    r = pool.evaluate(RELU, candidate(module_line="time.sleep(60)"), compile_timeout=2, **FAST)
    assert r.status == "timeout" and "within 2 s while loading" in r.error and not r.compiled
    assert pool.evaluate(RELU, GOOD, **FAST).ok


def test_evaluations_run_in_parallel_across_workers(pool, tmp_path):
    # each candidate records when its __init__ starts and ends: the two intervals must overlap.
    # It stays until the other has started (at most 20 s) and 1.5 s more, so that a worker
    # dispatched late on a loaded machine still overlaps; run one after the other, they cannot.
    def slow(tag, other):
        log, seen = str(tmp_path / tag), str(tmp_path / other)
        return candidate(init_line=(
            f"open({log!r}, 'a').write(f'{{time.time()}}\\n'); t = time.time()\n"
            f"        while not os.path.exists({seen!r}) and time.time() - t < 20: time.sleep(0.05)\n"
            f"        time.sleep(1.5); open({log!r}, 'a').write(f'{{time.time()}}\\n')"
        ))  # fmt: skip

    assert pool.wait_ready(60)
    results = pool.map(RELU, [slow("a", "b"), slow("b", "a")], **FAST)
    assert [r.status for r in results] == ["ok", "ok"], [r.error for r in results]
    assert {r.worker for r in results} == {0, 1}
    (a0, a1), (b0, b1) = ([float(t) for t in (tmp_path / k).read_text().split()[:2]] for k in "ab")
    assert a0 < b1 and b0 < a1, "the two evaluations did not overlap in time"


def test_the_callers_process_never_runs_the_candidate(pool, tmp_path):
    marker = tmp_path / "pid"
    # issue 17: the candidate's process has exited by now and may have a PID namespace of its
    # own, so it names itself by namespace and pid (was: its pid is one of pool.pids())
    me = "os.readlink('/proc/self/ns/pid') + ' ' + str(os.getpid())"
    source = candidate(module_line=f"open({str(marker)!r}, 'w').write({me})")
    assert pool.evaluate(RELU, source, **FAST).ok
    seen = marker.read_text()
    assert seen != f"{os.readlink('/proc/self/ns/pid')} {os.getpid()}"
    assert not any(name.startswith("cudaforge_candidate_") for name in __import__("sys").modules)


def test_a_candidate_printing_a_lot_does_not_break_the_protocol(pool):
    source = candidate("print('x' * 100_000); os.write(1, b'y' * 100_000)")
    assert pool.evaluate(RELU, source, **FAST).ok


def test_a_worker_killed_between_evaluations_is_restarted(pool):
    victim = pool.pids()[0]
    os.kill(victim, 9)
    assert _gone(victim)
    results = pool.map(RELU, [GOOD, GOOD, GOOD], **FAST)
    assert all(r.ok for r in results), [r.error for r in results]


def test_close_leaves_no_process_behind(tmp_path):
    marker = tmp_path / "child"
    # the candidate starts a process of its own; closing the pool kills its process group too
    # issue 17: in the worker's PID namespace p.pid is not the host's pid: the child is found
    # by its command line (a unique sleep time) instead
    spawn = (
        "import subprocess; p = subprocess.Popen(['sleep', '60.0170017']); "
        f"open({str(marker)!r}, 'w').write(str(p.pid))"
    )
    pool = WorkerPool(2, device="cpu", timeout=2, compile_timeout=20)
    pids = pool.pids()
    r = pool.evaluate(
        RELU, candidate(module_line=spawn, forward_first_line="time.sleep(30)"), **FAST
    )
    assert r.status == "timeout" and marker.exists()
    assert all(_gone(pid) for pid in _pids_running("60.0170017"))  # killed with the worker
    pids += pool.pids()
    pool.close()
    assert all(_gone(pid) for pid in pids)
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit(RELU, GOOD)


def test_pending_evaluations_are_cancelled_by_close():
    pool = WorkerPool(1, device="cpu")
    assert pool.wait_ready(60)
    slow = pool.submit(RELU, candidate(init_line="time.sleep(1)"), **FAST)
    queued = [pool.submit(RELU, GOOD, **FAST) for _ in range(3)]
    time.sleep(0.2)
    pool.close()
    assert slow.result().ok  # the running one finished
    assert all(f.cancelled() or f.result().ok for f in queued)


def test_evaluate_without_a_pool_uses_the_default_one():
    import cudaforge
    from cudaforge.harness.pool import default_pool

    try:
        r = cudaforge.evaluate(RELU, GOOD, device="cpu", **FAST)
        assert r.ok, r.error
        assert default_pool() is default_pool() and default_pool().size >= 1
    finally:
        default_pool().close()
