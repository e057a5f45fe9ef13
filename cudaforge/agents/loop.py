"""The Coder and the Judge, and the loop in which they write, repair and speed up a kernel.

Round 1: the Coder writes `ModelNew` for the problem; it is evaluated. Each later round continues
from the latest candidate:

- it failed (compile error, wrong values, ...): the Judge reads the source and the evidence
  verbatim (judge_repair) and says what to fix; the Coder repairs it (coder_repair);
- it is correct: the Judge reads the source and its measurements (judge_optimize), names the
  bottleneck and ONE optimization; the Coder applies it (coder_optimize). A Judge answer with the
  line `VERDICT: STOP` (no further gain in sight) ends the run;
- the Coder's reply held no code: the Coder is asked again for the code block (no Judge call).

A correct candidate that is not faster than the fastest one so far is not continued from: the
next round starts again from the fastest, and the Judge sees in the history what did not help.
"Faster" is beyond the noise: a candidate whose time's confidence interval overlaps the fastest's
is a tie, said so in the history, and the earlier one stays (harness.ties; medians decide for
records without intervals). The fastest correct candidate is kept. The run stops at a budget
(rounds, dollars, wall time), when the Judge says stop, or when a model cannot be reached. With
candidates=k, k independent lanes run side by side each round (threads; `evaluate` must then be
thread-safe).

Every run writes a JSONL transcript (agents.transcript) that `replay:PATH` re-runs without any
API. The prompts and the reading of replies are in agents.prompts; what the Judge reads about a
failure is in agents.evidence, about a correct candidate in profiling.measurements.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..errors import LLMError
from ..harness.options import DEFAULT_ATOL
from ..harness.results import EvalResult
from ..harness.ties import compare_results
from ..profiling.measurements import measurements_text
from .evidence import clip, failure_text, number_text
from .file_provider import FileProvider, RepliesPending
from .prompts import NO_CODE_ADVICE, NO_CODE_ERROR, Prompts, extract_code, says_stop
from .providers import Messages, Provider, Reply, Usage, get_provider, redact
from .resume import RecordedRun, source_sha256
from .target import this_machine_target
from .transcript import TRANSCRIPT_VERSION, Evaluate, Transcript, default_transcript_path

Feedback = Callable[[EvalResult], str]

DEFAULT_ROUNDS = 10
# stop reasons of a run that is not over: running it again continues it (agents.resume)
UNFINISHED = ("waiting", "needs_gpu")


# ---------------------------------------------------------------- agents


class Agent:
    """A model in one role: renders its prompt templates and asks its provider."""

    role = ""
    templates: ClassVar[dict[str, str]] = {}

    def __init__(self, provider: Provider, prompts: Prompts | None = None):
        self.provider = provider
        self.prompts = prompts or Prompts()

    def messages(self, task: str, **values: str) -> Messages:
        prompt = self.prompts.render(self.templates[task], **values)
        return [{"role": "user", "content": prompt}]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.provider.model_id!r})"


class Coder(Agent):
    """Writes `ModelNew`: a first attempt, a repair, or one optimization. Its prompts get the
    candidate contract (prompts/contract.txt) as {contract}, with {target} in it filled by
    `target`: what cudaforge.compile builds for (agents.target.target_text)."""

    role = "coder"
    templates: ClassVar[dict[str, str]] = {
        "first": "coder_first",
        "repair": "coder_repair",
        "format": "coder_repair",
        "optimize": "coder_optimize",
    }

    def __init__(self, provider: Provider, prompts: Prompts | None = None, target: str = ""):
        super().__init__(provider, prompts)
        self.target = target or this_machine_target().text

    def messages(self, task: str, **values: str) -> Messages:
        contract = self.prompts.render("contract", target=self.target).strip()
        return super().messages(task, contract=contract, **values)


class Judge(Agent):
    """Reads a candidate and its evidence: what to repair, or the bottleneck and one
    optimization (ending `VERDICT: CONTINUE` or `VERDICT: STOP`)."""

    role = "judge"
    templates: ClassVar[dict[str, str]] = {"repair": "judge_repair", "optimize": "judge_optimize"}

    def __init__(self, provider: Provider, prompts: Prompts | None = None, target: str = ""):
        super().__init__(provider, prompts)
        self.target = target or this_machine_target().text

    def messages(self, task: str, **values: str) -> Messages:
        # the Coder's rules, one text for both tasks, with the harness's own default tolerance
        # and the target the Coder's kernels are built for (advice may use all of it)
        rules = self.prompts.render("judge_rules", target=self.target,
                                    float32_tolerance=f"{DEFAULT_ATOL['float32']:g}")  # fmt: skip
        return super().messages(task, rules=rules.strip(), **values)


# ---------------------------------------------------------------- the loop


@dataclass
class Attempt:
    """One candidate: which round and lane made it, for what task, the source (None when the
    Coder's reply held no code), its result, and the Judge's advice it acted on."""

    round: int
    lane: int
    task: str  # "first", "repair", "format" (asked again for code) or "optimize"
    source: str | None
    result: EvalResult
    advice: str = ""
    reply: str = ""  # the Coder's whole reply

    @property
    def ok(self) -> bool:
        return self.result.ok

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict, API keys redacted."""
        return _redacted(
            {
                "round": self.round,
                "lane": self.lane,
                "task": self.task,
                "source": self.source,
                "result": self.result.to_dict(),
                "advice": self.advice,
            }
        )


def in_model_text(notes: str) -> str:
    """The prompts' {in_model}: the run's notes under a heading, or nothing."""
    if not notes:
        return ""
    heading = "How the model uses this code's outputs:"
    return f"\n{heading}\n{notes}\n"


def _redacted(data: Any) -> Any:
    """`data` (JSON-able) with every API key replaced (see cudaforge.agents.providers.redact)."""
    return json.loads(redact(json.dumps(data, default=str)))


def _speed_key(result: EvalResult) -> tuple[float, float]:
    """Smaller is faster: the candidate's time, else the inverse of its speedup."""
    ms = result.candidate_ms if result.candidate_ms is not None else math.inf
    return (ms, -(result.speedup or 0.0))


def _versus(result: EvalResult, best: EvalResult) -> str:
    """Whether `result` is "faster", "slower" or a "tie" against `best` (the tie rule); by
    _speed_key where either has no time (a result that only gives a speedup)."""
    if result.candidate_ms is None or best.candidate_ms is None:
        return "faster" if _speed_key(result) < _speed_key(best) else "slower"
    return compare_results(result, best)[0]


@dataclass
class LoopResult:
    """The outcome for one problem. usage: {"coder", "judge", "total"} for this problem only
    (a provider's own .usage sums every problem it served); seconds: wall time of the loop."""

    problem: str
    best: Attempt | None
    attempts: list[Attempt]
    # "rounds", "dollars", "seconds", "judge_stop", "waiting", "needs_gpu", "llm_error: ..."
    stop_reason: str
    rounds: int  # rounds started
    usage: dict[str, Usage]
    seconds: float
    transcript: str
    waiting_for: list[str] = field(default_factory=list)  # prompt files that need a reply

    @property
    def tokens_estimated(self) -> bool:
        """Whether some token counts are estimates (file: replies), not reported by an API."""
        return self.usage["total"].estimated_calls > 0 if "total" in self.usage else False

    @property
    def best_source(self) -> str | None:
        return self.best.source if self.best else None

    @property
    def best_result(self) -> EvalResult | None:
        return self.best.result if self.best else None

    @property
    def speedup(self) -> float | None:
        return self.best.result.speedup if self.best else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict for reports, API keys redacted."""
        return _redacted(
            {
                "problem": self.problem,
                "best": self.best.to_dict() if self.best else None,
                "attempts": [a.to_dict() for a in self.attempts],
                "stop_reason": self.stop_reason,
                "rounds": self.rounds,
                "usage": {k: u.to_dict() for k, u in self.usage.items()},
                "seconds": self.seconds,
                "transcript": self.transcript,
                "waiting_for": self.waiting_for,
                "tokens_estimated": self.tokens_estimated,
            }
        )


@dataclass
class _Lane:
    index: int
    current: Attempt | None = None  # what the next round continues from
    best: Attempt | None = None  # the fastest correct candidate of this lane
    history: list[str] = field(default_factory=list)
    stopped: str = ""  # why this lane ended, "" while it runs


def _first_line_after(text: str, label: str) -> str:
    match = re.search(rf"^[ \t*#]*{label}[ \t*]*:[ \t*]*(.+)$", text, re.MULTILINE | re.IGNORECASE)
    line = match[1].strip() if match else ""
    return line if len(line) <= 160 else line[:157] + "..."


def call_tag(round_no: int, lane: int, task: str) -> str:
    """The tag of one LLM call, distinct per role and stable from run to run: `r3/l0` for a
    first attempt or an optimization, `r3/l0/repair` and `r3/l0/format` for a repair and a
    re-ask for the code (file: names its files after it; resume finds recorded replies by it)."""
    tag = f"r{round_no}/l{lane}"
    return f"{tag}/{task}" if task in ("repair", "format") else tag


class _Run:
    """The state of one loop; run_loop's docstring describes it."""

    def __init__(self, problem_source, evaluate, coder, judge, config, transcript, recorded=None):
        self.problem_source = problem_source
        self.recorded: RecordedRun | None = recorded  # what an earlier run of it did (resume)
        self.replayed = {"llm": 0, "eval": 0}  # calls and evaluations answered from `recorded`
        self.needs_gpu = False  # set when recorded evaluations ran on a GPU and none is here
        self.evaluate = evaluate
        self.coder = coder
        self.judge = judge
        self.config = config
        self.transcript = transcript
        self.started = time.monotonic()
        self.usage = {"coder": Usage(), "judge": Usage()}
        self.attempts: list[Attempt] = []
        self.best: Attempt | None = None
        self.waiting_for: list[str] = []  # prompt files that need a reply (file: with wait=0)
        self._lock = threading.Lock()

    # ------------------------------------------------------------ budgets

    def spent(self) -> float:
        with self._lock:
            return self.usage["coder"].cost_usd + self.usage["judge"].cost_usd

    def over_budget(self) -> str:
        """The budget that is used up (dollars, seconds), or ""."""
        max_dollars, max_seconds = self.config["max_dollars"], self.config["max_seconds"]
        if max_dollars is not None and self.spent() >= max_dollars:
            return "dollars"
        if max_seconds is not None and time.monotonic() - self.started >= max_seconds:
            return "seconds"
        return ""

    # ------------------------------------------------------------ one call

    def ask(self, agent: Agent, task: str, round_no: int, lane: int, **values: str) -> Reply:
        messages = agent.messages(task, **values)
        tag = call_tag(round_no, lane, task)
        recorded = self.recorded.reply(agent.role, tag) if self.recorded is not None else None
        if recorded is not None:  # resumed: asked and answered before
            with self._lock:
                self.usage[agent.role].add(recorded)
                self.replayed["llm"] += 1
            return recorded
        started = time.monotonic()
        try:
            reply = agent.provider.complete(messages, tag=tag)
        except LLMError as exc:
            self.transcript.write(
                "llm_error", role=agent.role, task=task, round=round_no, lane=lane, tag=tag,
                model=agent.provider.model_id, error=str(exc),
            )  # fmt: skip
            raise
        with self._lock:
            self.usage[agent.role].add(reply)
        self.transcript.write(
            "llm",
            role=agent.role,
            task=task,
            round=round_no,
            lane=lane,
            tag=tag,
            model=reply.model,
            provider=agent.provider.model_id,
            messages=messages,
            reply=reply.text,
            input_tokens=reply.input_tokens,
            output_tokens=reply.output_tokens,
            cost_usd=reply.cost_usd,
            tokens_estimated=reply.tokens_estimated,
            finish_reason=reply.finish_reason,
            attempts=reply.attempts,
            seconds=round(time.monotonic() - started, 4),
        )
        return reply

    # ------------------------------------------------------------ one lane, one round

    def step(self, lane: _Lane, round_no: int) -> None:
        try:
            self._step(lane, round_no)
        except RepliesPending as exc:
            lane.stopped = "waiting"
            with self._lock:
                self.waiting_for += [str(p) for p in exc.prompt_files]
        except LLMError as exc:
            lane.stopped = f"llm_error: {exc}"

    def _step(self, lane: _Lane, round_no: int) -> None:
        common = {"problem": self.problem_source.strip("\n"), "gpu": self.config["gpu"],
                  "in_model": in_model_text(self.config["notes"])}  # fmt: skip
        history = "\n".join(lane.history) or "(none)"
        base = lane.current
        advice = ""
        if self.over_budget():
            return
        if base is None:
            task = "first"
            values = common
        elif base.source is None:
            task = "format"
            advice = NO_CODE_ADVICE
            values = {
                **common,
                "candidate": clip(base.reply, 6000) or "(an empty reply)",
                "feedback": f"status: no code\nerror: {NO_CODE_ERROR}",
                "advice": advice,
            }
        elif not base.ok:
            task = "repair"
            evidence = failure_text(base.result)
            advice = self.ask(
                self.judge, "repair", round_no, lane.index,
                candidate=base.source, feedback=evidence, history=history, **common,
            ).text  # fmt: skip
            values = {**common, "candidate": base.source, "feedback": evidence, "advice": advice}
        else:
            task = "optimize"
            measurements = self.config["feedback"](base.result)
            advice = self.ask(
                self.judge, "optimize", round_no, lane.index,
                candidate=base.source, feedback=measurements, history=history, **common,
            ).text  # fmt: skip
            if says_stop(advice):
                lane.stopped = "judge_stop"
                lane.history.append(f"round {round_no}: the Judge saw no further gain")
                return
            values = {**common, "candidate": base.source, "advice": advice}
        if self.over_budget():
            return
        reply = self.ask(self.coder, task, round_no, lane.index, **values)
        source = extract_code(reply.text)
        started = time.monotonic()
        recorded = self.recorded.evaluation(source) if self.recorded and source else None
        if source is None:
            result = EvalResult(
                problem=self.config["name"], status="load_error", error=NO_CODE_ERROR
            )
        elif recorded is not None:  # resumed: evaluated before
            result = recorded
            with self._lock:
                self.replayed["eval"] += 1
        elif self.needs_gpu:
            lane.stopped = "needs_gpu"
            return
        else:
            result = self.evaluate(self.problem_source, source)
        attempt = Attempt(round_no, lane.index, task, source, result, advice, reply.text)
        live = recorded is None and (
            source is not None or self.recorded is None
            or self.recorded.reply("coder", call_tag(round_no, lane.index, task)) is None
        )  # fmt: skip
        if live:
            self.transcript.write(
                "eval",
                round=round_no,
                lane=lane.index,
                task=task,
                evaluated=source is not None,
                source=source,
                source_sha256=source_sha256(source) if source is not None else None,
                result=result.to_dict(),
                seconds=round(time.monotonic() - started, 4),
            )
        self._advance(lane, attempt, live)

    def _advance(self, lane: _Lane, attempt: Attempt, live: bool = True) -> None:
        """Record an attempt, and choose what the lane continues from."""
        result = attempt.result
        what = attempt.task
        if attempt.task == "optimize":
            what += f" ({_first_line_after(attempt.advice, 'OPTIMIZATION') or 'see the Judge'})"
        line = f"round {attempt.round}: {what} -> {result.status}"
        if attempt.ok:
            line += (
                f", {number_text(result.candidate_ms, ' ms')}, "
                f"speedup {number_text(result.speedup, 'x', 3)}"
            )
            versus = "faster" if lane.best is None else _versus(result, lane.best.result)
            if versus == "faster":
                lane.best = attempt
                lane.current = attempt
            else:
                what = "a tie within noise with" if versus == "tie" else "not faster than"
                line += (
                    f"; {what} round {lane.best.round} "
                    f"({number_text(lane.best.result.candidate_ms, ' ms')}"
                    f"{', the time intervals overlap' if versus == 'tie' else ''}), which the "
                    "next round continues from"
                )
                lane.current = lane.best
        else:
            if result.error:
                line += f" ({result.error.splitlines()[0][:160]})"
            lane.current = attempt
        lane.history.append(line)
        with self._lock:
            self.attempts.append(attempt)
            improved = attempt.ok and (
                self.best is None or _versus(result, self.best.result) == "faster"
            )
            if improved:
                self.best = attempt
        if improved and live:
            self.transcript.write(
                "best", round=attempt.round, lane=attempt.lane, candidate_ms=result.candidate_ms,
                speedup=result.speedup,
            )  # fmt: skip


def run_loop(
    problem_source: str,
    evaluate: Evaluate,
    *,
    coder: str | Provider = "openai:o3",
    judge: str | Provider | None = None,
    rounds: int = DEFAULT_ROUNDS,
    max_dollars: float | None = None,
    max_seconds: float | None = None,
    candidates: int = 1,
    gpu: str = "",
    feedback: Feedback | None = None,
    transcript: str | os.PathLike | None = None,
    prompts_dir: str | os.PathLike | None = None,
    name: str | None = None,
    notes: str | None = None,
) -> LoopResult:
    """Have the Coder and the Judge write and improve `ModelNew` for one problem.

    problem_source: KernelBench-format source (Model, get_inputs, get_init_inputs).
    evaluate(problem_source, candidate_source) -> EvalResult: checks and times a candidate.
    coder, judge: model strings (cudaforge.agents.providers) or providers; judge defaults to the
    coder's model; `replay:PATH` for both replays a transcript. rounds: Coder rounds at most (each makes one
    candidate per lane). max_dollars (USD, priced calls only), max_seconds (wall time): stop
    before the next call once spent. candidates: lanes per round, run in parallel threads.
    gpu: the target GPU's facts, as text for the prompts. feedback(result) -> str: the
    measurements text the Judge reads (default: profiling.measurements.measurements_text, about
    3 KB). The Coder's contract names the target of this machine's GPU, else $CUDAFORGE_ARCH or
    sm_90a (agents.target). A `file:` provider writes its files under DIR/<name>/. transcript: the JSONL path
    (default: default_transcript_path(name)). prompts_dir: folder of prompt overrides.
    notes: what the model around the problem needs of ModelNew (optimize: the layout the model
    keeps an output in), shown after the problem in every prompt; None: a resumed run's recorded
    notes (none for a new run). A resumed run given notes uses them for the calls it makes now.

    Resume: when `transcript` holds an earlier run of this problem, the run continues it
    (agents.resume): recorded replies answer the calls with the same role and tag, recorded
    evaluations the candidates with the same sha256, the transcript is appended to (a `resume`
    record, then what is new), and the recorded gpu text and target keep the prompts as they
    were. If those evaluations ran on a GPU and this machine has none, the run stops with
    stop_reason 'needs_gpu' at its first new candidate. A transcript of another problem raises
    ValueError.

    Raises NeedsKeyError before any call when a key is missing; an LLMError during the run ends
    it with stop_reason 'llm_error: ...' and keeps what was found; a `file:DIR?wait=0` reply not
    written yet ends it with stop_reason 'waiting' and the prompt files in .waiting_for; errors of
    `evaluate` propagate.
    """
    if rounds < 1 or candidates < 1:
        raise ValueError(f"rounds ({rounds}) and candidates ({candidates}) must be at least 1")
    digest = hashlib.sha256(problem_source.encode()).hexdigest()
    name = name or f"problem-{digest[:10]}"
    prompts = Prompts(prompts_dir)
    coder_provider = get_provider(coder, role="coder")
    if judge is None and isinstance(coder, Provider):
        judge_provider = coder_provider
    else:
        judge_provider = get_provider(coder if judge is None else judge, role="judge")
    coder_provider, judge_provider = _providers_for_run(coder_provider, judge_provider, name)
    path = Path(transcript) if transcript is not None else default_transcript_path(name)
    recorded = RecordedRun.read(path)
    if recorded is not None and recorded.of_another_problem(problem_source):
        raise ValueError(
            f"transcript {path} records a run of another problem "
            f"({recorded.start.get('problem')}); resume it with its own problem, or give this "
            "run another transcript (or --out) to start afresh"
        )
    target = this_machine_target()
    target_text = target.text
    if recorded is not None:  # the run goes on with what its prompts said (resume.py)
        gpu = recorded.start.get("gpu", gpu)
        target_text = recorded.start.get("target_text", target_text)
        notes = recorded.notes if notes is None else notes
    config = {
        "name": name,
        "gpu": gpu.strip() or "(not given: assume a recent NVIDIA data-center GPU)",
        "feedback": feedback or measurements_text,
        "notes": (notes or "").strip(),
        "max_dollars": max_dollars,
        "max_seconds": max_seconds,
    }
    log = Transcript(path)
    run = _Run(
        problem_source, evaluate, Coder(coder_provider, prompts, target_text),
        Judge(judge_provider, prompts, target_text), config, log, recorded,
    )  # fmt: skip
    if recorded is not None:
        run.needs_gpu = recorded.on_gpu and not target.on_gpu
        log.write(
            "resume",
            time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            recorded_llm_calls=len(recorded.replies),
            recorded_evaluations=len(recorded.evaluations),
            recorded_on_gpu=recorded.on_gpu,
            gpu_here=target.on_gpu,
            coder=coder_provider.model_id,
            judge=judge_provider.model_id,
            rounds=rounds,
            max_dollars=max_dollars,
            max_seconds=max_seconds,
            notes=config["notes"],
        )
    else:
        log.write(
            "start",
            version=TRANSCRIPT_VERSION,
            time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            problem=name,
            problem_sha256=digest,
            problem_source=problem_source,
            coder=coder_provider.model_id,
            judge=judge_provider.model_id,
            rounds=rounds,
            candidates=candidates,
            max_dollars=max_dollars,
            max_seconds=max_seconds,
            gpu=config["gpu"],
            target=target.arch,
            target_text=target_text,
            notes=config["notes"],
        )
    lanes = [_Lane(i) for i in range(candidates)]
    round_no = 0
    stop_reason = "error"  # what the transcript says if `evaluate` raises
    pool = ThreadPoolExecutor(max_workers=candidates) if candidates > 1 else None
    try:
        while True:
            reason = _stop_reason(lanes, round_no, rounds, run)
            if reason:
                stop_reason = reason
                break
            round_no += 1
            active = [lane for lane in lanes if not lane.stopped]
            if pool is None:
                for lane in active:
                    run.step(lane, round_no)
            else:
                for future in [pool.submit(run.step, lane, round_no) for lane in active]:
                    future.result()
    except KeyboardInterrupt:
        stop_reason = "interrupted"  # running it again continues it
        raise
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
        seconds = time.monotonic() - run.started
        usage = {**run.usage, "total": run.usage["coder"] + run.usage["judge"]}
        best = run.best
        log.write(
            "end",
            stop_reason=stop_reason,
            rounds=round_no,
            best_round=best.round if best else None,
            best_lane=best.lane if best else None,
            best_source=best.source if best else None,
            best_result=best.result.to_dict() if best else None,
            usage={k: u.to_dict() for k, u in usage.items()},
            seconds=round(seconds, 4),
            waiting_for=run.waiting_for,
            replayed=run.replayed,
        )
        log.close()
    return LoopResult(
        problem=name,
        best=best,
        attempts=sorted(run.attempts, key=lambda a: (a.round, a.lane)),
        stop_reason=stop_reason,
        rounds=round_no,
        usage=usage,
        seconds=seconds,
        transcript=str(path),
        waiting_for=list(run.waiting_for),
    )


def _providers_for_run(coder: Provider, judge: Provider, name: str) -> tuple[Provider, Provider]:
    """file: providers narrowed to this run's folder (`name`), one role each: a Judge that
    shares the Coder's provider gets its own, for the judge's files."""
    shared = judge is coder
    if isinstance(coder, FileProvider):
        coder = coder.for_run(name, role="coder" if coder.role == "llm" else None)
    if isinstance(judge, FileProvider):
        judge = judge.for_run(name, role="judge" if shared or judge.role == "llm" else None)
    return coder, judge


def _stop_reason(lanes: list[_Lane], round_no: int, rounds: int, run: _Run) -> str:
    """Why the loop stops before the next round, or "". A lane that waits for a reply makes it
    "waiting" (the run resumes once the reply is written), one that needs a GPU "needs_gpu"."""
    stopped = [lane.stopped for lane in lanes if lane.stopped]
    unfinished = next((u for u in UNFINISHED if u in stopped), "")
    if len(stopped) == len(lanes):
        errors = [s for s in stopped if s.startswith("llm_error")]
        return unfinished or (errors[0] if errors else "judge_stop")
    reason = "rounds" if round_no >= rounds else run.over_budget()
    return unfinished if reason and unfinished else reason


__all__ = ["DEFAULT_ROUNDS", "Attempt", "Coder", "Judge", "LoopResult", "run_loop"]
