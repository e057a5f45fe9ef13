"""The model as torch.compile runs it, for a search, checks and timings done eagerly.

Hugging Face transformers leaves a causal attention mask out in eager mode when it can: no
padding, as many queries as keys, so SDPA runs with `is_causal=True`. While torch.compile
traces the model it does not (transformers' `masking_utils._ignore_causal_mask_sdpa`: with
torch before 2.14 the skip is never taken while compiling), so the compiled graph hands every
attention call a materialized boolean mask. That is another call, with other kernels: on the
H200, GPT-2's attention under torch.compile took 1.35 ms per forward in cuDNN's attention with
a mask, against eager's 0.55 ms with `is_causal` (benchmarks/RESULTS.md, 2026-12-04). Hot spots
found eagerly never see it.

`compiled_view()` makes transformers build its masks as under torch.compile while cudaforge
searches, extracts, verifies and times the model eagerly, so that the hot spots and the swapped
sites are the calls torch.compile's graph makes. `optimize(..., for_compile=True)` runs inside
it. Afterwards, eager calls (no mask) do not match those sites and run the original code,
without a warning (`SwappedHotspot.compile_only`); under torch.compile they match and run the
kernel.
"""

from __future__ import annotations

import contextlib
import threading

# What transformers' masking_utils reads while torch.compile traces (torch < 2.14): "no mask
# needed" is never decided (the bidirectional decision exists in newer versions), and every
# tensor is a traced one, which also picks how the mask is built (transformers 5.17 and 5.25:
# a dense mask, where eager's construction leaves an expanded view).
_CHANGES = {
    "_ignore_causal_mask_sdpa": lambda *args, **kwargs: False,
    "_ignore_bidirectional_mask_sdpa": lambda *args, **kwargs: False,
    "is_tracing": lambda *args, **kwargs: True,
}
_lock = threading.Lock()
_depth = 0
_saved: dict[str, object] = {}


def _masking_utils():
    try:
        from transformers import masking_utils
    except ImportError:  # no transformers (or one too old for masking_utils): nothing to change
        return None
    return masking_utils


@contextlib.contextmanager
def compiled_view():
    """Inside: transformers materializes attention masks as it does under torch.compile. Yields
    the names of the decisions it changed (empty: transformers is not installed or decides
    elsewhere, and the model runs as usual)."""
    global _depth
    module = _masking_utils()
    names = [n for n in _CHANGES if module is not None and callable(getattr(module, n, None))]
    with _lock:
        if _depth == 0:
            for name in names:
                _saved[name] = getattr(module, name)
                setattr(module, name, _CHANGES[name])
        _depth += 1
    try:
        yield names
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                for name, original in _saved.items():
                    setattr(module, name, original)
                _saved.clear()


def in_compiled_view() -> bool:
    """True inside compiled_view()."""
    return _depth > 0


__all__ = ["compiled_view", "in_compiled_view"]
