"""site_graphs(model) on the CPU: which calls are captured, replayed or run as usual, and that an
output a caller still holds is never overwritten. CUDA graphs need a GPU, so here a stand-in
graph (test fixture) replays by running the captured call again and copying its results into
the outputs it made at capture, as a graph writes into its own memory; the address key skips
its CUDA-only check. tests/test_site_graphs_gpu.py runs the real ones."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from test_hotspots import MLP, build
from test_swap import LINEAR_GELU

from cudaforge.model import site_graphs as sg
from cudaforge.model.hotspots import find_hotspots
from cudaforge.model.swap import site_graphs, stats, swap_in, swaps


class StandInGraph:
    """A captured call (test fixture): replay() runs it again into the outputs of the capture."""

    made: ClassVar[list[StandInGraph]] = []

    def __init__(self, call, outputs, shift=0.0):
        self.call, self.outputs, self.shift = call, outputs, shift
        self.replays, self.was_reset = 0, False
        StandInGraph.made.append(self)

    def replay(self):
        self.replays += 1
        for mine, fresh in zip(self.outputs, self.call()):
            mine.copy_(fresh + self.shift)

    def reset(self):
        self.was_reset = True


def cpu_key(tensors):
    return tuple((t.data_ptr(), t.shape, t.stride(), t.dtype) for t in tensors)


@pytest.fixture()
def graphs(monkeypatch):
    """Stand-in captures; shift: what each replay adds (a replay that differs from its call);
    fail: what a capture raises."""
    settings = {"shift": 0.0, "fail": None}

    def capture_call(torch_, call, device, warmup=1):
        if settings["fail"] is not None:
            raise settings["fail"]
        for _ in range(warmup):
            call()
        graph = StandInGraph(call, call(), settings["shift"])
        return graph, graph.outputs

    StandInGraph.made = []
    monkeypatch.setattr(sg, "capture_call", capture_call)
    monkeypatch.setattr(sg, "address_key", cpu_key)
    monkeypatch.setattr(sg, "capturing", lambda: False)
    return settings


def swapped_mlp():
    torch.manual_seed(0)
    model, x = build(MLP, 8, 64)
    search = find_hotspots(model, (x,), min_share=0.0)
    chain = next(h for h in search if h.label == "Linear -> GELU")
    swap = swap_in(chain.sites[0], LINEAR_GELU, chain.problem_source, name="chain")
    return model, x, swap


def expected_of(model, x):
    with torch.no_grad():
        return model.fc2(model.act(model.fc1(x)))


def test_the_same_tensors_are_captured_at_their_third_call_and_then_replayed(graphs):
    model, x, swap = swapped_mlp()
    assert site_graphs(model) == 1
    with torch.no_grad():
        outs = [model(x) for _ in range(5)]
    for out in outs:
        torch.testing.assert_close(out, expected_of(model, x))
    (graph,) = StandInGraph.made
    assert swap.graphs.captures == 1 and swap.graphs.replays == 2  # calls 4 and 5
    assert graph.replays == 3  # the capture's check, then calls 4 and 5
    assert stats(model)["chain"]["graphs"] == {"graphs": 1, "replays": 2, "captures": 1,
                                               "held": 0, "dropped": 0, "unused": 0,
                                               "output_bytes": 8 * 256 * 4, "off_reason": "",
                                               "full": ""}  # fmt: skip
    assert stats(model)["chain"]["kernel_calls"] == 5  # replays are kernel calls too
    with torch.no_grad():
        x.copy_(torch.randn_like(x))  # new values at the same address: the graph reads them
        torch.testing.assert_close(model(x), expected_of(model, x))
    assert swap.graphs.replays == 3


def test_an_output_still_held_is_never_overwritten(graphs):
    model, x, swap = swapped_mlp()
    site_graphs(model)
    with torch.no_grad():
        for _ in range(3):
            model(x)
        site_out = swap(x)  # a replay's output, held by this test
        kept = site_out.clone()
        assert swap.graphs.replays == 1
        x.copy_(torch.randn_like(x))
        again = swap(x)  # the graph would write into site_out's memory: runs as usual
        assert swap.graphs.held == 1 and swap.graphs.replays == 1
        torch.testing.assert_close(site_out, kept)
        torch.testing.assert_close(again, model.act(model.fc1(x)))
        view = site_out.t()  # a view holds the memory as well
        del site_out, again
        swap(x)
        assert swap.graphs.held == 2
        del view
        swap(x)
    assert swap.graphs.replays == 2 and swap.graphs.held == 2


def test_other_tensors_wait_for_their_own_sightings_and_take_the_oldest_place(graphs):
    model, x, swap = swapped_mlp()
    site_graphs(model, limit=2, sightings=2)
    a, b, c = (x.clone() for _ in range(3))
    with torch.no_grad():
        for t in (a, b, c, a, b, c, a, b):
            torch.testing.assert_close(model(t), expected_of(model, t))
    made = StandInGraph.made
    # second calls: a and b captured, then c in the place of a (neither replayed yet, a older)
    assert swap.graphs.captures == 3 and made[0].was_reset and not made[1].was_reset
    assert swap.graphs.replays == 1 and swap.graphs.dropped == 1 and swap.graphs.unused == 1
    with torch.no_grad():
        for t in (c, c, a):  # a's second sighting: b, replayed longer ago than c, makes room
            torch.testing.assert_close(model(t), expected_of(model, t))
    assert made[1].was_reset and not made[2].was_reset and swap.graphs.replays == 3
    assert swap.graphs.dropped == 2 and swap.graphs.unused == 1  # b had been replayed
    assert len(swap.graphs.graphs) == 2


def test_sites_in_a_row_settle_one_after_another(graphs):
    """Five sites in a row, each one's input landing elsewhere once the sites before it replay
    (as the allocator hands out addresses when a replay stops asking it for outputs): every
    site replays after sightings x 5 forwards, each captured once per site before it, and the
    graphs never replayed made room first."""
    # where a site's input lies, by how many sites before it replayed in this forward
    spots = [torch.randn(4) for _ in range(6)]
    sites = [sg.SiteGraphs(lambda inputs, tensors: [inputs[0] * 2.0], lambda a, e: "")
             for _ in range(5)]  # fmt: skip
    settled = None
    for forward in range(1, 30):
        replaying = 0
        for site in sites:
            before = site.replays
            x = spots[replaying]
            (out,) = site([x], [])
            torch.testing.assert_close(out, x * 2.0)
            replaying += site.replays > before
            del out
        if replaying == 5 and settled is None:
            settled = forward
    assert settled == 3 * 5 + 1, [s.to_dict() for s in sites]
    assert [s.captures for s in sites] == [1, 2, 3, 4, 5]
    assert [len(s.graphs) for s in sites] == [1, 2, 3, 4, 4]  # at most LIMIT
    assert [s.unused for s in sites] == [0, 0, 0, 0, 1] and sites[4].full == ""
    assert all(s.replays == 29 - 3 * k - 3 for k, s in enumerate(sites))


def test_graphs_still_held_are_not_dropped(graphs):
    site = sg.SiteGraphs(lambda inputs, tensors: [inputs[0] + 1.0], lambda a, e: "", limit=1,
                         sightings=1)  # fmt: skip
    a, b = torch.zeros(3), torch.ones(3)
    site([a], [])  # captured
    (held,) = site([a], [])  # replayed; held here
    (out,) = site([b], [])  # b's turn: the only graph is held, so no room
    torch.testing.assert_close(out, b + 1.0)
    assert site.captures == 1 and site.dropped == 0 and list(site.graphs) == [cpu_key([a])]
    del held
    site([b], [])  # tried again at its next call
    assert site.captures == 2 and site.dropped == 1 and list(site.graphs) == [cpu_key([b])]


def test_one_off_addresses_never_keep_a_repeated_one_from_being_captured(graphs):
    site = sg.SiteGraphs(lambda inputs, tensors: [inputs[0] - 1.0], lambda a, e: "", limit=1)
    once = [torch.randn(2) for _ in range(100)]  # each seen once: more than the 64 kept
    for x in once:
        site([x], [])
    assert len(site.seen) == 64 and cpu_key([once[-1]]) in site.seen
    again = torch.randn(2)
    for _ in range(4):
        (out,) = site([again], [])
        torch.testing.assert_close(out, again - 1.0)
    assert site.captures == 1 and site.replays == 1


def test_a_site_whose_addresses_keep_moving_stops_capturing(graphs, monkeypatch):
    monkeypatch.setattr(sg, "MAX_UNUSED", 5)
    site = sg.SiteGraphs(lambda inputs, tensors: [inputs[0] * 3.0], lambda a, e: "", limit=2,
                         sightings=1)  # fmt: skip
    fresh = [torch.randn(2) for _ in range(12)]  # a new address every call
    for x in fresh:
        (out,) = site([x], [])
        torch.testing.assert_close(out, x * 3.0)
    # 2 captures fill it, 4 more each drop one never replayed, the fifth such drop is refused
    assert site.captures == 6 and site.unused == 4 and site.dropped == 4
    assert site.full == ("5 of its graphs were never replayed: its tensors' addresses keep "
                         "moving; no more are captured")  # fmt: skip
    last = fresh[5]
    (out,) = site([last], [])  # the graphs it has still replay
    assert site.replays == 1 and site.off_reason == ""
    torch.testing.assert_close(out, last * 3.0)


def test_calls_inside_another_capture_or_under_autograd_run_as_usual(graphs, monkeypatch):
    model, x, swap = swapped_mlp()
    site_graphs(model)
    monkeypatch.setattr(sg, "capturing", lambda: True)
    with torch.no_grad():
        for _ in range(4):
            model(x)
    assert swap.graphs.captures == 0 and not StandInGraph.made
    monkeypatch.setattr(sg, "capturing", lambda: False)
    xg = x.clone().requires_grad_()
    for _ in range(4):
        model(xg).sum().backward()  # recorded by autograd: never from a graph
    assert swap.graphs.captures == 0 and swap.graphs.seen == {}


def test_a_replay_that_differs_or_a_failed_capture_turns_graphs_off(graphs):
    model, x, swap = swapped_mlp()
    site_graphs(model)
    graphs["shift"] = 0.25
    with torch.no_grad():
        outs = [model(x) for _ in range(5)]
    for out in outs:
        torch.testing.assert_close(out, expected_of(model, x))
    assert "its replay differs from the call it was captured from" in swap.graphs.off_reason
    assert swap.graphs.graphs == {} and StandInGraph.made[0].was_reset
    model, x, swap = swapped_mlp()
    site_graphs(model)
    graphs["fail"] = RuntimeError("operation not permitted when stream is capturing")
    with torch.no_grad():
        outs = [model(x) for _ in range(5)]
    for out in outs:
        torch.testing.assert_close(out, expected_of(model, x))
    assert swap.graphs.off_reason == ("its call cannot be captured in a CUDA graph: RuntimeError: "
                                      "operation not permitted when stream is capturing")  # fmt: skip


def test_the_inference_op_replays_and_off_frees_the_graphs(graphs):
    model, x, swap = swapped_mlp()
    site_graphs(model)
    with torch.no_grad():
        for _ in range(4):
            (out,) = torch.ops.cudaforge.hotspot_infer(swap.handle, [x], swap.bound)
            torch.testing.assert_close(out, model.act(model.fc1(x)))
    assert swap.graphs.replays == 1 and swap.stats.op_calls == 4
    twin = copy.deepcopy(model)
    (copied,) = swaps(twin)
    assert copied.graphs is not None and copied.graphs.graphs == {}  # its own, none yet
    assert copied.graphs.limit == swap.graphs.limit
    site_graphs(model, False)
    assert swap.graphs is None and StandInGraph.made[0].was_reset
    assert stats(model)["chain"]["graphs"] is None


def test_inductors_code_calls_the_inference_op_that_replays(graphs):
    """torch.compile's default mode (Inductor, here its CPU code) calls the swapped site through
    cudaforge::hotspot_infer, whose replays feed the compiled fc2: every output right while x
    takes new values at its address, and the outputs kept from earlier calls untouched."""
    model, x, swap = swapped_mlp()
    site_graphs(model)
    torch._dynamo.reset()
    compiled = torch.compile(model)
    outs, wanted = [], []
    try:
        with torch.no_grad():
            for _ in range(8):
                x.copy_(torch.randn_like(x))
                wanted.append(expected_of(model, x))
                outs.append(compiled(x))
    finally:
        torch._dynamo.reset()
    for out, want in zip(outs, wanted):
        torch.testing.assert_close(out, want)
    assert swap.stats.op_calls == 8 and swap.stats.kernel_calls == 0  # all through the op
    assert swap.graphs.captures == 1 and swap.graphs.replays == 5  # the third call captured


def test_tensors_off_the_gpu_are_never_captured():
    model, x, swap = swapped_mlp()
    site_graphs(model)
    with torch.no_grad():
        for _ in range(4):
            torch.testing.assert_close(model(x), expected_of(model, x))
    assert swap.graphs.captures == 0 and swap.graphs.seen == {}


BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def test_the_benchmark_variant_has_graphs_only_during_its_own_calls(graphs):
    sys.path.insert(0, str(BENCHMARKS))
    import models_optimize

    model, x, swap = swapped_mlp()
    during = []

    def forward():
        during.append(swap.graphs)
        with torch.no_grad():
            return model(x)

    variant = models_optimize.with_site_graphs(model, forward)
    assert swap.graphs is None
    for _ in range(4):
        torch.testing.assert_close(variant(), expected_of(model, x))
    assert swap.graphs is None and forward() is not None and during[-1] is None
    assert all(g is variant.site_graphs[0] for g in during[:4])
    # captured at the third call: settled once six more pass without a capture
    assert models_optimize.settle_site_graphs({"graphs": variant}) == 6
    assert variant.settled_in == 6 and models_optimize.settle_site_graphs({"plain": forward}) == 0
    (said,) = models_optimize.said_site_graphs("mlp", model, variant)
    assert said == {"site": swap.site.path, "graphs": 1, "replays": 7, "captures": 1,
                    "held": 0, "dropped": 0, "unused": 0, "output_bytes": 8 * 256 * 4,
                    "off_reason": "", "full": ""}  # fmt: skip


def test_the_benchmark_settles_site_graphs_before_it_times_them(graphs):
    sys.path.insert(0, str(BENCHMARKS))
    import models_optimize

    model, x, _ = swapped_mlp()

    def forward():
        with torch.no_grad():
            return model(x)

    plain_calls = []

    def plain():
        plain_calls.append(1)
        return forward()

    variant = models_optimize.with_site_graphs(model, forward)
    medians = models_optimize.time_side_by_side({"plain": plain, "graphs": variant}, reps=2,
                                                warmup=1)  # fmt: skip
    # call 1 warms up; settle, in rounds of both in their timed order: calls 2 and 3 (captured),
    # then 4 to 9 without a capture; the timed calls 10 and 11 replay too
    assert set(medians) == {"plain", "graphs"} and variant.settled_in == 8
    assert variant.site_graphs[0].replays == 8 and len(plain_calls) == 1 + 8 + 2


def test_the_overhead_benchmark_times_a_replay_and_puts_everything_back():
    sys.path.insert(0, str(BENCHMARKS))
    import swap_overhead

    _, x, swap = swapped_mlp()
    saved = sg.capture_call, sg.address_key, sg.capturing
    assert swap_overhead.replay_path_us(swap, x, 20) > 0
    assert (sg.capture_call, sg.address_key, sg.capturing) == saved and swap.graphs is None


def test_a_limit_or_sightings_below_one_is_refused_and_changes_nothing():
    model, _, swap = swapped_mlp()
    for bad in ({"limit": 0}, {"sightings": 0}, {"limit": 2.5}):
        with pytest.raises(ValueError, match="must be a whole number >= 1"):
            site_graphs(model, **bad)
        assert swap.graphs is None
    site_graphs(model, limit=2)
    before = swap.graphs
    with pytest.raises(ValueError, match="sightings must be a whole number >= 1, got -1"):
        site_graphs(model, sightings=-1)
    assert swap.graphs is before and before.limit == 2
