"""Seeing what a candidate runs: hooks on cudaforge.compile and torch's load_inline/load that
record the CUDA sources and modules it compiles while it loads, and the CUPTI tracer that records
the kernels of the traced runs (without the harness stream's own work)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from .evaluation import one_line
from .guards import kernel_names_in


class _CompileHooks:
    """Wraps cudaforge.compile and torch's load_inline/load while a candidate loads, to see the
    CUDA sources and modules it compiles."""

    def __init__(self):
        self.sources: list[str] = []
        self.compiled_modules: list = []
        self.restore: list[tuple[object, str, object]] = []

    def install(self) -> None:
        targets = []
        with contextlib.suppress(ImportError):
            import cudaforge
            import cudaforge.cuda.kernel

            targets += [(cudaforge, "compile"), (cudaforge.cuda.kernel, "compile")]
        with contextlib.suppress(ImportError):
            import torch.utils.cpp_extension as ext

            targets += [(ext, "load_inline"), (ext, "load")]
        wrapped: dict[int, Callable] = {}
        for owner, name in targets:
            original = getattr(owner, name, None)
            if original is None:
                continue
            if id(original) not in wrapped:
                wrapped[id(original)] = self._wrap(original, name)
            self.restore.append((owner, name, original))
            setattr(owner, name, wrapped[id(original)])

    def _wrap(self, original: Callable, kind: str) -> Callable:
        hooks = self

        def wrapper(*args, **kwargs):
            if kind == "compile":
                source = args[0] if args else kwargs.get("source", "")
                hooks.sources.append(str(source))
                module = original(*args, **kwargs)
                hooks.compiled_modules.append(module)
                return module
            if kind == "load_inline":
                for key in ("cuda_sources", "cpp_sources"):
                    value = kwargs.get(key)
                    if value is None and key == "cpp_sources" and len(args) > 1:
                        value = args[1]
                    if value is None and key == "cuda_sources" and len(args) > 2:
                        value = args[2]
                    if isinstance(value, str):
                        hooks.sources.append(value)
                    elif value:
                        hooks.sources.extend(str(v) for v in value)
            if kind == "load":
                files = kwargs.get("sources", args[1] if len(args) > 1 else ())
                for path in [files] if isinstance(files, str) else list(files or ()):
                    with contextlib.suppress(OSError), open(path) as f:
                        hooks.sources.append(f.read())
            return original(*args, **kwargs)

        wrapper.__wrapped__ = original
        wrapper.__name__ = getattr(original, "__name__", kind)
        wrapper.__doc__ = getattr(original, "__doc__", None)
        return wrapper

    def kernel_names(self) -> set[str]:
        names: set[str] = set()
        for source in self.sources:
            names |= kernel_names_in(source)
        return names

    def remove(self) -> None:
        for owner, name, original in reversed(self.restore):
            setattr(owner, name, original)
        self.restore = []


# ====================================================================== CUPTI tracing


class _Tracer:
    """CUPTI activity records of one measurement, without the harness stream's kernels."""

    def __init__(self, run):
        self.run = run
        self.active = False
        self.harness_stream_id = None
        self.reason = None
        try:
            from .. import _core
            from ..cuda import libs as _libs

            self.core = _core
            _libs.ensure("cupti")  # loaded on first use, like every CUDA library
        except ImportError as e:
            self.core, self.reason = None, f"the C core is not importable ({e})"
        except _core.LibraryNotFound as e:
            self.reason = f"libcupti could not be loaded ({one_line(e)})"
        if self.core is not None and not hasattr(self.core, "timing_start"):
            self.reason = "this build of the C core has no CUPTI timing"
        if self.reason is None:
            self.calibrate()
        run.result.timing["cupti"] = self.reason or "on"

    def calibrate(self) -> None:
        """Which CUPTI stream id the harness stream has: trace one flush alone."""
        run = self.run
        run.sync()
        if not self._start():
            return
        run.prepare_run([], None, 0)
        run.sync()
        records = self._stop()
        streams = {r.get("stream") for r in records or ()}
        if len(streams) == 1:
            self.harness_stream_id = streams.pop()
        else:
            self.reason = f"could not tell the harness stream in CUPTI's records ({streams})"

    def _start(self) -> bool:
        try:
            self.core.timing_start()
            self.active = True
            return True
        except Exception as e:  # noqa: BLE001 - ProfilerError and friends: keep the reason
            reason = getattr(e, "reason", "") or type(e).__name__
            self.reason = f"CUPTI tracing unavailable ({reason}: {one_line(e)})"
            self.run.result.timing["cupti"] = self.reason
            return False

    def _stop(self) -> list[dict] | None:
        import warnings

        if not self.active:
            return None
        self.active = False
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                records = self.core.timing_stop()
            except Exception as e:  # noqa: BLE001
                self.reason = f"CUPTI tracing failed: {one_line(e)}"
                self.run.result.timing["cupti"] = self.reason
                return None
        for w in caught:
            self.run.result.notes.append(f"CUPTI: {w.message}")
        return records

    def start(self) -> None:
        if self.reason is None:
            self._start()

    def stop(self, who: str) -> list[dict] | None:
        records = self._stop()
        if records is None:
            return None
        ours = [r for r in records if r.get("stream") != self.harness_stream_id]
        self.summarize(ours, who)
        return ours

    def summarize(self, records: list[dict], who: str) -> None:
        r, runs = self.run.result, self.run.opts.traced_runs
        key = "cupti_busy_ms" if who == "candidate" else "reference_cupti_busy_ms"
        if not records:
            r.timing[key] = 0.0
            return
        spans = sorted((rec["start_ns"], rec["end_ns"]) for rec in records)
        busy, cur_start, cur_end = 0, spans[0][0], spans[0][1]
        for s, e in spans[1:]:
            if s > cur_end:
                busy += cur_end - cur_start
                cur_start, cur_end = s, e
            else:
                cur_end = max(cur_end, e)
        busy += cur_end - cur_start
        r.timing[key] = busy / runs / 1e6
        if key == "cupti_busy_ms":
            r.timing["cupti_streams"] = len({rec.get("stream") for rec in records})
            r.timing["cupti_records"] = len(records)
