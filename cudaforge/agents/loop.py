"""The Coder and the Judge, and the loop in which they write, repair and speed up a kernel.

Round 1: the Coder writes `ModelNew` for the problem; it is evaluated. Each later round continues
from the latest candidate:

- it failed (compile error, wrong values, ...): the Judge reads the source and the evidence
  verbatim (judge_repair) and says what to fix; the Coder repairs it (coder_repair);
- it is correct: the Judge reads the source and its measurements (judge_optimize), names the
  bottleneck and ONE optimization; the Coder applies it (coder_optimize). A Judge answer with the
  line `VERDICT: STOP` (no further gain in sight) ends the run;
- the Coder's reply held no code: the Coder is asked again for the code block (no Judge call).

A correct candidate that is slower than the fastest one so far is not continued from: the next
round starts again from the fastest, and the Judge sees in the history what did not help. The
fastest correct candidate is kept. The run stops at a budget (rounds, dollars, wall time), when
the Judge says stop, or when a model cannot be reached. With candidates=k, k independent lanes
run side by side each round (threads; `evaluate` must then be thread-safe).

Every run writes a JSONL transcript (prompts, replies, evaluation results, timings, usage; API
keys redacted) that `replay:PATH` re-runs without any API.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.resources
import json
import math
import os
import re
import textwrap
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..errors import LLMError
from ..harness.results import EvalResult
from .providers import Messages, Provider, Reply, Usage, get_provider, redact

Evaluate = Callable[[str, str], EvalResult]  # (problem_source, candidate_source) -> EvalResult
Feedback = Callable[[EvalResult], str]

DEFAULT_ROUNDS = 10
STOP_MARKER = "VERDICT: STOP"
PROMPT_NAMES = (
    "coder_first",
    "coder_repair",
    "coder_optimize",
    "judge_repair",
    "judge_optimize",
    "contract",
)
# Evidence longer than this (characters) is cut in the middle: the head has the first errors, the
# tail the summary; beyond it a prompt gets costly without helping.
MAX_EVIDENCE_CHARS = 30_000
NO_CODE_ERROR = (
    "the reply contained no ```python code block defining `class ModelNew`, so nothing could be "
    "compiled or checked"
)
NO_CODE_ADVICE = (
    "Your previous reply had no ```python code block defining `class ModelNew`. Reply with the "
    "complete source file, all of it, in one ```python block."
)
TRANSCRIPT_VERSION = 1


# ---------------------------------------------------------------- prompts


def _shipped_prompt(name: str) -> str:
    try:
        return (importlib.resources.files("cudaforge.prompts") / f"{name}.txt").read_text("utf-8")
    except ModuleNotFoundError:  # running from a source tree that is not installed
        return (Path(__file__).resolve().parents[2] / "prompts" / f"{name}.txt").read_text(
            "utf-8"
        )


class Prompts:
    """The prompt templates: the files shipped in cudaforge.prompts, each replaced by a file of
    the same name in `folder` (or $CUDAFORGE_PROMPTS) where one exists.

    Templates are plain text; `{name}` is replaced by the value of that name, and any other brace
    (CUDA code in a user's template) is left alone."""

    _PLACEHOLDER = re.compile(r"\{(\w+)\}")

    def __init__(self, folder: str | os.PathLike | None = None):
        folder = folder if folder is not None else os.environ.get("CUDAFORGE_PROMPTS") or None
        self.folder = Path(folder) if folder is not None else None
        if self.folder is not None and not self.folder.is_dir():
            raise FileNotFoundError(f"prompts folder {self.folder} does not exist")
        self._texts: dict[str, str] = {}

    def text(self, name: str) -> str:
        if name not in self._texts:
            override = self.folder / f"{name}.txt" if self.folder is not None else None
            if override is not None and override.is_file():
                self._texts[name] = override.read_text("utf-8")
            else:
                self._texts[name] = _shipped_prompt(name)
        return self._texts[name]

    def render(self, name: str, **values: str) -> str:
        def fill(match: re.Match) -> str:
            return values[match[1]] if match[1] in values else match[0]

        return self._PLACEHOLDER.sub(fill, self.text(name))


# ---------------------------------------------------------------- reading replies


def code_blocks(text: str) -> list[tuple[str, str]]:
    """The fenced blocks of a Markdown reply as (language, code); a block the reply leaves open
    (cut off) runs to the end."""
    opening = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([^\s`~]*)[^`]*$")
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        match = opening.match(lines[i])
        i += 1
        if match is None:
            continue
        fence, body = match[1], []
        while i < len(lines):
            stripped = lines[i].strip()
            i += 1
            if len(stripped) >= len(fence) and set(stripped) == {fence[0]}:
                break
            body.append(lines[i - 1])
        blocks.append((match[2].lower(), textwrap.dedent("\n".join(body))))
    return blocks


_MODEL_NEW = re.compile(r"^[ \t]*class[ \t]+ModelNew\b", re.MULTILINE)


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    return True


def extract_code(text: str) -> str | None:
    """The candidate source in a Coder reply, or None when there is none.

    Of several code blocks, the last one defining `class ModelNew` that parses as Python wins (a
    reply often shows a broken version before the fixed one), else the last defining it. A reply
    without fences that is itself Python defining ModelNew (possibly after prose) is taken as is.
    """
    defining = [code for _, code in code_blocks(text) if _MODEL_NEW.search(code)]
    if defining:
        parsing = [code for code in defining if _parses(code)]
        return (parsing or defining)[-1].strip() + "\n"
    if "```" in text or "~~~" in text or not _MODEL_NEW.search(text):
        return None
    start = re.search(r"^(import|from)[ \t]", text, re.MULTILINE)
    for source in (text, text[start.start() :] if start else ""):
        if source and _MODEL_NEW.search(source) and _parses(source):
            return source.strip() + "\n"
    return None


def says_stop(judge_text: str) -> bool:
    """True when the Judge's answer has the line `VERDICT: STOP` (any case, any spacing)."""
    verdicts = re.findall(
        r"^[ \t*#>]*VERDICT[ \t*]*:[ \t*]*(\w+)", judge_text, re.MULTILINE | re.IGNORECASE
    )
    return bool(verdicts) and verdicts[-1].upper() == "STOP"


# ---------------------------------------------------------------- feedback texts


def clip(text: str, limit: int = MAX_EVIDENCE_CHARS) -> str:
    """`text`, cut in the middle when longer than `limit` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - limit} characters cut ...]\n{text[-tail:]}"


def _num(value: float | None, unit: str = "", digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}g}{unit}"


def failure_text(result: EvalResult) -> str:
    """What went wrong with a candidate, for the repair prompts: status, error, the mismatch
    report, the guards and the compile log (verbatim, cut only past MAX_EVIDENCE_CHARS)."""
    lines = [f"status: {result.status}"]
    if result.error:
        lines.append(f"error: {result.error}")
    failure = result.failure
    if failure is not None:
        lines.append(f"mismatch report (trial {failure.trial}, output {failure.output_index}):")
        lines.append(f"  {failure.message}")
        lines.append(
            f"  max abs error {_num(failure.max_abs_err)}, max rel error "
            f"{_num(failure.max_rel_err)}; {failure.mismatches} of {failure.total} elements "
            "outside tolerance"
        )
        if failure.worst_index:
            lines.append(
                f"  worst element at index {list(failure.worst_index)}: expected "
                f"{_num(failure.expected, digits=6)}, got {_num(failure.actual, digits=6)}"
            )
    if result.tolerances:
        lines.append(
            "tolerances: " + ", ".join(f"{k}={v:g}" for k, v in sorted(result.tolerances.items()))
        )
    if result.guards:
        lines.append("refused by guards: " + ", ".join(result.guards))
    if result.compile_log:
        lines.append("compile log:")
        lines.append(clip(result.compile_log.rstrip()))
    return "\n".join(lines)


def _profile_lines(profile: Any, indent: str = "  ") -> list[str]:
    if isinstance(profile, dict):
        out = []
        for key, value in profile.items():
            if isinstance(value, (dict, list)):
                out.append(f"{indent}{key}:")
                out += _profile_lines(value, indent + "  ")
            else:
                out.append(f"{indent}{key}: {value}")
        return out
    if isinstance(profile, list):
        return [line for item in profile for line in _profile_lines(item, indent)]
    return [f"{indent}{profile}"]


def metrics_text(result: EvalResult, max_kernels: int = 12) -> str:
    """The default measurements text for the Judge: timing, the kernels that ran (by GPU time),
    the guards, and the hardware metrics when the result has a profile."""
    lines = [
        f"candidate: {_num(result.candidate_ms, ' ms')} per forward"
        + (f" (spread {result.candidate_spread:.1%})" if result.candidate_spread else ""),
        f"reference (PyTorch): {_num(result.reference_ms, ' ms')}",
        f"speedup over the reference: {_num(result.speedup, 'x', 3)}",
    ]
    if result.compiled_reference_ms is not None:
        lines.append(
            f"torch.compile of the reference: {_num(result.compiled_reference_ms, ' ms')}"
            f" (speedup over it {_num(result.speedup_vs_compile, 'x', 3)})"
        )
    if result.own_kernel_share is not None:
        lines.append(
            f"share of GPU time in the candidate's own kernels: {result.own_kernel_share:.0%}"
        )
    if result.kernels:
        lines.append("kernels (GPU time during the timed forwards):")
        ranked = sorted(result.kernels, key=lambda k: k.total_us, reverse=True)
        for k in ranked[:max_kernels]:
            who = "own" if k.own else "library"
            lines.append(
                f"  {k.name} [{who}]: {k.calls} launch{'es' if k.calls != 1 else ''}, "
                f"{k.mean_us:.4g} us each, {k.total_us:.4g} us total"
            )
        if len(ranked) > max_kernels:
            lines.append(f"  ... {len(ranked) - max_kernels} more")
    if result.guards:
        lines.append("guards that fired: " + ", ".join(result.guards))
    if result.profile:
        lines.append("hardware metrics:")
        lines += _profile_lines(result.profile)
    else:
        lines.append("hardware metrics: none (not profiled)")
    return "\n".join(lines)


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
    candidate contract (prompts/contract.txt) as {contract}."""

    role = "coder"
    templates: ClassVar[dict[str, str]] = {
        "first": "coder_first",
        "repair": "coder_repair",
        "format": "coder_repair",
        "optimize": "coder_optimize",
    }

    def messages(self, task: str, **values: str) -> Messages:
        return super().messages(task, contract=self.prompts.text("contract").strip(), **values)


class Judge(Agent):
    """Reads a candidate and its evidence: what to repair, or the bottleneck and one
    optimization (ending `VERDICT: CONTINUE` or `VERDICT: STOP`)."""

    role = "judge"
    templates: ClassVar[dict[str, str]] = {"repair": "judge_repair", "optimize": "judge_optimize"}


# ---------------------------------------------------------------- transcript


def default_transcript_path(name: str) -> Path:
    """cache_dir()/transcripts/<UTC time>-<name>.jsonl ($CUDAFORGE_CACHE_DIR moves the cache)."""
    from ..cuda.kernel import cache_dir

    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    safe = re.sub(r"[^\w.-]+", "_", name)[:60]
    return cache_dir() / "transcripts" / f"{stamp}-{safe}-{os.getpid()}.jsonl"


class Transcript:
    """A JSONL file, one record a line, flushed as written; every line goes through `redact`."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 (closed by close())
        self._lock = threading.Lock()
        self._started = time.monotonic()

    def write(self, kind: str, **fields: Any) -> None:
        record = {"kind": kind, "t": round(time.monotonic() - self._started, 4), **fields}
        line = redact(json.dumps(record, default=str))
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_transcript(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a transcript, in order."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def recorded_evaluator(path: str | os.PathLike) -> Evaluate:
    """An `evaluate` that answers from a transcript's evaluation records, matched by candidate
    source: re-runs a loop with `replay:PATH` without a GPU. A source the transcript never saw
    gets a 'crashed' result saying so."""
    results = {}
    for record in read_transcript(path):
        if record["kind"] == "eval" and record.get("source") is not None:
            results[record["source"]] = record["result"]

    def evaluate(problem_source: str, candidate_source: str) -> EvalResult:
        if candidate_source in results:
            return EvalResult.from_dict(results[candidate_source])
        return EvalResult(
            problem="", status="crashed", error=f"candidate not evaluated in transcript {path}"
        )

    return evaluate


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


def _redacted(data: Any) -> Any:
    """`data` (JSON-able) with every API key replaced (see cudaforge.agents.providers.redact)."""
    return json.loads(redact(json.dumps(data, default=str)))


def _speed_key(result: EvalResult) -> tuple[float, float]:
    """Smaller is faster: the candidate's time, else the inverse of its speedup."""
    ms = result.candidate_ms if result.candidate_ms is not None else math.inf
    return (ms, -(result.speedup or 0.0))


@dataclass
class LoopResult:
    """The outcome for one problem. usage: {"coder", "judge", "total"} for this problem only
    (a provider's own .usage sums every problem it served); seconds: wall time of the loop."""

    problem: str
    best: Attempt | None
    attempts: list[Attempt]
    stop_reason: str  # "rounds", "dollars", "seconds", "judge_stop", "llm_error: ..."
    rounds: int  # rounds started
    usage: dict[str, Usage]
    seconds: float
    transcript: str

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


class _Run:
    """The state of one loop; run_loop's docstring describes it."""

    def __init__(self, problem_source, evaluate, coder, judge, config, transcript):
        self.problem_source = problem_source
        self.evaluate = evaluate
        self.coder = coder
        self.judge = judge
        self.config = config
        self.transcript = transcript
        self.started = time.monotonic()
        self.usage = {"coder": Usage(), "judge": Usage()}
        self.attempts: list[Attempt] = []
        self.best: Attempt | None = None
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
        tag = f"r{round_no}/l{lane}"
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
            finish_reason=reply.finish_reason,
            attempts=reply.attempts,
            seconds=round(time.monotonic() - started, 4),
        )
        return reply

    # ------------------------------------------------------------ one lane, one round

    def step(self, lane: _Lane, round_no: int) -> None:
        try:
            self._step(lane, round_no)
        except LLMError as exc:
            lane.stopped = f"llm_error: {exc}"

    def _step(self, lane: _Lane, round_no: int) -> None:
        common = {"problem": self.problem_source.strip("\n"), "gpu": self.config["gpu"]}
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
        if source is None:
            result = EvalResult(
                problem=self.config["name"], status="load_error", error=NO_CODE_ERROR
            )
        else:
            result = self.evaluate(self.problem_source, source)
        attempt = Attempt(round_no, lane.index, task, source, result, advice, reply.text)
        self.transcript.write(
            "eval",
            round=round_no,
            lane=lane.index,
            task=task,
            evaluated=source is not None,
            source=source,
            result=result.to_dict(),
            seconds=round(time.monotonic() - started, 4),
        )
        self._advance(lane, attempt)

    def _advance(self, lane: _Lane, attempt: Attempt) -> None:
        """Record an attempt, and choose what the lane continues from."""
        result = attempt.result
        what = attempt.task
        if attempt.task == "optimize":
            what += f" ({_first_line_after(attempt.advice, 'OPTIMIZATION') or 'see the Judge'})"
        line = f"round {attempt.round}: {what} -> {result.status}"
        if attempt.ok:
            line += f", {_num(result.candidate_ms, ' ms')}, speedup {_num(result.speedup, 'x', 3)}"
            if lane.best is None or _speed_key(result) < _speed_key(lane.best.result):
                lane.best = attempt
                lane.current = attempt
            else:
                line += (
                    f"; not faster than round {lane.best.round} "
                    f"({_num(lane.best.result.candidate_ms, ' ms')}), which the next round "
                    "continues from"
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
                self.best is None or _speed_key(result) < _speed_key(self.best.result)
            )
            if improved:
                self.best = attempt
        if improved:
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
) -> LoopResult:
    """Have the Coder and the Judge write and improve `ModelNew` for one problem.

    problem_source: KernelBench-format source (Model, get_inputs, get_init_inputs).
    evaluate(problem_source, candidate_source) -> EvalResult: checks and times a candidate.
    coder, judge: model strings (cudaforge.agents.providers) or providers; judge defaults to the coder's model.
    `replay:PATH` for both replays a transcript. rounds: Coder rounds at most (each makes one
    candidate per lane). max_dollars (USD, priced calls only), max_seconds (wall time): stop
    before the next call once spent. candidates: lanes per round, run in parallel threads.
    gpu: the target GPU's facts, as text for the prompts. feedback(result) -> str: the
    measurements text the Judge reads (default: metrics_text). transcript: the JSONL path
    (default: default_transcript_path(name)). prompts_dir: folder of prompt overrides.

    Raises NeedsKeyError before any call when a key is missing; an LLMError during the run ends
    it with stop_reason 'llm_error: ...' and keeps what was found; errors of `evaluate` propagate.
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
    config = {
        "name": name,
        "gpu": gpu.strip() or "(not given: assume a recent NVIDIA data-center GPU)",
        "feedback": feedback or metrics_text,
        "max_dollars": max_dollars,
        "max_seconds": max_seconds,
    }
    path = Path(transcript) if transcript is not None else default_transcript_path(name)
    log = Transcript(path)
    run = _Run(
        problem_source, evaluate, Coder(coder_provider, prompts), Judge(judge_provider, prompts),
        config, log,
    )  # fmt: skip
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
    )


def _stop_reason(lanes: list[_Lane], round_no: int, rounds: int, run: _Run) -> str:
    stopped = [lane.stopped for lane in lanes if lane.stopped]
    if len(stopped) == len(lanes):
        errors = [s for s in stopped if s.startswith("llm_error")]
        return errors[0] if errors else "judge_stop"
    if round_no >= rounds:
        return "rounds"
    return run.over_budget()


__all__ = [
    "DEFAULT_ROUNDS",
    "STOP_MARKER",
    "Attempt",
    "Coder",
    "Judge",
    "LoopResult",
    "Prompts",
    "Transcript",
    "code_blocks",
    "extract_code",
    "failure_text",
    "metrics_text",
    "read_transcript",
    "recorded_evaluator",
    "run_loop",
    "says_stop",
]
