"""cudaforge/swap.py on the CPU, with torch-only stand-in candidates (written here by hand, not
kernels): swap, guards and fallback, restore, autograd through the custom op (gradcheck, a
training step), opcheck, torch.compile and export, shadow checks catching a drifting candidate."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from test_hotspots import MLP, Block, build
from torch import nn

from cudaforge.errors import VerificationError
from cudaforge.model.hotspots import find_hotspots
from cudaforge.model.swap import (
    DriftWarning,
    FallbackWarning,
    SwapError,
    restore,
    stats,
    swap_in,
    swaps,
)

# Stand-in for a kernel: Linear+GELU computed with other torch ops than the reference's.
LINEAR_GELU = """
import torch
import torch.nn as nn

class ModelNew(nn.Module):  # torch-only stand-in candidate (test fixture)
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 256, bias=True)
        self.act = nn.GELU()

    def forward(self, x):
        y = torch.addmm(self.fc1.bias, x.reshape(-1, x.shape[-1]), self.fc1.weight.t())
        return (0.5 * y * (1.0 + torch.erf(y / 2 ** 0.5))).reshape(*x.shape[:-1], -1)
"""

# Correct for three calls, then off by 0.5: what shadow checking must catch.
DRIFTING = """
import torch
import torch.nn as nn

class ModelNew(nn.Module):  # torch-only stand-in candidate that drifts (test fixture)
    def __init__(self, in_features, out_features, bias):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=bias)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        out = torch.nn.functional.linear(x, self.linear.weight, self.linear.bias)
        return out + 0.5 if self.calls > 3 else out
"""

WRONG = LINEAR_GELU.replace("torch.erf(y / 2 ** 0.5)", "torch.tanh(y)")
MISSING_WEIGHTS = LINEAR_GELU.replace("self.fc1 = nn.Linear", "self.fc9 = nn.Linear")


def same_as_reference(hotspot):
    """The problem's own Model, renamed: a candidate that is exactly the original."""
    return hotspot.problem_source.replace("class Model(", "class ModelNew(")


@pytest.fixture()
def mlp():
    model, x = build(MLP, 8, 64)
    search = find_hotspots(model, (x,), min_share=0.0)
    chain = next(h for h in search if h.label == "Linear -> GELU")
    linear = next(h for h in search if h.label == "Linear")
    return model, x, chain, linear


def test_swap_runs_the_candidate_and_matches(mlp):
    model, x, chain, _ = mlp
    expected = model(x)
    swap = swap_in(chain.sites[0], LINEAR_GELU, chain.problem_source, name="fc1+gelu")
    assert "forward" in model.__dict__  # the model's own forward, patched on the instance
    assert swap.check.trials == 3 and swap.check.original_ms > 0 and swap.check.kernel_ms > 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(model(x), expected)
    assert stats(model)["fc1+gelu"]["kernel_calls"] == 1
    assert list(model.state_dict()) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert swap.candidate.fc1.weight is model.fc1.weight  # the live parameters, not copies


def test_guard_falls_back_and_warns_once(mlp):
    model, _, chain, linear = mlp
    swap_in(chain.sites[0], LINEAR_GELU, chain.problem_source, name="chain")
    swap_in(linear.sites[0], same_as_reference(linear), linear.problem_source, name="fc2")
    other = torch.randn(3, 64)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        outs = [model(other) for _ in range(3)]
    messages = [str(w.message) for w in record]
    assert len(messages) == 2, messages  # once per hot spot, not once per call
    assert "chain: its module was called differently (x is torch.float32[3, 64])" in messages[0]
    assert "fc2: input 0 is shape (3, 256) (verified: (8, 256))" in messages[1]
    restore(model)
    for out in outs:
        torch.testing.assert_close(out, model(other))
    assert "forward" not in model.__dict__


