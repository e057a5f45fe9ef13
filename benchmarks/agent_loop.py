"""Benchmark: the Coder/Judge loop with a named LLM on a set of dev problems, measured per round.

Runs `cudaforge bench` (resumable results, one transcript per problem, hardware feedback and the
torch.compile baseline on a GPU) on a fixed problem set, then writes a markdown table for
RESULTS.md from the results file and the transcripts:

- per round k, from each problem's best correct kernel after rounds 1..k (does round k improve on
  k-1?): correct, fast_1 / fast_1.5 / fast_2 against eager and against max(eager, compile), the
  geomean and median speedup against both, and how many problems round k made faster;
- the LLM calls, tokens (labelled as estimates when the provider estimates them, as `file:`
  does), and the harness's share of the wall time (evaluation seconds / the loop's wall time).

    python benchmarks/agent_loop.py --set agent16 --llm 'file:prompts?wait=0' --rounds 5
    python benchmarks/agent_loop.py --set ablation8 --judge-metrics off --llm 'file:...'
    python benchmarks/agent_loop.py --set agent16 --report-only --md table.md   # no GPU needed

`--judge-metrics off` is the ablation: the candidates are not profiled, so the Judge reads timing
only. Run the same command again to resume (a `file:...?wait=0` run stops at each prompt that
needs a reply). The run's files go to --out (default benchmarks/runs/<set>-metrics-<on|off>).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from cudaforge.cli.bench import dev_set_problems, read_results, transcript_path
from cudaforge.cli.bench import transcripts_dir_path as default_transcripts_dir
from cudaforge.reporting.formatting import duration, percent, times
from cudaforge.reporting.markdown import markdown_table
from cudaforge.reporting.speedups import BaselineStats, baseline_stats

RUNS = Path(__file__).resolve().parent / "runs"

# (level, problem id) of the dev set. Chosen for a reference that runs well under a second at the
# default size on an H200, and a mix of kinds:
AGENT16 = (
    (1, 4),  # Matrix_vector_multiplication: matmul-ish, memory-bound
    (1, 12),  # Matmul_with_diagonal_matrices: a matmul that is really a row scaling
    (1, 19),  # ReLU: elementwise
    (1, 23),  # Softmax: row reduction + elementwise
    (1, 36),  # RMSNorm: norm
    (1, 47),  # Sum_reduction_over_a_dimension: reduction
    (1, 88),  # MinGPTNewGelu: elementwise, transcendental
    (1, 94),  # MSELoss: reduction to a scalar
    (2, 1),  # Conv2D_ReLU_BiasAdd: conv + fused epilogue
    (2, 9),  # Matmul_Subtract_Multiply_ReLU: GEMM + fused epilogue
    (2, 14),  # Gemm_Divide_Sum_Scaling: GEMM + reduction
    (2, 29),  # Matmul_Mish_Mish: GEMM + transcendental epilogue
    (2, 37),  # Matmul_Swish_Sum_GroupNorm: GEMM + norm
    (2, 76),  # Gemm_Add_ReLU: GEMM + bias epilogue
    (3, 1),  # MLP: a chain of GEMMs
    (3, 8),  # ResNetBasicBlock: convs, batch norms, residual
)
ABLATION8 = ((1, 4), (1, 19), (1, 23), (1, 36), (1, 47), (2, 14), (2, 29), (2, 76))
SETS = {"agent16": AGENT16, "ablation8": ABLATION8}
FAST_P = (1.0, 1.5, 2.0)


def set_problems(name: str) -> list:
    """The dev-set problems (cudaforge.cli.bench.BenchProblem) of a named set, in its order."""
    chosen = SETS[name]
    problems = dev_set_problems(
        sorted({lv for lv, _ in chosen}), sorted({pid for _, pid in chosen})
    )
    by_id = {(p.level, p.problem_id): p for p in problems}
    return [by_id[item] for item in chosen]


def write_problems(problems: list, folder: Path) -> Path:
    """The problems as files, folder/level<L>/<name>.py: `cudaforge bench FOLDER` reads them
    under the same keys as the dev set ("level1/19_ReLU")."""
    for problem in problems:
        path = folder / f"level{problem.level}" / f"{problem.name}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text("utf-8") != problem.source:
            path.write_text(problem.source, "utf-8")
    return folder


# ---------------------------------------------------------------- reading a run


@dataclass
class Candidate:
    round: int
    ok: bool
    candidate_ms: float | None
    speedup: float | None
    speedup_vs_compile: float | None


@dataclass
class ProblemRun:
    """What one problem's transcript says (records repeated by a resumed run count once)."""

    key: str
    candidates: list[Candidate] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)  # role -> LLM calls
    input_tokens: int = 0
    output_tokens: int = 0
    estimated: bool = False  # a provider estimated its token counts
    models: set[str] = field(default_factory=set)
    llm_seconds: float = 0.0
    harness_seconds: float = 0.0  # the evaluations
    wall_seconds: float = 0.0  # the loop, summed over resumed runs

    def best_after(self, round_no: int) -> Candidate | None:
        """The fastest correct candidate of rounds 1..round_no (the loop keeps that one)."""
        done = [c for c in self.candidates if c.ok and c.round <= round_no]
        return min(done, key=lambda c: c.candidate_ms or float("inf"), default=None)


