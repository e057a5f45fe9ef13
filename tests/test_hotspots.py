"""cudaforge/model/hotspots.py and its parts on the CPU: profiling, candidates (leaf modules,
chains, blocks) on an MLP, two transformer blocks and a conv net, and the generated problems: valid
KernelBench sources whose Model, given the captured weights, reproduces the original module's
output."""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cudaforge.harness.problem import Problem
from cudaforge.model.codegen import init_arguments, load_problem
from cudaforge.model.hotspots import HotspotError, find_hotspots
from cudaforge.model.timing import profile_model

# ---------------------------------------------------------------- small models (also used by the
# swap and optimize tests)


class MLP(nn.Module):
    def __init__(self, dim=64, hidden=256):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class NewGELU(nn.Module):
    """The tanh GELU written out, as in GPT-2 codebases: eight elementwise ops."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


class CausalSelfAttention(nn.Module):
    def __init__(self, dim=64, heads=4, context=16):
        super().__init__()
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)
        self.attn_dropout = nn.Dropout(0.1)
        self.heads, self.dim = heads, dim
        mask = torch.tril(torch.ones(context, context)).view(1, 1, context, context)
        self.register_buffer("bias", mask)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.dim, dim=2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class Block(nn.Module):
    """A GPT-2 style transformer block: manual causal attention, NewGELU MLP."""

    def __init__(self, dim=64, heads=4, context=16):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, context)
        self.ln_2 = nn.LayerNorm(dim)
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.act = NewGELU()
        self.c_proj = nn.Linear(4 * dim, dim)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(self.act(self.c_fc(self.ln_2(x))))


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class SdpaBlock(nn.Module):
    """A LLaMA-flavoured block: RMSNorm, scaled_dot_product_attention, SiLU MLP."""

    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.norm = RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.up = nn.Linear(dim, 2 * dim, bias=False)
        self.down = nn.Linear(2 * dim, dim, bias=False)
        self.heads = heads

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(y.transpose(1, 2).reshape(B, T, C))
        return x + self.down(F.silu(self.up(x)))


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
        )  # fmt: skip
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.features(x)), 1))


def build(model_cls, *shape, seed=0):
    torch.manual_seed(seed)
    model = model_cls().eval()
    with torch.no_grad():  # non-trivial norm weights and running statistics
        for module in model.modules():
            if isinstance(module, (nn.LayerNorm, nn.BatchNorm2d, RMSNorm)):
                module.weight.uniform_(0.5, 1.5)
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.2, 0.2)
                module.running_var.uniform_(0.5, 2.0)
    return model, torch.randn(*shape)


def by_label(search, text):
    found = [h for h in search if text in h.label]
    assert found, f"no hot spot with {text!r} in {[h.label for h in search]}"
    return found[0]


def reproduces(hotspot, site_index=0):
    """The generated Model, with the captured weights, gives the site's output exactly."""
    site = hotspot.sites[site_index]
    module = load_problem(hotspot.problem_source)
    model = module.Model(*module.get_init_inputs())
    model.load_state_dict(hotspot.state_dict(site_index))
    with torch.no_grad():
        got = model(*hotspot.inputs(site_index))
        expected = site.run_original(site.inputs)
    got = [got] if isinstance(got, torch.Tensor) else list(got)
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    return True


@pytest.fixture(scope="module")
def mlp():
    model, x = build(MLP, 32, 64)
    return model, x, find_hotspots(model, (x,), min_share=0.0)


@pytest.fixture(scope="module")
def block():
    model, x = build(Block, 4, 16, 64)
    return model, x, find_hotspots(model, (x,), min_share=0.0)


@pytest.fixture(scope="module")
def convnet():
    model, x = build(ConvNet, 4, 3, 32, 32)
    return model, x, find_hotspots(model, (x,), min_share=0.0)


# ---------------------------------------------------------------- profile


def test_profile_gives_time_per_module_and_op(mlp):
    model, x, _ = mlp
    profile = profile_model(model, (x,), repeat=2)
    assert profile.time_kind == "cpu" and profile.forward_ms > 0
    assert {"", "fc1", "act", "fc2"} <= set(profile.modules)
    assert profile.modules["fc1"].leaf and not profile.modules[""].leaf
    assert profile.modules["fc1"].calls == 1
    assert 0 < profile.share("fc1") < 1
    names = {op.name for op in profile.ops}
    assert any("addmm" in n or "linear" in n for n in names), names
    assert "fc1" in profile.table()


# ---------------------------------------------------------------- candidates and problems


