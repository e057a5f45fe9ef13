"""A user's script for `cudaforge optimize`: GPT-2 from Hugging Face (random weights from its
config), bf16, batch 8 x 1024, on the GPU. On the H200:

    python -m cudaforge optimize benchmarks/gpt2_script.py --rounds 5 \\
        --llm "file:benchmarks/runs/models/llm?wait=0" \\
        --transcripts benchmarks/runs/models/gpt2/transcripts \\
        --store benchmarks/runs/models/store.sqlite3
"""

import torch
import transformers


def get_model():
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    return model.to("cuda", torch.bfloat16).eval()


def get_inputs():
    return (torch.randint(0, 50257, (8, 1024), device="cuda"),)
