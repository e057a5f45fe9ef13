"""Outputs in their caller's layout (harness.layouts, EvalOptions.output_orders): the timed
forward of a candidate whose output comes back in another layout than the model keeps it in
includes the copy the model will make, and the result (and so the Judge) says so."""

from __future__ import annotations

import pytest
import torch

from cudaforge.harness.layouts import check_orders, in_orders, strides_of
from cudaforge.harness.options import make_options
from cudaforge.harness.pool import WorkerPool
from cudaforge.harness.problem import Problem
from cudaforge.profiling.measurements import measurements_text

TRANSPOSED = Problem.from_source(
    """
import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return (x * 2).view(4, 16, 8, 32).transpose(1, 2)
def get_inputs():
    return [torch.randn(4, 16, 256)]
def get_init_inputs():
    return []
""",
    name="transposed",
)
HEAD = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
CONTIGUOUS = HEAD + "        return (x * 2).view(4, 16, 8, 32).transpose(1, 2).contiguous()\n"
IN_PLACE = HEAD + "        return (x * 2).view(4, 16, 8, 32).transpose(1, 2)\n"
ORDERS = [(0, 2, 1, 3)]
FAST = {"trials": 2, "timed_runs": 5, "warmup": 1, "input_sets": 1}


def test_strides_of_an_order_are_the_models():
    model_out = torch.empty(4, 16, 8, 32).transpose(1, 2)
    assert strides_of(model_out.shape, (0, 2, 1, 3)) == model_out.stride()
    nhwc = torch.empty(2, 3, 5, 7).to(memory_format=torch.channels_last)
    assert strides_of(nhwc.shape, (0, 2, 3, 1)) == nhwc.stride()
    assert strides_of((2, 3), (0, 1)) == (3, 1)


def test_in_orders_copies_only_what_is_laid_out_otherwise():
    copies = []
    out = torch.randn(4, 16, 8, 32)
    wrapped = in_orders(lambda a, b: (a, b, 7), ORDERS + [None],
                        lambda i, have, want: copies.append((i, have, want)))  # fmt: skip
    a, b, seven = wrapped(out.transpose(1, 2).contiguous(), out)
    assert a.stride() == out.transpose(1, 2).stride() and torch.equal(a, out.transpose(1, 2))
    assert b is out and seven == 7  # no order given, or not a tensor: untouched
    assert copies == [(0, (4096, 512, 32, 1), (4096, 32, 256, 1))]
    view = out.transpose(1, 2)
    assert in_orders(lambda: view, ORDERS)() is view  # already there: no copy
    flat = torch.randn(3)
    assert in_orders(lambda: flat, ORDERS)() is flat  # another rank: untouched


def test_orders_are_checked():
    assert check_orders([[1, 0], None]) == ((1, 0), None)
    with pytest.raises(ValueError, match="permutation"):
        make_options(output_orders=[(0, 0)])
    with pytest.raises(TypeError):
        make_options(output_orders="0123")


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(1, device="cpu", timeout=60, compile_timeout=60) as p:
        yield p


def test_an_output_in_another_layout_is_copied_in_the_timed_forward_and_said(pool):
    copied = pool.evaluate(TRANSPOSED, CONTIGUOUS, output_orders=ORDERS, **FAST)
    assert copied.ok, copied.error
    said = [n for n in copied.notes if n.startswith("output 0 came back with strides")]
    expected = ("output 0 came back with strides (4096, 512, 32, 1); the caller keeps it with "
                "strides (4096, 32, 256, 1), so every call copied it there, and the times include "
                "it")  # fmt: skip
    assert said == [expected]
    assert said[0] in measurements_text(copied)  # the Judge reads it
    in_place = pool.evaluate(TRANSPOSED, IN_PLACE, output_orders=ORDERS, **FAST)
    assert in_place.ok and not any("came back with strides" in n for n in in_place.notes)
    plain = pool.evaluate(TRANSPOSED, CONTIGUOUS, **FAST)  # no orders: nothing copied
    assert plain.ok and not any("came back with strides" in n for n in plain.notes)