def test_guard_checks_layout_shape_and_dtype():
    model, x = build(MLP, 8, 64)
    search = find_hotspots(model, (x,), min_share=0.0, targets=["Linear"])
    linear = next(h for h in search if h.label == "Linear")
    swap = swap_in(linear.sites[0], same_as_reference(linear), linear.problem_source)
    fc = linear.sites[0].module
    for bad, why in ((torch.randn(256, 8).t(), "non-contiguous"), (torch.randn(9, 256), "shape")):
        swap.warned = False
        with pytest.warns(FallbackWarning, match=why):
            out = fc(bad)
        torch.testing.assert_close(out, torch.nn.functional.linear(bad, fc.weight, fc.bias))
    assert swap.stats.fallbacks == 2 and swap.stats.kernel_calls == 0
    inputs, reason = swap._match((linear.inputs()[0].double(),), {})
    assert inputs is None and "dtype torch.float64" in reason
    model.double()  # parameters and inputs change dtype together: the original runs
    swap.warned = False
    with pytest.warns(FallbackWarning, match="float64"):
        out = model(x.double())
    assert out.dtype == torch.float64
    _, reason = swap._tensors()
    assert "dtype torch.float64" in reason


def test_restore_undoes_every_swap():
    model, x = build(Block, 2, 16, 64)
    expected = model(x)
    search = find_hotspots(model, (x,), min_share=0.0)
    for hotspot in search:
        for site in hotspot.sites:
            swap_in(site, same_as_reference(hotspot), hotspot.problem_source)
    assert len(swaps(model)) == sum(len(h.sites) for h in search)
    torch.testing.assert_close(model(x), expected)
    assert restore(model) is model
    assert swaps(model) == [] and not any("forward" in m.__dict__ for m in model.modules())
    torch.testing.assert_close(model(x), expected)


def test_chain_falls_back_when_the_mode_changes():
    model, x = build(Block, 2, 16, 64)
    search = find_hotspots(model, (x,), min_share=0.0, targets=["softmax"])
    attention = search[0]
    swap_in(attention.sites[0], same_as_reference(attention), attention.problem_source)
    model.train()  # its dropout is active now: not what was verified
    with pytest.warns(FallbackWarning, match="training"):
        model(x)
    model.eval()
    calls = swaps(model)[0].stats.kernel_calls
    model(x)
    assert swaps(model)[0].stats.kernel_calls == calls + 1


def test_autograd_through_the_swapped_op_gradcheck():
    torch.manual_seed(0)
    model = MLP(dim=6, hidden=5).double()
    x = torch.randn(3, 6, dtype=torch.double)
    chain = find_hotspots(model, (x,), min_share=0.0, targets=["chain"])[0]
    source = LINEAR_GELU.replace("64, 256", "6, 5").replace(
        "nn.Linear(6, 5, bias=True)", "nn.Linear(6, 5, bias=True).double()"
    )
    swap = swap_in(chain.sites[0], source, chain.problem_source, training=True)
    assert swap.check.gradient_checked and swap.check.gradient_max_abs_err < 1e-10
    params = list(model.parameters())

    def f(x, *weights):
        swapped = dict(zip(["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"], weights))
        return torch.func.functional_call(model, swapped, (x,))

    inputs = (x.clone().requires_grad_(), *[p.detach().clone().requires_grad_() for p in params])
    # a swap made for training without a backward kernel runs the original where autograd
    # records; the op's recompute path is what a swap made for inference (or torch.compile) runs
    swap.original_under_grad = False
    assert torch.autograd.gradcheck(f, inputs)
    assert swap.stats.kernel_calls > 0  # the op ran, not the fallback


def test_training_step_gradients_match(mlp):
    model, x, chain, _ = mlp
    reference = copy.deepcopy(model)
    swap = swap_in(chain.sites[0], LINEAR_GELU, chain.problem_source, training=True)
    assert swap.check.gradient_checked
    for m in (model, reference):
        loss = m(x.clone().requires_grad_()).pow(2).sum()
        loss.backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    # no backward kernel: a recompute would cost the kernel's forward on top of eager's, so the
    # call autograd recorded ran the original; without autograd the kernel runs
    assert swap.stats.kernel_calls == 0 and swap.stats.grad_originals == 1
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x))
    assert swap.stats.kernel_calls == 1 and swap.stats.fallbacks == 0


