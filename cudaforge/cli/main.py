"""The `cudaforge` command.

Exit codes: 0 done; 1 the work failed (a candidate was wrong, a run ended in errors); 2 bad usage
or input; 3 a needed resource is missing (GPU, CUDA library, API key; also a resumed GPU run on a
machine without one); 4 waiting for replies (a `file:DIR?wait=0` model: the prompt files that need
a reply are printed; write the replies, then run the same command again); 130 interrupted.
Errors print one readable line; --debug shows the traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from .doctor import gpu_facts, has_gpu

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_MISSING, EXIT_WAITING = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130
CPU_MAX_BYTES = 32 << 20  # problems are shrunk to this on the CPU path (dev inputs reach GBs)


# ---------------------------------------------------------------- helpers


def parse_sizes(text: str | None) -> dict[str, int]:
    """'batch_size=16,dim=256' -> {'batch_size': 16, 'dim': 256}."""
    out: dict[str, int] = {}
    for part in filter(None, (text or "").split(",")):
        name, sep, value = part.partition("=")
        if not sep or not name.strip().isidentifier():
            raise ValueError(f"--sizes takes NAME=INT[,NAME=INT...], got {part!r}")
        out[name.strip()] = int(value)
    return out


def load_problem(spec: str, sizes: str | None = None, shrink: bool | None = None):
    """A problem from a .py path or a dev-set id ('L1/19', 'level1/19', '1/19').

    Shrunk to fit the CPU path when no GPU is visible (or when `shrink` is True)."""
    from ..harness.problem import Problem

    overrides = parse_sizes(sizes)
    path = Path(spec)
    if path.suffix == ".py" or path.exists():
        if not path.exists():
            raise FileNotFoundError(f"no problem file {spec}")
        problem = Problem.from_file(path, sizes=overrides or None)
    else:
        text = spec.lower().removeprefix("level").removeprefix("l")
        level, sep, pid = text.partition("/")
        if not sep or not level.isdigit() or not pid.isdigit():
            raise ValueError(f"{spec!r} is neither a .py file nor a dev-set id like L1/19")
        try:
            problem = Problem.from_dev_set(int(level), int(pid), sizes=overrides or None)
        except KeyError as exc:
            raise ValueError(exc.args[0]) from None
    if shrink or (shrink is None and not overrides and not has_gpu()):
        problem = problem.shrink(CPU_MAX_BYTES)
    return problem


def read_source(path: str) -> str:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no candidate file {path}")
    return p.read_text()


def result_table(result) -> str:
    rows = [("problem", result.problem), ("status", result.status)]
    if result.error:
        rows.append(("error", result.error.splitlines()[0][:200]))
    if result.failure is not None:
        f = result.failure
        rows.append(("first failure", f"trial {f.trial}, output {f.output_index}: {f.message}"))
    rows.append(("trials", str(result.trials)))

    def ms(v):
        return "-" if v is None else f"{v:.4f} ms"

    rows += [("candidate", ms(result.candidate_ms)), ("reference", ms(result.reference_ms))]
    if result.speedup is not None:
        rows.append(("speedup vs eager", f"{result.speedup:.2f}x"))
    if result.speedup_vs_compile is not None:
        rows.append(("speedup vs torch.compile", f"{result.speedup_vs_compile:.2f}x"))
    if result.own_kernel_share is not None:
        rows.append(("GPU time in own kernels", f"{100 * result.own_kernel_share:.0f}%"))
    if result.guards:
        rows.append(("guards fired", ", ".join(result.guards)))
    if result.device:
        rows.append(("device", result.device))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    for k in result.kernels[:8]:
        lines.append(
            f"  kernel {k.name[:60]}: {k.calls} calls, {k.mean_us:.2f} us mean"
            + (" (own)" if k.own else "")
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- commands


def cmd_doctor(args) -> int:
    from .doctor import doctor, format_report

    report = doctor()
    print(json.dumps(report, indent=2, default=str) if args.json else format_report(report))
    return EXIT_OK


def _evaluate(args, profile: bool):
    from ..harness.evaluate import evaluate

    problem = load_problem(args.problem, args.sizes, args.shrink)
    source = read_source(args.candidate)
    return evaluate(
        problem,
        source,
        trials=args.trials,
        timed_runs=args.timed_runs,
        compare_compile=getattr(args, "compile", False),
        timeout=args.timeout,
        profile=profile,
    )


def cmd_eval(args) -> int:
    result = _evaluate(args, profile=False)
    print(result.to_json() if args.json else result_table(result))
    return EXIT_OK if result.ok else EXIT_FAILED


def cmd_profile(args) -> int:
    from ..profiling.feedback import format_profile
    from ..profiling.profiler import ForwardProfile

    result = _evaluate(args, profile=True)
    if args.json:
        print(result.to_json())
    elif result.profile is None:
        print(result_table(result))
        print("no profile: " + (result.error or "the candidate did not pass"), file=sys.stderr)
    else:
        print(format_profile(ForwardProfile.from_dict(result.profile), budget=args.budget))
    return EXIT_OK if result.ok else EXIT_FAILED


def _source_evaluator(
    args,
    *,
    name: str | None = None,
    profile: bool = False,
    pool=None,
    compiled_times=None,
    device: str | None = None,
):
    """The agents' evaluate(problem_source, candidate_source) with the command's run options.
    compiled_times: a file (cudaforge.harness.compiled_reference) that makes the evaluations time
    torch.compile of each problem's reference once; None: not timed. device: "cpu" keeps a
    resumed CPU run on the CPU."""
    from ..harness.compiled_reference import CompiledReferenceTimes, once_per_problem
    from ..harness.evaluate import evaluate
    from ..harness.problem import Problem

    def run(problem_source: str, candidate_source: str, compare_compile: bool = False):
        problem = Problem.from_source(problem_source, name=name)
        return evaluate(
            problem,
            candidate_source,
            trials=args.trials,
            timed_runs=args.timed_runs,
            timeout=args.timeout,
            compare_compile=compare_compile,
            profile=profile,
            pool=pool,
            device=device,
        )

    if compiled_times is None:
        return run
    return once_per_problem(run, CompiledReferenceTimes(compiled_times))


def cmd_forge(args) -> int:
    from ..agents.loop import run_loop
    from ..agents.resume import RecordedRun

    problem = load_problem(args.problem, args.sizes, args.shrink)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    transcript = out_dir / f"{problem.name}.transcript.jsonl"
    source, device = problem.source, None
    recorded = RecordedRun.read(transcript)
    if recorded is not None:  # the same forge again: it continues the recorded run
        source = recorded.problem_source or source
        if recorded.evaluations and not recorded.on_gpu:
            device = "cpu"  # a CPU run stays a CPU run
    print(
        f"{'resuming' if recorded else 'forging'} {problem.name} with coder {args.llm}, judge "
        f"{args.judge or args.llm}; transcript {transcript}",
        file=sys.stderr,
    )
    gpu = has_gpu() and device is None
    evaluate = _source_evaluator(
        args,
        name=problem.name,
        profile=gpu and not args.no_profile,
        compiled_times=out_dir / "compiled_reference.json" if gpu else None,
        device=device,
    )
    result = run_loop(
        source,
        evaluate,
        coder=args.llm,
        judge=args.judge,
        rounds=args.rounds,
        max_dollars=args.max_dollars,
        max_seconds=args.max_seconds,
        candidates=args.candidates,
        gpu=gpu_facts(),
        transcript=str(transcript),
        name=problem.name,
    )
    summary = result.to_dict()
    (out_dir / f"{problem.name}.result.json").write_text(json.dumps(summary, indent=2, default=str))
    if result.stop_reason in ("waiting", "needs_gpu"):
        return _unfinished(result.stop_reason, result.waiting_for)
    if result.best_source:
        best = out_dir / f"{problem.name}.best.py"
        best.write_text(result.best_source)
        speed = f"{result.speedup:.2f}x" if result.speedup else "-"
        print(f"best kernel: {best} (speedup {speed}); stopped: {result.stop_reason}")
        return EXIT_OK
    print(f"no correct kernel in {result.rounds} rounds; stopped: {result.stop_reason}")
    return EXIT_FAILED


def _unfinished(stop_reason: str, waiting_for: list[str]) -> int:
    """The exit code of a run that stopped before its end, after saying how to go on."""
    if stop_reason == "needs_gpu":
        print(
            "stopped: needs_gpu (the recorded evaluations ran on a GPU and this machine has none; "
            "run the same command on a GPU machine to evaluate the new candidates)",
            file=sys.stderr,
        )
        return EXIT_MISSING
    print(
        f"stopped: waiting for {len(waiting_for)} repl{'y' if len(waiting_for) == 1 else 'ies'}; "
        "write each NAME.reply.md beside its NAME.prompt.md below, then run the same command "
        "again (it continues from the transcript)",
        file=sys.stderr,
    )
    for prompt_file in waiting_for:
        print(prompt_file)
    return EXIT_WAITING


def cmd_bench(args) -> int:
    from .bench import (
        compiled_times_path,
        dev_set_problems,
        dir_problems,
        loop_forge,
        run_bench,
        transcripts_dir_path,
    )

    levels = args.level or None
    ids = args.ids or None
    if args.dev_set:
        problems = dev_set_problems(levels, ids)
    elif args.dir:
        problems = dir_problems(args.dir, levels, ids)
    else:
        raise ValueError("bench needs a problem folder or --dev-set")
    pool = None
    if args.ray:
        from ..harness.ray_pool import RayPool

        pool = RayPool(args.ray)
    gpu = has_gpu() if pool is None else any(d.startswith("cuda") for d in pool.devices)
    shrink = args.shrink or (not gpu and not args.full_size)

    forge = loop_forge(
        _source_evaluator(
            args,
            pool=pool,
            profile=gpu and not args.no_profile,
            compiled_times=compiled_times_path(args.results) if gpu else None,
        ),
        coder=args.llm,
        judge=args.judge,
        rounds=args.rounds,
        max_dollars=args.max_dollars,
        gpu=args.target_gpu or gpu_facts(),
        transcripts_dir=transcripts_dir_path(args.results),
    )
    if shrink:
        inner = forge

        def forge(bench_problem):  # the CPU path: the same problem at a size that fits
            small = bench_problem.to_problem().shrink(CPU_MAX_BYTES)
            return inner(dataclasses.replace(bench_problem, source=small.source))

    try:
        outcome = run_bench(
            problems,
            forge,
            args.results,
            jobs=args.jobs,
            retry_errors=args.retry_errors,
            meta={
                "coder": args.llm,
                "judge": args.judge or args.llm,
                "rounds": args.rounds,
                "shrunk": shrink,
                "profile": gpu and not args.no_profile,
            },
        )
    finally:
        if pool is not None:
            pool.close()
    print(
        f"results: {outcome.results} ({len(outcome.records)} run, {len(outcome.skipped)} "
        "already done)"
    )
    waiting = [path for r in outcome.records for path in r.waiting_for]
    if any(r.stop_reason == "waiting" for r in outcome.records):
        return _unfinished("waiting", waiting)
    if any(r.stop_reason == "needs_gpu" for r in outcome.records):
        return _unfinished("needs_gpu", [])
    errors = sum(1 for r in outcome.records if r.status == "error")
    return EXIT_FAILED if errors else EXIT_OK


def cmd_report(args) -> int:
    from ..reporting.summary import report

    summary = report(*args.results)
    if args.json:
        print(summary.to_json())
    else:
        print(summary.to_markdown())
    if args.html:
        Path(args.html).write_text(summary.to_html())
        print(f"wrote {args.html}", file=sys.stderr)
    return EXIT_OK


def cmd_optimize(args) -> int:
    import runpy

    from ..model.optimize import optimize

    script = runpy.run_path(args.script)
    for needed in ("get_model", "get_inputs"):
        if needed not in script:
            raise ValueError(f"{args.script} must define {needed}()")
    model, inputs = script["get_model"](), script["get_inputs"]()
    result = optimize(
        model,
        inputs,
        llm=args.llm,
        judge=args.judge,
        rounds=args.rounds,
        training=args.training,
        for_compile=args.for_compile,
        site_graphs={"off": False, "on": True, "auto": "auto"}[args.site_graphs],
        profile=not args.no_profile,
        transcripts=args.transcripts,
        store=args.store,
        **({"targets": args.targets} if args.targets else {}),
        **({"min_share": args.min_share} if args.min_share is not None else {}),
    )
    print(result.report())
    if result.waiting_for:
        return _unfinished("waiting", result.waiting_for)
    return EXIT_OK


def cmd_demo(args) -> int:
    from .demo import run_demo

    return run_demo(out_dir=args.out, llm=args.llm, run_command=main, runs_dir=args.runs)


# ---------------------------------------------------------------- the parser


def _add_eval_options(p) -> None:
    p.add_argument("problem", help="a problem .py file, or a dev-set id like L1/19")
    p.add_argument("candidate", help="a .py file defining ModelNew")
    _add_run_options(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def _add_run_options(p) -> None:
    p.add_argument("--sizes", help="override size constants: NAME=INT[,NAME=INT...]")
    p.add_argument(
        "--shrink",
        action="store_true",
        default=None,
        help="shrink the problem's sizes to fit a CPU run (automatic without a GPU)",
    )
    p.add_argument("--trials", type=int, default=5, help="correctness trials (default 5)")
    p.add_argument("--timed-runs", type=int, default=100,
                   help="timed runs per side of the fixed rule, the CPU's (default 100); on a GPU "
                   "the runs adapt to a 1%% interval of the median")  # fmt: skip
    p.add_argument("--timeout", type=float, default=60.0, help="per evaluation, s (default 60)")


def _add_llm_options(p) -> None:
    p.add_argument(
        "--llm",
        default=os.environ.get("CUDAFORGE_LLM", "openai:o3"),
        help="the Coder: openai:MODEL, anthropic:MODEL, openai:MODEL@URL, "
        "replay:TRANSCRIPT, file:DIR (prompts and replies as files; file:DIR?wait=0 does not "
        "wait for a reply) (default $CUDAFORGE_LLM or openai:o3)",
    )
    p.add_argument("--judge", help="the Judge's model, as --llm (default: the Coder's)")
    p.add_argument("--rounds", type=int, default=10, help="rounds per problem (default 10)")
    p.add_argument("--max-dollars", type=float, help="stop a problem past this cost")


def _add_profile_option(p) -> None:
    p.add_argument(
        "--no-profile",
        action="store_true",
        help="the Judge gets timing only: no hardware metrics (on a GPU every correct candidate "
        "is profiled by default)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cudaforge",
        description=__doc__.splitlines()[0],
        epilog=" ".join(__doc__.split("\n\n")[1].split("\n")[:-1]),
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("doctor", help="what this machine offers: driver, CUDA, NVRTC, CUPTI, GPUs")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=cmd_doctor)

    p = sub.add_parser("eval", help="evaluate one candidate against its problem")
    _add_eval_options(p)
    p.add_argument("--compile", action="store_true", help="also time torch.compile's reference")
    p.set_defaults(run=cmd_eval)

    p = sub.add_parser("profile", help="the hardware metrics the Judge would see")
    _add_eval_options(p)
    p.add_argument("--budget", type=int, default=4000, help="characters of feedback text")
    p.set_defaults(run=cmd_profile)

    p = sub.add_parser(
        "forge",
        help="the Coder/Judge loop on one problem; run it again with the same --out to resume",
    )
    p.add_argument("problem", help="a problem .py file, or a dev-set id like L1/19")
    _add_run_options(p)
    _add_llm_options(p)
    p.add_argument("--max-seconds", type=float, help="stop past this wall time")
    p.add_argument("--candidates", type=int, default=1, help="parallel candidates per round")
    _add_profile_option(p)
    p.add_argument("--out", default="cudaforge-out", help="folder for the best kernel and log")
    p.set_defaults(run=cmd_forge)

    p = sub.add_parser("bench", help="forge many problems; results appended as JSONL, resumable")
    p.add_argument("dir", nargs="?", help="a folder of problem .py files")
    p.add_argument("--dev-set", action="store_true", help="the KernelBench dev set")
    p.add_argument("--level", type=int, action="append", help="level(s) to run")
    p.add_argument("--ids", type=int, nargs="+", help="problem ids to run")
    p.add_argument("--results", default="bench-results.jsonl", help="the JSONL results file")
    p.add_argument(
        "--target-gpu",
        help="the GPU that evaluates the candidates, as the agents' prompts describe it (default: "
        "this machine's); for prompts rendered on another machine",
    )
    p.add_argument(
        "--full-size",
        action="store_true",
        help="keep the problems' sizes without a GPU: render the agents' prompts here for a run "
        "whose candidates are evaluated on a GPU machine (use with a file: model and wait=0)",
    )
    p.add_argument("--jobs", type=int, default=1, help="problems at once")
    p.add_argument("--retry-errors", action="store_true", help="rerun problems that errored")
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="evaluate on the Ray cluster at ADDRESS ('auto', HOST:PORT, ray://...; "
        "'local' starts one here); needs pip install cudaforge[ray]",
    )
    _add_run_options(p)
    _add_llm_options(p)
    _add_profile_option(p)
    p.set_defaults(run=cmd_bench)

    p = sub.add_parser("report", help="summarize bench results in the paper's terms")
    p.add_argument("results", nargs="+", help="JSONL results file(s)")
    p.add_argument("--html", help="also write an HTML page with plots here")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(run=cmd_report)

    p = sub.add_parser("optimize", help="optimize the model of a script (get_model, get_inputs)")
    p.add_argument("script", help="a .py file defining get_model() and get_inputs()")
    _add_llm_options(p)
    p.add_argument("--training", action="store_true", help="keep autograd right")
    p.add_argument(
        "--for-compile", action="store_true",
        help="hot spots as torch.compile runs the model (Hugging Face attention masks built as "
        "under compile), for torch.compile of the result",
    )  # fmt: skip
    p.add_argument(
        "--site-graphs", choices=("off", "on", "auto"), default="off",
        help="replay the swapped sites' inference calls from CUDA graphs (auto: only where the "
        "model is faster with them)",
    )  # fmt: skip
    p.add_argument(
        "--transcripts", metavar="DIR",
        help="one agents transcript per hot spot here; running again with it resumes them",
    )  # fmt: skip
    p.add_argument("--store", metavar="FILE", help="the kernel store (default: the cache dir's)")
    p.add_argument(
        "--targets", nargs="+", metavar="TARGET",
        help="only these hot spots: module paths, class names, kinds (module, chain, block, "
        "layer) or label text",
    )  # fmt: skip
    p.add_argument("--min-share", type=float, help="smallest share of the forward (default 0.02)")
    _add_profile_option(p)
    p.set_defaults(run=cmd_optimize)

    p = sub.add_parser(
        "demo",
        help="the main job: the agents' recorded runs (proven live on a GPU), or the "
        "shipped kernels",
    )
    p.add_argument("--out", default="cudaforge-demo", help="folder for the report")
    p.add_argument("--runs", help="folder of recorded agent runs (default benchmarks/runs/)")
    p.add_argument(
        "--llm",
        default=os.environ.get("CUDAFORGE_LLM"),
        help="also forge one problem with this model (default $CUDAFORGE_LLM)",
    )
    p.set_defaults(run=cmd_demo)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("cudaforge: interrupted; finished work is kept", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        if args.debug:
            raise
        from ..errors import ExtraNotInstalled, LibraryNotFound, NeedsKeyError, NoGPUError

        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"cudaforge: error: {type(exc).__name__}: {first}", file=sys.stderr)
        if isinstance(exc, (NoGPUError, LibraryNotFound, NeedsKeyError, ExtraNotInstalled)):
            return EXIT_MISSING
        if isinstance(exc, (ValueError, FileNotFoundError, TypeError, KeyError)):
            return EXIT_USAGE
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
