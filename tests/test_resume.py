"""Resuming a forge run from its transcript (agents.resume): no LLM call and no evaluation is
repeated, the run goes on live from the first call without a record (after a budget stop, a
crash, or `wait=0`), and a GPU run resumed on a machine without a GPU stops with `needs_gpu`."""

from __future__ import annotations

import pytest
from test_agents import (
    BROKEN,
    CORRECT,
    JUDGE_OPTIMIZE,
    JUDGE_REPAIR,
    JUDGE_STOP,
    PROBLEM,
    CPUEvaluator,
    candidate,
    coder_reply,
)

from cudaforge.agents import loop
from cudaforge.agents.loop import run_loop
from cudaforge.agents.providers import ScriptedProvider
from cudaforge.agents.target import Target
from cudaforge.agents.transcript import read_transcript
from cudaforge.cli.main import EXIT_MISSING, EXIT_OK, EXIT_WAITING, main
from cudaforge.harness.results import EvalResult

NAME = "relu_scale"
CODER = [
    coder_reply(candidate(BROKEN, 9.0)),
    coder_reply(candidate(CORRECT, 2.0)),
    coder_reply(candidate(CORRECT + "  # fused", 0.5)),
]
JUDGE = [JUDGE_REPAIR, JUDGE_OPTIMIZE, JUDGE_STOP]


def kinds(path) -> list[str]:
    return [r["kind"] for r in read_transcript(path)]


def test_a_resumed_run_repeats_no_call_and_no_evaluation(tmp_path):
    path = tmp_path / "run.jsonl"
    coder, judge = ScriptedProvider(CODER[:2]), ScriptedProvider(JUDGE[:1])
    evaluate = CPUEvaluator()
    first = run_loop(PROBLEM, evaluate, coder=coder, judge=judge, rounds=2, transcript=path)
    assert first.stop_reason == "rounds" and len(evaluate.seen) == 2

    # the same run again, with a larger budget: only what is new is asked and evaluated
    coder, judge = ScriptedProvider(CODER[2:]), ScriptedProvider(JUDGE[1:])
    evaluate = CPUEvaluator()
    out = run_loop(PROBLEM, evaluate, coder=coder, judge=judge, rounds=5, transcript=path)
    assert len(coder.prompts) == 1 and len(judge.prompts) == 2
    assert evaluate.seen == [candidate(CORRECT + "  # fused", 0.5)]
    assert out.stop_reason == "judge_stop"
    assert [a.task for a in out.attempts] == ["first", "repair", "optimize"]
    assert out.best.result.candidate_ms == 0.5
    assert out.usage["total"].calls == 6  # the recorded calls count for the problem's budget
    assert kinds(path).count("start") == 1 and kinds(path).count("resume") == 1
    assert kinds(path).count("eval") == 3  # each candidate once

    # once more: everything is recorded, nothing is asked
    coder, judge, evaluate = ScriptedProvider(), ScriptedProvider(), CPUEvaluator()
    again = run_loop(PROBLEM, evaluate, coder=coder, judge=judge, rounds=5, transcript=path)
    assert again.stop_reason == "judge_stop" and again.best.result.candidate_ms == 0.5
    assert not coder.prompts and not judge.prompts and not evaluate.seen


def test_a_run_resumes_after_a_crash(tmp_path):
    path = tmp_path / "run.jsonl"
    coder, judge = ScriptedProvider(CODER), ScriptedProvider(JUDGE)
    seen = []

    def crashing(problem_source: str, source: str) -> EvalResult:
        if len(seen) == 1:
            raise RuntimeError("FIXTURE: the machine went away")
        seen.append(source)
        return CPUEvaluator()(problem_source, source)

    with pytest.raises(RuntimeError):
        run_loop(PROBLEM, crashing, coder=coder, judge=judge, transcript=path)
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"kind": "llm", "torn')  # killed in the middle of a line
    coder, judge, evaluate = (
        ScriptedProvider(CODER[2:]),
        ScriptedProvider(JUDGE[1:]),
        CPUEvaluator(),
    )
    out = run_loop(PROBLEM, evaluate, coder=coder, judge=judge, transcript=path)
    assert out.stop_reason == "judge_stop"
    assert evaluate.seen == [candidate(CORRECT, 2.0), candidate(CORRECT + "  # fused", 0.5)]
    assert len(coder.prompts) == 1 and len(judge.prompts) == 2  # the repair reply was recorded