def test_backward_kernel_is_checked_and_used():
    model, x = build(MLP, 8, 64)
    chain = find_hotspots(model, (x,), min_share=0.0, targets=["chain"])[0]
    with_backward = (
        LINEAR_GELU
        + """
    def backward(self, grad_outputs, inputs):  # stand-in backward: autograd on its own math
        (x,) = inputs
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            w = self.fc1.weight.detach().requires_grad_()
            b = self.fc1.bias.detach().requires_grad_()
            y = torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b))
            gx, gw, gb = torch.autograd.grad(y, (x, w, b), grad_outputs[0])
        return [gx], {"fc1.weight": gw, "fc1.bias": gb}
"""
    )
    swap = swap_in(chain.sites[0], with_backward, chain.problem_source, training=True)
    assert swap.check.backward_kernel and swap.use_backward_kernel
    broken = with_backward.replace("return [gx]", "return [gx * 2]")
    restore(model)
    swap = swap_in(chain.sites[0], broken, chain.problem_source, training=True)
    assert not swap.use_backward_kernel and "gradient 0" in swap.check.backward_kernel_refused


def test_opcheck(mlp):
    _, _, chain, linear = mlp
    swap = swap_in(chain.sites[0], LINEAR_GELU, chain.problem_source)
    inputs = [t.clone() for t in chain.inputs()]
    result = torch.library.opcheck(
        torch.ops.cudaforge.hotspot.default, (swap.handle, inputs, list(swap.site.tensors))
    )
    assert set(result.values()) == {"SUCCESS"}, result
    other = swap_in(linear.sites[0], same_as_reference(linear), linear.problem_source)
    result = torch.library.opcheck(
        torch.ops.cudaforge.hotspot.default,
        (other.handle, [t.clone() for t in linear.inputs()], list(other.site.tensors)),
    )
    assert set(result.values()) == {"SUCCESS"}, result


def block_with_every_hotspot_swapped():
    """A Block with each hot spot's every site swapped for its own reference code, its input
    and its output before the swaps."""
    model, x = build(Block, 2, 16, 64)
    expected = model(x)
    for hotspot in find_hotspots(model, (x,), min_share=0.0):
        for site in hotspot.sites:
            swap_in(site, same_as_reference(hotspot), hotspot.problem_source)
    return model, x, expected


def test_torch_compile_and_export():
    model, x, expected = block_with_every_hotspot_swapped()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), expected)
    exported = torch.export.export(model, (x,))
    ops = [str(n.target) for n in exported.graph.nodes if n.op == "call_function"]
    assert ops.count("cudaforge.hotspot.default") == len(swaps(model))
    torch.testing.assert_close(exported.module()(x), expected)


def test_shadow_check_switches_off_a_drifting_kernel(mlp):
    model, x, _, linear = mlp
    expected = model(x)
    swap = swap_in(
        linear.sites[0], DRIFTING, linear.problem_source, verify_every=1, name="drifting", trials=1
    )
    swap.candidate.calls = 0  # forget the calls of the swap-time checks and timing
    for _ in range(3):
        torch.testing.assert_close(model(x), expected)
    with pytest.warns(DriftWarning, match="drifted"):
        out = model(x)
    torch.testing.assert_close(out, expected)  # the call that caught it returns the original's
    assert not swap.enabled and "shadow check" in swap.off_reason
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        torch.testing.assert_close(model(x), expected)
    assert [w.category for w in record] == [FallbackWarning]
    assert stats(model)["drifting"]["shadow_checks"] == 4  # three passed, the fourth caught it


