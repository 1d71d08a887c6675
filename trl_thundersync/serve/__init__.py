"""The embedded rollout server: a `transformers` model behind the subset of vLLM's HTTP API that
`rollout.vllm_client.VLLMServerEngine` uses, so the same client drives CPU runs and tests here and vLLM on GPUs.

    python -m trl_thundersync.serve --model PATH --port 8000 [--host 127.0.0.1] [--max-in-flight 16]
    with ServerThread(EmbeddedServer(PATH)) as server: ...   # in this process, on a daemon thread (server.url)

- `app.py`: routes, versioned full-weight swaps (`POST /thundersync/update_weights`), LoRA adapters.
- `protocol.py`: request validation and vLLM-shaped response bodies.
- `generation.py`: the decoding loop (the embedded engine's sampling arithmetic, `rollout/sampling.py`, per-request
  seeds) and prompt scoring (`prompt_logprobs`: the server can be an OPD teacher for `distill.teacher_server`).

Every answer carries `x-thundersync-policy-version`; a weight swap waits for in-flight requests to finish, so no
request ever mixes two versions. The real thing, for comparison (GPU):

    VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --weight-transfer-config '{"backend": "nccl"}' \
        --logprobs-mode processed_logprobs --max-logprobs -1                       # full fine-tuning
    VLLM_SERVER_DEV_MODE=1 VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 vllm serve MODEL --enable-lora \
        --max-lora-rank R --logprobs-mode processed_logprobs                        # LoRA adapters
"""

from __future__ import annotations

__all__ = ["EmbeddedServer", "ServerThread", "make_http_server"]


def __getattr__(name: str):
    if name in __all__:
        from . import app

        return getattr(app, name)
    raise AttributeError(f"module 'trl_thundersync.serve' has no attribute {name!r}")
