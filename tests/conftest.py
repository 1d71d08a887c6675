"""Shared fixtures: one tiny offline model folder per session, CPU-only configs, deterministic rollouts."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    from trl_thundersync.testing.tiny import save_tiny_model

    return str(save_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-qwen3"))


@pytest.fixture(scope="session")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


@pytest.fixture(scope="session")
def tiny_agent(tmp_path_factory):
    """The warm-started tool-calling tiny agent (testing/tiny_agent.py), built once per session (about a minute)."""
    from trl_thundersync.testing.tiny_agent import save_tiny_agent_model

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
