"""Hot spots' shares of the forward are disjoint and add up to at most 100% (measured inside the
forward by cudaforge/model/attribution.py), with the coverage reported; on a ResNet-50-like and
a ViT-like model written by hand (torchvision's structure: bottlenecks sharing one in-place ReLU,
`out += identity`, nn.MultiheadAttention), and on torchvision's own classes where it imports."""

from __future__ import annotations

import itertools

import pytest
import torch
from test_hotspots import reproduces
from test_hotspots_layers import runs_standalone
from torch import nn

from cudaforge.model.attribution import attribute
from cudaforge.model.hotspots import _overlaps, find_hotspots

# ---------------------------------------------------------------- ResNet-like, by hand


class Bottleneck(nn.Module):
    """torchvision's Bottleneck: one ReLU module called three times, in place."""

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


def _stage(inplanes, planes, blocks, stride):
    downsample = nn.Sequential(
        nn.Conv2d(inplanes, planes * 4, 1, stride=stride, bias=False), nn.BatchNorm2d(planes * 4)
    )
    layers = [Bottleneck(inplanes, planes, stride, downsample)]
    layers += [Bottleneck(planes * 4, planes) for _ in range(blocks - 1)]
    return nn.Sequential(*layers)


class TinyResNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = _stage(16, 16, 2, 1)
        self.layer2 = _stage(64, 32, 2, 2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(128, classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# ---------------------------------------------------------------- ViT-like, by hand


class EncoderBlock(nn.Module):
    """torchvision's ViT EncoderBlock: nn.MultiheadAttention and an MLP Sequential."""

    def __init__(self, dim=32, heads=2, mlp=64):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.dropout = nn.Dropout(0.0)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(
            nn.Linear(dim, mlp), nn.GELU(), nn.Dropout(0.0), nn.Linear(mlp, dim), nn.Dropout(0.0)
        )

    def forward(self, x):
        y = self.ln_1(x)
        y, _ = self.self_attention(y, y, y, need_weights=False)
        x = self.dropout(y) + x
        return x + self.mlp(self.ln_2(x))


class TinyViT(nn.Module):
    def __init__(self, dim=32, patch=8, image=32, layers=2, classes=10):
        super().__init__()
        self.conv_proj = nn.Conv2d(3, dim, patch, stride=patch)
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embedding = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        self.layers = nn.Sequential(*[EncoderBlock(dim) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.conv_proj(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.layers(x + self.pos_embedding)
        return self.head(self.ln(x)[:, 0])


def _built(cls, *shape, channels_last=False):
    torch.manual_seed(0)
    model = cls().eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 2.0)
    x = torch.randn(*shape)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)
    return model, x


def check_disjoint(search):
    """Every pair of chosen sites is disjoint, the shares add up to the coverage, at most 1."""
    sites = [s for h in search for s in h.sites]
    for a, b in itertools.combinations(sites, 2):
        assert not _overlaps(a, b), (a.path, a.label, b.path, b.label)
    assert search.coverage is not None
    assert all(0 < h.share <= 1 for h in search), [(h.name, h.share) for h in search]
    assert sum(h.share for h in search) == pytest.approx(search.coverage)
    assert 0 < search.coverage <= 1.0 + 1e-9
    assert f"covering {search.coverage:.1%}" in search.summary()
    assert [h.share for h in search] == sorted((h.share for h in search), reverse=True)


def test_resnet_like_shares_are_disjoint():
    model, x = _built(TinyResNet, 2, 3, 64, 64, channels_last=True)
    search = find_hotspots(model, (x,), min_share=0.0, max_hotspots=30)
    check_disjoint(search)
    chains = [h for h in search if "Conv2d -> BatchNorm2d -> ReLU" in h.label]
    assert chains and all(h.kind == "chain" for h in chains)
    # a conv inside a chosen chain is not also a hot spot of its own
    chain_convs = {f"{s.path}.{n}" for h in chains for s in h.sites for n in ("conv1", "conv2")}
    assert not chain_convs & {s.path for h in search if h.kind == "module" for s in h.sites}
    for hotspot in search:
        assert reproduces(hotspot)
    assert runs_standalone(chains[0])


def test_vit_like_shares_are_disjoint_and_attention_is_found():
    model, x = _built(TinyViT, 2, 3, 32, 32)
    search = find_hotspots(model, (x,), min_share=0.0, max_hotspots=30)
    check_disjoint(search)
    attention = [h for h in search if h.label == "MultiheadAttention"]
    assert attention and attention[0].kind == "module" and len(attention[0].sites) == 2
    for hotspot in search:
        assert reproduces(hotspot)
    assert runs_standalone(attention[0])


def test_a_region_and_the_modules_inside_it_are_not_both_counted():
    """attribute() itself, given overlapping sites on purpose: the range inside another counts
    for nothing, so the total never passes the forward."""
    model, x = _built(TinyResNet, 2, 3, 64, 64)
    search = find_hotspots(model, (x,), min_share=0.0, max_hotspots=30)
    conv = find_hotspots(model, (x,), min_share=0.0, targets=["layer1.0.conv1"])[0]
    assert conv.kind == "module"
    chain = next(h for h in search if _overlaps(h.sites[0], conv.sites[0]))
    assert chain.kind == "chain" and chain.sites[0].path == "layer1.0"
    found = attribute(model, (x,), {}, [chain.sites, conv.sites], "cpu")
    assert found.ms[0] > 0 and found.ms[1] == 0.0  # conv1 ran inside the chain's range
    assert 0 < found.coverage <= 1 and not found.missed
    alone = attribute(model, (x,), {}, [conv.sites], "cpu")
    assert alone.ms[0] > 0  # on its own it is counted


# ---------------------------------------------------------------- torchvision's own classes


@pytest.mark.parametrize("name", ["resnet", "vit"])
def test_torchvision_models(name):
    try:
        import torchvision
    except Exception as exc:  # noqa: BLE001 - a CPU torch with a CUDA torchvision fails to import
        pytest.skip(f"torchvision does not import here: {type(exc).__name__}")
    torch.manual_seed(0)
    if name == "resnet":
        model = torchvision.models.resnet50(num_classes=10).eval()
        model = model.to(memory_format=torch.channels_last)
        x = torch.randn(1, 3, 64, 64).to(memory_format=torch.channels_last)
    else:
        model = torchvision.models.VisionTransformer(
            image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64
        ).eval()
        x = torch.randn(2, 3, 32, 32)
    search = find_hotspots(model, (x,), min_share=0.0, max_hotspots=40)
    check_disjoint(search)
    for hotspot in search:
        assert reproduces(hotspot)
