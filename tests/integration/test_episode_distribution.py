"""Real generation against stock TRL on the real environment: `scripts/episode_distribution.py --env swe`.

The warm-started tiny agent on the bundled SWE tasks with the bubblewrap-sandboxed shell, greedy (top_k=1): stock
`trl.GRPOTrainer` (transformers generation, its tool loop) and ThunderSync through the default engine (the embedded
vLLM-API server, agent_protocol="trl") must give the same episodes token for token — the model's turns, the real
tool output between them, the masks — so turns, tool calls and lengths agree exactly, not only in distribution.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None and not os.environ.get("THUNDERSYNC_REQUIRE_SANDBOX"),
                       reason="the SWE environment's shell runs in bubblewrap"),
]
ROOT = Path(__file__).resolve().parents[2]


def test_greedy_swe_episodes_are_token_identical_to_stock_trl(tmp_path, tiny_agent):
    out = tmp_path / "episodes.json"
    env = dict(os.environ, TRL_EXPERIMENTAL_SILENCE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "episode_distribution.py"), "--env", "swe", "--prompts", "4",
         "--generations", "2", "--top_k", "1", "--max_tool_calling_iterations", "5", "--engine", "auto",
         "--protocols", "trl", "--model", tiny_agent, "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    stock, ours = json.loads(out.read_text())["table"]
    assert stock["episodes"] == ours["episodes"] == 8
    assert stock["tool_calls_mean"] > 0 and stock["tool_tokens_mean"] > 0, "the agent must really run tools"
    assert ours["identical_episodes"] == 1.0, (stock, ours)
    for key in ("turns", "tool_calls", "model_tokens", "tool_tokens", "completion_tokens"):
        assert ours[f"{key}_mean"] == stock[f"{key}_mean"], key