def test_wrong_or_incompatible_candidates_are_refused(mlp):
    model, _, chain, _ = mlp
    with pytest.raises(VerificationError, match="trial 0: output 0"):
        swap_in(chain.sites[0], WRONG, chain.problem_source)
    with pytest.raises(SwapError, match="no submodule 'fc1'"):
        swap_in(chain.sites[0], MISSING_WEIGHTS, chain.problem_source)
    with pytest.raises(SwapError, match="does not load"):
        swap_in(chain.sites[0], "this is not python", chain.problem_source)
    assert swaps(model) == [] and "forward" not in model.__dict__


def test_swapping_twice_is_refused_and_deepcopy_works(mlp):
    model, x, _, linear = mlp
    site = linear.sites[0]
    swap_in(site, same_as_reference(linear), linear.problem_source)
    with pytest.raises(SwapError, match="already swapped"):
        swap_in(site, same_as_reference(linear), linear.problem_source)
    twin = copy.deepcopy(model)
    torch.testing.assert_close(twin(x), model(x))
    (copied,) = swaps(twin)
    assert copied.handle != swaps(model)[0].handle
    assert copied.candidate.linear.weight is twin.fc2.weight
    assert isinstance(copied.site.module, nn.Linear) and copied.site.module is twin.fc2


def ops_under_compile(model, *args, **kwargs):
    """The call_function targets torch.compile's graph of model(*args, **kwargs) holds, and its
    output."""
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    try:
        out = torch.compile(model, backend=backend)(*args, **kwargs)
    finally:
        torch._dynamo.reset()
    return seen, out


def test_a_kernel_that_loses_to_compile_steps_aside_under_compile_only():
    from cudaforge.model.under_compile import choose_under_compile

    model, x, expected = block_with_every_hotspot_swapped()
    installed = swaps(model)
    for swap in installed:
        swap.site.release()  # as optimize() leaves them: no captured inputs
    said = []
    choices = choose_under_compile(model, backend="aot_eager", say=said.append)
    # one choice per hot spot: the two LayerNorms are one problem with one kernel
    assert len(choices) == len(installed) - 1 and len(said) == len(choices)
    assert sum(c.sites for c in choices) == len(installed)
    by_name = {c.name: c for c in choices}
    for swap in installed:
        choice = by_name.get(swap.name) or by_name["ln_1: LayerNorm"]
        assert choice.compiled_ms > 0 and choice.kernel_ms > 0
        assert choice.under_compile == (choice.kernel_ms * 1.02 < choice.compiled_ms)
        assert swap.under_compile == choice.under_compile
    for swap in installed:
        swap.under_compile = False
    ops, out = ops_under_compile(model, x)
    assert "cudaforge.hotspot" not in " ".join(ops) and ops  # the originals, traced
    torch.testing.assert_close(out, expected)
    before = stats(model)
    torch.testing.assert_close(model(x), expected)  # eager calls still take the kernels
    assert sum(v["kernel_calls"] for v in stats(model).values()) > sum(
        v["kernel_calls"] for v in before.values()
    )
    installed[0].under_compile = True
    ops, out = ops_under_compile(model, x)
    assert " ".join(ops).count("cudaforge.hotspot") == 1
    torch.testing.assert_close(out, expected)


