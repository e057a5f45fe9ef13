"""cudaforge/agents/: the Coder/Judge loop on a CPU problem, with scripted FIXTURE replies (in
code, and over the loopback server of tests/llm_server.py) and an evaluator that really runs each
candidate on the CPU against the reference. Its timings are fixed by a marker in the candidate
source, so every run is deterministic."""

from __future__ import annotations

import json
import re
import threading

import pytest
import torch
from llm_server import LLMServer

from cudaforge.agents.evidence import clip, failure_text
from cudaforge.agents.loop import run_loop
from cudaforge.agents.prompts import NO_CODE_ADVICE, Prompts, code_blocks, extract_code, says_stop
from cudaforge.agents.providers import ScriptedProvider
from cudaforge.agents.transcript import read_transcript, recorded_evaluator
from cudaforge.errors import LLMError
from cudaforge.harness.results import EvalResult, KernelTime, TrialFailure

PROBLEM = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """FIXTURE problem: y = relu(x) * scale."""

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.relu(x) * self.scale


def get_inputs():
    return [torch.randn(64, 32)]


def get_init_inputs():
    return [2.0]
'''

CORRECT = "return torch.clamp(x, min=0) * self.scale"
WRONG = "return x * self.scale"
BROKEN = "return torch.clamp(x, min=0 * self.scale"  # unbalanced parenthesis


def candidate(body: str, ms: float) -> str:
    return f"""import torch
import torch.nn as nn

# FIXTURE candidate; evaluator time: {ms} ms
class ModelNew(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        {body}
"""


def coder_reply(source: str) -> str:
    return f"FIXTURE Coder reply: here is the kernel.\n\n```python\n{source}```\n\nDone."


class CPUEvaluator:
    """Checks a candidate against the reference on the CPU over three seeded trials; the time
    it reports is the candidate's marker. Records every candidate it was given."""

    def __init__(self):
        self.seen: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, problem_source: str, source: str) -> EvalResult:
        with self.lock:
            self.seen.append(source)
        name = "relu_scale"
        try:
            code = compile(source, "candidate.py", "exec")
        except SyntaxError as exc:
            log = f"candidate.py({exc.lineno}): error: {exc.msg}\n    {(exc.text or '').strip()}"
            return EvalResult(
                name, "compile_error", error=f"SyntaxError: {exc.msg}", compile_log=log
            )
        reference_ns: dict = {}
        exec(problem_source, reference_ns)  # noqa: S102 (the test's own fixture problem)
        init = reference_ns["get_init_inputs"]()
        namespace: dict = {}
        try:
            exec(code, namespace)  # noqa: S102 (running candidates is this evaluator's job)
            model = namespace["ModelNew"](*init)
        except Exception as exc:  # noqa: BLE001 (any failure of a candidate is a result)
            return EvalResult(name, "load_error", compiled=True, error=repr(exc))
        reference = reference_ns["Model"](*init)
        tolerances = {"atol": 1e-5, "rtol": 1e-5}
        for trial in range(3):
            torch.manual_seed(trial)
            inputs = reference_ns["get_inputs"]()
            expected = reference(*inputs)
            try:
                actual = model(*inputs)
            except Exception as exc:  # noqa: BLE001 (any failure of a candidate is a result)
                return EvalResult(name, "runtime_error", compiled=True, error=repr(exc))
            if not torch.allclose(actual, expected, **tolerances):
                diff = (actual - expected).abs()
                worst = int(diff.argmax())
                failure = TrialFailure(
                    trial=trial,
                    output_index=0,
                    message="output 0 differs from the reference",
                    max_abs_err=float(diff.max()),
                    mismatches=int((diff > 1e-5).sum()),
                    total=diff.numel(),
                    worst_index=list(divmod(worst, diff.shape[1])),
                    expected=float(expected.flatten()[worst]),
                    actual=float(actual.flatten()[worst]),
                )
                return EvalResult(
                    name, "incorrect", compiled=True, error="output 0 differs",
                    failure=failure, trials=trial + 1, tolerances=tolerances,
                )  # fmt: skip
        ms = float(re.search(r"evaluator time: ([\d.]+) ms", source)[1])
        kernel = KernelTime(
            "relu_scale_kernel", calls=1, total_us=ms * 1e3, mean_us=ms * 1e3, own=True
        )
        return EvalResult(
            name, "ok", compiled=True, correct=True, trials=3, tolerances=tolerances,
            candidate_ms=ms, reference_ms=1.0, speedup=1.0 / ms, kernels=[kernel],
        )  # fmt: skip


JUDGE_REPAIR = "CAUSE: FIXTURE the parenthesis of clamp is not closed.\nFIX: close it."
JUDGE_OPTIMIZE = (
    "BOTTLENECK: FIXTURE two passes over memory.\nOPTIMIZATION: FIXTURE fuse into one kernel.\n"
    "VERDICT: CONTINUE"
)
JUDGE_STOP = "FIXTURE: it runs at the memory roofline.\nVERDICT: STOP"


def full_script():
    """compile error -> repair -> correct (2 ms) -> optimize -> correct (0.5 ms) -> stop."""
    coder = ScriptedProvider(
        [
            coder_reply(candidate(BROKEN, 9.0)),
            coder_reply(candidate(CORRECT, 2.0)),
            coder_reply(candidate(CORRECT + "  # fused", 0.5)),
        ],
        model="fixture-coder",
        cost_per_call=0.01,
    )
    judge = ScriptedProvider(
        [JUDGE_REPAIR, JUDGE_OPTIMIZE, JUDGE_STOP], model="fixture-judge", cost_per_call=0.02
    )
    return coder, judge


def prompt_of(provider: ScriptedProvider, call: int) -> str:
    return provider.prompts[call][-1]["content"]


# ---------------------------------------------------------------- the loop


def test_full_loop_compile_error_repair_correct_optimize_stop(tmp_path):
    coder, judge = full_script()
    evaluate = CPUEvaluator()
    out = run_loop(
        PROBLEM, evaluate, coder=coder, judge=judge, gpu="FIXTURE GPU: 132 SMs",
        transcript=tmp_path / "run.jsonl", name="relu_scale",
    )  # fmt: skip
    assert [a.result.status for a in out.attempts] == ["compile_error", "ok", "ok"]
    assert [a.task for a in out.attempts] == ["first", "repair", "optimize"]
    assert out.stop_reason == "judge_stop" and out.rounds == 4
    assert out.best.round == 3 and out.best_source == candidate(CORRECT + "  # fused", 0.5)
    assert out.speedup == pytest.approx(2.0)
    assert coder.remaining == 0 and judge.remaining == 0

    # round 1: the Coder gets the problem, the GPU facts and the candidate contract
    first = prompt_of(coder, 0)
    assert "class Model(nn.Module)" in first and "FIXTURE GPU: 132 SMs" in first
    assert "cudaforge.compile" in first and "class ModelNew" in first
    # round 2: the Judge sees the failing source and the compile log verbatim
    judge_repair = prompt_of(judge, 0)
    assert candidate(BROKEN, 9.0) in judge_repair
    assert evaluate_log(evaluate.seen[0]) in judge_repair
    # ... and the Coder gets the Judge's diagnosis with the evidence
    assert JUDGE_REPAIR in prompt_of(coder, 1) and "compile log" in prompt_of(coder, 1)
    # round 3: the Judge sees the correct source and its measurements
    judge_optimize = prompt_of(judge, 1)
    assert candidate(CORRECT, 2.0) in judge_optimize
    assert "2 ms" in judge_optimize and "relu_scale_kernel" in judge_optimize
    assert "round 1: first -> compile_error" in judge_optimize
    assert JUDGE_OPTIMIZE in prompt_of(coder, 2)
    # round 4: the Judge is shown the faster candidate and says stop
    assert candidate(CORRECT + "  # fused", 0.5) in prompt_of(judge, 2)
    assert "fuse into one kernel" in prompt_of(judge, 2)  # the history names what was tried

    assert out.usage["coder"].calls == 3 and out.usage["judge"].calls == 3
    assert out.usage["total"].cost_usd == pytest.approx(3 * 0.01 + 3 * 0.02)

    records = read_transcript(out.transcript)
    kinds = [r["kind"] for r in records]
    assert kinds[0] == "start" and kinds[-1] == "end"
    assert kinds.count("llm") == 6 and kinds.count("eval") == 3
    evals = [r for r in records if r["kind"] == "eval"]
    assert [EvalResult.from_dict(r["result"]).status for r in evals] == [
        "compile_error",
        "ok",
        "ok",
    ]
    end = records[-1]
    assert end["stop_reason"] == "judge_stop" and end["best_round"] == 3
    assert end["usage"]["total"]["calls"] == 6
    llm = [r for r in records if r["kind"] == "llm"]
    assert all(r["messages"] and r["reply"] and r["tag"] for r in llm)
    assert json.dumps(out.to_dict())  # the result serializes


def evaluate_log(source: str) -> str:
    return CPUEvaluator()(PROBLEM, source).compile_log


def test_incorrect_candidate_gets_the_mismatch_report(tmp_path):
    coder = ScriptedProvider(
        [coder_reply(candidate(WRONG, 1.0)), coder_reply(candidate(CORRECT, 1.0))]
    )
    judge = ScriptedProvider(["CAUSE: FIXTURE negative inputs are kept.\nFIX: clamp.", JUDGE_STOP])
    out = run_loop(PROBLEM, CPUEvaluator(), coder=coder, judge=judge, transcript=tmp_path / "t")
    assert [a.result.status for a in out.attempts] == ["incorrect", "ok"]
    report = prompt_of(judge, 0)
    assert "mismatch report (trial 0, output 0)" in report and "max abs error" in report
    assert "worst element at index" in report and "tolerances: atol=1e-05" in report


def test_reply_without_code_block_asks_the_coder_again(tmp_path):
    coder = ScriptedProvider(
        [
            "FIXTURE: I would fuse the ReLU and the scale into one kernel.",
            coder_reply(candidate(CORRECT, 1.0)),
        ]
    )
    judge = ScriptedProvider([JUDGE_STOP])
    evaluate = CPUEvaluator()
    out = run_loop(PROBLEM, evaluate, coder=coder, judge=judge, transcript=tmp_path / "t")
    assert [a.task for a in out.attempts] == ["first", "format"]
    assert out.attempts[0].source is None and out.attempts[0].result.status == "load_error"
    assert len(evaluate.seen) == 1  # the reply without code was not evaluated
    again = prompt_of(coder, 1)
    assert NO_CODE_ADVICE in again and "I would fuse the ReLU" in again
    assert len(judge.prompts) == 1  # no Judge call for a missing code block
    assert out.best.round == 2


def test_slower_candidate_is_not_continued_from(tmp_path):
    coder = ScriptedProvider(
        [
            coder_reply(candidate(CORRECT, 1.0)),
            coder_reply(candidate(CORRECT + "  # slower", 3.0)),
        ]
    )
    judge = ScriptedProvider([JUDGE_OPTIMIZE, JUDGE_STOP])
    out = run_loop(PROBLEM, CPUEvaluator(), coder=coder, judge=judge, transcript=tmp_path / "t")
    assert out.best.round == 1
    last_judge = prompt_of(judge, 1)
    assert candidate(CORRECT, 1.0) in last_judge  # back to the fastest
    assert candidate(CORRECT + "  # slower", 3.0) not in last_judge
    assert "not faster than round 1" in last_judge


class IntervalEvaluator(CPUEvaluator):
    """CPUEvaluator whose results carry a 95% interval of +-2% around the marked time."""

    def __call__(self, problem_source: str, source: str) -> EvalResult:
        result = super().__call__(problem_source, source)
        if result.ok:
            result.candidate_low_ms = result.candidate_ms * 0.98
            result.candidate_high_ms = result.candidate_ms * 1.02
        return result


def test_a_candidate_within_the_noise_of_the_best_is_a_tie_not_faster(tmp_path):
    coder = ScriptedProvider(
        [
            coder_reply(candidate(CORRECT, 1.0)),
            coder_reply(candidate(CORRECT + "  # 1% faster", 0.99)),  # intervals overlap
            coder_reply(candidate(CORRECT + "  # 10% faster", 0.9)),
        ]
    )
    judge = ScriptedProvider([JUDGE_OPTIMIZE, JUDGE_OPTIMIZE, JUDGE_STOP])
    out = run_loop(PROBLEM, IntervalEvaluator(), coder=coder, judge=judge, rounds=3,
                   transcript=tmp_path / "t")  # fmt: skip
    assert [a.result.candidate_ms for a in out.attempts] == [1.0, 0.99, 0.9]
    third = prompt_of(judge, 1)  # the Judge before round 3: the tie is in the history
    assert "a tie within noise with round 1 (1 ms, the time intervals overlap)" in third
    assert candidate(CORRECT, 1.0) in third  # round 3 continues from round 1, not the tie
    assert out.best.round == 3  # beyond the noise: faster
    bests = [e for e in read_transcript(out.transcript) if e["kind"] == "best"]
    assert [e["round"] for e in bests] == [1, 3]


def test_rounds_budget(tmp_path):
    coder = ScriptedProvider([coder_reply(candidate(CORRECT, 1.0 / (i + 1))) for i in range(5)])
    judge = ScriptedProvider([JUDGE_OPTIMIZE] * 5)
    out = run_loop(
        PROBLEM, CPUEvaluator(), coder=coder, judge=judge, rounds=2, transcript=tmp_path / "t"
    )
    assert out.stop_reason == "rounds" and out.rounds == 2 and len(out.attempts) == 2
    assert coder.remaining == 3 and judge.remaining == 4


def test_dollar_budget(tmp_path):
    coder = ScriptedProvider(
        [coder_reply(candidate(CORRECT, 1.0 / (i + 1))) for i in range(5)], cost_per_call=0.1
    )
    judge = ScriptedProvider([JUDGE_OPTIMIZE] * 5, cost_per_call=0.1)
    out = run_loop(
        PROBLEM, CPUEvaluator(), coder=coder, judge=judge, max_dollars=0.25,
        transcript=tmp_path / "t",
    )  # fmt: skip
    # round 1: coder ($0.1); round 2: judge ($0.2) and coder ($0.3); then the budget is spent
    assert out.stop_reason == "dollars" and len(out.attempts) == 2
    assert out.usage["total"].cost_usd == pytest.approx(0.3)
    assert read_transcript(out.transcript)[-1]["stop_reason"] == "dollars"


def test_dollar_budget_checked_between_judge_and_coder(tmp_path):
    coder = ScriptedProvider([coder_reply(candidate(CORRECT, 1.0))] * 3, cost_per_call=0.1)
    judge = ScriptedProvider([JUDGE_OPTIMIZE] * 3, cost_per_call=1.0)
    out = run_loop(
        PROBLEM, CPUEvaluator(), coder=coder, judge=judge, max_dollars=0.5,
        transcript=tmp_path / "t",
    )  # fmt: skip
    assert out.stop_reason == "dollars" and len(out.attempts) == 1 and coder.remaining == 2


def test_wall_time_budget(tmp_path):
    coder = ScriptedProvider([coder_reply(candidate(CORRECT, 1.0))])
    out = run_loop(PROBLEM, CPUEvaluator(), coder=coder, max_seconds=0.0, transcript=tmp_path / "t")
    assert out.stop_reason == "seconds" and out.attempts == [] and out.best is None
    assert coder.remaining == 1


def test_llm_error_ends_the_run_and_keeps_the_best(tmp_path):
    coder = ScriptedProvider([coder_reply(candidate(CORRECT, 1.0))])  # then runs out
    judge = ScriptedProvider([JUDGE_OPTIMIZE])
    out = run_loop(PROBLEM, CPUEvaluator(), coder=coder, judge=judge, transcript=tmp_path / "t")
    assert out.stop_reason.startswith("llm_error") and "no scripted reply left" in out.stop_reason
    assert out.best.round == 1
    assert [r["kind"] for r in read_transcript(out.transcript)].count("llm_error") == 1


def test_evaluator_errors_propagate_and_the_transcript_is_closed(tmp_path):
    def broken(problem, source):
        raise RuntimeError("FIXTURE evaluator bug")

    coder = ScriptedProvider([coder_reply(candidate(CORRECT, 1.0))])
    with pytest.raises(RuntimeError, match="FIXTURE evaluator bug"):
        run_loop(PROBLEM, broken, coder=coder, transcript=tmp_path / "t.jsonl")
    assert read_transcript(tmp_path / "t.jsonl")[-1]["stop_reason"] == "error"


def test_parallel_candidates_are_evaluated_concurrently(tmp_path):
    barrier = threading.Barrier(2, timeout=5)
    cpu = CPUEvaluator()

    def evaluate(problem, source):
        barrier.wait()  # both lanes must be inside evaluate at once
        return cpu(problem, source)

    def write(messages):
        return coder_reply(candidate(CORRECT, 1.0))

    coder = ScriptedProvider([write, write])
    judge = ScriptedProvider([JUDGE_STOP, JUDGE_STOP])
    out = run_loop(
        PROBLEM, evaluate, coder=coder, judge=judge, candidates=2, transcript=tmp_path / "t"
    )
    assert sorted((a.round, a.lane) for a in out.attempts) == [(1, 0), (1, 1)]
    assert out.stop_reason == "judge_stop" and out.best.round == 1


# ---------------------------------------------------------------- transcripts


def test_transcript_redacts_api_keys(tmp_path, monkeypatch):
    """The server echoes the key it received into the reply text, and a 401 names it: neither
    may reach the transcript."""
    openai_key = "sk-FIXTURE-transcript-key-0123456789"
    anthropic_key = "FIXTURE-anthropic-key-without-sk-prefix-42"
    monkeypatch.setenv("OPENAI_API_KEY", openai_key)
    monkeypatch.setenv("ANTHROPIC_API_KEY", anthropic_key)
    with LLMServer() as server:
        server.push_text(coder_reply(candidate(CORRECT, 1.0)) + "\nFIXTURE echo: {auth}")
        server.push_text("BOTTLENECK: FIXTURE {auth}\nOPTIMIZATION: x\nVERDICT: CONTINUE")
        server.push_text(coder_reply(candidate(CORRECT, 0.5)))
        server.push_error(401, f"FIXTURE bad key {openai_key}")
        out = run_loop(
            PROBLEM,
            CPUEvaluator(),
            coder=f"anthropic:claude-sonnet-4-5@{server.url}",
            judge=f"openai:o3@{server.url}/v1",
            transcript=tmp_path / "keys.jsonl",
        )
        assert server.requests[0].headers["x-api-key"] == anthropic_key  # the key was sent
        assert server.requests[1].headers["authorization"] == f"Bearer {openai_key}"
    text = (tmp_path / "keys.jsonl").read_text()
    assert "FIXTURE echo: [redacted]" in text and "BOTTLENECK: FIXTURE [redacted]" in text
    assert "HTTP 401" in text and out.stop_reason.startswith("llm_error")
    assert openai_key not in text and anthropic_key not in text
    assert openai_key in out.attempts[1].advice  # the echo reached the loop ...
    report = json.dumps(out.to_dict())
    assert openai_key not in report and anthropic_key not in report  # ... but not its report
    assert "[redacted]" in report


def test_loop_over_http_with_a_reply_without_code(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with LLMServer() as server:
        server.push_text("FIXTURE: no code in this reply, only prose.")
        server.push_text(coder_reply(candidate(CORRECT, 1.0)), input_tokens=100, output_tokens=50)
        server.push_text(JUDGE_STOP)
        out = run_loop(
            PROBLEM, CPUEvaluator(), coder=f"openai:fixture-model@{server.url}/v1",
            transcript=tmp_path / "t",
        )  # fmt: skip
        paths = [r.path for r in server.requests]
    assert paths == ["/v1/chat/completions"] * 3
    assert [a.task for a in out.attempts] == ["first", "format"]
    assert out.stop_reason == "judge_stop" and out.best.round == 2
    assert out.usage["total"].input_tokens == 11 + 100 + 11


def test_replay_reproduces_the_best_candidate_without_an_api(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    coder, judge = full_script()
    first = run_loop(
        PROBLEM, CPUEvaluator(), coder=coder, judge=judge, transcript=tmp_path / "a.jsonl"
    )
    again = run_loop(
        PROBLEM, CPUEvaluator(), coder=f"replay:{tmp_path / 'a.jsonl'}",
        transcript=tmp_path / "b.jsonl",
    )  # fmt: skip
    assert again.best_source == first.best_source and again.best.round == first.best.round
    assert again.stop_reason == first.stop_reason
    assert [a.result.status for a in again.attempts] == [a.result.status for a in first.attempts]
    assert again.usage["total"].cost_usd == pytest.approx(first.usage["total"].cost_usd)
    # and again from the second transcript, with the recorded results instead of an evaluator
    third = run_loop(
        PROBLEM, recorded_evaluator(tmp_path / "b.jsonl"),
        coder=f"replay:{tmp_path / 'b.jsonl'}", transcript=tmp_path / "c.jsonl",
    )  # fmt: skip
    assert third.best_source == first.best_source


def test_replay_of_parallel_lanes_follows_the_tags(tmp_path):
    def make(lane_ms):
        return lambda messages: coder_reply(candidate(CORRECT, lane_ms.pop(0)))

    times = [1.0, 0.25]  # whichever lane asks first gets 1.0 ms
    coder = ScriptedProvider([make(times), make(times)])
    judge = ScriptedProvider([JUDGE_STOP, JUDGE_STOP])
    first = run_loop(
        PROBLEM, CPUEvaluator(), coder=coder, judge=judge, candidates=2,
        transcript=tmp_path / "a.jsonl",
    )  # fmt: skip
    again = run_loop(
        PROBLEM, CPUEvaluator(), coder=f"replay:{tmp_path / 'a.jsonl'}", candidates=2,
        transcript=tmp_path / "b.jsonl",
    )  # fmt: skip
    assert again.best_source == first.best_source
    assert again.best.lane == first.best.lane


# ---------------------------------------------------------------- reading replies


def test_extract_code_from_prose_and_several_blocks():
    source = candidate(CORRECT, 1.0)
    reply = (
        "FIXTURE. First the CUDA part:\n```cuda\n__global__ void k() {}\n```\n"
        f"A broken draft:\n```python\nclass ModelNew(nn.Module):\n    def f(:\n```\n"
        f"The final version:\n```python\n{source}```\nThat is all; usage:\n```python\nm = ModelNew(2.0)\n```"
    )
    assert extract_code(reply) == source


def test_extract_code_takes_the_last_parsing_block_defining_modelnew():
    a, b = candidate(CORRECT, 1.0), candidate(CORRECT + "  # v2", 1.0)
    assert extract_code(f"```python\n{a}```\n\n```py\n{b}```") == b
    assert extract_code(f"~~~python\n{a}~~~") == a


def test_extract_code_without_a_block():
    assert extract_code("FIXTURE: I cannot help with that.") is None
    assert extract_code("") is None
    assert extract_code("```python\nprint('no model here')\n```") is None
    bare = candidate(CORRECT, 1.0)
    assert extract_code(bare) == bare
    assert extract_code("FIXTURE: here it is\n" + bare) == bare


def test_extract_code_from_an_unterminated_or_indented_block():
    source = candidate(CORRECT, 1.0)
    assert extract_code(f"FIXTURE\n```python\n{source}") == source
    indented = "".join("    " + line for line in source.splitlines(keepends=True))
    assert extract_code(f"1. Code:\n    ```python\n{indented}    ```\n") == source
    assert code_blocks("```\na\n```\n```c++\nb\n```") == [("", "a"), ("c++", "b")]


def test_says_stop():
    assert says_stop(JUDGE_STOP) and says_stop("**VERDICT:** STOP") and says_stop("verdict: stop")
    assert not says_stop(JUDGE_OPTIMIZE) and not says_stop("I would STOP here")
    assert not says_stop("VERDICT: STOP\n...on second thought\nVERDICT: CONTINUE")


# ---------------------------------------------------------------- prompts and feedback


def test_prompts_override_folder_keeps_other_braces(tmp_path, monkeypatch):
    (tmp_path / "coder_first.txt").write_text(
        "FIXTURE override for {problem} on {gpu}; CUDA: __global__ void k() { int i; } {unknown}"
    )
    prompts = Prompts(tmp_path)
    text = prompts.render("coder_first", problem="P", gpu="G")
    assert text == "FIXTURE override for P on G; CUDA: __global__ void k() { int i; } {unknown}"
    assert "{candidate}" in prompts.text("coder_repair")  # not overridden: the shipped one
    monkeypatch.setenv("CUDAFORGE_PROMPTS", str(tmp_path))
    assert Prompts().text("coder_first").startswith("FIXTURE override")
    with pytest.raises(FileNotFoundError):
        Prompts(tmp_path / "missing")


def test_shipped_prompts_have_their_placeholders():
    prompts = Prompts(folder=None)
    for name, needed in {
        "coder_first": ["{problem}", "{gpu}", "{contract}"],
        "coder_repair": ["{problem}", "{gpu}", "{candidate}", "{feedback}", "{advice}"],
        "coder_optimize": ["{problem}", "{gpu}", "{candidate}", "{advice}", "{contract}"],
        "judge_repair": ["{problem}", "{gpu}", "{candidate}", "{feedback}", "{history}"],
        "judge_optimize": ["{problem}", "{gpu}", "{candidate}", "{feedback}", "VERDICT: STOP"],
    }.items():
        text = prompts.text(name)
        assert all(n in text for n in needed), name


def test_render_fills_values_once():
    prompts = Prompts()
    text = prompts.render("judge_repair", candidate="x = '{problem}'", problem="P")
    assert "x = '{problem}'" in text  # a value is not itself filled in


def test_failure_text_and_clip():
    log = "\n".join(f"kernel.cu({i}): error: FIXTURE {i}" for i in range(5000))
    text = failure_text(EvalResult("p", "compile_error", error="NVRTC failed", compile_log=log))
    assert text.startswith("status: compile_error\nerror: NVRTC failed\ncompile log:\n")
    assert "kernel.cu(0): error: FIXTURE 0" in text and "kernel.cu(4999): error" in text
    assert "characters cut" in text and len(text) < 31_000
    assert clip("short") == "short"
    rejected = EvalResult("p", "rejected", guards=["own_kernels", "aliasing"])
    assert "refused by guards: own_kernels, aliasing" in failure_text(rejected)


def test_custom_feedback_reaches_the_judge(tmp_path):
    coder = ScriptedProvider([coder_reply(candidate(CORRECT, 1.0))])
    judge = ScriptedProvider([JUDGE_STOP])
    run_loop(
        PROBLEM, CPUEvaluator(), coder=coder, judge=judge, transcript=tmp_path / "t",
        feedback=lambda result: f"FIXTURE metrics: {result.candidate_ms} ms, occupancy 50%",
    )  # fmt: skip
    assert "FIXTURE metrics: 1.0 ms, occupancy 50%" in prompt_of(judge, 0)


def test_bad_arguments():
    with pytest.raises(ValueError):
        run_loop(PROBLEM, CPUEvaluator(), coder=ScriptedProvider(), rounds=0)
    with pytest.raises(LLMError):
        run_loop(PROBLEM, CPUEvaluator(), coder="replay:/nonexistent/transcript.jsonl")
