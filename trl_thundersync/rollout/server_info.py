"""What a rollout server says about itself: its vLLM release, its log-prob mode and how many sequences it batches.

    GET /version                          {"version": "0.27.0"}          (every vLLM; not the embedded server)
    GET /server_info?config_format=json   {"vllm_config": {"model_config": {"logprobs_mode", ...},
                                           "scheduler_config": {"max_num_seqs", ...}, ...}, ...}
                                          (vLLM with VLLM_SERVER_DEV_MODE=1, which TRL's NCCL weight transfer needs
                                          anyway; the embedded server answers the same subset)

Two decisions are made from it, at engine start:

- Concurrency (`default_concurrency`). vLLM batches up to `--max-num-seqs` sequences per step (the resolved value:
  256 by default on GPUs under 70 GiB, 1024 on H100/H200/B200 class GPUs); fewer requests in flight leave its batch
  partly empty, more only queue on the server. Unless `rollout_max_in_flight` is set, the engine keeps each server's
  `max_num_seqs` requests in flight; a server that does not report it counts as `VLLM_DEFAULT_MAX_NUM_SEQS`.
- Log-prob mode (`check_logprobs_mode`), as TRL's GRPO trainer reads it (`get_server_info()["model_config"]
  ["logprobs_mode"]`). The importance-sampling correction divides the learner's probability by the sampler's; vLLM's
  default `raw_logprobs` are the model's softmax before temperature, top-k/p, penalties, so with any of those set
  every ratio is wrong by the same factor the sampling changed. TRL only warns; here it is refused (the run would
  not optimize the objective it reports). With default sampling raw and processed log-probs are the same
  distribution, so nothing is refused. `raw_logits` / `processed_logits` are not log-probs at all: always refused
  while the correction is on. A server that does not report its mode (not in dev mode) is logged once, not refused.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigurationError
from .request_fields import check_server_release, sampling_departures
from .vllm_api import Cancellation, http_call

logger = logging.getLogger(__name__)

VLLM_DEFAULT_MAX_NUM_SEQS = 256  # `vllm serve`'s --max-num-seqs on GPUs under 70 GiB (arg_utils, 0.22 … 0.31)
PROCESSED = "processed_logprobs"
_TOKENIZER_PROBE = "ThunderSync tokenizer probe: 2 + 3 = 5, def add(a, b):"


@dataclass(frozen=True)
class ServerLimits:
    """One server's self-description; every field None when the server does not report it."""

    release: str | None  # vLLM release from GET /version (None: the route is absent, e.g. the embedded server)
    logprobs_mode: str | None  # vllm_config.model_config.logprobs_mode (None: no /server_info, vLLM not in dev mode)
    max_num_seqs: int | None  # vllm_config.scheduler_config.max_num_seqs: sequences the server batches per step


def _get(url: str, path: str, timeout: float, cancel: Cancellation | None) -> Any:
    """The JSON of a GET answered 200; None for any other status or a non-JSON body (the route is optional)."""
    reply = http_call(url, "GET", path, timeout=timeout, cancel=cancel)
    if reply.status != 200:
        return None
    try:
        return reply.json()
    except ValueError:
        return None


def read_limits(url: str, *, timeout: float = 30.0, cancel: Cancellation | None = None) -> ServerLimits:
    """`ServerLimits` of the server at `url` (two GETs; raises `OSError` only when the server does not answer)."""
    version = _get(url, "/version", timeout, cancel)
    info = _get(url, "/server_info?config_format=json", timeout, cancel)
    config = info.get("vllm_config") if isinstance(info, dict) else None
    config = config if isinstance(config, dict) else {}
    model = config.get("model_config") if isinstance(config.get("model_config"), dict) else {}
    scheduler = config.get("scheduler_config") if isinstance(config.get("scheduler_config"), dict) else {}
    seqs = scheduler.get("max_num_seqs")
    release = version.get("version") if isinstance(version, dict) else None
    mode = model.get("logprobs_mode")
    return ServerLimits(release=str(release) if release is not None else None,
                        logprobs_mode=str(mode) if mode is not None else None,
                        max_num_seqs=seqs if isinstance(seqs, int) and not isinstance(seqs, bool) and seqs > 0
                        else None)


def default_concurrency(limits: Sequence[ServerLimits]) -> int:
    """Requests in flight over all servers when `rollout_max_in_flight` is unset: each server's `max_num_seqs`."""
    return sum(lim.max_num_seqs or VLLM_DEFAULT_MAX_NUM_SEQS for lim in limits)


def startup_checks(replicas: Sequence[Any], tokenizer: Any, sampling: Any, extra: Mapping[str, Any], *,
                   importance_sampling: bool) -> None:
    """`VLLMServerEngine`'s checks of connected replicas (`vllm_replicas.Replica`: url, base_model, limits): the
    tokenizer (when given), the vLLM release against the extra request fields, the log-prob mode."""
    for replica in replicas:
        if tokenizer is not None:
            check_server_tokenizer(replica.url, replica.base_model, tokenizer, role="rollout server")
        check_server_release(replica.url, replica.limits.release, extra)
        check_logprobs_mode(replica.url, replica.limits, sampling, extra, importance_sampling=importance_sampling)


def check_logprobs_mode(url: str, limits: ServerLimits, sampling: Any, extra: Mapping[str, Any], *,
                        importance_sampling: bool) -> None:
    """Refuse a server whose log-probs would bias the importance-sampling correction (see the module docstring)."""
    if not importance_sampling:
        return
    mode = limits.logprobs_mode
    fix = (f"restart it with `--logprobs-mode {PROCESSED}` (TRL's `trl vllm-serve` does), or set "
           "vllm_importance_sampling_correction=False")
    if mode is None:
        logger.warning("rollout server %s does not report its --logprobs-mode (GET /server_info needs "
                       "VLLM_SERVER_DEV_MODE=1); the importance-sampling correction needs --logprobs-mode %s, "
                       "which is not checked", url, PROCESSED)
        return
    if mode.endswith("_logits"):
        raise ConfigurationError(f"rollout server {url} runs with --logprobs-mode {mode}: it reports logits, not "
                                 f"log-probs, so the importance-sampling correction would be meaningless; {fix}")
    departures = sampling_departures(sampling, extra)
    if mode != PROCESSED and departures:
        raise ConfigurationError(
            f"rollout server {url} runs with --logprobs-mode {mode}: its log-probs ignore "
            f"{', '.join(departures)}, so every importance-sampling ratio would be biased; {fix}")


def check_server_tokenizer(url: str, model: str, tokenizer: Any, *, role: str, timeout: float = 30.0,
                           error: type[ConfigurationError] = ConfigurationError) -> None:
    """Probe vLLM's `POST /tokenize` at `url` with a fixed text; `error` when `model` splits it into other ids than
    `tokenizer` does. A server without the route (404) is not checked."""
    local = list(tokenizer(_TOKENIZER_PROBE, add_special_tokens=False)["input_ids"])
    body = {"model": model, "prompt": _TOKENIZER_PROBE, "add_special_tokens": False}
    reply = http_call(url, "POST", "/tokenize", body, timeout=timeout)
    if reply.status == 200 and list((reply.json() or {}).get("tokens", local)) != local:
        raise error(f"{role} {url} serves {model!r}, whose tokenizer splits text differently from the "
                                 "trainer's: serve the model's own checkpoint (or its tokenizer)")