def _estimates(record: dict) -> bool:
    """True when the call's token counts are estimates (file: says so; scripted: estimates)."""
    provider = str(record.get("provider") or "")
    said = str(record.get("finish_reason") or "").lower()
    return "estimated" in said or provider.startswith(("file:", "scripted"))


def read_problem_run(key: str, path: Path) -> ProblemRun:
    """A ProblemRun from a transcript (cudaforge.agents.transcript)."""
    run = ProblemRun(key)
    seen: set = set()
    segment_end = last_t = 0.0
    for line in path.read_text("utf-8").splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        t = float(record.get("t") or 0.0)
        if t < last_t:  # a resumed run's transcript restarts its clock
            segment_end += last_t
        last_t = t
        kind = record.get("kind")
        if kind == "llm":
            identity = ("llm", record.get("role"), record.get("tag"), record.get("task"))
            if identity in seen or record.get("reused"):
                continue
            seen.add(identity)
            role = record.get("role") or "llm"
            run.calls[role] = run.calls.get(role, 0) + 1
            run.input_tokens += int(record.get("input_tokens") or 0)
            run.output_tokens += int(record.get("output_tokens") or 0)
            run.estimated = run.estimated or _estimates(record)
            run.models.add(str(record.get("model") or record.get("provider") or "?"))
            run.llm_seconds += float(record.get("seconds") or 0.0)
        elif kind == "eval" and record.get("evaluated", True):
            digest = hashlib.sha256(str(record.get("source")).encode()).hexdigest()
            identity = ("eval", record.get("round"), record.get("lane"), digest)
            if identity in seen or record.get("reused"):
                continue
            seen.add(identity)
            result = record.get("result") or {}
            run.candidates.append(
                Candidate(
                    int(record.get("round") or 0),
                    result.get("status") == "ok",
                    result.get("candidate_ms"),
                    result.get("speedup"),
                    result.get("speedup_vs_compile"),
                )
            )
            run.harness_seconds += float(record.get("seconds") or 0.0)
    run.wall_seconds = segment_end + last_t
    return run


def read_runs(results: Path, transcripts: Path | None = None) -> dict[str, ProblemRun]:
    """Each problem's ProblemRun, by key, from a results file's transcripts folder (and the
    transcripts of problems still running, which are not in the results file yet)."""
    folder = transcripts or default_transcripts_dir(results)
    keys = set()
    if results.is_file():
        keys = {str(r.get("key") or r.get("problem")) for r in read_results(results).records}
    if folder.is_dir():
        keys |= {
            p.relative_to(folder).as_posix()[: -len(".jsonl")] for p in folder.rglob("*.jsonl")
        }
    runs = {}
    for key in sorted(keys):
        path = transcript_path(folder, key)
        if path.is_file():
            runs[key] = read_problem_run(key, path)
    return runs


# ---------------------------------------------------------------- the tables


@dataclass
class RoundRow:
    round: int
    correct: int
    eager: BaselineStats
    faster: BaselineStats
    improved: int  # problems whose best kernel is new in this round (first correct, or faster)


def round_rows(runs: dict[str, ProblemRun], problems: int, rounds: int) -> list[RoundRow]:
    """One row per round 1..rounds over `problems` problems (those without a run count as not
    correct)."""
    rows = []
    for k in range(1, rounds + 1):
        kernels, improved = [], 0
        for run in runs.values():
            best, before = run.best_after(k), run.best_after(k - 1)
            if best is not None:
                kernels.append((best.speedup, best.speedup_vs_compile))
                improved += best is not before
        rows.append(
            RoundRow(
                k,
                len(kernels),
                baseline_stats("eager", kernels, problems, FAST_P),
                baseline_stats("faster", kernels, problems, FAST_P),
                improved,
            )
        )
    return rows


