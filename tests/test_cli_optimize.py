"""`cudaforge optimize my_model.py` on a script that builds a Hugging Face model (a tiny GPT-2 on
the CPU), answered through the file: provider: the first run stops waiting for replies (exit 4)
and lists the prompt files, the second resumes from the transcripts with the replies written
in between (FIXTURE replies: each hot spot's own reference code as the candidate) and prints the
report with its end-to-end line."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from test_cli import cli

from cudaforge.agents.file_provider import _file_word

pytest.importorskip("transformers")

SCRIPT = """
import torch
import transformers


def get_model():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=64, n_head=4, n_positions=64,
                                     vocab_size=512)
    return transformers.GPT2LMHeadModel(config).eval()


def get_inputs():
    return (torch.randint(0, 512, (2, 32)),)
"""


def test_optimize_a_hugging_face_script_through_the_file_provider(tmp_path):
    script = tmp_path / "my_model.py"
    script.write_text(SCRIPT)
    replies, transcripts = tmp_path / "replies", tmp_path / "transcripts"
    args = ["optimize", str(script), "--llm", f"file:{replies}?wait=0", "--rounds", "1",
            "--transcripts", str(transcripts), "--store", str(tmp_path / "store.sqlite3"),
            "--no-profile", "--targets", "lm_head", "--min-share", "0"]  # fmt: skip
    env = {"CUDAFORGE_CACHE_DIR": str(tmp_path / "cache")}
    first = cli(*args, env=env)
    assert first.returncode == 4, first.stderr[-3000:]
    assert "end-to-end on the example inputs" in first.stdout  # the report, kernels or not
    prompts = sorted(replies.glob("*/coder-r1-l0.prompt.md"))
    assert prompts and all(str(p) in first.stdout for p in prompts), first.stdout[-2000:]
    logs = sorted(transcripts.glob("*.jsonl"))
    assert len(logs) == len(prompts)
    for log in logs:  # FIXTURE reply: the hot spot's own Model, renamed, as the candidate
        start = json.loads(log.read_text().splitlines()[0])
        source = re.sub(r"\bclass Model\(", "class ModelNew(", start["problem_source"])
        reply = replies / _file_word(start["problem"]) / "coder-r1-l0.reply.md"
        assert reply.with_name("coder-r1-l0.prompt.md") in prompts
        reply.write_text(f"FIXTURE reply\n```python\n{source}\n```\n")
        os.utime(reply, (time.time() - 5, time.time() - 5))
    second = cli(*args, "--site-graphs", "auto", env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "end-to-end on the example inputs" in second.stdout
    # asked for, and on the CPU (or with no kernel kept, the reference as its own candidate)
    # the report says why there are none
    assert re.search(r"site graphs: none(, no kernel was swapped in| on cpu \(CUDA graphs need "
                     r"a GPU\))", second.stdout), second.stdout[-2000:]  # fmt: skip
    assert "waiting for" not in second.stdout
    for log in logs:
        kinds = [json.loads(line)["kind"] for line in log.read_text().splitlines()]
        assert kinds.count("resume") == 1 and "eval" in kinds  # resumed, the reply evaluated
    assert Path(tmp_path / "store.sqlite3").exists()


def test_for_compile_asks_for_the_attention_call_that_torch_compile_makes(tmp_path):
    pytest.importorskip("transformers.masking_utils")
    script = tmp_path / "my_model.py"
    script.write_text(SCRIPT)
    replies = tmp_path / "replies"
    run = cli("optimize", str(script), "--for-compile", "--llm", f"file:{replies}?wait=0",
              "--rounds", "1", "--transcripts", str(tmp_path / "transcripts"), "--store",
              str(tmp_path / "store.sqlite3"), "--no-profile", "--targets",
              "scaled_dot_product_attention", "--min-share", "0",
              env={"CUDAFORGE_CACHE_DIR": str(tmp_path / "cache")})  # fmt: skip
    assert run.returncode == 4, run.stderr[-3000:]
    (prompt,) = replies.glob("*/coder-r1-l0.prompt.md")
    text = prompt.read_text()
    assert "attn_mask = attention_mask" in text and "torch.tril(" in text
