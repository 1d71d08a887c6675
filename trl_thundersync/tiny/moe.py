"""Tiny offline Qwen3-MoE model (random weights, the tiny tokenizer of `tiny.py`), for the MoE router-loss tests.

Its config declares `router_aux_loss_coef` (Qwen3-MoE's default 0.001, or the value given) and
`output_router_logits=False`, like the published Qwen3-MoE checkpoints: TRL 1.16 then enables the load-balancing
auxiliary loss on default settings (`GRPOConfig.router_aux_loss_coef=None` reads the model's coefficient).

    python -m trl_thundersync.tiny.moe ./tiny-qwen3-moe
"""

from __future__ import annotations

import argparse
from pathlib import Path

MOE_HIDDEN, MOE_LAYERS = 32, 2  # the tiny MoE model's width and depth


def build_tiny_moe_model(tokenizer, hidden_size: int = MOE_HIDDEN, num_layers: int = MOE_LAYERS, num_experts: int = 4,
                         experts_per_token: int = 2, router_aux_loss_coef: float = 0.001, seed: int = 0):
    """A Qwen3-MoE causal LM sized for a CPU test: every layer sparse, `num_experts` experts, top-k routing."""
    from transformers import Qwen3MoeConfig

    from .model import model_from_config, tiny_shape

    config = Qwen3MoeConfig(
        **tiny_shape(tokenizer, hidden_size, num_layers),
        moe_intermediate_size=hidden_size,
        num_experts=num_experts,
        num_experts_per_tok=experts_per_token,
        decoder_sparse_step=1,
        norm_topk_prob=True,
        router_aux_loss_coef=router_aux_loss_coef,
        output_router_logits=False,
    )
    return model_from_config(config, tokenizer, seed)


def save_tiny_moe_model(path: str | Path, router_aux_loss_coef: float = 0.001, seed: int = 0) -> Path:
    """Create (or reuse, if it has this shape) a tiny MoE model folder at `path` and return it."""
    from .model import built_shape, save_model_folder

    return save_model_folder(path, lambda tokenizer: build_tiny_moe_model(
        tokenizer, router_aux_loss_coef=router_aux_loss_coef, seed=seed), shape=built_shape(MOE_HIDDEN, MOE_LAYERS))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", nargs="?", default="tiny-qwen3-moe", help="output folder")
    parser.add_argument("--router-aux-loss-coef", type=float, default=0.001)
    args = parser.parse_args(argv)
    print(f"tiny MoE model and tokenizer written to {save_tiny_moe_model(args.path, args.router_aux_loss_coef)}")


if __name__ == "__main__":
    main()