def test_mlp_fuses_linear_and_gelu(mlp):
    _, _, search = mlp
    chain = by_label(search, "Linear -> GELU")
    assert chain.kind == "chain" and chain.sites[0].path == ""
    (linear,) = [h for h in search if h.label == "Linear"]
    assert linear.sites[0].path == "fc2"  # fc1 is inside the chain: no overlap
    assert [h.sites[0].path for h in search if h.kind == "module"] == ["fc2"]
    assert all(reproduces(h) for h in search)
    assert 0 < chain.share <= 1 and chain.ms > 0
    assert search.forward_ms > 0 and "Linear -> GELU" in search.summary()


def test_module_problem_keeps_the_real_init_arguments(mlp):
    _, _, search = mlp
    (linear,) = [h for h in search if h.label == "Linear"]
    source = linear.problem_source
    problem = Problem.from_source(source)
    module = problem.build_module()
    assert module.get_init_inputs() == [256, 64, True]
    assert "def __init__(self, in_features, out_features, bias):" in source
    assert "nn.Linear(in_features, out_features, bias=bias)" in source
    (x,) = module.get_inputs()
    assert x.shape == (32, 256) and x.dtype == torch.float32


def test_chain_problem_is_kernelbench_format(mlp):
    _, _, search = mlp
    source = by_label(search, "Linear -> GELU").problem_source
    assert "class Model(nn.Module):" in source
    assert "self.fc1 = nn.Linear(64, 256, bias=True)" in source
    assert "= None" not in source.split("def forward")[1]  # fx's bookkeeping is tidied away
    problem = Problem.from_source(source)
    model = problem.make_model()
    (out,) = [model(*problem.make_inputs())]
    assert out.shape == (32, 256)


def test_transformer_block(block):
    _, _, search = block
    attention = by_label(search, "softmax")
    assert attention.kind == "chain" and attention.sites[0].path == "attn"
    assert "matmul" in attention.label and "masked_fill" in attention.label
    # the attention core takes the qkv projection's output; the causal mask is a buffer of it
    assert attention.shapes == [[4, 16, 192]]
    assert "torch.tril(torch.ones((1, 1, 16, 16)))" in attention.problem_source
    gelu = by_label(search, "NewGELU")
    assert gelu.kind == "block" and gelu.sites[0].path == "act"
    norm = by_label(search, "LayerNorm")
    assert sorted(s.path for s in norm.sites) == ["ln_1", "ln_2"]  # one problem, two sites
    for hotspot in search:
        for i in range(len(hotspot.sites)):
            assert reproduces(hotspot, i)
    names = [h.name for h in search]
    assert len(set(names)) == len(names)


def test_attention_problem_runs_in_the_evaluation_harness(block):
    from cudaforge.harness.evaluate import run_evaluation
    from cudaforge.harness.options import EvalOptions

    _, _, search = block
    source = by_label(search, "softmax").problem_source
    same = source.replace("class Model(", "class ModelNew(")  # the reference as its own candidate
    options = EvalOptions(trials=2, timed_runs=3, warmup=1, input_sets=1, device="cpu")
    assert torch.is_grad_enabled()
    result = run_evaluation(Problem.from_source(source), same, options)
    assert torch.is_grad_enabled()  # the evaluation leaves autograd as it found it
    assert result.status == "ok", result.error
    assert result.correct


def test_sdpa_block(tmp_path):
    model, x = build(SdpaBlock, 2, 8, 64)
    search = find_hotspots(model, (x,), min_share=0.0)
    sdpa = by_label(search, "scaled_dot_product_attention")
    assert sdpa.kind == "chain"
    assert sdpa.shapes == [[2, 8, 192]]  # the views and the chunk that feed it are inside
    norm = by_label(search, "RMSNorm")
    assert norm.kind == "block" and norm.sites[0].path == "norm"
    assert "self.weight = nn.Parameter(" in norm.problem_source
    silu = by_label(search, "silu")
    assert silu.kind == "chain" and "Linear" in silu.label
    for hotspot in search:
        assert reproduces(hotspot)
    saved = norm.save(tmp_path / "rms")
    assert (saved / "problem.py").read_text() == norm.problem_source
    weights = torch.load(saved / "weights.pt")
    inputs = torch.load(saved / "inputs.pt")
    module = load_problem((saved / "problem.py").read_text())
    rebuilt = module.Model(*module.get_init_inputs())
    rebuilt.load_state_dict(weights)
    torch.testing.assert_close(rebuilt(*inputs), model.norm(x), rtol=0, atol=0)


def test_conv_net(convnet):
    _, _, search = convnet
    chains = [h for h in search if "Conv2d -> BatchNorm2d -> ReLU" in h.label]
    assert len(chains) == 2
    assert all(h.sites[0].path == "features" for h in chains)
    source = chains[0].problem_source
    assert ".eval()" in source  # batch norm as observed, with running statistics
    assert "padding=(1, 1)" in source
    for hotspot in search:
        assert reproduces(hotspot)
    refused = {s.path: s.reason for s in search.skipped}
    assert "in place" in refused["features.2"]


