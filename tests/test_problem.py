"""cudaforge.Problem: loading KernelBench problems (string, file, dev set), size overrides, inputs and
models, and shrinking every dev problem to a size a CPU can run."""

from __future__ import annotations

import importlib.util
import json
import pickle
import warnings

import pytest
import torch

from cudaforge.harness.problem import Problem, dev_set_path

RELU = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)

batch_size = 4096
dim = 393216
shape = (batch_size, dim)

def get_inputs():
    return [torch.randn(*shape)]

def get_init_inputs():
    return []
"""

SMALL_BUDGET = 16 << 20  # bytes of inputs + parameters + outputs after shrinking


def _dev_ids() -> list[tuple[int, int]]:
    try:
        return [(p.level, p.problem_id) for p in Problem.list_dev_set()]
    except FileNotFoundError:
        return []


DEV_IDS = _dev_ids()
needs_dev_set = pytest.mark.skipif(not DEV_IDS, reason="KernelBench dev set not found")


def test_sizes_override_constants_and_what_derives_from_them():
    p = Problem.from_source(RELU, name="relu", sizes={"batch_size": 2, "dim": 8})
    assert p.size_constants() == {"batch_size": 2, "dim": 8}
    assert p.constants()["shape"] == (2, 8)  # derived after the override line
    (x,) = p.make_inputs(seed=0)
    assert x.shape == (2, 8)
    assert "dim = 8  # cudaforge: size override" in p.source
    assert p.base_source == RELU and "dim = 393216" in p.source
    # without overrides, nothing is rewritten
    assert Problem.from_source(RELU).source == RELU


def test_bad_overrides_say_what_is_overridable():
    with pytest.raises(ValueError, match="overridable: batch_size, dim, shape"):
        Problem.from_source(RELU, sizes={"batch": 2})
    with pytest.raises(TypeError, match="int constant"):
        Problem.from_source(RELU, sizes={"dim": 2.5})
    with pytest.raises(TypeError, match="must be an int"):
        Problem.from_source(RELU, sizes={"dim": "8"})


def test_bad_sources_are_refused_clearly():
    with pytest.raises(ValueError, match="does not define Model"):
        Problem.from_source("def get_inputs(): return []\ndef get_init_inputs(): return []\n")
    with pytest.raises(ValueError, match="syntax error at line 2"):
        Problem.from_source("x = 1\ndef (:\n")
    with pytest.raises(TypeError):
        Problem.from_source(b"class Model: pass")


def test_hash_follows_what_runs():
    a = Problem.from_source(RELU, sizes={"dim": 8})
    b = Problem.from_source(RELU, sizes={"dim": 16})
    assert a.hash != b.hash
    assert a.hash == Problem.from_source(RELU, sizes={"dim": 8}).hash
    assert a.with_sizes(dim=16).hash == b.hash


def test_inputs_are_drawn_as_under_torch_manual_seed_without_formatting_stacks(monkeypatch):
    # the same values torch.manual_seed(seed) gives; but not through it: its XPU and MTIA
    # seeding formats a Python stack per call, 0.7 ms before every timed run on the H200's host
    import random
    import traceback

    p = Problem.from_source(RELU, sizes={"batch_size": 3, "dim": 5})
    torch.manual_seed(7)
    expected = torch.randn(3, 5)  # RELU's get_inputs
    random.seed(0)
    formatted = []
    real = traceback.format_stack
    monkeypatch.setattr(traceback, "format_stack", lambda *a, **k: formatted.append(1) or real())
    (x,) = p.make_inputs(seed=7)
    assert torch.equal(x, expected)
    assert formatted == []
    assert random.random() == random.Random(7).random()  # Python's generator is seeded too


def test_inputs_and_models_are_seeded():
    p = Problem.from_source(RELU, sizes={"batch_size": 3, "dim": 5})
    assert torch.equal(p.make_inputs(seed=1)[0], p.make_inputs(seed=1)[0])
    assert not torch.equal(p.make_inputs(seed=1)[0], p.make_inputs(seed=2)[0])
    linear = Problem.from_source(
        "import torch\nclass Model(torch.nn.Module):\n"
        "    def __init__(self, n):\n        super().__init__()\n"
        "        self.fc = torch.nn.Linear(n, n)\n"
        "    def forward(self, x):\n        return self.fc(x)\n"
        "n = 4\ndef get_inputs():\n    return [torch.randn(2, n)]\n"
        "def get_init_inputs():\n    return [n]\n"
    )
    w1 = linear.make_model(seed=3).fc.weight
    assert torch.equal(w1, linear.make_model(seed=3).fc.weight)
    assert not torch.equal(w1, linear.make_model(seed=4).fc.weight)


def test_build_module_is_fresh_each_time():
    p = Problem.from_source(RELU, sizes={"dim": 8})
    m1, m2 = p.build_module(), p.build_module()
    m1.dim = 99
    assert m2.dim == 8 and m1.Model is not m2.Model


def test_from_file_and_round_trips(tmp_path):
    path = tmp_path / "19_ReLU.py"
    path.write_text(RELU)
    p = Problem.from_file(path, sizes={"dim": 8})
    assert p.name == "19_ReLU" and p.origin == str(path)
    again = Problem.from_dict(json.loads(json.dumps(p.to_dict())))
    assert again.source == p.source and again.sizes == {"dim": 8}
    assert pickle.loads(pickle.dumps(p)) == p


def test_shrink_brings_a_6gb_problem_to_a_cpu_size():
    p = Problem.from_source(RELU, name="relu")
    assert p.footprint()["input_bytes"] == 4096 * 393216 * 4
    small = p.shrink(SMALL_BUDGET)
    fp = small.footprint()
    assert fp["input_bytes"] + fp["output_bytes"] <= SMALL_BUDGET
    (x,) = small.make_inputs()
    model = small.make_model()
    assert model(x).shape == x.shape


def test_dev_set_path_from_environment(tmp_path, monkeypatch):
    row = {"level": 9, "problem_id": 1, "name": "1_relu", "code": RELU}
    (tmp_path / "dev_problems.jsonl").write_text(json.dumps(row) + "\n")
    monkeypatch.setenv("CUDAFORGE_KERNELBENCH", str(tmp_path))
    assert dev_set_path() == tmp_path / "dev_problems.jsonl"
    p = Problem.from_dev_set(9, 1, sizes={"dim": 4})
    assert (p.level, p.problem_id, p.name, p.origin) == (9, 1, "1_relu", "dev:9/1")
    with pytest.raises(KeyError, match="level 9 has ids 1"):
        Problem.from_dev_set(9, 2)
    monkeypatch.setenv("CUDAFORGE_KERNELBENCH", str(tmp_path / "nowhere.jsonl"))
    with pytest.raises(FileNotFoundError, match="CUDAFORGE_KERNELBENCH"):
        Problem.from_dev_set(9, 1)


@needs_dev_set
def test_dev_set_has_200_problems():
    levels = [lvl for lvl, _ in DEV_IDS]
    assert len(DEV_IDS) == 200
    assert (levels.count(1), levels.count(2), levels.count(3)) == (80, 80, 40)


@needs_dev_set
@pytest.mark.parametrize("level,problem_id", DEV_IDS, ids=[f"L{a}-{b}" for a, b in DEV_IDS])
def test_dev_problem_builds_small_and_makes_inputs(level, problem_id):
    p = Problem.from_dev_set(level, problem_id)
    if "einops" in p.source and importlib.util.find_spec("einops") is None:
        pytest.skip("this problem imports einops, which is not installed")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        small = p.shrink(SMALL_BUDGET)
        module = small.build_module()
        inputs = small.make_inputs(seed=0, module=module)
        assert inputs and any(isinstance(x, torch.Tensor) for x in inputs)
        fp = small.footprint(forward=False)
        # a model too big for a quick CPU build (architecture constants, not sizes) is built
        # on the meta device: construction and shapes are still checked. One that cannot be
        # built on meta (fp is None: it calls .item() in __init__) is built on the CPU.
        too_big = fp is not None and fp["param_bytes"] > 64 << 20
        device = "meta" if too_big else "cpu"
        model = small.make_model(device=device, module=module)
        assert isinstance(model, torch.nn.Module)
        if fp is not None:
            tensor_bytes = sum(x.numel() * x.element_size() for x in inputs if torch.is_tensor(x))
            assert tensor_bytes == fp["input_bytes"]
