"""Host time a swapped hot spot adds per call, on the CPU (no GPU needed).

A swapped site runs its kernel through cudaforge's Python: the call's check against what was
verified, then the kernel; for a call that autograd records, a forward and a backward through
`EagerHotspot` (eager) or the custom op `cudaforge::hotspot` (what torch.compile sees). Where a
model's forward or training step is paced by the host, that time is what decides. This times, with
a torch stand-in kernel (the problem's own Model, so kernel time is the same on both sides):
- inference: the model's forward, original against swapped, and the candidate called directly;
  one kernel call through the custom op and through `hotspot_infer` (what torch.compile's
  graph calls, with and without gradients) against without; the Python of a call replayed from
  a site graph (`site_graphs`; an empty stand-in graph, since the CPU has no CUDA graphs);
- training: forward + backward of the model, through EagerHotspot against through the custom op,
  both with a backward kernel (the stand-in's own autograd).

    python benchmarks/swap_overhead.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

from test_backward import CHAIN_BACKWARD
from test_hotspots import MLP, build
from test_swap import LINEAR_GELU

from cudaforge.model import swapped_hotspot
from cudaforge.model.backward import backward_hotspot
from cudaforge.model.hotspots import find_hotspots
from cudaforge.model.swap import swap_in


def per_call_us(fn, calls: int) -> float:
    """Median over 5 blocks of `calls` calls, microseconds per call."""
    for _ in range(min(calls, 200)):
        fn()
    blocks = []
    for _ in range(5):
        began = time.perf_counter()
        for _ in range(calls):
            fn()
        blocks.append((time.perf_counter() - began) / calls * 1e6)
    return sorted(blocks)[2]


class _EmptyGraph:
    """A stand-in for a captured CUDA graph (none on the CPU): replay() does nothing."""

    def replay(self):
        pass

    def reset(self):
        pass


def replay_path_us(swap, x, calls: int) -> float:
    """us per call of a site graph's replay path (cudaforge.model.site_graphs) on the CPU: what
    a replay costs in Python, with an empty stand-in graph and the CUDA-only checks skipped."""
    from cudaforge.model import site_graphs as sg

    saved = sg.capture_call, sg.address_key, sg.capturing
    sg.capture_call = lambda torch_, call, device, warmup=1: (_EmptyGraph(), call())
    sg.address_key = lambda tensors: tuple((t.data_ptr(), t.shape, t.stride(), t.dtype)
                                           for t in tensors)  # fmt: skip
    sg.capturing = lambda: False
    try:
        swap.use_graphs(True)
        for _ in range(sg.SIGHTINGS + 1):
            swap.graphs([x], swap.bound)
        if swap.graphs.replays != 1:
            raise SystemExit(f"the stand-in graph was not replayed: {swap.graphs.to_dict()}")
        return per_call_us(lambda: swap.graphs([x], swap.bound), calls)
    finally:
        swap.use_graphs(False)
        sg.capture_call, sg.address_key, sg.capturing = saved


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    torch.manual_seed(0)
    model, x = build(MLP, 8, 64)
    model.train()
    original = copy.deepcopy(model)
    chain = find_hotspots(model, (x,), min_share=0.0, targets=["chain"])[0]
    problem = backward_hotspot(chain).problem_source
    swap = swap_in(chain.sites[0], LINEAR_GELU, chain.problem_source, training=True,
                   backward=(CHAIN_BACKWARD, problem))  # fmt: skip
    if not swap.use_backward_kernel:
        raise SystemExit(f"the stand-in backward was refused: {swap.check.backward_kernel_refused}")
    with torch.no_grad():
        print(f"inference, us per forward: original {per_call_us(lambda: original(x), args.calls):.1f}"
              f", swapped {per_call_us(lambda: model(x), args.calls):.1f}, candidate alone "
              f"{per_call_us(lambda: swap.candidate(x), args.calls):.1f}")  # fmt: skip
        # what torch.compile's graph calls at a swapped site: the custom op, against the same
        # kernel call without its dispatch
        ops = torch.ops.cudaforge
        op = per_call_us(lambda: ops.hotspot(swap.handle, [x], swap.bound), args.calls)
        lean = per_call_us(lambda: ops.hotspot_infer(swap.handle, [x], swap.bound), args.calls)
        direct = per_call_us(lambda: swap.run_kernel([x], swap.bound), args.calls)
        print(f"inference, us per kernel call: through the custom op {op:.1f} ({op - direct:+.1f})"
              f", through hotspot_infer {lean:.1f} ({lean - direct:+.1f}), run_kernel directly "
              f"{direct:.1f}")  # fmt: skip
        print(f"inference, us per kernel call: a site graph's replay path {replay_path_us(swap, x, args.calls):.1f}"
              " (its Python: the address key, the held check, the outputs handed out; a stand-in"
              f" graph whose replay is empty), the usual call {direct:.1f}")  # fmt: skip
    xg = x.clone().requires_grad_()

    def step(m):
        m(xg).sum().backward()

    through_function = per_call_us(lambda: step(model), args.calls // 4)
    plain = swapped_hotspot._plain
    swapped_hotspot._plain = lambda tensors: False  # the eager path declines: the custom op
    try:
        through_op = per_call_us(lambda: step(model), args.calls // 4)
    finally:
        swapped_hotspot._plain = plain
    print(f"training, us per forward + backward: original {per_call_us(lambda: step(original), args.calls // 4):.1f}"
          f", swapped through EagerHotspot {through_function:.1f}, through the custom op "
          f"{through_op:.1f} ({through_op - through_function:+.1f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