def test_targets_select_hot_spots(block):
    model, x, _ = block
    only = find_hotspots(model, (x,), targets=["attn"])
    assert {s.path.split(".")[0] for h in only for s in h.sites} == {"attn"}
    by_kind = find_hotspots(model, (x,), targets=["block"])
    assert [h.kind for h in by_kind] == ["block"]
    assert len(find_hotspots(model, (x,), min_share=0.0, max_hotspots=2)) == 2


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)
        self.norm = nn.LayerNorm(32)

    def forward(self, x):
        if x.sum() > 0:  # control flow on values: fx cannot trace this
            x = x * 2
        return self.norm(torch.relu(self.fc(x)))


def test_untraceable_forward_keeps_its_leaf_modules():
    model, x = build(DataDependent, 8, 32)
    search = find_hotspots(model, (x,), min_share=0.0)
    assert {h.sites[0].path for h in search} == {"fc", "norm"}
    refused = [s for s in search.skipped if s.path == ""]
    assert refused and "cannot trace" in refused[0].reason


class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x)


class OnlyPython(nn.Module):
    """No torch.nn module and a forward fx cannot follow: nothing to extract."""

    def forward(self, x):
        return x.exp() if float(x.mean()) > -100 else x


def test_errors_name_what_and_why():
    with pytest.raises(HotspotError, match=r"Broken does not run on the example inputs.*shapes"):
        find_hotspots(Broken(), (torch.randn(4, 5),))
    with pytest.raises(HotspotError, match=r"no hot spot found in OnlyPython.*cannot trace"):
        find_hotspots(OnlyPython(), (torch.randn(4, 5),), min_share=0.0)
    with pytest.raises(TypeError, match="example_inputs"):
        find_hotspots(Broken(), 3)


def test_init_arguments_read_back():
    conv = nn.Conv2d(3, 8, (3, 5), stride=2, padding=(1, 2), groups=1, bias=False)
    assert dict(init_arguments(conv))["kernel_size"] == (3, 5)
    assert dict(init_arguments(conv))["bias"] is False
    attention = nn.MultiheadAttention(32, 4, bias=False, batch_first=True)
    arguments = dict(init_arguments(attention))
    assert arguments["bias"] is False and arguments["batch_first"] is True
    with pytest.raises(Exception, match="not a torch.nn module"):
        init_arguments(RMSNorm(8))


def test_multihead_attention_module_with_keyword_arguments():
    class Wrapper(nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = nn.MultiheadAttention(32, 4, batch_first=True)

        def forward(self, x):
            return self.mha(x, x, x, need_weights=False)[0]

    model, x = build(Wrapper, 2, 8, 32)
    search = find_hotspots(model, (x,), min_share=0.0, targets=["MultiheadAttention"])
    mha = search[0]
    assert mha.kind == "module" and mha.sites[0].path == "mha"
    assert "need_weights = False" in mha.problem_source
    assert reproduces(mha)
    with torch.no_grad():
        out = mha.sites[0].run_original(mha.inputs())
    assert len(out) == 1  # (output, None): the None is not a problem output


def test_inputs_keep_their_layout():
    from cudaforge.model.codegen import NotExtractable, _input_source

    permuted = torch.randn(2, 5, 3, 4).permute(0, 2, 3, 1)
    made = eval(_input_source(permuted), {"torch": torch})
    assert made.shape == permuted.shape and made.stride() == permuted.stride()
    tokens = torch.randint(3, 50, (4, 7))
    made = eval(_input_source(tokens), {"torch": torch})
    assert made.dtype == torch.int64 and made.min() >= 0 and made.max() < 50
    mask = eval(_input_source(torch.rand(3, 3) < 0.5), {"torch": torch})
    assert mask.dtype == torch.bool
    with pytest.raises(NotExtractable, match="strided view"):
        _input_source(torch.randn(8, 8)[:, ::2])


def test_profiling_for_hot_spots_has_kineto_release_cupti_unless_the_user_said(monkeypatch):
    """Kineto leaves CUPTI attached after a session unless TEARDOWN_CUPTI is "1"; cudaforge's
    profiling sets it for the process, and keeps a value the user set."""
    from cudaforge.model.timing import release_cupti_after_profiling

    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    assert release_cupti_after_profiling() is True
    assert os.environ["TEARDOWN_CUPTI"] == "1"
    assert release_cupti_after_profiling() is False
    monkeypatch.setenv("TEARDOWN_CUPTI", "0")
    assert release_cupti_after_profiling() is False
    assert os.environ["TEARDOWN_CUPTI"] == "0"
