"""Tiny offline models for CPU runs, the examples and the tests — nothing is downloaded.

- `model`: a Qwen3-style model with random weights and a byte-level tokenizer trained on a built-in corpus, saved as
  a normal Hugging Face folder (`trl-thundersync-tiny DIR`, or `python -m trl_thundersync.tiny.model DIR`);
- `agent`: that model warm-started to call tools, so agentic examples have real multi-turn work
  (`python -m trl_thundersync.tiny.agent DIR [--suite thermostat]`, about three minutes on two cores, once; a
  suite's `Suite.warm_start` adds its own transcripts);
- `moe`: a Qwen3-MoE variant whose config declares a router load-balancing coefficient.
"""

from .model import build_tiny_model, build_tiny_tokenizer, save_tiny_model

__all__ = ["build_tiny_model", "build_tiny_tokenizer", "save_tiny_model"]