def report_markdown(
    runs: dict[str, ProblemRun], problems: list[str], rounds: int, title: str = ""
) -> str:
    """The RESULTS.md section: the per-round table, then the calls, tokens and time."""
    n = len(problems)
    mine = {k: r for k, r in runs.items() if k in set(problems)}
    header = ["round", "correct"]
    header += [f"fast_{p:g} eager" for p in FAST_P] + [f"fast_{p:g} max" for p in FAST_P]
    header += ["geomean eager", "median eager", "geomean max", "median max", "improved"]
    table = []
    for row in round_rows(mine, n, rounds):
        cells = [str(row.round), f"{percent(row.correct / n) if n else '-'} ({row.correct})"]
        cells += [percent(v) for v in row.eager.fast_p.values()]
        cells += [percent(v) for v in row.faster.fast_p.values()]
        cells += [times(row.eager.geomean), times(row.eager.median)]
        cells += [times(row.faster.geomean), times(row.faster.median), str(row.improved)]
        table.append(cells)
    lines = [f"### {title}", ""] if title else []
    models = sorted({m for r in mine.values() for m in r.models})
    lines += [
        (
            f"{n} problems, {len(mine)} with a transcript; {rounds} rounds; models: "
            f"{', '.join(models) or 'none yet'}."
        ),
        "",
        *markdown_table(header, table),
        "",
        (
            "Per round k: each problem's best correct kernel after rounds 1..k. fast_p: share of "
            f"all {n} problems whose kernel is correct and more than p times faster than eager "
            "PyTorch (eager) or than the faster of eager and torch.compile (max; eager alone where "
            "torch.compile was not timed); geomean and median over the correct problems; "
            "improved: problems whose best kernel is new in round k."
        ),
        "",
    ]
    calls = {role: sum(r.calls.get(role, 0) for r in mine.values()) for role in ("coder", "judge")}
    estimated = any(r.estimated for r in mine.values())
    label = " (estimates: characters / 4)" if estimated else ""
    harness = sum(r.harness_seconds for r in mine.values())
    wall = sum(r.wall_seconds for r in mine.values())
    llm = sum(r.llm_seconds for r in mine.values())
    share = percent(harness / wall) if wall else "-"
    lines += markdown_table(
        ["LLM calls (coder + judge)", f"input tokens{label}", f"output tokens{label}",
         "evaluation time", "LLM time", "loop wall time", "harness share"],
        [[f"{calls['coder'] + calls['judge']} ({calls['coder']} + {calls['judge']})",
          str(sum(r.input_tokens for r in mine.values())),
          str(sum(r.output_tokens for r in mine.values())),
          duration(harness), duration(llm), duration(wall), share]],
    )  # fmt: skip
    lines += [
        "",
        (
            "harness share: the evaluations' time (compile, check, time, profile) / the loop's "
            "wall time, summed over resumed runs; LLM time is the time spent waiting for replies "
            "(a `file:...?wait=0` run does not wait: its replies were written between runs)."
        ),
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=sorted(SETS), default="agent16", help="problem set")
    parser.add_argument("--llm", help="the Coder's model string (e.g. 'file:DIR?wait=0')")
    parser.add_argument("--judge", help="the Judge's model (default: the Coder's)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per problem (default 5)")
    parser.add_argument(
        "--judge-metrics",
        choices=("on", "off"),
        default="on",
        help="off: the Judge reads timing only, no hardware metrics (the ablation)",
    )
    parser.add_argument("--out", help="the run's folder (default benchmarks/runs/<set>-metrics-X)")
    parser.add_argument("--report-only", action="store_true", help="only the table, from files")
    parser.add_argument("--md", help="also write the table to this markdown file")
    parser.add_argument("--jobs", type=int, default=1, help="problems at once")
    return parser


# The benchmark's GPU as cudaforge.cli.doctor.gpu_facts describes it on the H200 (doctor there,
# 2026-12-03: 132 SMs, 140 GiB, L2 60 MiB; 227 KiB opt-in shared memory, 64K registers and 2048
# threads per SM are compute capability 9.0's limits), so that prompts rendered on a machine
# without a GPU say what a run on the H200 would.
H200 = (
    "NVIDIA H200: compute capability 9.0, 132 SMs, 140 GiB, L2 60 MiB, up to 227 KiB shared "
    "memory per block (opt-in), 65536 registers and 2048 threads per SM, warp size 32."
)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = Path(args.out) if args.out else RUNS / f"{args.set}-metrics-{args.judge_metrics}"
    results = out / "results.jsonl"
    problems = set_problems(args.set)
    code = 0
    if not args.report_only:
        if not args.llm:
            raise SystemExit("agent_loop: --llm is needed to run (or --report-only)")
        from cudaforge.cli.doctor import has_gpu
        from cudaforge.cli.main import main as cudaforge

        command = ["bench", str(write_problems(problems, out / "problems")),
                   "--results", str(results), "--llm", args.llm, "--rounds", str(args.rounds),
                   "--jobs", str(args.jobs), "--full-size"]  # fmt: skip
        # prompts rendered here for the H200 describe it; on a GPU they describe that GPU
        command += [] if has_gpu() else ["--target-gpu", H200]
        command += ["--judge", args.judge] if args.judge else []
        command += ["--no-profile"] if args.judge_metrics == "off" else []
        code = cudaforge(command)
    title = f"{args.set}, Judge metrics {args.judge_metrics}"
    text = report_markdown(read_runs(results), [p.key for p in problems], args.rounds, title)
    print(text)
    if args.md:
        Path(args.md).write_text(text, "utf-8")
    return code


if __name__ == "__main__":
    sys.exit(main())