def test_a_transcript_of_another_problem_is_refused(tmp_path):
    path = tmp_path / "run.jsonl"
    run_loop(PROBLEM, CPUEvaluator(), coder=ScriptedProvider(CODER[1:2]), rounds=1,
             transcript=path)  # fmt: skip
    with pytest.raises(ValueError, match="another problem"):
        run_loop(PROBLEM + "\n# changed\n", CPUEvaluator(), coder=ScriptedProvider(),
                 transcript=path)  # fmt: skip


def on_the_h200(problem_source: str, source: str) -> EvalResult:
    result = CPUEvaluator()(problem_source, source)
    result.device = "NVIDIA H200 (cuda:0)"
    return result


def test_a_gpu_run_resumed_without_a_gpu_stops_with_needs_gpu(tmp_path, monkeypatch):
    path = tmp_path / "run.jsonl"
    coder, judge = ScriptedProvider(CODER[:1]), ScriptedProvider()
    run_loop(PROBLEM, on_the_h200, coder=coder, judge=judge, rounds=1, transcript=path)

    monkeypatch.setattr(loop, "this_machine_target", lambda: Target("sm_90a"))
    coder, judge, evaluate = ScriptedProvider(CODER[1:]), ScriptedProvider(JUDGE), CPUEvaluator()
    out = run_loop(PROBLEM, evaluate, coder=coder, judge=judge, rounds=5, transcript=path)
    assert out.stop_reason == "needs_gpu"
    assert not evaluate.seen  # the new candidate waits for a GPU
    assert len(coder.prompts) == 1 and len(judge.prompts) == 1  # its prompts are rendered
    assert [a.result.device for a in out.attempts] == ["NVIDIA H200 (cuda:0)"]

    # on a GPU machine, the same run goes on from there
    monkeypatch.setattr(loop, "this_machine_target", lambda: Target("sm_90a", "H200", True))
    coder, judge = ScriptedProvider(CODER[2:]), ScriptedProvider(JUDGE[1:])
    out = run_loop(PROBLEM, on_the_h200, coder=coder, judge=judge, rounds=5, transcript=path)
    assert out.stop_reason == "judge_stop" and len(out.attempts) == 3


def test_a_cpu_run_stays_a_cpu_run(tmp_path, monkeypatch):
    path = tmp_path / "run.jsonl"
    run_loop(PROBLEM, CPUEvaluator(), coder=ScriptedProvider(CODER[:1]), rounds=1,
             transcript=path)  # fmt: skip
    monkeypatch.setattr(loop, "this_machine_target", lambda: Target("sm_90a"))
    evaluate = CPUEvaluator()
    out = run_loop(
        PROBLEM, evaluate, coder=ScriptedProvider(CODER[1:2]), judge=ScriptedProvider(JUDGE[:1]),
        rounds=2, transcript=path,
    )  # fmt: skip
    assert out.stop_reason == "rounds" and len(evaluate.seen) == 1


def write_reply(replies, stem: str, text: str) -> None:
    (replies / NAME / f"{stem}.reply.md").write_text(text, "utf-8")


def test_wait0_forge_waits_then_resumes_and_finishes(tmp_path, capsys):
    problem = tmp_path / f"{NAME}.py"
    problem.write_text(PROBLEM)
    replies, out = tmp_path / "replies", tmp_path / "out"
    forge = ["forge", str(problem), "--llm", f"file:{replies}?wait=0", "--out", str(out),
             "--trials", "2", "--timed-runs", "3"]  # fmt: skip
    assert main(forge) == EXIT_WAITING
    assert capsys.readouterr().out.split() == [str(replies / NAME / "coder-r1-l0.prompt.md")]
    write_reply(replies, "coder-r1-l0", coder_reply(candidate(CORRECT, 1.0)))
    assert main(forge) == EXIT_WAITING
    assert capsys.readouterr().out.split() == [str(replies / NAME / "judge-r2-l0.prompt.md")]
    write_reply(replies, "judge-r2-l0", JUDGE_STOP)
    assert main(forge) == EXIT_OK
    assert "stopped: judge_stop" in capsys.readouterr().out
    transcript = out / f"{NAME}.transcript.jsonl"
    records = read_transcript(transcript)
    assert [r["kind"] for r in records].count("resume") == 2
    assert [r["tag"] for r in records if r["kind"] == "llm"] == ["r1/l0", "r2/l0"]
    assert sum(1 for r in records if r["kind"] == "eval") == 1  # evaluated once, not per run
    assert (out / f"{NAME}.best.py").exists()


