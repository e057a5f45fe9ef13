"""The GPU's lock between a pool's processes (harness/quiet.py): exclusive across processes,
released when its holder ends, and set by the pool for GPU slots only."""

from __future__ import annotations

import subprocess
import sys
import time

from cudaforge.harness import quiet

HOLD = """
import os, sys, time
sys.path.insert(0, {root!r})
from cudaforge.harness.quiet import gpu_quiet
with gpu_quiet() as waited:
    print("held", flush=True)
    time.sleep(float(sys.argv[1]))
    released = time.time()
print(released, flush=True)
"""


def _holder(tmp_path, seconds: float) -> subprocess.Popen:
    root = str(__import__("pathlib").Path(__file__).resolve().parents[1])
    child = subprocess.Popen([sys.executable, "-c", HOLD.format(root=root), str(seconds)],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert child.stdout.readline().strip() == "held"
    return child


def test_the_lock_waits_for_another_process_to_release_it(tmp_path, monkeypatch):
    monkeypatch.setenv(quiet.ENV, str(tmp_path / "cuda-0.lock"))
    child = _holder(tmp_path, 0.5)
    with quiet.gpu_quiet() as waited:
        entered = time.time()
    released = float(child.stdout.readline())
    child.wait(10)
    assert entered >= released and waited > 0


def test_a_holder_that_dies_releases_the_lock(tmp_path, monkeypatch):
    monkeypatch.setenv(quiet.ENV, str(tmp_path / "cuda-0.lock"))
    child = _holder(tmp_path, 60.0)
    child.kill()
    child.wait(10)
    with quiet.gpu_quiet() as waited:
        assert waited is not None and waited < 30


def test_without_the_variable_nothing_is_locked(monkeypatch):
    monkeypatch.delenv(quiet.ENV, raising=False)
    with quiet.gpu_quiet() as waited:
        assert waited is None


def test_the_pool_gives_gpu_slots_one_lock_per_gpu(tmp_path, monkeypatch):
    from cudaforge.harness import pool as pool_module

    planned = [({}, "cuda:0"), ({}, "cuda:1"), ({}, "cuda:0")]
    monkeypatch.setattr(pool_module, "_plan_workers", lambda workers, device: planned)
    monkeypatch.setattr(pool_module.Slot, "start", lambda slot: None)
    monkeypatch.setattr(pool_module.WorkerPool, "_start_serving", lambda *a: None)
    pool_module.WorkerPool(log_dir=tmp_path)
    paths = [env[quiet.ENV] for env, _ in planned]
    assert paths[0] == paths[2] != paths[1]
    assert paths[0] == quiet.lock_path(tmp_path, "cuda:0") and paths[0].startswith(str(tmp_path))


def test_an_evaluation_times_only_while_it_holds_the_lock(tmp_path, monkeypatch):
    from cudaforge.harness.evaluate import run_evaluation
    from cudaforge.harness.options import make_options
    from cudaforge.harness.problem import Problem

    problem = Problem.from_source(
        "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
        "        return torch.relu(x)\n"
        "def get_inputs():\n    return [torch.randn(4, 32)]\n"
        "def get_init_inputs():\n    return []\n"
    )
    source = (
        "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
        "        return x.clamp_min(0)\n"
    )
    monkeypatch.setenv(quiet.ENV, str(tmp_path / "cuda-0.lock"))
    options = make_options(device="cpu", trials=1, timed_runs=3, warmup=1, input_sets=1)
    child = _holder(tmp_path, 1.0)
    started = time.time()
    result = run_evaluation(problem, source, options)
    released = float(child.stdout.readline())
    child.wait(10)
    assert result.status == "ok", result.error
    # the phases before the timing ran while the other process held the lock; the timing waited
    assert result.phase_seconds["gpu_lock_wait"] > 0
    assert started + result.phase_seconds["timing"] <= time.time() and released > started
