"""find_hotspots on the four models of the real-architectures issue, in bf16, on the GPU (the
H200): GPT2LMHeadModel(GPT2Config()) batch 8 seq 1024, a 2-layer Llama (hidden 2048, GQA) batch 4
seq 2048, resnet50 batch 64 channels_last, vit_b_16 batch 64. Each extracted problem runs
standalone and reproduces its module; the shares are disjoint (they add up to the coverage, at
most 100%); nothing is refused for taking *args/**kwargs; the coverage is printed.

Run on the GPU machine with:  python -m pytest tests/test_models_gpu.py -m gpu -v -s
(about 2-3 minutes; benchmarks/models_hotspots.py prints the same reports.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import models_hotspots

import cudaforge

NEEDS = {"gpt2": "transformers", "llama": "transformers", "resnet50": "torchvision",
         "vit_b_16": "torchvision"}  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("name", models_hotspots.MODELS)
def test_issue_model_hotspots(name):
    pytest.importorskip(NEEDS[name])
    report = models_hotspots.run_model(name, "cuda")
    print("\n" + models_hotspots.describe(report))
    hotspots = report["hotspots"]
    assert hotspots, report["refused"]
    for hotspot in hotspots:
        assert hotspot["standalone"] and hotspot["matches"], hotspot
        assert hotspot["dtype"] == "bfloat16" or "int64" in hotspot["dtype"], hotspot
    shares = [h["share"] for h in hotspots]
    assert all(s > 0 for s in shares)
    assert report["coverage"] == pytest.approx(sum(shares)) and sum(shares) <= 1.0 + 1e-6
    assert not [r for r in report["refused"] if "*args" in r["reason"]], report["refused"]
    if name in ("gpt2", "llama"):
        assert any("scaled_dot_product_attention" in h["label"] for h in hotspots)
    # the largest hot spot's problem through the harness (a worker of the default pool), as its
    # own candidate: `cudaforge eval PROBLEM PROBLEM`; bf16 is judged against the fp32 reference
    torch.cuda.empty_cache()
    source = hotspots[0]["problem_source"]
    same = source.replace("class Model(", "class ModelNew(")
    result = cudaforge.evaluate(source, same, trials=2, timed_runs=5, warmup=2, traced_runs=0,
                                ignore_guards=["no_own_kernels"])  # torch code as the candidate
    assert result.status == "ok", result.error
    print(f"{name}: {hotspots[0]['name']} through the harness: ok, {result.tolerances}")


STORE = Path(__file__).resolve().parents[1] / "benchmarks" / "runs" / "models" / "store.sqlite3"


@pytest.mark.gpu
def test_gpt2_training_step_with_a_stored_kernel_keeps_the_gradients(tmp_path):
    # the kernels a real model wrote for GPT-2 (benchmarks/runs/models, store committed), applied
    # with load(training=True): at least one swapped, one step's gradients as eager's
    pytest.importorskip("transformers")
    import shutil

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import models_optimize

    store = tmp_path / "store.sqlite3"
    shutil.copy(STORE, store)  # load() re-verifies and may write: never the committed file
    eager, inputs = models_optimize.training_model("gpt2", "cuda", small=False)
    mine = models_optimize.copy.deepcopy(eager)
    loaded = cudaforge.load(mine, inputs, store=store, training=True, inplace=True,
                            max_hotspots=6, min_share=0.02)  # fmt: skip
    print("\n" + loaded.report())
    assert loaded.swapped, [(h.name, h.status, h.detail) for h in loaded.hotspots]
    grad_err, loss_err = models_optimize.gradient_error(eager, mine, inputs)
    print(f"largest relative gradient difference {grad_err:.3g}, loss {loss_err:.3g}")
    assert grad_err < 0.02 and loss_err < 1e-3
