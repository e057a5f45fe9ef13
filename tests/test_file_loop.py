"""The `file:` provider in the forge loop: prompts as files, replies from another thread or a
later run, the `waiting` stop and the CLI's exit code for it, distinct call tags, the Coder's
target and the Judge's budgeted measurements (CPU only)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from test_agents import (
    BROKEN,
    CORRECT,
    JUDGE_REPAIR,
    JUDGE_STOP,
    PROBLEM,
    CPUEvaluator,
    candidate,
    coder_reply,
)

from cudaforge.agents.file_provider import FileProvider
from cudaforge.agents.loop import call_tag, run_loop
from cudaforge.agents.providers import ScriptedProvider
from cudaforge.agents.target import this_machine_target
from cudaforge.agents.transcript import read_transcript
from cudaforge.cli.main import EXIT_WAITING, main
from cudaforge.harness.options import DEFAULT_ATOL
from cudaforge.harness.results import EvalResult
from cudaforge.profiling.measurements import measurements_text

NAME = "relu_scale"


def reply_when_asked(run_dir: Path, answers: dict[str, str], stop: threading.Event) -> None:
    """Play a model: write the reply to each prompt file named in `answers` once it appears."""
    while not stop.is_set():
        for stem, text in answers.items():
            prompt = run_dir / f"{stem}.prompt.md"
            reply = run_dir / f"{stem}.reply.md"
            if prompt.exists() and not reply.exists():
                temporary = run_dir / f".{stem}.tmp"
                temporary.write_text(text, "utf-8")
                temporary.rename(reply)
        time.sleep(0.01)


def test_file_run_waits_and_gets_its_replies_from_another_thread(tmp_path):
    run_dir = tmp_path / "replies" / NAME
    answers = {
        "coder-r1-l0": coder_reply(candidate(BROKEN, 2.0)),
        "judge-r2-l0-repair": JUDGE_REPAIR,
        "coder-r2-l0-repair": coder_reply(candidate(CORRECT, 1.0)),
        "judge-r3-l0": JUDGE_STOP,
    }
    stop = threading.Event()
    model = threading.Thread(target=reply_when_asked, args=(run_dir, answers, stop), daemon=True)
    model.start()
    try:
        out = run_loop(
            PROBLEM, CPUEvaluator(), coder=f"file:{tmp_path / 'replies'}?poll=0.02&timeout=30",
            rounds=5, transcript=tmp_path / "t.jsonl", name=NAME,
        )  # fmt: skip
    finally:
        stop.set()
        model.join()
    assert out.stop_reason == "judge_stop"
    assert [a.task for a in out.attempts] == ["first", "repair"]
    assert out.best is not None and out.best.round == 2
    assert sorted(p.name for p in run_dir.glob("*.prompt.md")) == sorted(
        f"{stem}.prompt.md" for stem in answers
    )
    # token counts from files are estimates, and say so in the result and the transcript
    assert out.tokens_estimated and out.usage["total"].estimated_calls == 4
    assert out.to_dict()["tokens_estimated"] is True
    calls = [r for r in read_transcript(out.transcript) if r["kind"] == "llm"]
    assert [r["tag"] for r in calls] == ["r1/l0", "r2/l0/repair", "r2/l0/repair", "r3/l0"]
    assert all(r["tokens_estimated"] for r in calls)


def test_shared_file_provider_gives_the_judge_its_own_files(tmp_path):
    provider = FileProvider(tmp_path, wait=False)
    (tmp_path / NAME).mkdir()
    (tmp_path / NAME / "coder-r1-l0.reply.md").write_text(coder_reply(candidate(CORRECT, 1.0)))
    out = run_loop(
        PROBLEM, CPUEvaluator(), coder=provider, rounds=3, transcript=tmp_path / "t.jsonl",
        name=NAME,
    )  # fmt: skip
    assert out.stop_reason == "waiting"
    assert out.waiting_for == [str(tmp_path / NAME / "judge-r2-l0.prompt.md")]


def test_call_tags_are_distinct_per_task():
    assert call_tag(3, 0, "first") == "r3/l0"
    assert call_tag(3, 0, "optimize") == "r3/l0"
    assert call_tag(3, 1, "repair") == "r3/l1/repair"
    assert call_tag(3, 0, "format") == "r3/l0/format"


def test_wait0_stops_waiting_and_the_cli_exits_with_its_code(tmp_path, capsys, monkeypatch):
    problem = tmp_path / f"{NAME}.py"
    problem.write_text(PROBLEM)
    replies = tmp_path / "replies"
    code = main(
        ["forge", str(problem), "--llm", f"file:{replies}?wait=0", "--out", str(tmp_path / "out")]
    )
    assert code == EXIT_WAITING == 4
    captured = capsys.readouterr()
    prompt = replies / NAME / "coder-r1-l0.prompt.md"
    assert prompt.exists()
    assert str(prompt) in captured.out.splitlines()
    assert "waiting for 1 reply" in captured.err


def test_the_coder_gets_the_target_and_the_judge_the_measurements(tmp_path):
    coder = ScriptedProvider([coder_reply(candidate(CORRECT, 1.0))])
    judge = ScriptedProvider([JUDGE_STOP])
    profile = json.loads((Path(__file__).parent / "fixtures" / "profile_h200.json").read_text())
    results: list[EvalResult] = []

    def evaluate(problem_source: str, source: str) -> EvalResult:
        result = CPUEvaluator()(problem_source, source)
        result.profile = profile  # the profile recorded on the H200
        results.append(result)
        return result

    run_loop(PROBLEM, evaluate, coder=coder, judge=judge, transcript=tmp_path / "t.jsonl")
    coder_prompt = coder.prompts[0][-1]["content"]
    assert this_machine_target().text in coder_prompt and "{target}" not in coder_prompt
    judge_prompt = judge.prompts[0][-1]["content"]
    block = measurements_text(results[0])
    assert block in judge_prompt and len(block) <= 3000
    assert "metrics_requested" not in judge_prompt and "profile_s" not in judge_prompt
    # the Judge is told the Coder's rules, with the harness's default float32 tolerance
    tolerance = f"atol = rtol =\n{DEFAULT_ATOL['float32']:g} for float32"
    assert "The rules the Coder works under" in judge_prompt and tolerance in judge_prompt
    assert "{rules}" not in judge_prompt and "{float32_tolerance}" not in judge_prompt
    # and the target the Coder's kernels are built for, so that advice can use all of it
    assert this_machine_target().text in judge_prompt and "{target}" not in judge_prompt


def test_bench_full_size_renders_the_problems_own_sizes_without_a_gpu(tmp_path, capsys):
    """Prompts for a GPU run are rendered on a machine without one: --full-size keeps the
    problem's sizes, where a plain CPU bench shrinks them."""
    folder = tmp_path / "problems" / "level1"
    folder.mkdir(parents=True)
    (folder / "1_big_relu.py").write_text(
        "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
        "    def forward(self, x):\n        return torch.relu(x)\n\n"
        "batch_size = 4096\ndim = 393216\n\n"
        "def get_inputs():\n    return [torch.randn(batch_size, dim)]\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    prompts = {}
    target = ["--target-gpu", "Test GPU: compute capability 9.0"]
    for label, extra in (("full", ["--full-size", *target]), ("shrunk", [])):
        replies = tmp_path / f"replies-{label}"
        code = main(
            ["bench", str(tmp_path / "problems"), "--results", str(tmp_path / f"{label}.jsonl"),
             "--llm", f"file:{replies}?wait=0", "--rounds", "1", *extra]
        )  # fmt: skip
        assert code == EXIT_WAITING
        (prompt,) = replies.rglob("coder-r1-l0.prompt.md")
        prompts[label] = prompt.read_text()
    capsys.readouterr()
    assert "dim = 393216" in prompts["full"] and "size override" not in prompts["full"]
    assert "size override" in prompts["shrunk"]
    assert "Test GPU: compute capability 9.0" in prompts["full"]
    assert "Test GPU" not in prompts["shrunk"]
