"""Training runs against a real `vllm serve`, as users start them: the examples' scripts as subprocesses with TRL's
`use_vllm=True, vllm_mode="server"` fields, full weights (`vllm_weight_publisher="auto"`, which is "reload" on CPU)
and LoRA adapters, the multi-turn sandboxed quickstart, and GKD/OPD with a teacher served by vLLM.

Order matters inside this module: the LoRA run first (the server's base weights are the ones it started with), then
the full-weight run (which replaces them), then the LoRA run that must refuse that base; `restored_base` puts the
served model's weights and label back for the tests after."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.real_vllm.conftest import REPO, restore_base
from trl_thundersync.rollout.vllm_api import http_call

SCRIPT_ENV = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
VLLM_FIELDS = ("--use_vllm", "true", "--vllm_mode", "server")
LORA_FIELDS = ("--use_peft", "true", "--lora_r", "8", "--lora_alpha", "16", "--lora_target_modules", "q_proj", "v_proj",
               "--lora_dropout", "0", "--vllm_weight_publisher", "lora")  # adapters hot-loaded ("auto" merges them, as
# TRL does); no dropout, so the learner's log-probs are the policy's (TRL's 0.05 default shows up as ~1e-4 here)
TIMEOUT_S = 600


def run_example(script: str, real_vllm, out: Path, *args: str) -> str:
    argv = [sys.executable, str(REPO / "examples" / script), "--model_name_or_path", real_vllm.model,
            "--output_dir", str(out), *VLLM_FIELDS, "--vllm_server_base_url", real_vllm.url, *args]
    done = subprocess.run(argv, cwd=out.parent, env=SCRIPT_ENV, capture_output=True, text=True, timeout=TIMEOUT_S)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{script} failed (rc {done.returncode}):\n{output[-4000:]}"
    return output


def largest_sampling_difference(output: str) -> float:
    """The largest `sampling/sampling_logp_difference/max` a run logged (TRL's metric: |sampler − learner| log-prob)."""
    found = [float(v) for v in re.findall(r"'sampling/sampling_logp_difference/max': '?([0-9.e+-]+)", output)]
    assert found, "the run logged no sampling/sampling_logp_difference/max"
    return max(found)


def weight_label(url: str) -> str:
    reply = http_call(url, "GET", "/weight_info", timeout=30)
    assert reply.status == 200, reply.body
    return reply.json()["weight_version"]


@pytest.fixture(scope="module")
def restored_base(real_vllm, tmp_path_factory):
    yield
    restore_base(real_vllm, tmp_path_factory.mktemp("restore"))


TOY = ("toy_grpo.py", "--config", str(REPO / "configs" / "toy_grpo.yaml"), "--max_steps", "2")


def test_toy_grpo_with_lora_adapters_on_real_vllm(real_vllm, tmp_path, restored_base):
    before = weight_label(real_vllm.url)
    output = run_example(*TOY[:1], real_vllm, tmp_path / "lora", *TOY[1:], *LORA_FIELDS)
    assert "done: 2 optimizer steps, policy version 2" in output
    assert largest_sampling_difference(output) <= 1e-5  # the adapter vLLM sampled with is the learner's
    assert weight_label(real_vllm.url) == before  # adapters only: the base weights and their label are untouched


def test_toy_grpo_with_full_weights_on_real_vllm_reports_the_runs_last_version(real_vllm, tmp_path, restored_base):
    output = run_example(*TOY[:1], real_vllm, tmp_path / "full", *TOY[1:])
    assert "done: 2 optimizer steps, policy version 2" in output
    assert largest_sampling_difference(output) <= 1e-5  # the reloaded weights are the learner's
    assert re.fullmatch(r"policy-[0-9a-z]+-v2", weight_label(real_vllm.url)), weight_label(real_vllm.url)


def test_a_lora_run_refuses_base_weights_another_run_replaced(real_vllm, restored_base):
    """What the LoRA run of `test_toy_grpo_with_lora_adapters_on_real_vllm` does at engine start, after the
    full-weight run: refused before its first batch (which would sample the replaced base), naming the label."""
    from transformers import AutoTokenizer

    from trl_thundersync.errors import ServerBaseWeightsError
    from trl_thundersync.rollout.vllm_client import VLLMServerEngine
    from trl_thundersync.types import SamplingParams

    label = weight_label(real_vllm.url)
    assert label != "default", "run after the full-weight test: the server must hold another run's weights"
    tokenizer = AutoTokenizer.from_pretrained(real_vllm.model)
    with pytest.raises(ServerBaseWeightsError, match=re.escape(label)):
        VLLMServerEngine([real_vllm.url], tokenizer, SamplingParams(max_new_tokens=4), publisher="lora",
                         startup_timeout=30.0)


@pytest.mark.parametrize("weights", ["lora", "full"])
def test_the_quickstart_trains_multi_turn_with_tools_on_real_vllm(weights, real_vllm, tmp_path, restored_base):
    """The main job (sandboxed shell tools, several turns per episode) with vLLM rollouts, 2 short steps."""
    restore_base(real_vllm, tmp_path)  # the quickstart's agent is the served model: start from its own weights
    extra = LORA_FIELDS if weights == "lora" else ()
    output = run_example("thermostat_grpo.py", real_vllm, tmp_path / "thermostat", "--max_steps", "2",
                         "--per_device_train_batch_size", "8", "--num_generations", "4", "--eval_samples", "0", *extra)
    assert "2 optimizer steps" in output and "policy version 2" in output
    assert largest_sampling_difference(output) <= 1e-4  # ~900-token contexts: the embedded server (same FP32
    # model) shows up to 3e-5 on the quickstart; one wrong weight or dropout gives >= 1e-4 (see the toy runs)
    turns = [float(v) for v in re.findall(r"'agent/turns_mean': '?([0-9.e+-]+)", output)]
    assert turns and max(turns) > 1, turns  # multi-turn episodes: tool calls were made and answered
    label = weight_label(real_vllm.url)
    assert label == "default" if weights == "lora" else re.fullmatch(r"policy-[0-9a-z]+-v2", label), label
