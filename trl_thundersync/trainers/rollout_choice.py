"""Which rollout engine a run samples with: `rollout_engine`, with "auto" resolved once per trainer from what this
machine has and what the model is.

    choice = choose_rollout_engine(args, model_config, uses_rollout_func=False)
    choice.engine, choice.reason      # "managed_vllm", "vLLM found at .venv-vllm/bin/python (CPU build)"

"auto" (the default) picks, in order:

    use_vllm=True                          -> "vllm_server"   (TRL's fields: servers the user started)
    rollout_func (GRPO)                    -> "trl"           (TRL's own batch generation)
    a vLLM installation that can serve it  -> "managed_vllm"  (`vllm serve` processes started for the run)
    otherwise                              -> "embedded_server", with the reason vLLM was not used

A vLLM installation is `rollout_vllm`, else `$THUNDERSYNC_VLLM_PYTHON`, else a `.venv-vllm` made by
`scripts/setup_vllm.sh` in the working directory or a parent (`THUNDERSYNC_VLLM=0` turns the search off). "Can serve
it": a CPU build of vLLM needs a supported attention head size (`rollout.vllm_shapes`); `vllm_weight_publisher='http'`
(the embedded servers' format) keeps the embedded server. `rollout_engine='managed_vllm'` asked for by name refuses
what "auto" would fall back from, naming the reason.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigurationError, UnsupportedOptionError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RolloutChoice:
    """The engine a run samples with, and why."""

    engine: str  # a concrete `RolloutEngine` value (never "auto")
    reason: str  # one sentence, logged when "auto" decided
    install: Any = None  # the `VLLMInstall` for "managed_vllm", else None


def _managed_blocker(args: Any, model_config: Any) -> tuple[Any, str | None]:
    """(install, None) when managed vLLM servers can serve this run, else (install or None, why not)."""
    from ..rollout.vllm_launch import find_vllm
    from ..rollout.vllm_shapes import cpu_attention_head_size_error

    install = find_vllm(args.rollout_vllm)  # a named installation that cannot import vLLM raises here
    if install is None:
        return None, ("no vLLM installation was found (scripts/setup_vllm.sh makes .venv-vllm; rollout_vllm or "
                      "$THUNDERSYNC_VLLM_PYTHON names another)")
    if args.vllm_weight_publisher == "http":
        return install, "vllm_weight_publisher='http' is the embedded servers' weight format"
    problem = cpu_attention_head_size_error(model_config) if install.cpu and model_config is not None else None
    if problem is not None:
        return install, f"the CPU build of vLLM at {install.python} cannot serve this model ({problem})"
    return install, None


def choose_rollout_engine(args: Any, model_config: Any, *, uses_rollout_func: bool = False) -> RolloutChoice:
    """The engine `args.rollout_engine` stands for with this model (`model_config`: its Hugging Face config)."""
    engine = args.rollout_engine
    if engine == "managed_vllm":
        install, blocker = _managed_blocker(args, model_config)
        if blocker is not None:
            error = ConfigurationError if install is None else UnsupportedOptionError
            raise error(f"rollout_engine='managed_vllm': {blocker}; use rollout_engine='embedded_server' or 'auto'")
        return RolloutChoice("managed_vllm", f"asked for; vLLM at {install.python}", install)
    if engine != "auto":
        return RolloutChoice(engine, "asked for")
    if args.use_vllm:
        return RolloutChoice("vllm_server", "use_vllm=True: the vLLM servers at vllm_server_* / vllm_server_base_urls")
    if uses_rollout_func:
        return RolloutChoice("trl", "rollout_func generates with TRL's own batch generation")
    install, blocker = _managed_blocker(args, model_config)
    if blocker is None:
        build = "CPU" if install.cpu else "GPU"
        return RolloutChoice("managed_vllm", f"vLLM found at {install.python} ({build} build); it can serve this "
                             "model", install)
    return RolloutChoice("embedded_server", f"{blocker}; set rollout_engine='managed_vllm' to require vLLM")


def log_choice(choice: RolloutChoice) -> None:
    """One line on the main process (RANK 0 or unset) when "auto" decided: which engine and why."""
    if os.environ.get("RANK", "0") == "0":
        logger.warning("rollout_engine='auto' chose %r: %s", choice.engine, choice.reason)
