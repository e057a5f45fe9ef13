"""The hot-spot search remembered in the store (cudaforge.model.remembered_search): load()
searches only the module paths where an earlier run found its hot spots, finds the same
problems there, and searches the whole model again when the model or its inputs changed or the
remembered paths hold nothing any more. CPU."""

from __future__ import annotations

import torch
from test_hotspots import Block
from torch import nn

from cudaforge.model import hotspots, remembered_search
from cudaforge.model.remembered_search import model_key, search
from cudaforge.model.store import KernelStore


def two_blocks():
    torch.manual_seed(0)
    return nn.Sequential(Block(), Block()).eval(), torch.randn(2, 16, 64)


def spy(monkeypatch) -> list:
    """The `paths` of every find_hotspots call and how many modules each captured."""
    calls: list = []
    real_find, real_capture = hotspots.find_hotspots, hotspots.capture_calls

    def find(*args, paths=None, **kwargs):
        calls.append({"paths": paths})
        return real_find(*args, paths=paths, **kwargs)

    def capture(model, args, kwargs, wanted):
        calls[-1]["captured"] = len(wanted)
        return real_capture(model, args, kwargs, wanted)

    monkeypatch.setattr(remembered_search, "find_hotspots", find)
    monkeypatch.setattr(hotspots, "capture_calls", capture)
    return calls


def test_a_second_search_looks_only_where_the_first_found_hot_spots(tmp_path, monkeypatch):
    model, x = two_blocks()
    store = KernelStore(tmp_path / "k.sqlite3")
    calls = spy(monkeypatch)
    options = {"min_share": 0.05, "max_hotspots": 2}
    first = search(model, (x,), store=store, use_remembered=True, **options)  # nothing yet
    paths = sorted({site.path for h in first for site in h.sites})
    assert calls[0]["paths"] is None and store.searched(model_key(model, (x,))) == paths
    again = search(model, (x,), store=store, use_remembered=True, **options)
    assert calls[1]["paths"] == paths
    assert calls[1]["captured"] == len(paths) < calls[0]["captured"]
    assert [h.problem_hash for h in again] == [h.problem_hash for h in first]
    assert [[s.path for s in h.sites] for h in again] == [[s.path for s in h.sites] for h in first]
    # optimize() searches the whole model even with a remembered search
    search(model, (x,), store=store, use_remembered=False, **options)
    assert calls[2]["paths"] is None


def test_another_model_or_input_shape_is_searched_whole(tmp_path, monkeypatch):
    model, x = two_blocks()
    store = KernelStore(tmp_path / "k.sqlite3")
    search(model, (x,), store=store, use_remembered=True, min_share=0.05)
    calls = spy(monkeypatch)
    # min_share 0: which paths are searched is the point, and at batch 1 on a busy CPU no
    # module's timed share need reach 5% (seen once in CI)
    search(model, (x[:1],), store=store, use_remembered=True, min_share=0.0)  # other inputs
    wider = nn.Sequential(Block(), Block(), Block()).eval()
    assert model_key(wider, (x,)) != model_key(model, (x,))
    search(wider, (x,), store=store, use_remembered=True, min_share=0.0)
    assert [c["paths"] for c in calls] == [None, None]


def test_remembered_paths_with_nothing_there_fall_back_to_the_whole_model(tmp_path, monkeypatch):
    model, x = two_blocks()
    store = KernelStore(tmp_path / "k.sqlite3")
    store.remember_search(model_key(model, (x,)), ["0.ln_1"])  # a LayerNorm: under min_share
    calls = spy(monkeypatch)
    said: list[str] = []
    found = search(model, (x,), store=store, use_remembered=True, say=said.append,
                   min_share=0.2)  # fmt: skip
    assert [c["paths"] for c in calls] == [["0.ln_1"], None] and list(found)
    assert "searching the whole model" in said[0]
    assert store.searched(model_key(model, (x,))) != ["0.ln_1"]  # what was found now
