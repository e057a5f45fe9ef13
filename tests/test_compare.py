"""The one verification core (cudaforge/harness/compare.py, options.py, problem_hash): the workers'
evaluation and swap read one tolerance table, give one verdict on the same values, decide aliasing
by one rule, and key problems by one hash."""

from __future__ import annotations

import hashlib

import pytest
import torch

import cudaforge.model.store
from cudaforge.harness.compare import aliases, check_outputs, tensor_difference
from cudaforge.harness.options import EvalOptions, Tolerances, tolerance_of
from cudaforge.harness.problem import Problem, problem_hash
from cudaforge.model import swap

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def test_one_tolerance_table():
    for dtype in DTYPES:
        assert swap.tolerances(dtype) == tolerance_of(EvalOptions(), dtype)
    assert tolerance_of(EvalOptions(), torch.float64) == (1e-6, 1e-6, 1e-5)
    assert tolerance_of(EvalOptions(), "bf16") == (2e-2, 2e-2, 2e-2)
    assert tolerance_of(EvalOptions(), torch.float32) == (1e-4, 1e-4, 1e-3)
    assert tolerance_of(EvalOptions(), torch.int64) == (1e-4, 1e-4, 1e-3)  # fp32's
    # swap's shorthand: one tolerance for atol and rtol, the L2 bound 10x it at least
    assert swap.tolerances(torch.float32, 1e-3) == (1e-3, 1e-3, 1e-2)
    assert swap.tolerances(torch.bfloat16, 1e-3) == (1e-3, 1e-3, 2e-2)
    assert tolerance_of(Tolerances.uniform(None), torch.float16) == swap.tolerances(torch.float16)


def _cases():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=g)
    nan = x.clone()
    nan[3] = float("nan")
    inf = x.clone()
    inf[5] = float("inf")
    tiny = torch.softmax(torch.randn(16384, generator=g), 0)
    # bf16 values in [2, 2.25), where one ulp is 2^-6: two ulps (a fused kernel rounding once
    # against eager's rounding after each op) is 1.4-1.6% of the value
    bf = (2 + 0.25 * torch.rand(4096, generator=g)).bfloat16()
    two_ulps = (bf.float() + 2**-5).bfloat16()
    d = torch.randn(4096, generator=g, dtype=torch.float64)
    return [
        ("same", x, x.clone(), True),
        ("within fp32", x + 5e-5, x, True),
        ("beyond fp32", x + 1e-3, x, False),
        ("a NaN where the reference is finite", nan, x, False),
        ("the reference's own NaN", nan, nan.clone(), True),
        ("Inf of the other sign", -inf, inf, False),
        ("all zeros for tiny outputs", torch.zeros_like(tiny), tiny, False),
        ("bf16 two ulps apart", two_ulps, bf, True),
        ("fp64 off by 1e-5, fp32's precision", d + 1e-5, d, False),
        ("fp64 reordered", d + 1e-13, d, True),
        ("ints off by one", torch.arange(10) + (torch.arange(10) == 7), torch.arange(10), False),
    ]


@pytest.mark.parametrize("name, actual, expected, correct", _cases(), ids=[c[0] for c in _cases()])
def test_the_harness_and_swap_give_one_verdict(name, actual, expected, correct):
    harness = check_outputs(actual, expected, EvalOptions()) is None
    worst, problem = swap.compare([actual], [expected])
    assert harness == correct and (problem == "") == correct, (name, problem)
    assert tensor_difference(actual, expected, Tolerances()).ok == correct
    if not correct:
        assert problem.startswith("output 0: ") and worst.index == 0


def test_aliasing_is_decided_by_element_extent():
    storage = torch.zeros(16)
    first, second, straddling = storage[:8], storage[8:], storage[7:9]
    assert aliases([second], [first]) is None  # one allocation, disjoint elements
    assert aliases([straddling], [first]) == (0, 0)
    assert aliases([torch.zeros(3), straddling], [second, first]) == (1, 0)
    strided = storage.view(4, 4)[:, :2]  # rows 0-3, columns 0-1: spans elements 0..13
    assert aliases([storage[14:]], [strided]) is None and aliases([storage[13:]], [strided])
    assert aliases([torch.zeros(0)], [storage]) is None


def test_one_problem_hash_stable_for_the_same_source():
    source = "import torch\n\nclass Model(torch.nn.Module):\n    pass\n"
    problem = Problem.from_source(
        source + "\ndef get_inputs():\n    return []\n\ndef get_init_inputs():\n    return []\n"
    )
    assert problem.hash == problem_hash(problem.source)
    assert cudaforge.model.store.problem_hash is problem_hash  # the store keys by the same hash
    # the definition itself: a stored kernel's key must not move for the same source
    assert problem_hash(source) == hashlib.sha256(source.strip().encode()).hexdigest()
    edited = source.replace("\n", "   \r\n") + "\n\n"
    assert problem_hash(edited) == problem_hash(source)
    assert problem_hash(source.replace("pass", "pass  # x")) != problem_hash(source)
