"""A hot spot's backward as a problem of its own (cudaforge.model.backward): the problem's
reference gives autograd's gradients, a worker verifies a backward candidate like any other
(a wrong one fails), what cannot be differentiated is refused with a reason, and BackwardKernel
turns a verified kernel into a swapped candidate's `backward`. CPU; candidates are FIXTURE torch
code standing in for kernels."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import cudaforge
from cudaforge.harness.problem import Problem
from cudaforge.model.backward import (
    BackwardKernel,
    _forward_part,
    backward_problem,
    interface,
)
from cudaforge.model.codegen import NotExtractable, load_problem

FORWARD = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """FIXTURE problem: two floating-point outputs, an integer input and output, a buffer."""

    def __init__(self, features):
        super().__init__()
        self.fc = nn.Linear(features, 2 * features)
        self.scale = nn.Parameter(torch.randn(2 * features))
        self.register_buffer("shift", torch.randn(2 * features))

    def forward(self, x, index):
        h = torch.nn.functional.gelu(self.fc(x)) * self.scale + self.shift
        return h, index + 1, h.sum(-1)


def get_inputs():
    return [torch.randn(4, 16), torch.arange(4)]


def get_init_inputs():
    return [16]
'''

LINEAR = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(32, 24)

    def forward(self, x):
        return self.linear(x)


def get_inputs():
    return [torch.randn(8, 32)]


def get_init_inputs():
    return []
"""

# FIXTURE backward candidate: the Linear's gradients written out by hand
LINEAR_BACKWARD = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(32, 24)

    def forward(self, x, grad_out):
        weight = self.linear.weight
        return grad_out @ weight, grad_out.t() @ x, grad_out.sum(0)
