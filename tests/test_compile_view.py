"""optimize(for_compile=True) on a tiny Hugging Face GPT-2 on the CPU: transformers builds its
attention masks as under torch.compile while cudaforge searches and verifies, the attention
hot spot is the masked call that torch.compile's graph makes, and the swapped site runs under
torch.compile and stays out of eager calls, without a warning. Without for_compile the same
site is the eager call (`is_causal`, no mask), which torch.compile's graph never makes. The
candidates are FIXTURE replies: each hot spot's own reference code, renamed."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from test_swap import ops_under_compile

import cudaforge
from cudaforge.agents.providers import ScriptedProvider
from cudaforge.harness.pool import WorkerPool
from cudaforge.model.compile_view import compiled_view, in_compiled_view
from cudaforge.model.swap import swaps

transformers = pytest.importorskip("transformers")
masking_utils = pytest.importorskip("transformers.masking_utils")

FAST_EVAL = {"trials": 1, "timed_runs": 5, "warmup": 1, "input_sets": 1}


def tiny_gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64,
                                     vocab_size=128)  # fmt: skip
    model = transformers.GPT2LMHeadModel(config).eval()
    return model, {"input_ids": torch.randint(0, 128, (2, 32)), "use_cache": False}


def attention_masks(model, call, monkeypatch):
    """The attn_mask of each scaled_dot_product_attention call in one forward."""
    seen = []
    original = F.scaled_dot_product_attention

    def recorded(*args, **kwargs):
        seen.append(kwargs.get("attn_mask"))
        return original(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recorded)
    with torch.no_grad():
        model(**call)
    monkeypatch.setattr(F, "scaled_dot_product_attention", original)
    return seen


def test_the_view_gives_attention_the_mask_torch_compile_gives_it_and_puts_all_back(monkeypatch):
    model, call = tiny_gpt2()
    before = {name: getattr(masking_utils, name, None) for name in ("_ignore_causal_mask_sdpa",
                                                                    "is_tracing")}  # fmt: skip
    assert attention_masks(model, call, monkeypatch) == [None, None]  # eager: is_causal instead
    with compiled_view() as changed:
        assert "_ignore_causal_mask_sdpa" in changed and in_compiled_view()
        with compiled_view():  # nested: one change, undone by the outer one
            pass
        masks = attention_masks(model, call, monkeypatch)
    assert len(masks) == 2 and not in_compiled_view()
    causal = torch.tril(torch.ones(32, 32, dtype=torch.bool)).expand(2, 1, 32, 32)
    for mask in masks:
        assert mask.dtype == torch.bool and mask.is_contiguous()
        assert torch.equal(mask, causal)
    assert attention_masks(model, call, monkeypatch) == [None, None]
    for name, value in before.items():
        assert getattr(masking_utils, name, None) is value


def reference_as_candidate(messages):
    text = messages[-1]["content"]
    if text.startswith("You are the Judge"):
        return "FIXTURE Judge reply: nothing left to gain.\nVERDICT: STOP"
    problem = text.split("```python\n", 1)[1].split("```", 1)[0]
    return "```python\n" + re.sub(r"\bclass Model\(", "class ModelNew(", problem) + "```"


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(1, device="cpu") as workers:
        yield workers


class Recording:
    """A worker pool that records the options of each evaluation."""

    def __init__(self, pool):
        self.pool, self.size, self.options = pool, 1, []

    def evaluate(self, problem_source, candidate_source, **options):
        self.options.append(options)
        return self.pool.evaluate(problem_source, candidate_source, **options)


def optimized(pool, for_compile):
    model, call = tiny_gpt2()
    result = cudaforge.optimize(
        model, call, llm=ScriptedProvider([reference_as_candidate] * 20, model="fixture"),
        pool=pool, store=False, progress=False, rounds=1, min_speedup=0.0, min_share=0.0,
        targets=["scaled_dot_product_attention"], eval_options=FAST_EVAL, tolerance=1e-3,
        for_compile=for_compile,
    )  # fmt: skip
    (hotspot,) = result.hotspots
    assert hotspot.status == "swapped", hotspot.detail
    return model, call, result, hotspot


def test_for_compile_swaps_the_attention_call_that_torch_compile_makes(pool):
    model, call, result, hotspot = optimized(pool, for_compile=True)
    assert "attn_mask = attention_mask" in hotspot.problem_source
    assert "torch.tril(torch.ones((32, 32), dtype=torch.bool))" in hotspot.problem_source
    installed = swaps(result.model)
    assert len(installed) == 2 and all(s.compile_only for s in installed)
    with torch.no_grad():
        expected = model(**call).logits
    calls = [s.stats.kernel_calls for s in installed]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an eager call runs the original, and says nothing
        with torch.no_grad():
            eager = result.model(**call).logits
    torch.testing.assert_close(eager, expected)
    assert [s.stats.kernel_calls for s in installed] == calls
    assert all(s.stats.fallbacks > 0 for s in installed)
    with torch.no_grad():
        ops, compiled = ops_under_compile(result.model, **call)
    assert ops.count("cudaforge.hotspot_infer") == 2, ops  # no gradients: the lean op
    assert [s.stats.op_calls for s in installed] == [1, 1]  # one compiled forward ran each
    assert not any("scaled_dot_product" in op for op in ops)
    torch.testing.assert_close(compiled.logits, expected, atol=1e-4, rtol=1e-4)


def test_without_for_compile_the_site_is_the_eager_call_that_compile_never_makes(pool):
    recording = Recording(pool)
    model, call, result, hotspot = optimized(recording, for_compile=False)
    # SDPA's output is a (B, H, L, D) view of (B, L, H, D) memory: candidates are timed with
    # their output laid out so (harness.layouts), and the prompts say it
    assert recording.options and all(o["output_orders"] == ((0, 2, 1, 3),)
                                     for o in recording.options)  # fmt: skip
    assert "is_causal = True" in hotspot.problem_source and "tril" not in hotspot.problem_source
    assert not any(s.compile_only for s in swaps(result.model))
    with torch.no_grad():
        ops, compiled = ops_under_compile(result.model, **call)
    assert not any(op.startswith("cudaforge.") for op in ops)  # compile's call (a mask) differs
    with torch.no_grad():
        torch.testing.assert_close(compiled.logits, model(**call).logits, atol=1e-4, rtol=1e-4)