def test_a_channels_last_output_keeps_its_layout():
    """The swapped op's outputs are laid out as the original's: a channels_last conv chain's
    output stays channels_last (forcing it contiguous copied it and slowed every layer after
    it), eagerly and under torch.compile (the fake outputs agree)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU()).eval()
    model = model.to(memory_format=torch.channels_last)
    x = torch.randn(2, 8, 12, 12).to(memory_format=torch.channels_last)
    expected = model(x)
    assert expected.is_contiguous(memory_format=torch.channels_last)
    search = find_hotspots(model, (x,), min_share=0.0)
    chain = next(h for h in search if "Conv2d" in h.label and "ReLU" in h.label)
    swap = swap_in(chain.sites[0], same_as_reference(chain), chain.problem_source)
    out = model(x)
    assert swap.stats.kernel_calls > 0
    assert out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous()
    torch.testing.assert_close(out, expected)
    ops, compiled_out = ops_under_compile(model, x)
    assert "cudaforge.hotspot" in " ".join(ops)
    torch.testing.assert_close(compiled_out, expected)
    assert compiled_out.stride() == expected.stride()


def test_kernels_kept_under_compile_are_checked_on_the_whole_compiled_model(monkeypatch):
    """Each kernel beats compile on its hot spot, but the compiled model is slower with them
    (host time per call): the kernels that gain least step aside until it is faster, and the
    one that gains most stays. Times are scripted (test fixture); the compiles are real."""
    from cudaforge.model import under_compile

    model, x, _ = block_with_every_hotspot_swapped()
    installed = swaps(model)
    for swap in installed:
        swap.site.release()
    per_hot_spot = iter(range(1000))

    def scripted_time(fn, device, queued=False, **_):
        if queued:  # a hot spot: compiled original 2 + i ms, then its kernel 1 ms
            i = next(per_hot_spot)
            return 1.0 if i % 2 else 2.0 + i
        kept = [s for s in installed if s.under_compile]
        best = installed_best[0]
        return 10.0 + 1.0 * len(kept) - (3.5 if best.under_compile else 0.0)

    installed_best = []
    monkeypatch.setattr(under_compile, "time_call", scripted_time)
    said = []
    original_choose = under_compile._choose

    def choose(swap, margin, backend):
        choice = original_choose(swap, margin, backend)
        installed_best[:] = [swap]  # the last hot spot timed gains most (2 + i grows)
        return choice

    monkeypatch.setattr(under_compile, "_choose", choose)
    choices = under_compile.choose_under_compile(model, (x,), backend="aot_eager",
                                                 say=said.append)  # fmt: skip
    assert len(choices) >= 4
    kept = [c for c in choices if c.under_compile]
    gains = {c.name: under_compile._gain_ms(c) for c in choices}
    # 10 + kept - 3.5 must be under 10 / 1.02: three kernels at most, the best among them
    assert 1 <= len(kept) <= 3 and installed_best[0].under_compile
    assert min(gains[c.name] for c in kept) >= max(
        gains[c.name] for c in choices if not c.under_compile
    )
    aside = [c for c in choices if not c.under_compile]
    assert all("the compiled model took" in c.reason for c in aside)
    assert sum("steps aside under torch.compile (the compiled model" in m for m in said) == len(
        aside
    )
    for choice in choices:  # every site of a hot spot follows its choice
        for swap in installed:
            if swap.name == choice.name:
                assert swap.under_compile == choice.under_compile


def test_the_prompts_say_how_the_model_keeps_an_output():
    """layout_notes: a channels_last chain's output is named with its strides and an allocation
    that has exactly them (a kernel that writes there is not copied after each call); a
    contiguous output needs no note."""
    import ast
    import re

    from cudaforge.model.swapped_hotspot import layout_notes

    model = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU()).eval()
    model = model.to(memory_format=torch.channels_last)
    x = torch.randn(2, 8, 12, 12).to(memory_format=torch.channels_last)
    chain = next(h for h in find_hotspots(model, (x,), min_share=0.0) if "ReLU" in h.label)
    note = layout_notes(chain.sites[0])
    assert note.startswith(
        "- Output 0, float32[2, 16, 12, 12], is kept with strides (2304, 1, 192, 16)"
    )
    memory, back = re.search(
        r"torch\.empty\((\([\d, ]+\)), \.\.\.\)\.permute(\([\d, ]+\))", note
    ).groups()
    made = torch.empty(ast.literal_eval(memory)).permute(*ast.literal_eval(back))
    assert made.shape == model(x).shape and made.stride() == model(x).stride()
    mlp, y = build(MLP, 8, 64)
    flat = next(h for h in find_hotspots(mlp, (y,), min_share=0.0))
    assert flat.sites[0].output_specs and layout_notes(flat.sites[0]) == ""
