"""cudaforge.RayPool on a local Ray instance on the CPU: results come back from the actors with
the node that measured them; two actors evaluate at once; a segfaulting candidate kills only its
worker subprocess, never the actor; a lost actor is replaced; `optimize(cluster="ray")` and
`cudaforge bench --ray` evaluate through a RayPool; without Ray the error says what to install."""

from __future__ import annotations

import json
import os
import sys

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install cudaforge[ray])")

import cudaforge
import cudaforge.harness.ray_pool
from cudaforge.harness.ray_pool import RayPool

FAST = {"trials": 2, "timed_runs": 4, "warmup": 1, "input_sets": 1}
PROBLEM = cudaforge.Problem.from_dev_set(1, 19).shrink(8 << 20)  # ReLU at a CPU size

GOOD = """
import torch
class ModelNew(torch.nn.Module):  # a PyTorch stand-in for a kernel
    def forward(self, x):
        return torch.clamp_min(x, 0.0)
"""
WRONG = GOOD.replace("clamp_min(x, 0.0)", "clamp_min(x, 0.1)")
SEGFAULT = GOOD.replace(
    "        return", "        __import__('ctypes').string_at(0)\n        return"
)


def stamped(log, partner=None) -> str:
    """GOOD, but its __init__ sleeps 1 s and writes when it started and ended and which process
    it is (its start time in ticks since boot, PID namespace and pid: issue 17 starts each
    worker in a namespace of its own, where the host's pids, the actor's included, are not
    visible, and namespaces' numbers are reused) to `log`. With `partner` (the other candidate's
    log) it first says it started and waits up to 20 s for the partner to start too: a worker
    that starts late on a loaded 2-core machine still overlaps, while two evaluations run one
    after the other still do not (the first ends before the second starts)."""
    wait = ""
    if partner is not None:
        wait = (
            f"open({str(log) + '.started'!r}, 'w').close(); d = time.time() + 20; "
            "[time.sleep(0.05) for _ in iter(lambda: os.path.exists("
            f"{str(partner) + '.started'!r}) or time.time() > d, True)]; "
        )
    record = (
        f"t = time.time(); {wait}time.sleep(1.0); "
        f"open({str(log)!r}, 'w').write(json.dumps({{'start': t, 'end': time.time(), "
        "'pid': open('/proc/self/stat').read().split(')')[-1].split()[19] + ' ' + "
        "os.readlink('/proc/self/ns/pid') + ' ' + str(os.getpid())}))"
    )
    return GOOD.replace("import torch", "import json, os, time, torch").replace(
        "    def forward", f"    def __init__(self):\n        super().__init__()\n        {record}\n"
        "    def forward",
    )  # fmt: skip


@pytest.fixture(scope="module")
def pool():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with RayPool(workers=2, device="cpu", timeout=20, compile_timeout=60) as p:
            assert p.wait_ready(120), p.devices
            yield p
    finally:
        ray.shutdown()


def two_at_once(pool, tmp_path, tag: str) -> list[dict]:
    """Two stamped evaluations submitted together: what each candidate wrote, by actor slot."""
    logs = [tmp_path / f"{tag}{i}.json" for i in range(2)]
    results = pool.map(PROBLEM, [stamped(logs[0], logs[1]), stamped(logs[1], logs[0])], **FAST)
    assert [r.status for r in results] == ["ok", "ok"], [r.error for r in results]
    assert {r.worker for r in results} == {0, 1}, "one actor took both"
    stamps = [json.loads(log.read_text()) for log in logs]
    return [stamp for _, stamp in sorted(zip([r.worker for r in results], stamps))]


def test_right_and_wrong_candidates_with_the_node_that_measured_them(pool):
    good, wrong = pool.map(PROBLEM, [GOOD, WRONG], **FAST)
    assert good.status == "ok" and good.correct and good.candidate_ms > 0, good.error
    assert wrong.status == "incorrect" and wrong.failure is not None, wrong.error
    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    for r in (good, wrong):
        assert r.node in nodes and r.worker in (0, 1) and r.problem_hash == PROBLEM.hash
        assert cudaforge.EvalResult.from_json(r.to_json()).node == r.node
    assert pool.size == 2 and all(d.startswith("cpu@") for d in pool.devices)
    assert cudaforge.evaluate(PROBLEM, GOOD, pool=pool, **FAST).ok  # evaluate(pool=RayPool)


def test_two_actors_evaluate_at_once(pool, tmp_path):
    first, second = two_at_once(pool, tmp_path, "overlap")
    assert first["start"] < second["end"] and second["start"] < first["end"], (first, second)
    # in two actors' worker subprocesses (two processes: their slots differ, see two_at_once),
    # neither of them this process
    me = f"{os.readlink('/proc/self/ns/pid')} {os.getpid()}"
    assert first["pid"] != second["pid"] and not any(s["pid"].endswith(me) for s in (first, second))


