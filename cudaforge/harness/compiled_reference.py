"""The torch.compile time of a problem's reference, measured once per problem and GPU.

Compiling the reference costs seconds to a minute, so the agents' loop and `cudaforge bench` do
not ask for it on every candidate. `once_per_problem(evaluate, times)` wraps an evaluator: the
first correct candidate of a problem is evaluated with `compare_compile=True`, and the compiled
reference's time is kept in a `CompiledReferenceTimes` file, keyed by the problem hash and the
GPU's name; every later candidate of that problem on that GPU gets the kept time and its
`speedup_vs_compile` without compiling again. A candidate that fails before the timing does not
measure it, so the next one tries. A torch.compile that fails is kept too (as a note), so that it
is not retried on every candidate.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .problem import problem_hash
from .results import EvalResult

FILE_NAME = "compiled_reference.json"
COMPILE_FAILED = "torch.compile of the reference failed"

# evaluate(problem_source, candidate_source, compare_compile) -> EvalResult
EvaluateCompiled = Callable[[str, str, bool], EvalResult]


def gpu_name(device: str) -> str:
    """'NVIDIA H200 (cuda:0)' -> 'NVIDIA H200': the key part of EvalResult.device."""
    name, _, index = device.rpartition(" (")
    return name if name and index.endswith(")") else device


class CompiledReferenceTimes:
    """A JSON file of {problem hash: {GPU name: {"ms": float | None, "note": str, "when": UTC}}};
    thread-safe within a process, written whole after each change (rename into place)."""

    def __init__(self, path: str | os.PathLike | None = None):
        if path is None:
            from ..cuda.kernel import cache_dir

            path = cache_dir() / FILE_NAME
        self.path = Path(path)
        self._lock = threading.Lock()
        self._times: dict[str, dict[str, dict[str, Any]]] = {}
        if self.path.is_file():
            try:
                loaded = json.loads(self.path.read_text("utf-8"))
            except ValueError:
                loaded = {}  # a damaged cache only costs a compile again
            if isinstance(loaded, dict):
                self._times = {k: v for k, v in loaded.items() if isinstance(v, dict)}

    def get(self, problem: str, gpu: str) -> dict[str, Any] | None:
        """What is kept for this problem hash on this GPU, or None."""
        with self._lock:
            entry = self._times.get(problem, {}).get(gpu)
            return dict(entry) if entry is not None else None

    def put(self, problem: str, gpu: str, ms: float | None, note: str = "") -> None:
        """Keep the compiled reference's time (ms; None when torch.compile failed)."""
        entry = {"ms": ms, "note": note, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        with self._lock:
            self._times.setdefault(problem, {})[gpu] = entry
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
            partial.write_text(json.dumps(self._times, indent=1, sort_keys=True), "utf-8")
            os.replace(partial, self.path)


def _fill_in(result: EvalResult, entry: dict[str, Any]) -> None:
    """Give a result measured without the compile the kept compiled-reference time."""
    ms = entry.get("ms")
    if ms is None:
        result.notes.append(f"{entry.get('note') or COMPILE_FAILED} (kept from {entry['when']})")
        return
    result.compiled_reference_ms = ms
    if result.eager_candidate_ms:  # eager on both sides (the speedup may use graph replays)
        result.speedup_vs_compile = ms / result.eager_candidate_ms
    result.timing["compiled_reference"] = f"measured once for this problem, {entry['when']}"


def once_per_problem(
    evaluate: EvaluateCompiled, times: CompiledReferenceTimes, gpu: str = ""
) -> Callable[[str, str], EvalResult]:
    """The agents' evaluate(problem_source, candidate_source) that measures the compiled reference
    only while `times` has nothing for the problem on this GPU (module docstring). gpu: the GPU's
    name as EvalResult.device gives it before ' (cuda:N)'; '' learns it from the first result."""
    known_gpu = [gpu]

    def run(problem_source: str, candidate_source: str) -> EvalResult:
        key = problem_hash(problem_source)
        kept = times.get(key, known_gpu[0]) if known_gpu[0] else None
        result = evaluate(problem_source, candidate_source, kept is None)
        device = gpu_name(result.device) if result.device else known_gpu[0]
        if device and not known_gpu[0]:
            known_gpu[0] = device
        if kept is None:
            kept = times.get(key, device) if device else None
        if result.compiled_reference_ms is not None:
            times.put(key, device, result.compiled_reference_ms)
        elif result.ok and kept is None:
            failed = [n for n in result.notes if n.startswith(COMPILE_FAILED)]
            if failed:
                times.put(key, device, None, failed[0])
        elif result.ok and kept is not None:
            _fill_in(result, kept)
        return result

    return run


__all__ = ["COMPILE_FAILED", "FILE_NAME", "CompiledReferenceTimes", "gpu_name", "once_per_problem"]