"""


def test_the_backward_problems_reference_gives_autograds_gradients():
    source = backward_problem(FORWARD)
    problem = Problem.from_source(source, name="fixture backward")
    model = problem.make_model("cpu", seed=3)
    x, index, grad_h, grad_sum = problem.make_inputs(seed=5)
    assert index.dtype == torch.int64 and grad_h.shape == (4, 32) and grad_sum.shape == (4,)
    with torch.no_grad():  # as the harness calls it
        got = model(x, index, grad_h, grad_sum)
    # the same weights in a plain forward Model, differentiated here
    forward = load_problem(FORWARD).Model(16)
    forward.load_state_dict(model.state_dict())
    leaf = x.clone().requires_grad_(True)
    h, _, total = forward(leaf, index)
    wanted = [leaf, *forward.parameters()]
    expected = torch.autograd.grad([h, total], wanted, [grad_h, grad_sum])
    assert len(got) == 4  # x, scale, fc.weight, fc.bias; no gradient for the index or the buffer
    for a, e in zip(got, expected):
        torch.testing.assert_close(a, e)
    assert _forward_part(source).strip() == FORWARD.strip()


def test_the_interface_names_what_goes_in_and_out():
    face = interface(FORWARD)
    assert face.inputs == ["x", "index"] and face.input_float == [True, False]
    assert face.outputs == ["grad_out0", "grad_out2"] and face.output_index == [0, 2]
    assert face.params == ["scale", "fc.weight", "fc.bias"]  # named_parameters: own first
    text = backward_problem(FORWARD)
    assert "def forward(self, x, index, grad_out0, grad_out2):" in text
    assert "the gradient of parameter fc.weight, float32[32, 16]" in text


def test_a_worker_passes_a_right_backward_kernel_and_fails_a_wrong_one():
    source = backward_problem(LINEAR)
    options = {"device": "cpu", "trials": 2, "timed_runs": 4, "warmup": 1, "input_sets": 1}
    right = cudaforge.evaluate(source, LINEAR_BACKWARD, **options)
    assert right.ok, (right.status, right.error)
    wrong = cudaforge.evaluate(
        source, LINEAR_BACKWARD.replace("grad_out.sum(0)", "grad_out.mean(0)"), **options
    )
    assert wrong.status == "incorrect" and "output 2" in wrong.error  # the bias gradient


SUPER = LINEAR.replace("super().__init__()", "super(Model, self).__init__()")
ITEM = LINEAR.replace("return self.linear(x)", "return self.linear(x) * float(x.sum().item())")
INTEGERS = (
    LINEAR.replace("self.linear = nn.Linear(32, 24)", "pass")
    .replace("return self.linear(x)", "return x.float().sum()")
    .replace("return [torch.randn(8, 32)]", "return [torch.arange(8)]")
)


@pytest.mark.parametrize(
    "source, reason",
    [
        (SUPER, "names itself"),
        (ITEM, "meta device"),
        (INTEGERS, "no floating-point input or parameter"),
    ],
    ids=["super(Model, self)", "item()", "integers only"],
)
def test_what_cannot_be_differentiated_is_refused_with_the_reason(source, reason):
    assert source != LINEAR
    with pytest.raises(NotExtractable, match=reason):
        backward_problem(source)


def test_a_backward_kernel_answers_as_a_candidates_backward():
    face = interface(FORWARD)
    model = load_problem(backward_problem(FORWARD)).Model(16)
    specs = [torch.empty(4, 32), torch.empty(4, dtype=torch.int64), torch.empty(4)]
    kernel = BackwardKernel(model, face, specs)
    x, index = torch.randn(4, 16), torch.arange(4)
    grad_h = torch.randn(4, 32)
    # the loss did not use the third output: its gradient comes as None and counts as zeros
    input_grads, param_grads = kernel([grad_h, None, None], [x, index])
    assert input_grads[1] is None and input_grads[0].shape == (4, 16)
    assert sorted(param_grads) == ["fc.bias", "fc.weight", "scale"]
    expected = model(x, index, grad_h, torch.zeros(4))
    torch.testing.assert_close(param_grads["scale"], expected[1])
    assert not isinstance(kernel, nn.Module)


# FIXTURE backward candidate of the MLP's Linear -> GELU chain (test_hotspots.MLP): its
# gradients written out with the exact GELU's derivative
CHAIN_BACKWARD = """
import math
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 256, bias=True)

    def forward(self, x, grad_out):
        y = torch.nn.functional.linear(x, self.fc1.weight, self.fc1.bias)
        slope = 0.5 * (1.0 + torch.erf(y / math.sqrt(2.0)))
        slope = slope + y * torch.exp(-0.5 * y * y) / math.sqrt(2.0 * math.pi)
        grad_y = grad_out * slope
        return grad_y @ self.fc1.weight, grad_y.t() @ x, grad_y.sum(0)