def test_a_segfault_kills_only_the_worker_and_the_actor_carries_on(pool, tmp_path):
    before = two_at_once(pool, tmp_path, "before")
    restarts = pool.restarts
    crashed = pool.evaluate(PROBLEM, SEGFAULT, **FAST)
    assert crashed.status == "crashed" and "SIGSEGV" in crashed.error, crashed.error
    assert crashed.node and crashed.worker in (0, 1)
    after = two_at_once(pool, tmp_path, "after")
    # both actors took the next evaluations fine (no actor was replaced: restarts below), each
    # in a new worker: issue 17 runs every candidate in a fresh process, so the other actor's
    # worker is new too (was: the same process as before)
    assert after[crashed.worker]["pid"] != before[crashed.worker]["pid"]  # a new worker there
    assert after[1 - crashed.worker]["pid"] != before[1 - crashed.worker]["pid"]
    assert pool.restarts == restarts  # no actor was replaced


def test_a_lost_actor_is_replaced_and_its_job_retried(pool, tmp_path):
    restarts = pool.restarts
    ray.kill(pool._slots[0].actor, no_restart=True)  # as if its node went away
    two_at_once(pool, tmp_path, "lost")
    assert pool.restarts == restarts + 1 and pool.wait_ready(0)


class Borrowed:
    """Stands in for a RayPool that optimize() or the CLI makes: the module's pool, counted."""

    def __init__(self, pool, *args, **kwargs):
        self.pool, self.args, self.kwargs = pool, args, kwargs
        self.submitted, self.closed = 0, False

    def __getattr__(self, name):
        return getattr(self.pool, name)

    def submit_options(self, *args):
        self.submitted += 1
        return self.pool.submit_options(*args)

    def evaluate(self, *args, **options):
        self.submitted += 1
        return self.pool.evaluate(*args, **options)

    def close(self):
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@pytest.fixture()
def borrowed(pool, monkeypatch):
    made: list[Borrowed] = []

    def make(*args, **kwargs):
        made.append(Borrowed(pool, *args, **kwargs))
        return made[-1]

    monkeypatch.setattr(cudaforge.harness.ray_pool, "RayPool", make)
    return made


def test_optimize_with_cluster_ray_evaluates_on_a_ray_pool(borrowed, tmp_path, monkeypatch):
    from test_hotspots import build
    from test_optimize_cpu import FAST_EVAL, GELU_FUSED, TOLERANCE, Net, scripted

    monkeypatch.setenv("CUDAFORGE_CACHE_DIR", str(tmp_path / "cache"))
    model, x = build(Net, 128, 64)
    result = cudaforge.optimize(
        model, (x,), llm=scripted([GELU_FUSED]), store=False, progress=False, rounds=1,
        min_share=0.0, min_speedup=0.0, tolerance=TOLERANCE, eval_options=FAST_EVAL,
        cluster="ray",
    )  # fmt: skip
    (ray_pool,) = borrowed
    assert ray_pool.args == () and ray_pool.submitted >= 1 and ray_pool.closed
    gelu = next(h for h in result.hotspots if "NewGELU" in h.name)
    assert gelu.status == "swapped", gelu.detail
    assert gelu.worker_result["node"] in ray_pool.nodes
    with pytest.raises(ValueError, match="cluster"):
        cudaforge.optimize(model, (x,), llm=scripted([GELU_FUSED]), cluster="dask")


def test_bench_ray_option_evaluates_on_a_ray_pool(pool, borrowed, tmp_path, monkeypatch, capsys):
    from cudaforge.agents.loop import run_loop
    from cudaforge.agents.providers import ScriptedProvider
    from cudaforge.cli.main import CPU_MAX_BYTES, main

    monkeypatch.setenv("CUDAFORGE_CACHE_DIR", str(tmp_path / "cache"))
    transcript = tmp_path / "fixture.jsonl"
    # FIXTURE replies written by hand for the test, recorded by a real loop, then replayed
    run_loop(
        cudaforge.Problem.from_dev_set(1, 19).shrink(CPU_MAX_BYTES).source,
        lambda problem, candidate: pool.evaluate(problem, candidate, **FAST),
        coder=ScriptedProvider([f"FIXTURE\n```python\n{GOOD}\n```"], model="fixture"),
        judge=ScriptedProvider(["FIXTURE Judge.\nVERDICT: STOP"], model="fixture"),
        rounds=1, transcript=str(transcript), name="19_ReLU",
    )  # fmt: skip
    results = tmp_path / "bench.jsonl"
    code = main(["bench", "--dev-set", "--level", "1", "--ids", "19", "--llm",
                 f"replay:{transcript}", "--rounds", "1", "--results", str(results),
                 "--trials", "2", "--timed-runs", "4", "--ray", "local"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    (ray_pool,) = borrowed
    assert ray_pool.args == ("local",) and ray_pool.submitted >= 1 and ray_pool.closed
    (record,) = [json.loads(line) for line in results.read_text().splitlines()]
    assert record["status"] == "ok" and record["meta"]["shrunk"] is True


def test_without_ray_the_error_says_what_to_install(monkeypatch, capsys):
    from cudaforge.cli.main import EXIT_MISSING, main

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if it were absent
    with pytest.raises(
        cudaforge.errors.ExtraNotInstalled, match=r"pip install cudaforge\[ray\]"
    ) as e:
        RayPool(device="cpu")
    assert isinstance(e.value, ImportError) and isinstance(e.value, cudaforge.CudaforgeError)
    assert e.value.name == "ray" and e.value.extra == "ray"
    assert main(["bench", "--dev-set", "--ids", "19", "--ray", "local"]) == EXIT_MISSING
    assert "pip install cudaforge[ray]" in capsys.readouterr().err
