"""site_graphs(model) with real CUDA graphs and NVRTC kernels (the HAND-WRITTEN FIXTURE kernels of
test_optimize_gpu: GELU and LayerNorm) swapped into a transformer block: eager calls and
torch.compile's default mode replay them and give the block's outputs; an output still held is
not overwritten; while torch.compile's reduce-overhead mode or cudaforge.graphed captures the
forward, no site graph is captured or replayed inside it, and their replays are right."""

from __future__ import annotations

import pytest
import torch
from test_optimize_gpu import GELU, LAYER_NORM, build_block, fixture_llm

import cudaforge
from cudaforge.model.hotspots import find_hotspots
from cudaforge.model.site_graphs import settle
from cudaforge.model.swap import site_graphs, swap_in, swaps

pytestmark = pytest.mark.gpu


def swapped_block():
    model, x = build_block()
    with torch.no_grad():
        expected = model(x)
    for hotspot in find_hotspots(model, (x,), min_share=0.0):
        if "NewGELU" in hotspot.problem_source:
            source = GELU
        elif "(module): LayerNorm" in hotspot.problem_source:
            source = LAYER_NORM
        else:
            continue
        for site in hotspot.sites:
            swap_in(site, source, hotspot.problem_source, timed=False)
    assert len(swaps(model)) == 3  # ln_1, ln_2, the GELU
    return model, x, expected


def replays(model) -> int:
    return sum(s.graphs.replays for s in swaps(model))


def test_eager_calls_replay_and_a_held_output_is_kept():
    model, x, expected = swapped_block()
    assert site_graphs(model) == 3
    with torch.no_grad():
        for _ in range(5):
            torch.testing.assert_close(model(x), expected, rtol=1e-4, atol=1e-4)
    norm = next(s for s in swaps(model) if s.site.path == "ln_1")
    # ln_1 reads the model's input, at one address: captured at the third forward, replayed at
    # the fourth and fifth (the other sites read activations, wherever the allocator puts them)
    assert norm.graphs.replays == 2, [s.graphs.to_dict() for s in swaps(model)]
    assert all(s.graphs.off_reason == "" for s in swaps(model))
    assert norm.graphs.output_bytes() == 8 * 128 * 256 * 4  # the graph keeps its output
    with torch.no_grad():
        held = norm(x)  # a replay's output
        kept = held.clone()
        x2 = x + 1.0
        other = norm(x2)  # another address: runs as usual
        x.add_(1.0)  # x now holds x2's values, at the address the graph reads
        again = norm(x)  # held is still held: runs as usual, writes elsewhere
        torch.cuda.synchronize()
    torch.testing.assert_close(held, kept)
    torch.testing.assert_close(again, other)
    assert norm.graphs.held == 1
    del held
    with torch.no_grad():
        torch.testing.assert_close(norm(x), other)  # replayed on the new values
    assert norm.graphs.replays == 4
    site_graphs(model, False)
    assert all(s.graphs is None for s in swaps(model))


def test_every_site_of_the_block_replays_once_their_addresses_settle():
    """ln_1, the GELU and ln_2 in a row: each one's activations move once the ones before it
    replay, so they settle one after another (cudaforge.model.site_graphs), within sightings x 3
    forwards and a few more for the allocator (site_graphs.settle)."""
    model, x, expected = swapped_block()
    site_graphs(model)
    own = [s.graphs for s in swaps(model)]
    with torch.no_grad():
        took = settle(lambda: model(x), own)
        assert took < 40, [g.to_dict() for g in own]
        torch.testing.assert_close(model(x), expected, rtol=1e-4, atol=1e-4)
        before = replays(model)
        for _ in range(3):
            torch.testing.assert_close(model(x), expected, rtol=1e-4, atol=1e-4)
    found = [s.graphs.to_dict() for s in swaps(model)]
    assert replays(model) - before == 3 * 3, found
    assert all(g["off_reason"] == "" and g["full"] == "" and g["graphs"] <= 4 for g in found)


def test_torch_compile_default_mode_replays_them():
    model, x, expected = swapped_block()
    site_graphs(model)
    compiled = torch.compile(model)
    with torch.no_grad():
        for _ in range(6):
            torch.testing.assert_close(compiled(x), expected, rtol=1e-4, atol=1e-4)
    assert replays(model) > 0, [s.graphs.to_dict() for s in swaps(model)]


def test_no_site_graph_inside_a_graph_that_captures_the_forward():
    model, x, expected = swapped_block()
    site_graphs(model, sightings=2)  # graphed's warm-up call is one sighting, its capture none
    replayed = cudaforge.graphed(model, (x.clone(),), warmup=1)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(replayed(x), expected, rtol=1e-4, atol=1e-4)
    assert replayed.replays == 3
    assert all(s.graphs.captures == 0 for s in swaps(model))
    torch._dynamo.reset()
    compiled = torch.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(4):
            torch.testing.assert_close(compiled(x).clone(), expected, rtol=1e-4, atol=1e-4)
    assert all(s.graphs.off_reason == "" for s in swaps(model))


def test_optimize_settles_checks_and_times_them(tmp_path, monkeypatch):
    """optimize(site_graphs="auto") on the block: every swapped site replays once settled, the
    model's outputs match with them, and the verdict (on or off) comes from the interleaved
    timing, with both times in the note."""
    monkeypatch.setenv("CUDAFORGE_CACHE_DIR", str(tmp_path / "cache"))
    model, x = build_block()
    with torch.no_grad():
        expected = model(x)
    with cudaforge.WorkerPool(1) as pool:
        result = cudaforge.optimize(
            model, (x,), llm=fixture_llm(), rounds=1, pool=pool, store=False, min_share=0.0,
            min_speedup=0, site_graphs="auto",
        )  # fmt: skip
    print(result.report())
    found = swaps(result.model)
    note = result.site_graphs
    assert found and f"{len(found)} of {len(found)} sites replay after" in note, note
    assert note.startswith(("site graphs: on, faster with them", "site graphs: off: not faster"))
    assert "ms per forward without" in note and result.outputs_match
    with torch.no_grad():
        torch.testing.assert_close(result.model(x), expected, rtol=1e-4, atol=1e-4)
    kept = note.startswith("site graphs: on")
    assert all((s.graphs is not None) == kept for s in found)
