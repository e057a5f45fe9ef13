"""Hot spots of modules whose forward takes *args/**kwargs (every Hugging Face attention and
decoder layer): extracted from the call actually observed, tuples of tensors (rotary (cos, sin))
and keyword flags included; the generated problems run standalone and reproduce the module. On
hand-written equivalents (torch only) and, where transformers is installed, on tiny GPT-2 and
Llama configurations."""

from __future__ import annotations

import types
import warnings

import pytest
import torch
import torch.nn.functional as F
from test_hotspots import reproduces
from torch import nn

from cudaforge.harness.evaluate import run_evaluation
from cudaforge.harness.options import EvalOptions
from cudaforge.harness.problem import Problem
from cudaforge.model.hotspots import find_hotspots
from cudaforge.model.swap import FallbackWarning, restore, stats, swap_in

# ---------------------------------------------------------------- a Llama-style decoder, by hand


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)
        self.eps = eps

    def forward(self, x):
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype)


class Rotary(nn.Module):
    """(cos, sin) for position ids, as Hugging Face's rotary embeddings return them."""

    def __init__(self, head_dim, base=10000.0):
        super().__init__()
        inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2).float() / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x, position_ids):
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class KwargsAttention(nn.Module):
    """GQA attention with RoPE whose forward takes **kwargs and returns (output, None)."""

    def __init__(self, dim=64, heads=4, kv_heads=2):
        super().__init__()
        self.head_dim = dim // heads
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, hidden_states, position_embeddings, attention_mask=None, **kwargs):
        B, T, _ = hidden_states.shape
        shape = (B, T, -1, self.head_dim)
        q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        cos, sin = position_embeddings
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attention_mask, is_causal=attention_mask is None, enable_gqa=True
        )
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1)), None


class SiLUActivation(nn.Module):
    """An activation module of the model's own (as Hugging Face's): no weights, one op."""

    def forward(self, x):
        return F.silu(x)


