"""cudaforge/agents/target.py and prompts/contract.txt: the Coder is told the exact target that
cudaforge.compile builds for, and how to pass NVRTC options and name expressions."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import cudaforge
from cudaforge.agents.loop import Prompts
from cudaforge.agents.target import target_text

# the repository's prompts (an installed cudaforge.prompts may be another checkout's)
PROMPTS = Path(__file__).resolve().parent.parent / "prompts"
H200 = (
    "sm_90a (NVIDIA H200, compute capability 9.0: wgmma, TMA and thread-block clusters are "
    "available; also mma.sync tensor cores (fp16, bf16, tf32, fp8), cp.async; up to 227 KB of "
    "shared memory per block)"
)


def test_target_text_names_what_the_target_offers():
    assert target_text("sm_90a", "NVIDIA H200") == H200
    plain = target_text("sm_90")
    assert plain.startswith("sm_90 (compute capability 9.0: TMA and thread-block clusters")
    assert "wgmma needs sm_90a" in plain
    assert "PTX that the driver compiles at load" in target_text("compute_90", "NVIDIA H100")
    ampere = target_text("sm_80", "NVIDIA A100")
    assert "cp.async" in ampere and "wgmma" not in ampere and "163 KB" in ampere
    assert "tcgen05" in target_text("SM_100A")
    for bad in ("hopper", "sm90", "90"):
        with pytest.raises(ValueError):
            target_text(bad)


def test_the_contract_renders_with_its_target_and_leaves_no_placeholder():
    prompts = Prompts(PROMPTS)
    assert "{target}" in prompts.text("contract")
    text = prompts.render("contract", target=target_text("sm_90a", "NVIDIA H200"))
    assert re.findall(r"\{\w+\}", text) == []
    assert f"The target: {H200}." in text
    assert "load_inline" in text and "tens of seconds" in text


def test_the_contract_names_every_parameter_of_compile():
    text = Prompts(PROMPTS).text("contract")
    for name, parameter in inspect.signature(cudaforge.compile).parameters.items():
        if parameter.default is inspect.Parameter.empty:
            assert name in text, name
        else:  # as the contract spells it: name="kernel.cu", options=(), arch=None
            assert f"{name}={parameter.default!r}".replace("'", '"') in text, name
    assert "options=[" in text and "name_expressions=[" in text