"""


def _chain():
    from test_hotspots import MLP, build

    from cudaforge.model.hotspots import find_hotspots

    model, x = build(MLP, 8, 64)
    chain = find_hotspots(model, (x,), min_share=0.0, targets=["chain"])[0]
    return model, x, chain


def test_a_swap_uses_a_backward_kernel_that_passes_the_gradient_check():
    import copy

    from test_swap import LINEAR_GELU

    from cudaforge.model.backward import backward_hotspot
    from cudaforge.model.swap import restore, swap_in

    model, x, chain = _chain()
    reference = copy.deepcopy(model)
    problem = backward_hotspot(chain).problem_source
    swap = swap_in(chain.sites[0], LINEAR_GELU, chain.problem_source, training=True,
                   backward=(CHAIN_BACKWARD, problem))  # fmt: skip
    assert swap.use_backward_kernel and swap.check.backward_kernel, swap.check
    for m in (model, reference):
        m(x.clone().requires_grad_()).pow(2).sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name, rtol=1e-4, atol=1e-5)
    # where the kernel's forward is slower here, its backward kernel still runs after the
    # original forward (the kernel's forward is not called: it would raise), and a call without
    # autograd runs the original alone
    swap.forward_original = True
    swap.candidate.forward = lambda *args: 1 / 0
    calls = swap.stats.kernel_calls
    for m in (model, reference):
        m.zero_grad()
        m(x.clone().requires_grad_()).pow(2).sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name, rtol=1e-4, atol=1e-5)
    assert swap.stats.kernel_calls == calls + 1  # through the op, for its backward
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x))
    assert swap.stats.kernel_calls == calls + 1
    restore(model)
    wrong = CHAIN_BACKWARD.replace("grad_y.sum(0)", "grad_y.sum(0) * 1.1")
    swap = swap_in(chain.sites[0], LINEAR_GELU, chain.problem_source, training=True,
                   backward=(wrong, problem))  # fmt: skip
    assert not swap.use_backward_kernel and "gradient 2" in swap.check.backward_kernel_refused
    restore(model)
    unbuilt = CHAIN_BACKWARD.replace("class ModelNew", "class Other")
    swap = swap_in(chain.sites[0], LINEAR_GELU, chain.problem_source, training=True,
                   backward=(unbuilt, problem))  # fmt: skip
    assert not swap.use_backward_kernel and swap.check.gradient_checked
    assert "does not build" in swap.check.backward_kernel_refused


# FIXTURE backward candidate of test_optimize_cpu.Net's tanh GELU (NewGELU): the derivative
# written out
GELU_BACKWARD = """```python
import torch
import torch.nn as nn


class ModelNew(nn.Module):  # FIXTURE: torch stand-in for a GELU backward kernel
    def __init__(self):
        super().__init__()

    def forward(self, x, grad_out):
        c = 0.7978845608028654
        t = torch.tanh(c * (x + 0.044715 * x**3))
        slope = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * x * x)
        return (grad_out * slope,)
```"""


def _fixture_llm(gelu_backward: str):
    """A FIXTURE LLM: the forward candidates of test_optimize_cpu, `gelu_backward` for the
    GELU's backward problem, a reply that does not compile for the Linear's."""
    from test_optimize_cpu import GELU_FUSED, LINEAR_AS_IS, STOP

    from cudaforge.agents.providers import ScriptedProvider

    def reply(messages):
        text = messages[-1]["content"]
        if text.startswith("You are the Judge"):
            return STOP
        if "class Model(Forward)" in text:
            return gelu_backward if "NewGELU" in text else "FIXTURE: no code here"
        return GELU_FUSED if "NewGELU" in text else LINEAR_AS_IS

    return ScriptedProvider([reply] * 50, model="fixture")


@pytest.fixture(scope="module")
def cpu_pool():
    from cudaforge.harness.pool import WorkerPool

    with WorkerPool(1, device="cpu") as workers:
        yield workers


@pytest.mark.parametrize("right", [True, False], ids=["right backward", "wrong backward"])
def test_optimize_for_training_forges_and_swaps_backward_kernels(right, cpu_pool, tmp_path,
                                                                  monkeypatch):  # fmt: skip
    import copy

    from test_hotspots import build
    from test_optimize_cpu import FAST_EVAL, Net

    from cudaforge.model.swap import swaps

    monkeypatch.setenv("CUDAFORGE_CACHE_DIR", str(tmp_path / "cache"))
    model, x = build(Net, 128, 64)
    backward = (
        GELU_BACKWARD if right else GELU_BACKWARD.replace("0.5 * (1.0 + t)", "0.6 * (1.0 + t)")
    )
    result = cudaforge.optimize(
        model, (x,), llm=_fixture_llm(backward), pool=cpu_pool, store=tmp_path / "k.sqlite3",
        progress=False, eval_options=FAST_EVAL, training=True, min_speedup=0.0, min_share=0.0,
        rounds=1, tolerance=1e-3,
    )  # fmt: skip
    by_name = {h.name: h for h in result.hotspots}
    gelu = next(h for h in result.hotspots if h.kind == "block")
    gelu_backward = by_name[gelu.name + " (backward)"]
    linear_backward = next(h for n, h in by_name.items() if "Linear" in n and "backward" in n)
    assert gelu.status == "swapped" and gelu_backward.kind == "backward"
    assert linear_backward.status == "no_kernel"  # its reply held no code
    (swap,) = [s for s in swaps(result.model) if s.name == gelu.name]
    if right:
        assert gelu_backward.status == "swapped", gelu_backward.detail
        assert gelu_backward.worker_result["status"] == "ok" and gelu_backward.speedup
        assert swap.use_backward_kernel and gelu.checks[0]["backward_kernel"]
        assert "gradients checked (backward kernel)" in result.report()
        # load() with training=True takes both kernels from the store again, no LLM
        fresh = copy.deepcopy(model)
        loaded = cudaforge.load(fresh, (x,), store=tmp_path / "k.sqlite3", pool=cpu_pool,
                                progress=False, eval_options=FAST_EVAL, training=True,
                                min_speedup=0.0, min_share=0.0, tolerance=1e-3)  # fmt: skip
        again = next(h for h in loaded.hotspots if h.name == gelu_backward.name)
        assert again.status == "swapped" and again.origin == "store", again.detail
    else:  # refused by the worker: the swap differentiates by recompute
        assert gelu_backward.status == "no_kernel" and "incorrect" in gelu_backward.detail
        assert not swap.use_backward_kernel
    for m in (result.model, model):
        m.zero_grad()
        m(x).square().sum().backward()
    for p, q in zip(result.model.parameters(), model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4)


def test_a_forward_slower_here_stays_installed_for_its_backward_kernel(cpu_pool, tmp_path,
                                                                      monkeypatch):  # fmt: skip
    """optimize(training=True): a hot spot whose kernel is slower in this process but whose
    backward kernel passed keeps its swap, running the original forward; without a backward
    kernel the swap is taken out."""
    import copy

    from test_hotspots import build
    from test_optimize_cpu import FAST_EVAL, Net

    import cudaforge.model.swap as swap_module
    from cudaforge.model.optimize import _Run
    from cudaforge.model.swap import swaps

    def slower_here(swap, *args, **kwargs):  # the in-process timing: the kernel takes 2x
        swap.check.original_ms, swap.check.kernel_ms = 1.0, 2.0
        return swap.check

    monkeypatch.setenv("CUDAFORGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(swap_module, "measure", slower_here)
    monkeypatch.setattr(_Run, "faster", lambda self, result: result.ok)
    model, x = build(Net, 128, 64)
    for backward, used in ((GELU_BACKWARD, True), ("FIXTURE: no code here", False)):
        result = cudaforge.optimize(
            copy.deepcopy(model), (x,), llm=_fixture_llm(backward), pool=cpu_pool,
            store=tmp_path / f"{used}.sqlite3", progress=False, eval_options=FAST_EVAL,
            training=True, min_share=0.0, rounds=1, tolerance=1e-3,
        )  # fmt: skip
        gelu = next(h for h in result.hotspots if h.kind == "block")
        gelu_backward = next(h for h in result.hotspots if h.name == gelu.name + " (backward)")
        assert gelu.status == "slower_here" and gelu.speedup == 0.5, gelu.detail
        kept = [s for s in swaps(result.model) if s.name == gelu.name]
        assert gelu.forward_original is used and bool(kept) is used, gelu.detail
        if used:
            assert all(s.forward_original and s.use_backward_kernel for s in kept)
            assert gelu_backward.status == "swapped", gelu_backward.detail
            assert "the original forward runs, with the backward kernel" in gelu.detail
        else:
            assert gelu_backward.status == "no_kernel"
        fresh = copy.deepcopy(model)
        for m in (result.model, fresh):
            m.zero_grad()
            m(x).square().sum().backward()
        for p, q in zip(result.model.parameters(), fresh.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4)


def test_a_bf16_gradient_is_judged_against_an_fp32_run_of_the_original():
    """The gradient check judges a bf16 gradient as the worker judges a bf16 output: against
    an fp32 run, within a multiple of the bf16 reference's own error. A backward kernel that
    computes in fp32 passes; one 3 ulps off everywhere (within rtol 0.02 of the bf16 autograd)
    is refused."""
    from test_hotspots import MLP, build
    from test_swap import LINEAR_GELU

    from cudaforge.model.backward import backward_hotspot
    from cudaforge.model.hotspots import find_hotspots
    from cudaforge.model.swap import restore, swap_in

    model, x = build(MLP, 8, 64)
    model, x = model.to(torch.bfloat16), x.to(torch.bfloat16)
    chain = find_hotspots(model, (x,), min_share=0.0, targets=["chain"])[0]
    problem = backward_hotspot(chain).problem_source
    in_fp32 = CHAIN_BACKWARD.replace(
        "        y = torch.nn.functional.linear(x, self.fc1.weight, self.fc1.bias)",
        "        dtype, x, grad_out = x.dtype, x.float(), grad_out.float()\n"
        "        w, b = self.fc1.weight.float(), self.fc1.bias.float()\n"
        "        y = torch.nn.functional.linear(x, w, b)",
    ).replace(
        "        return grad_y @ self.fc1.weight, grad_y.t() @ x, grad_y.sum(0)",
        "        grads = grad_y @ w, grad_y.t() @ x, grad_y.sum(0)\n"
        "        return tuple((g * SCALE).to(dtype) for g in grads)",
    )
    assert in_fp32.count("SCALE") == 1 and "w, b =" in in_fp32
    seen = {}
    for scale in (1.0, 1.0 + 3 / 256):
        source = in_fp32.replace("SCALE", repr(scale))
        swap = swap_in(chain.sites[0], LINEAR_GELU, chain.problem_source, training=True,
                       backward=(source, problem))  # fmt: skip
        seen[scale] = (swap.use_backward_kernel, swap.check.backward_kernel_refused)
        restore(model)
    assert seen[1.0] == (True, ""), seen
    used, why = seen[1.0 + 3 / 256]
    assert not used and "fp32" in why, why


def test_an_eager_call_autograd_records_runs_an_autograd_function_not_the_custom_op(
    monkeypatch,
):
    """The custom op's dispatch cost host time that paced a training step; an eager call takes
    EagerHotspot instead, with the same kernels and gradients, and a call the fast match refuses
    still takes the op."""
    import copy

    from test_swap import LINEAR_GELU

    from cudaforge.model import swapped_hotspot
    from cudaforge.model.backward import backward_hotspot
    from cudaforge.model.hotspot_op import EagerHotspot
    from cudaforge.model.swap import swap_in

    model, x, chain = _chain()
    reference = copy.deepcopy(model)
    problem = backward_hotspot(chain).problem_source
    swap = swap_in(chain.sites[0], LINEAR_GELU, chain.problem_source, training=True,
                   backward=(CHAIN_BACKWARD, problem))  # fmt: skip
    assert swap.use_backward_kernel
    applied, backward_calls = [], []
    gradients = swap.gradients

    class Counted(EagerHotspot):
        @staticmethod
        def forward(ctx, *args):
            applied.append(1)
            return EagerHotspot.forward(ctx, *args)

    def counted_gradients(*args):
        backward_calls.append(1)
        return gradients(*args)

    def no_op(*args):
        raise AssertionError("the custom op ran in eager mode")

    monkeypatch.setattr(swapped_hotspot, "EagerHotspot", Counted)
    monkeypatch.setattr(swap, "gradients", counted_gradients)
    with monkeypatch.context() as patched:
        patched.setattr(torch.ops.cudaforge, "hotspot", no_op)
        for m in (model, reference):
            m(x.clone().requires_grad_()).pow(2).sum().backward()
    assert applied == [1] and backward_calls == [1] and swap.stats.kernel_calls == 1
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name, rtol=1e-4, atol=1e-5)
    # a call the fast match refuses takes the full check, then the custom op: same gradients
    first = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    swap._fast_ready = False  # as after a mismatch the fast match cannot judge
    model(x.clone().requires_grad_()).pow(2).sum().backward()
    assert applied == [1] and len(backward_calls) == 2 and swap.stats.kernel_calls == 2
    for p, g in zip(model.parameters(), first):
        torch.testing.assert_close(p.grad, g, rtol=0, atol=0)
