"""The eager side's spin (timed_sides.EagerSide): every run after the first is queued behind a
spin longer than the host took to issue the runs before it, so that a forward slower to issue
than to run is timed on the GPU, not on the host. A fake run and fake CUDA events stand in for
the GPU; the host's time is real (a sleep in the forward)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from cudaforge.harness import timed_sides
from cudaforge.harness.timed_sides import EagerSide


class _Event:
    def __init__(self, enable_timing=False):
        self.at = None

    def record(self):
        self.at = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return (other.at - self.at) * 1e3


class _Run:
    """What EagerSide needs of an evaluation, with a forward that takes `host_s` to issue."""

    def __init__(self, host_s: float, cuda: bool = True):
        self.cuda = cuda
        self.host_s = host_s
        self.opts = SimpleNamespace(fresh_inputs=False)
        self.torch = SimpleNamespace(cuda=SimpleNamespace(Event=_Event))
        self.settings = SimpleNamespace(apply=lambda: None)
        self.spins: list[int] = []

    def check_l2(self):
        pass

    def prepare_run(self, buffers, seed, index, ahead_ns=0):
        self.spins.append(ahead_ns)

    def call(self, model, inputs, who):
        time.sleep(self.host_s)


def test_each_spin_covers_the_hosts_issue_time_of_the_runs_before():
    run = _Run(host_s=0.002)
    side = EagerSide(run, model=None, who="candidate", buffers=[[]], seed=0)
    for i in range(6):
        side.queue(i)
    # the first run has no measured issue yet: a fixed guess; the later ones follow the host
    assert run.spins[0] == timed_sides.AHEAD_MAX_NS // 5
    for spin, before in zip(run.spins[1:], range(1, 6)):
        slowest = max(side.issue_ns[:before][-timed_sides.AHEAD_RECENT:])
        # the cap holds even where a loaded host took longer than planned over a 2 ms sleep
        assert spin >= min(timed_sides.AHEAD_MAX_NS, timed_sides.AHEAD_FACTOR * slowest)
        assert spin >= 1.5 * 2_000_000  # a 2 ms issue is never spun for less than 3 ms
    assert 0.0019 < side.host_ms() < 0.05 * 1e3


def test_the_warm_up_estimate_sets_the_first_spin_and_the_spin_is_capped():
    run = _Run(host_s=0.0)
    side = EagerSide(run, model=None, who="reference", buffers=[[]], seed=0, host_s=0.010)
    side.queue(0)
    assert run.spins[0] == timed_sides.AHEAD_MAX_NS  # 1.5 x 10 ms is over the cap
    slow = _Run(host_s=0.0)
    fast = EagerSide(slow, model=None, who="reference", buffers=[[]], seed=0, host_s=0.0001)
    fast.queue(0)
    assert slow.spins[0] == int(1.5 * 100_000 + timed_sides.AHEAD_MARGIN_NS)


def test_no_spin_on_a_cpu():
    run = _Run(host_s=0.0, cuda=False)
    side = EagerSide(run, model=None, who="candidate", buffers=[[]], seed=0)
    ms = side.read(side.queue(0))
    assert run.spins == [0] and ms >= 0.0
    assert side.host_ms() is None


def test_graph_replays_are_queued_behind_the_spin_too_and_host_ahead_false_turns_it_off():
    from cudaforge.harness.timed_sides import GraphSide

    run = _Run(host_s=0.0)
    captured = SimpleNamespace(inputs=[], graph=SimpleNamespace(replay=lambda: time.sleep(0.001)))
    side = GraphSide(run, captured, "reference", seed=0)
    for i in range(3):
        side.read(side.queue(i))
    assert run.spins[0] == timed_sides.AHEAD_MAX_NS // 5
    assert all(spin >= 1.5 * 1_000_000 for spin in run.spins[1:])  # the 1 ms launch, covered
    assert side.host_ms() >= 1.0
    run.opts.host_ahead = False
    eager = EagerSide(run, model=None, who="candidate", buffers=[[]], seed=0)
    eager.queue(0)
    side.queue(3)
    assert run.spins[-2:] == [0, 0]