def test_a_gpu_forge_resumed_on_the_cpu_exits_with_the_missing_gpu_code(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(loop, "this_machine_target", lambda: Target("sm_90a"))
    replies, out = tmp_path / "replies", tmp_path / "out"
    (replies / NAME).mkdir(parents=True)
    write_reply(replies, "coder-r1-l0", CODER[0])
    run_loop(
        PROBLEM, on_the_h200, coder=f"file:{replies}", rounds=1, name=NAME,
        transcript=out / f"{NAME}.transcript.jsonl",
    )  # fmt: skip
    write_reply(replies, "judge-r2-l0-repair", JUDGE_REPAIR)
    write_reply(replies, "coder-r2-l0-repair", CODER[1])
    problem = tmp_path / f"{NAME}.py"
    problem.write_text(PROBLEM)
    code = main(["forge", str(problem), "--llm", f"file:{replies}?wait=0", "--out", str(out)])
    assert code == EXIT_MISSING
    assert "needs_gpu" in capsys.readouterr().err


def _text(messages) -> str:
    return "\n".join(m["content"] for m in messages)


def test_notes_reach_every_prompt_and_a_resumed_run_takes_the_new_ones(tmp_path):
    path = tmp_path / "run.jsonl"
    coder, judge = ScriptedProvider(CODER[:2]), ScriptedProvider(JUDGE[:1])
    run_loop(PROBLEM, CPUEvaluator(), coder=coder, judge=judge, rounds=2, transcript=path)
    assert not any("How the model uses" in _text(m) for m in coder.prompts + judge.prompts)

    note = "- Output 0 is kept with strides (1, 4)."
    coder, judge = ScriptedProvider(CODER[2:]), ScriptedProvider(JUDGE[1:])
    run_loop(PROBLEM, CPUEvaluator(), coder=coder, judge=judge, rounds=5, transcript=path,
             notes=note)  # fmt: skip
    asked = coder.prompts + judge.prompts
    assert len(asked) == 3 and all(note in _text(m) for m in asked)
    problem_end = _text(coder.prompts[0]).index(
        "```\n", _text(coder.prompts[0]).index("class Model")
    )
    assert _text(coder.prompts[0]).index(note) > problem_end  # after the problem, outside its code
    assert [r.get("notes") for r in read_transcript(path) if r["kind"] in ("start", "resume")] == [
        "",
        note,
    ]


def test_a_run_resumed_without_notes_keeps_its_recorded_ones(tmp_path):
    """A resumed run given no notes (a CPU --render, say) asks what the run that recorded them
    would ask: the file: provider refuses a prompt that differs from the one on file."""
    path, note = tmp_path / "run.jsonl", "- Output 0 is kept with strides (1, 4)."
    coder, judge = ScriptedProvider(CODER[:2]), ScriptedProvider(JUDGE[:1])
    run_loop(PROBLEM, CPUEvaluator(), coder=coder, judge=judge, rounds=2, transcript=path,
             notes=note)  # fmt: skip
    assert all(note in _text(m) for m in coder.prompts + judge.prompts)
    coder, judge = ScriptedProvider(CODER[2:]), ScriptedProvider(JUDGE[1:])
    run_loop(PROBLEM, CPUEvaluator(), coder=coder, judge=judge, rounds=5, transcript=path)
    assert len(coder.prompts + judge.prompts) == 3
    assert all(note in _text(m) for m in coder.prompts + judge.prompts)
