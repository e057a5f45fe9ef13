"""The `cudaforge` command end to end on the CPU: exit codes, one-line errors, JSON output, a
forge replayed from a transcript, the report, the demo."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import cudaforge
from cudaforge.agents.loop import run_loop
from cudaforge.agents.providers import ScriptedProvider

GOOD = """
import torch
class ModelNew(torch.nn.Module):  # a PyTorch stand-in for a kernel
    def forward(self, x):
        return torch.clamp_min(x, 0.0)
"""
WRONG = GOOD.replace("clamp_min(x, 0.0)", "clamp_min(x, 0.1)")
FAST = ["--trials", "2", "--timed-runs", "5"]


def cli(*args, env=None, cwd=None):
    full_env = dict(os.environ, **(env or {}))
    full_env.pop("OPENAI_API_KEY", None)
    return subprocess.run(
        [sys.executable, "-m", "cudaforge", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=full_env,
        cwd=cwd,
        check=False,
    )


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDAFORGE_CACHE_DIR", str(tmp_path / "cache"))


def test_eval_right_and_wrong_candidates(tmp_path):
    good, wrong = tmp_path / "good.py", tmp_path / "wrong.py"
    good.write_text(GOOD)
    wrong.write_text(WRONG)
    out = cli("eval", "L1/19", str(good), "--json", *FAST)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["status"] == "ok"
    out = cli("eval", "L1/19", str(wrong), *FAST)
    assert out.returncode == 1
    assert "incorrect" in out.stdout and "first failure" in out.stdout


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    out = cli("eval", "L1/5", str(tmp_path / "none.py"))
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "cudaforge: error:" in out.stderr
    out = cli("eval", "nonsense", str(tmp_path / "none.py"))
    assert out.returncode == 2 and "dev-set id" in out.stderr


def test_forge_without_a_key_says_which_variable(tmp_path):
    out = cli("forge", "L1/19", "--llm", "openai:o3", "--out", str(tmp_path))
    assert out.returncode == 3
    assert "OPENAI_API_KEY" in out.stderr and "Traceback" not in out.stderr


def test_forge_replays_a_transcript_with_no_api(tmp_path):
    problem = cudaforge.Problem.from_dev_set(1, 19).shrink(8 << 20)
    transcript = tmp_path / "fixture.jsonl"
    # FIXTURE replies written by hand for the test, recorded by a real loop, then replayed
    coder = ScriptedProvider([f"FIXTURE\n```python\n{GOOD}\n```"], model="fixture")
    judge = ScriptedProvider(["FIXTURE Judge.\nVERDICT: STOP"], model="fixture")

    def evaluate(problem_source, candidate_source):
        return cudaforge.evaluate(
            cudaforge.Problem.from_source(problem_source), candidate_source, trials=2, timed_runs=5
        )

    recorded = run_loop(
        problem.source,
        evaluate,
        coder=coder,
        judge=judge,
        rounds=2,
        transcript=str(transcript),
        name="19_ReLU",
    )
    assert recorded.best_source
    out = cli(
        "forge",
        "L1/19",
        "--llm",
        f"replay:{transcript}",
        "--rounds",
        "2",
        "--out",
        str(tmp_path / "out"),
        *FAST,
    )
    assert out.returncode == 0, out.stderr + out.stdout
    best = tmp_path / "out" / f"{problem.name}.best.py"
    assert best.read_text() == recorded.best_source


def test_report_markdown_and_html(tmp_path):
    results = tmp_path / "runs.jsonl"
    rows = [{"key": "level1/19_ReLU", "problem": "19_ReLU", "level": 1, "problem_id": 19,
             "status": "ok", "correct": True, "speedup": 1.6, "cost_usd": 0.2, "seconds": 60},
            {"key": "level1/21_Sigmoid", "problem": "21_Sigmoid", "level": 1, "problem_id": 21,
             "status": "incorrect", "correct": False, "speedup": None, "cost_usd": 0.3,
             "seconds": 90}]  # fmt: skip
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = cli("report", str(results), "--html", str(tmp_path / "r.html"))
    assert out.returncode == 0, out.stderr
    assert "| **all** | 2 | 50.0% (1) | 50.0% | 50.0% | 0.0% |" in out.stdout
    assert "<svg" in (tmp_path / "r.html").read_text()


@pytest.mark.skipif(os.path.exists("/proc/driver/nvidia"), reason="the GPU path runs the demo")
def test_demo_without_gpu_compiles_the_examples(tmp_path):
    # no recorded agent runs in --runs: the demo falls back to the shipped examples
    (tmp_path / "no-runs").mkdir()
    out = cli("demo", "--out", str(tmp_path / "demo"), "--runs", str(tmp_path / "no-runs"))
    assert out.returncode == 0, out.stderr
    report = (tmp_path / "demo" / "demo.md").read_text()
    assert report.count("| L") == 7 and "failed" not in report
