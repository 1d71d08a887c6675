"""Confirming by content, not only by label, that a vLLM server holds the weights just published to it.

vLLM (>= 0.32, dev mode) hashes its own parameters on request:

    POST /weight_checker {"action": "checksum"} -> {"checksums": {"dp0:pp0:pcp0:tp0:<param name>": "<sha256 hex>"}}

one SHA-256 per parameter over its bytes as the server holds them (`vllm/model_executor/model_loader/
weight_checksum.py`): the server's dtype, vLLM's names (`.base_layer.` inside a LoRA wrapper), and vLLM's fused
layouts — `qkv_proj` = cat(q_proj, k_proj, v_proj) and `gate_up_proj` = cat(gate_proj, up_proj) along dim 0, the
stacking vLLM's Llama-family `load_weights` performs (`STACKED`). `expected_digest` computes the same hash from the
published checkpoint, one tensor at a time (`safetensors.safe_open`), so nothing but digests is kept in memory.

What the check can and cannot see:

- On CPU, vLLM repacks linear layers into kernel-specific buffers; their parameters then hash as empty tensors
  (`EMPTY_DIGEST`): those are `invisible`, and only the rest (embeddings, norms) is compared. Measured with the CPU
  build of vLLM 0.32: every `*_proj` weight is invisible, embeddings and norms are visible.
- A parameter this module cannot lay out like vLLM does (another fusion, a padded vocabulary, a tensor-parallel
  shard) does not match; it is `unexplained`, not an error: only a parameter that still holds the bytes of the
  previously published version proves a stale reload (`stale`), which is the failure reloading can have (a tensor
  the checkpoint lacks keeps its old value, with no error from vLLM).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

EMPTY_DIGEST = hashlib.sha256(b"").hexdigest()  # what vLLM reports for a parameter repacked away (CPU)
STACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
DTYPES = {"torch.float32": torch.float32, "float32": torch.float32, "torch.bfloat16": torch.bfloat16,
          "bfloat16": torch.bfloat16, "torch.float16": torch.float16, "float16": torch.float16}


@dataclass(frozen=True)
class ContentCheck:
    """One server's parameters, compared with the published version's checkpoint."""

    confirmed: tuple[str, ...]  # parameters whose bytes are the published version's
    stale: tuple[str, ...]  # parameters that still hold the previously published version's bytes: the reload missed
    invisible: tuple[str, ...]  # parameters hashed as empty tensors (CPU: linear layers repacked by vLLM)
    unexplained: tuple[str, ...]  # parameters laid out in a way this module does not reproduce (not an error)


def parameter_name(key: str) -> str:
    """The HF-style name of a `/weight_checker` key: the `dp0:pp0:pcp0:tp0:` prefix and LoRA's `.base_layer` go."""
    return key.rsplit(":", 1)[-1].replace(".base_layer.", ".")


def checkpoint_tensor(read: Callable[[str], torch.Tensor | None], name: str) -> torch.Tensor | None:
    """The tensor `name` as vLLM lays it out, built from checkpoint tensors (`read(name)`, None when absent)."""
    tensor = read(name)
    if tensor is not None:
        return tensor
    for fused, parts in STACKED.items():
        if f".{fused}." in f".{name}":
            pieces = [read(name.replace(fused, part)) for part in parts]
            if all(p is not None for p in pieces):
                return torch.cat(pieces, dim=0)
    return None


def tensor_digest(tensor: torch.Tensor, dtype: torch.dtype) -> str:
    """vLLM's digest of `tensor` held in `dtype`: SHA-256 over its contiguous bytes."""
    data = tensor.detach().to(device="cpu", dtype=dtype).contiguous().view(-1).view(torch.uint8)
    return hashlib.sha256(data.numpy()).hexdigest()


class CheckpointDigests:
    """Digests of one published checkpoint (`model.safetensors` in `folder`), computed per name when first asked."""

    def __init__(self, file: Path, dtype: torch.dtype) -> None:
        self.file, self.dtype = file, dtype
        self._digests: dict[str, str | None] = {}

    def get(self, name: str) -> str | None:
        """The digest vLLM would report for `name`, or None when the checkpoint cannot produce that tensor."""
        if name not in self._digests:
            if not self.file.exists():  # retired: only the digests computed while it was published remain
                return None
            from safetensors import safe_open

            with safe_open(str(self.file), framework="pt") as f:
                keys = set(f.keys())
                tensor = checkpoint_tensor(lambda n: f.get_tensor(n) if n in keys else None, name)
            self._digests[name] = None if tensor is None else tensor_digest(tensor, self.dtype)
        return self._digests[name]


def compare(server: Mapping[str, str], current: CheckpointDigests,
            previous: CheckpointDigests | None) -> ContentCheck:
    """Classify every parameter `server` (`/weight_checker` checksums) reports against the published checkpoint."""
    confirmed, stale, invisible, unexplained = [], [], [], []
    for key, digest in sorted(server.items()):
        name = parameter_name(key)
        if digest == EMPTY_DIGEST:
            invisible.append(name)
            continue
        expected = current.get(name)
        if expected == digest:
            confirmed.append(name)
        elif expected is not None and previous is not None and previous.get(name) == digest:
            stale.append(name)
        else:
            unexplained.append(name)
    return ContentCheck(tuple(confirmed), tuple(stale), tuple(invisible), tuple(unexplained))
