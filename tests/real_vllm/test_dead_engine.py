"""A real vLLM server whose engine core dies: the batch fails within seconds naming vLLM's message, not after the
client waited `restart_timeout` (300 s) for a restart that never comes (measured before the fix: 300.6 s, naming
`ConnectionRefusedError`).

The session server's engine core process is killed (SIGKILL): what any crash of vLLM's engine looks like from
outside — an unsupported CPU attention shape (`Unsupported CPU attention configuration: head_dim=16` at the first
forward, the case measured in issue 24; the package now refuses such a model before the first batch,
`rollout/vllm_shapes.py`), an out-of-memory kill. vLLM then answers HTTP 500 `EngineCore encountered an issue ...`
and its API server exits. The server does not come back, so this test runs last in the folder (`ends_server`).
The stub version (and a restart that is waited for): `tests/unit/rollout/test_dead_engine.py`.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from tests.real_vllm.conftest import current_session_server
from trl_thundersync.errors import DeadEngineError
from trl_thundersync.rollout.vllm_client import VLLMServerEngine
from trl_thundersync.types import RolloutRequest, SamplingParams

DEADLINE_S = 30.0  # the bound; measured here: 0.1 s from the first request


def engine_core_pids(group: int) -> list[int]:
    """The processes of process group `group` (the server's) that vLLM named `VLLM::EngineCore`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if int(rest[2]) == group and name.startswith("VLLM::EngineCor"):
            found.append(int(entry.name))
    return found


@pytest.mark.ends_server
def test_a_dead_engine_fails_the_batch_within_seconds_naming_vllms_error(real_vllm):
    process = current_session_server(real_vllm).process  # after test_restart: TRL's `trl vllm-serve`
    (core,) = engine_core_pids(process.pid)  # the server runs in its own session: its process group is its pid
    tokenizer = AutoTokenizer.from_pretrained(real_vllm.model)
    engine = VLLMServerEngine([real_vllm.url], tokenizer,
                              SamplingParams(max_new_tokens=8, eos_token_ids=(tokenizer.eos_token_id,)),
                              startup_timeout=30.0, restart_timeout=300.0)
    try:
        os.kill(core, signal.SIGKILL)
        start = time.perf_counter()
        with pytest.raises(DeadEngineError, match="EngineCore encountered an issue") as failure:
            engine.start_batch([RolloutRequest(index=i, group=0, prompt_ids=(5, 6, 7), seed=i) for i in range(4)],
                               policy_version=0)
            list(engine.results())
        elapsed = time.perf_counter() - start
    finally:
        engine.close()
    assert elapsed < DEADLINE_S, elapsed
    assert real_vllm.url in str(failure.value) and "server's log" in str(failure.value)
    process.wait(DEADLINE_S)  # vLLM's API server shuts down after a dead-engine answer
