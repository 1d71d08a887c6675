"""Publication time at 1–100 M parameters (issue 40's ladder): θ pushed to the rollout servers and acknowledged.

    python -m benchmarks.publish_ladder [--sizes 1m,10m,43m,100m] [--publishes 3] [--no-vllm]

For each size of `benchmarks.memory_ladder` (the tiny builder's Qwen3 shapes, FP32), the median seconds of
`engine.publish` (what the trainer logs as `thundersync/publish_seconds`) over `--publishes` versions, each with
the weights perturbed so every publication carries new values:
- the embedded server (one replica, `trl_thundersync.serve`), full weights;
- a real `vllm serve` (vLLM 0.32 CPU from `.venv-vllm`, when it is there, started as the package starts it): a
  rank-8 LoRA adapter on q_proj/v_proj, then full weights by checkpoint reload.
Measured on this two-core machine, one run; the servers share the cores with the learner.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch

from benchmarks.memory_ladder import SIZES


def _perturb(model, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=generator) * 1e-3)


def _publish_times(engine, model, publishes: int) -> list[float]:
    times = []
    for version in range(1, publishes + 1):
        _perturb(model, version)
        times.append(engine.publish(model, version))
    return times


def embedded(model_dir: str, publishes: int) -> list[float]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_thundersync.serve.launcher import start_embedded_engine
    from trl_thundersync.types import SamplingParams

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    engine = start_embedded_engine(model, tokenizer, SamplingParams(8, temperature=1.0), replicas=1)
    try:
        return _publish_times(engine, model, publishes)
    finally:
        engine.close()


def real_vllm(model_dir: str, publishes: int) -> dict[str, list[float]]:
    """One server per size (LoRA enabled, as the package starts it): the adapter first, while the server still holds
    the base it started with, then full weights by checkpoint reload."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_thundersync.rollout.vllm_client import VLLMServerEngine
    from trl_thundersync.rollout.vllm_launch import VLLMServerProcess, find_vllm
    from trl_thundersync.types import SamplingParams

    server = VLLMServerProcess(find_vllm(Path(".venv-vllm")), model_dir, port=0).start()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    params = SamplingParams(max_new_tokens=8, eos_token_ids=(tokenizer.eos_token_id,),
                            pad_token_id=tokenizer.pad_token_id)
    out = {}
    try:
        for kind, publisher in (("vllm_lora", "lora"), ("vllm_reload", "reload")):
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
            if publisher == "lora":
                model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
            engine = VLLMServerEngine([server.url], tokenizer, params, publisher=publisher, startup_timeout=60.0)
            try:
                out[kind] = _publish_times(engine, model, publishes)
            finally:
                engine.close()
    finally:
        server.stop()
    return out


def main(argv: list[str] | None = None) -> None:
    from trl_thundersync.tiny.model import save_tiny_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1m,10m,43m,100m")
    parser.add_argument("--publishes", type=int, default=3)
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("outputs/publish_ladder.json"))
    args = parser.parse_args(argv)
    vllm = not args.no_vllm and Path(".venv-vllm/bin/python").exists()
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for size in args.sizes.split(","):
            hidden, layers = SIZES[size]
            model_dir = str(save_tiny_model(Path(work) / size, hidden_size=hidden, num_layers=layers))
            row = {"size": size, "embedded": embedded(model_dir, args.publishes)}
            if vllm:
                row.update(real_vllm(model_dir, args.publishes))
            rows.append(row)
            print(json.dumps({k: v if k == "size" else round(statistics.median(v), 3) for k, v in row.items()}),
                  flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    print(f"{'size':>5} {'embedded s':>11} {'vLLM reload s':>14} {'vLLM LoRA s':>12}")
    for row in rows:
        cells = [f"{statistics.median(row[k]):.3f}" if k in row else "-" for k in ("embedded", "vllm_reload",
                                                                                 "vllm_lora")]
        print(f"{row['size']:>5} {cells[0]:>11} {cells[1]:>14} {cells[2]:>12}")


if __name__ == "__main__":
    main()