class SwiGLU(nn.Module):
    def __init__(self, dim=64, hidden=128):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)
        self.act_fn = SiLUActivation()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class KwargsDecoderLayer(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.input_layernorm = RMSNorm(dim)
        self.self_attn = KwargsAttention(dim)
        self.post_attention_layernorm = RMSNorm(dim)
        self.mlp = SwiGLU(dim)

    def forward(self, hidden_states, *args, **kwargs):
        residual = hidden_states
        hidden_states, _ = self.self_attn(self.input_layernorm(hidden_states), *args, **kwargs)
        hidden_states = residual + hidden_states
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class KeyValueCache:
    """Stands for a Hugging Face cache object: not a tensor, not a literal."""


class TinyDecoder(nn.Module):
    """Calls its layers as Hugging Face does: keyword arguments, a (cos, sin) tuple, position
    ids the attention ignores, flags, and a cache object unless use_cache=False."""

    def __init__(self, dim=64, layers=2, vocab=100, mask=False):
        super().__init__()
        self.config = types.SimpleNamespace(use_cache=True)
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.rotary_emb = Rotary(dim // 4)
        self.layers = nn.ModuleList(KwargsDecoderLayer(dim) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.mask = mask

    def forward(self, input_ids, use_cache=None):
        use_cache = self.config.use_cache if use_cache is None else use_cache
        cache = KeyValueCache() if use_cache else None
        hidden = self.embed_tokens(input_ids)
        T = input_ids.shape[1]
        positions = torch.arange(T).unsqueeze(0)
        mask = (
            torch.tril(torch.ones(T, T, dtype=torch.bool)).view(1, 1, T, T) if self.mask else None
        )
        embeddings = self.rotary_emb(hidden, positions)
        for layer in self.layers:
            hidden = layer(
                hidden, position_embeddings=embeddings, attention_mask=mask,
                position_ids=positions, output_attentions=False, past_key_values=cache,
            )  # fmt: skip
        return self.lm_head(self.norm(hidden))


def tiny_decoder(**kw):
    torch.manual_seed(0)
    return TinyDecoder(**kw).eval(), torch.randint(0, 100, (2, 12))


def runs_standalone(hotspot):
    """The problem file alone: Model(*get_init_inputs())(*get_inputs()), and the harness's
    evaluation of the problem against itself (`cudaforge eval PROBLEM PROBLEM` on the CPU)."""
    problem = Problem.from_source(hotspot.problem_source)
    model = problem.make_model()
    with torch.no_grad():
        out = model(*problem.make_inputs())
    outs = [out] if isinstance(out, torch.Tensor) else list(out)
    assert [tuple(o.shape) for o in outs] == [tuple(s.shape) for s in hotspot.sites[0].output_specs]
    same = hotspot.problem_source.replace("class Model(", "class ModelNew(")
    options = EvalOptions(trials=2, timed_runs=2, warmup=1, input_sets=1, device="cpu")
    result = run_evaluation(problem, same, options)
    assert result.status == "ok", result.error
    return True


@pytest.fixture(scope="module")
def decoder_search():
    model, ids = tiny_decoder()
    return model, ids, find_hotspots(model, (ids,), min_share=0.0, max_hotspots=20)


def test_kwargs_attention_yields_the_rope_and_attention_chain(decoder_search):
    _, _, search = decoder_search
    assert not [s for s in search.skipped if "*args" in s.reason], search.summary()
    attention = next(h for h in search if "scaled_dot_product_attention" in h.label)
    assert attention.kind == "chain" and attention.sites[0].path == "layers.0.self_attn"
    assert "cat" in attention.label and "neg" in attention.label  # RoPE is inside
    assert [s.path for s in attention.sites] == ["layers.0.self_attn", "layers.1.self_attn"]
    # q, k, v projections and the (cos, sin) tuple, flattened
    assert attention.shapes == [[2, 12, 64], [2, 12, 32], [2, 12, 32], [1, 12, 16], [1, 12, 16]]
    assert "position_embeddings_0, position_embeddings_1" in attention.problem_source
    # SwiGLU: the gate projection, the model's own SiLU module and the product, one chain; the
    # SiLU module is then no hot spot of its own
    gate = next(h for h in search if h.label == "Linear -> silu -> mul")
    assert gate.kind == "chain" and gate.sites[0].path == "layers.0.mlp"
    assert gate.sites[0].inlined == ["act_fn"]
    assert not [h for h in search if h.sites[0].path.endswith("act_fn")]
    for hotspot in search:
        for i in range(len(hotspot.sites)):
            assert reproduces(hotspot, i)
    assert any("use_cache=False" in note for note in search.notes)


@pytest.mark.parametrize("target", ["KwargsAttention", "KwargsDecoderLayer"])
def test_kwargs_layers_are_extracted_whole(decoder_search, target):
    model, ids, _ = decoder_search
    (layer,) = find_hotspots(model, (ids,), min_share=0.0, targets=[target])
    assert layer.kind == "layer" and layer.sites[0].path.startswith("layers.0")
    assert len(layer.sites) == 2  # both layers: one problem
    source = layer.problem_source
    # the tensors of the call are the inputs; position_ids is never read, so it is no input;
    # attention_mask=None and output_attentions=False are specialized on
    assert "def forward(self, hidden_states, position_embeddings_0, position_embeddings_1):" in (
        source
    )
    assert "position_ids" not in source and "is_causal = True" in source
    call = layer.sites[0].call.describe()
    assert call["kwargs"]["attention_mask"] == "None"
    assert call["kwargs"]["position_ids"].startswith("ignored int64[1, 12]")
    assert call["kwargs"]["position_embeddings"] == ["tensor 1", "tensor 2"]
    assert reproduces(layer, 0) and reproduces(layer, 1)
    assert runs_standalone(layer)


def test_a_causal_mask_input_is_generated_as_observed():
    model, ids = tiny_decoder(mask=True)
    (layer,) = find_hotspots(model, (ids,), min_share=0.0, targets=["KwargsAttention"])
    assert "torch.tril(torch.ones((12, 12), dtype=torch.bool)).expand((1, 1, 12, 12))" in (
        layer.problem_source
    )
    assert layer.sites[0].call.describe()["kwargs"]["attention_mask"] == "tensor 3"
    assert reproduces(layer) and runs_standalone(layer)


def test_a_cache_object_is_refused_with_the_way_out():
    model, ids = tiny_decoder()
    search = find_hotspots(model, {"input_ids": ids, "use_cache": True}, min_share=0.0)
    refused = [s for s in search.skipped if s.path == "layers.0.self_attn"]
    assert refused and "KeyValueCache" in refused[0].reason
    assert "use_cache=False" in refused[0].reason
    assert not search.notes  # the call said use_cache itself


def test_swapped_kwargs_layer_matches_calls_by_their_template(decoder_search):
    model, ids, _ = decoder_search
    (layer,) = find_hotspots(model, (ids,), min_share=0.0, targets=["KwargsAttention"])
    expected = model(ids, use_cache=False)
    same = layer.problem_source.replace("class Model(", "class ModelNew(")
    for site in layer.sites:
        swap_in(site, same, layer.problem_source, name=f"attention {site.path}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            torch.testing.assert_close(model(ids, use_cache=False), expected, rtol=0, atol=0)
        assert [v["kernel_calls"] for v in stats(model).values()] == [1, 1]
        with pytest.warns(FallbackWarning, match="KeyValueCache"):
            torch.testing.assert_close(model(ids, use_cache=True), expected, rtol=0, atol=0)
    finally:
        restore(model)


# ---------------------------------------------------------------- the real classes


class _RotaryFunction(nn.Module):
    """A function wrapped in a module object at import and held by no model: the `kernels`
    package does this to transformers' apply_rotary_pos_emb (transformers 5.25)."""

    def forward(self, q, k, cos, sin):
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


APPLY_ROTARY = _RotaryFunction()


class WrappedRopeAttention(KwargsAttention):
    def forward(self, hidden_states, position_embeddings, attention_mask=None, **kwargs):
        B, T, _ = hidden_states.shape
        shape = (B, T, -1, self.head_dim)
        q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        cos, sin = position_embeddings
        q, k = APPLY_ROTARY(q, k, cos.unsqueeze(1), sin.unsqueeze(1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1)), None


class WrappedRopeBlock(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.rotary_emb = Rotary(dim // 4)
        self.self_attn = WrappedRopeAttention(dim)

    def forward(self, hidden):
        positions = torch.arange(hidden.shape[1]).unsqueeze(0)
        return self.self_attn(hidden, position_embeddings=self.rotary_emb(hidden, positions))[0]


def test_a_module_the_model_does_not_hold_is_traced_through():
    torch.manual_seed(0)
    model, x = WrappedRopeBlock().eval(), torch.randn(2, 12, 64)
    search = find_hotspots(model, (x,), min_share=0.0, max_hotspots=20)
    assert not [s for s in search.skipped if "submodule" in s.reason], search.summary()
    attention = next(h for h in search if "scaled_dot_product_attention" in h.label)
    assert "cat" in attention.label and "neg" in attention.label  # the wrapped RoPE, inlined
    assert reproduces(attention)
    (layer,) = find_hotspots(model, (x,), min_share=0.0, targets=["WrappedRopeAttention"])
    assert layer.kind == "layer" and reproduces(layer) and runs_standalone(layer)


def _hf_models():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    gpt2_config = {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 64, "vocab_size": 128,
                       "bos_token_id": 0, "eos_token_id": 0}  # fmt: skip
    llama_config = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
                        "max_position_embeddings": 64}  # fmt: skip
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(**gpt2_config))
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(**llama_config))
    return {"gpt2": gpt2.eval(), "llama": llama.eval()}


@pytest.fixture(scope="module")
def hf_models():
    return _hf_models()


@pytest.mark.parametrize(
    "name, layers",
    [("gpt2", ["GPT2Attention", "GPT2Block"]), ("llama", ["LlamaAttention", "LlamaDecoderLayer"])],
)
def test_hugging_face_layers(hf_models, name, layers):
    model = hf_models[name]
    ids = torch.randint(0, 128, (2, 16))
    search = find_hotspots(model, (ids,), min_share=0.0, max_hotspots=20)
    assert not [s for s in search.skipped if "*args" in s.reason], search.summary()
    attention = next(h for h in search if "scaled_dot_product_attention" in h.label)
    assert attention.kind == "chain" and attention.sites[0].path.endswith("attn")
    if name == "llama":  # SwiGLU's gate, with Hugging Face's own activation module inside
        assert any(h.label == "Linear -> silu -> mul" for h in search), search.summary()
    for hotspot in search:
        assert reproduces(hotspot)
    for target in layers:
        (layer,) = find_hotspots(model, (ids,), min_share=0.0, targets=[target])
        assert layer.kind == "layer" and type(layer.sites[0].module).__name__ == target
        assert reproduces(layer) and runs_standalone(layer)
