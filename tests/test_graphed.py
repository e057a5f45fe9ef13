"""cudaforge.graphed: a model's inference forward replayed as one CUDA graph. On the CPU: which
calls may replay (the argument match) and the refusal without a GPU; on the GPU: replays equal
the eager forward, see in-place changes of inputs and parameters, and any other call runs eagerly
with a FallbackWarning."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import cudaforge
from cudaforge.errors import NoGPUError
from cudaforge.model.graphed import mismatch
from cudaforge.model.swap_errors import FallbackWarning, SwapError


def test_arguments_match_only_with_the_same_shape_dtype_strides_and_values():
    x = torch.zeros(4, 8)
    assert mismatch((x, 3), (torch.ones(4, 8), 3)) == ""
    assert "captured for (4, 8)" in mismatch((x,), (torch.zeros(4, 9),))
    assert "torch.float16" in mismatch((x,), (x.half(),))
    assert "strides (1, 4)" in mismatch((x,), (torch.zeros(8, 4).t(),))
    assert "is 4, the graph was captured with 3" in mismatch((x, 3), (x, 4))
    assert "not a tensor" in mismatch((x,), (1.0,))
    assert "2 arguments" in mismatch((x,), (x, x))


def test_graphed_refuses_inputs_not_on_a_gpu():
    with pytest.raises(NoGPUError, match="CUDA device"):
        cudaforge.graphed(nn.Linear(4, 4), (torch.zeros(2, 4),))


class Scale(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x, k: int):
        return {"y": torch.relu(self.lin(x)) * k, "x": x + 1}


@pytest.mark.gpu
def test_replays_equal_the_eager_forward_and_other_calls_run_eagerly():
    model = Scale().cuda().eval()
    x = torch.randn(32, 64, device="cuda")
    replayed = cudaforge.graphed(model, (x, 2))
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(32, 64, device="cuda")
            got, want = replayed(x, 2), model(x, 2)
            torch.testing.assert_close(got["y"], want["y"])
            torch.testing.assert_close(got["x"], want["x"])
        kept = replayed(x, 2)["y"]
        replayed(torch.randn(32, 64, device="cuda"), 2)  # outputs are clones: kept stays
        torch.testing.assert_close(kept, model(x, 2)["y"])
        model.lin.weight.mul_(0.5)  # an in-place change is seen by the replay
        torch.testing.assert_close(replayed(x, 2)["y"], model(x, 2)["y"])
    assert replayed.replays == 6 and replayed.fallbacks == 0
    with torch.no_grad(), pytest.warns(FallbackWarning, match="captured for"):
        out = replayed(torch.randn(16, 64, device="cuda"), 2)
    assert out["y"].shape == (16, 64) and replayed.fallbacks == 1
    with torch.no_grad():
        replayed(x, 3)
    assert "captured with 2" in replayed.fallback_reason
    replayed(x, 2)["y"].sum().backward()  # gradients enabled: eager, so autograd works
    assert model.lin.weight.grad is not None and "gradients" in replayed.fallback_reason


@pytest.mark.gpu
def test_a_forward_that_reads_the_gpu_on_the_host_cannot_be_captured():
    class Syncs(nn.Module):
        def forward(self, x):
            return x * float(x.sum())

    with pytest.raises(SwapError, match="cannot be captured"):
        cudaforge.graphed(Syncs().cuda(), (torch.ones(4, device="cuda"),))
    # the failed capture left the random generators usable (it raised "Offset increment outside
    # graph capture" in the next test before they were put back)
    assert torch.rand(4, device="cuda").shape == (4,)


def test_the_report_says_when_the_optimized_forward_waits_for_the_host():
    from cudaforge.model.outcomes import OptimizeResult

    paced = OptimizeResult(model=nn.Identity(), hotspots=[], before_ms=4.7, after_ms=4.1, max_abs_err=0.0,
                           outputs_match=True, after_gpu_ms=3.0)  # fmt: skip
    assert "paced by the host: 4.1 ms per call for 3 ms of GPU work" in paced.report()
    assert "cudaforge.graphed(model, example_inputs)" in paced.report()
    assert "paced by the host" in paced._repr_html_()  # the notebook's report says it too
    busy = OptimizeResult(model=nn.Identity(), hotspots=[], before_ms=4.7, after_ms=3.2, max_abs_err=0.0,
                          outputs_match=True, after_gpu_ms=3.0)  # fmt: skip
    assert busy.host_paced == "" and "paced by the host" not in busy.report()
    assert OptimizeResult(model=nn.Identity(), hotspots=[], after_ms=3.0).host_paced == ""
