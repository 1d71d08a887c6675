"""Shared fixtures: one tiny offline model folder per session, CPU-only configs, deterministic rollouts."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)
# rollout_engine='auto' picks managed vLLM servers when it finds a vLLM installation (trainers/rollout_choice.py).
# The suite's tests pin what they test against; the automatic search is off here (and in the processes they start),
# so 'auto' means the embedded server. The real-vLLM layer names its installation (tests/real_vllm/conftest.py).
TEST_VLLM_PYTHON = os.environ.pop("THUNDERSYNC_VLLM_PYTHON", None)  # a developer's own vLLM, for the real layer
os.environ["THUNDERSYNC_VLLM"] = "0"


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    from trl_thundersync.tiny.model import save_tiny_model

    return str(save_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-qwen3"))


@pytest.fixture(scope="session")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


@pytest.fixture(scope="session")
def tiny_agent(tmp_path_factory):
    """The warm-started tool-calling tiny agent (tiny/agent.py), built once per session (about a minute)."""
    from trl_thundersync.tiny.agent import save_tiny_agent_model

    return str(save_tiny_agent_model(tmp_path_factory.mktemp("agent") / "tiny-agent"))


@pytest.fixture(scope="module")
def runner():
    """A tool runner with its own event loop thread (async tools), as the trainers build one."""
    from trl_thundersync.envs.harness.agent_loop import ToolRunner

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    r = ToolRunner(loop=loop)
    yield r
    r.close()
    loop.call_soon_threadsafe(loop.stop)


UNIT = Path(__file__).resolve().parent / "unit"  # tests/unit and its folders, which mirror the package's

# Test layers (README "Tests"): every test in tests/unit that needs none of a model, a sandbox or a spawned
# process is marked `fast`, so `pytest -m fast` runs the pure layer alone in seconds. A unit module that needs one
# is listed below with what it needs; a test that asks for a model fixture is marked `model` whatever its module.
_UNIT_MODULE_MARKS = {
    "test_rollout_local.py": ("spawn", "model"),
    "test_server_lifecycle.py": ("spawn",),
    "test_teacher_server.py": ("spawn", "model"),
    "test_distill_vocab_map.py": ("model",),
    "test_grading_integrity.py": ("sandbox",),
    "test_task_envs.py": ("sandbox",),
    "test_sandbox.py": ("sandbox",),
    "test_sandbox_hardening.py": ("sandbox",),
    "test_suite_eval.py": ("sandbox", "model"),
    "test_sandbox_cgroup.py": ("sandbox",),
    "test_sandbox_launcher.py": ("sandbox",),
}
_MODEL_FIXTURES = frozenset({"tiny_model_path", "tokenizer", "tiny_agent"})
_HEAVY_MARKS = frozenset({"slow", "sandbox", "spawn", "model", "gpu"})


def pytest_collection_modifyitems(config, items):
    for item in items:
        unit = item.path.resolve().is_relative_to(UNIT)
        for name in _UNIT_MODULE_MARKS.get(item.path.name, ()) if unit else ():
            item.add_marker(getattr(pytest.mark, name))
        if _MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)
        if unit and not _HEAVY_MARKS & {m.name for m in item.iter_markers()}:
            item.add_marker(pytest.mark.fast)
