"""`rollout_engine='auto'` on a machine with vLLM: the trainer starts its own real `vllm serve`
(`rollout_engine='managed_vllm'`), trains with vLLM's samples at the trainer's policy version, restarts a server that
dies mid-batch (re-publishing the current weights before it gets requests again), and leaves no vLLM process or
folder behind.

One run of `tests/fixtures/server_lifecycle_script.py` (two GRPO steps, SGD with a large learning rate, so θ_1 is
far from θ_0) in a subprocess with its own TMPDIR, its vLLM API server SIGKILLed at the first reward of step 1.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.real_vllm.conftest import REPO

SCRIPT = REPO / "tests" / "fixtures" / "server_lifecycle_script.py"


def vllm_processes(tmp: Path) -> list[int]:
    """Processes (guard, API server, engine core) whose command line or environment names a folder under `tmp`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:
            continue
        if str(tmp).encode() in text and (b"vllm" in text) and int(entry.name) != os.getpid():
            found.append(int(entry.name))
    return found


def test_auto_trains_on_managed_vllm_and_a_server_killed_mid_batch_comes_back_with_the_current_weights(
        vllm_install, served_model_path, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "THUNDERSYNC_VLLM_PYTHON": str(vllm_install.python)}
    env.pop("THUNDERSYNC_VLLM", None)  # tests/conftest.py turned the automatic search off; a user's machine has it on
    done = subprocess.run([sys.executable, str(SCRIPT), served_model_path, str(tmp_path), "--engine", "auto",
                           "--kill-server-at-step", "1"], env=env, capture_output=True, text=True, timeout=900)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "rollout_engine='auto' chose 'managed_vllm'" in log and "vLLM rollout server(s) ready in" in log
    result = torch.load(tmp_path / "result.pt")
    assert result["engine"] == "managed_vllm" and result["restarts"] == 1.0
    # the restarted server loads θ_0 from the run's folder and must get θ_1 back before serving step 1's resent
    # requests: sampler and learner log-probs then agree to FP32 rounding (θ_0's would not, after SGD at 0.05)
    assert len(result["logp_differences"]) == 2 and max(result["logp_differences"]) <= 1e-4, result
    deadline = time.monotonic() + 30
    while (vllm_processes(tmp) or list(tmp.glob("thundersync-*"))) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert vllm_processes(tmp) == [] and list(tmp.glob("thundersync-*")) == []


def test_a_model_a_cpu_vllm_cannot_serve_is_refused_before_any_server_starts(vllm_install, tmp_path):
    """Head size 16 (vLLM's CPU attention has no kernel for it): refused by name at construction, from the real
    installation's build, with no 40-second server start first; 'auto' falls back to the embedded server."""
    from transformers import Qwen3Config

    from benchmarks.parity import cpu_config
    from trl_thundersync import ThunderSyncGRPOConfig
    from trl_thundersync.errors import UnsupportedOptionError

    model_config = Qwen3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    named = dict(rollout_vllm=str(vllm_install.python))
    started = time.monotonic()
    with pytest.raises(UnsupportedOptionError, match="cannot serve this model.*head_dim=16"):
        cpu_config(ThunderSyncGRPOConfig, tmp_path, rollout_engine="managed_vllm", **named).settle_rollout_engine(
            model_config)
    choice = cpu_config(ThunderSyncGRPOConfig, tmp_path, **named).settle_rollout_engine(model_config)
    assert choice.engine == "embedded_server" and "head_dim=16" in choice.reason
    assert time.monotonic() - started < 30  # probes of the installation, not a server start
