"""Hot spots of the four models of the real-architectures issue, in bf16: GPT-2 (GPT2LMHeadModel of
the default GPT2Config, batch 8, seq 1024), a Llama decoder (LlamaForCausalLM, 2 layers, hidden
2048, GQA, batch 4, seq 2048), torchvision's resnet50 (batch 64, 224x224, channels_last) and
vit_b_16 (batch 64). Random weights from the configs; nothing is downloaded.

For each model: the hot spots, their shares of the forward (measured inside it, disjoint), the
coverage, what was refused and why, and per hot spot whether its problem runs standalone (a fresh
Model on fresh inputs) and whether its Model, with the captured weights, reproduces the captured
module's outputs.

    python benchmarks/models_hotspots.py                      # all four, on the GPU
    python benchmarks/models_hotspots.py gpt2 llama --out hotspots.json
    python benchmarks/models_hotspots.py --small --device cpu # tiny configurations (a smoke run)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cudaforge.harness.problem import Problem
from cudaforge.model.codegen import load_problem
from cudaforge.model.hotspots import find_hotspots
from cudaforge.model.swap_compare import compare

MODELS = ("gpt2", "llama", "resnet50", "vit_b_16")


def build(name: str, device, dtype=torch.bfloat16, small: bool = False):
    """(model, example inputs) of one of the issue's models, random weights, in eval mode."""
    torch.manual_seed(0)
    if name in ("gpt2", "llama"):
        import transformers

        if name == "gpt2":
            config = transformers.GPT2Config(
                **({"n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 64} if small else {})
            )
            model = transformers.GPT2LMHeadModel(config)
            batch, seq = (2, 32) if small else (8, 1024)
        else:
            size = (
                {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "vocab_size": 256}
                if small else
                {"hidden_size": 2048, "intermediate_size": 5632, "num_attention_heads": 16,
                 "num_key_value_heads": 4}
            )  # fmt: skip
            config = transformers.LlamaConfig(num_hidden_layers=2, **size)
            model = transformers.LlamaForCausalLM(config)
            batch, seq = (2, 32) if small else (4, 2048)
        ids = torch.randint(0, config.vocab_size, (batch, seq), device=device)
        return model.to(device=device, dtype=dtype).eval(), (ids,)
    import torchvision

    if name == "resnet50":
        model = torchvision.models.resnet50()
        batch, side = (2, 64) if small else (64, 224)
        model = model.to(device=device, dtype=dtype, memory_format=torch.channels_last).eval()
        x = torch.randn(batch, 3, side, side, device=device, dtype=dtype)
        return model, (x.to(memory_format=torch.channels_last),)
    if name == "vit_b_16":
        if small:
            model = torchvision.models.VisionTransformer(
                image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64
            )
            batch, side = 2, 32
        else:
            model = torchvision.models.vit_b_16()
            batch, side = 64, 224
        x = torch.randn(batch, 3, side, side, device=device, dtype=dtype)
        return model.to(device=device, dtype=dtype).eval(), (x,)
    raise ValueError(f"no model {name!r}; models: {', '.join(MODELS)}")


def check_hotspot(hotspot, device) -> dict:
    """Whether the problem runs standalone and reproduces the captured module's outputs."""
    report: dict = {"standalone": False, "matches": False}
    try:
        problem = Problem.from_source(hotspot.problem_source)
        model = problem.make_model(device, 0)
        with torch.no_grad():
            out = model(*problem.make_inputs(0, device))
        outs = [out] if isinstance(out, torch.Tensor) else list(out)
        report["standalone"] = all(bool(torch.isfinite(o.float()).all()) for o in outs)
        if not report["standalone"]:
            report["error"] = "the standalone run gives NaN/Inf"
        module = load_problem(hotspot.problem_source)
        with torch.device(device):
            rebuilt = module.Model(*module.get_init_inputs())
        rebuilt.load_state_dict(hotspot.state_dict())
        site = hotspot.sites[0]
        with torch.no_grad():
            got = rebuilt(*hotspot.inputs())
            expected = site.run_original(site.inputs)
        got = [got] if isinstance(got, torch.Tensor) else list(got)
        worst, problem_text = compare(got, expected)
        report["matches"] = not problem_text
        report["max_abs_err"] = worst.max_abs_err if worst is not None else math.inf
        if problem_text:
            report["error"] = problem_text
    except Exception as exc:  # noqa: BLE001 - a failed check is reported, not raised
        report["error"] = f"{type(exc).__name__}: {exc}"
    return report


def run_model(name: str, device, small: bool = False, max_hotspots: int = 8) -> dict:
    """find_hotspots on one model, each hot spot checked: a JSON-able report."""
    began = time.perf_counter()
    model, inputs = build(name, device, small=small)
    search = find_hotspots(model, inputs, max_hotspots=max_hotspots)
    hotspots = []
    for hotspot in search:
        hotspots.append(
            {
                "name": hotspot.name,
                "kind": hotspot.kind,
                "label": hotspot.label,
                "share": hotspot.share,
                "model_ms": hotspot.model_ms,
                "own_ms": hotspot.ms,
                "sites": [s.path or "(root)" for s in hotspot.sites],
                "dtype": hotspot.dtype,
                "shapes": hotspot.shapes,
                "problem_source": hotspot.problem_source,
                **check_hotspot(hotspot, device),
            }
        )
    report = {
        "model": name,
        "device": str(device),
        "forward_ms": search.forward_ms,
        "coverage": search.coverage,
        "hotspots": hotspots,
        "refused": [{"path": s.path, "what": s.what, "reason": s.reason} for s in search.skipped],
        "notes": list(search.notes),
        "seconds": time.perf_counter() - began,
    }
    del model, search
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    return report


def describe(report: dict) -> str:
    coverage = report["coverage"]
    covered = f"{coverage:.1%}" if coverage is not None else "not measured"
    lines = [
        (
            f"== {report['model']} on {report['device']}: forward {report['forward_ms']:.3g} ms, "
            f"hot spots cover {covered} ({report['seconds']:.0f} s)"
        )
    ]
    for h in report["hotspots"]:
        verdict = "ok" if h["standalone"] and h["matches"] else f"FAILED ({h.get('error', '')})"
        lines.append(
            f"  {h['share']:6.1%}  {h['kind']:<6} {h['name']}  [{len(h['sites'])} site(s), "
            f"{h['dtype']} {h['shapes']}] problem: {verdict}"
        )
    lines.append(f"  sum of shares: {sum(h['share'] for h in report['hotspots']):.1%}")
    lines += [f"  note: {n}" for n in report["notes"]]
    if report["refused"]:
        lines.append("  refused:")
        lines += [
            f"    {r['path'] or '(root)'} ({r['what']}): {r['reason']}" for r in report["refused"]
        ]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", choices=MODELS, help="default: all four")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="tiny configurations")
    parser.add_argument("--max-hotspots", type=int, default=8)
    parser.add_argument("--out", help="write the reports as JSON to this file")
    args = parser.parse_args(argv)
    reports, failed = [], 0
    for name in args.models or MODELS:
        try:
            report = run_model(name, args.device, args.small, args.max_hotspots)
        except Exception as exc:  # noqa: BLE001 - one model's failure is reported, not fatal
            report = {"model": name, "error": f"{type(exc).__name__}: {exc}"}
            print(f"== {name}: FAILED: {report['error']}", flush=True)
            failed += 1
        else:
            print(describe(report), flush=True)
            failed += sum(not (h["standalone"] and h["matches"]) for h in report["hotspots"])
        reports.append(report)
    if args.out:
        Path(args.out).write_text(json.dumps(reports, indent=2, default=str))
        print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
