"""scripts/vllm_smoke.py end to end against the embedded server (`--embedded`: the `trl_thundersync.serve`
launcher): a batch, a full-weight publication, a LoRA load, every check passed and every step timed; the LoRA check
alone (`--no-full-weights`). Against a real vLLM: `tests/real_vllm`."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

_SPEC = importlib.util.spec_from_file_location("vllm_smoke", Path(__file__).parents[2] / "scripts" / "vllm_smoke.py")
smoke = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(smoke)


def test_the_smoke_script_passes_against_the_embedded_server(tiny_model_path, capsys):
    code = smoke.main(["--model", tiny_model_path, "--embedded", "--lora", "--prompts", "2", "--max-tokens", "3",
                       "--startup-timeout", "300"])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and summary["ok"], summary
    # the embedded server answers GET /weight_info as vLLM >= 0.27 does: the version it confirms is checked too
    assert summary["checks"] == {"batch_v0": True, "batch_v1": True, "server_confirmed_version": True,
                                 "lora_batch_v1": True}
    assert set(summary["seconds"]) == {"start_server", "connect", "batch_v0", "publish_full_v1", "batch_v1",
                                       "lora_connect", "publish_lora_v1", "lora_batch_v1"}
    assert summary["server"]["logprobs_mode"] == "processed_logprobs"  # the embedded /server_info
    assert summary["server"]["max_concurrency"] == summary["server"]["max_num_seqs"] == 16
    assert summary["versions"]["trl"] and summary["versions"]["torch"]
    assert summary["publisher"] == "HTTPWeightFile"  # what 'auto' picks for an embedded server


def test_the_lora_check_runs_alone(tiny_model_path, capsys):
    code = smoke.main(["--model", tiny_model_path, "--embedded", "--lora", "--no-full-weights", "--prompts", "2",
                       "--max-tokens", "3", "--startup-timeout", "300"])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and summary["checks"] == {"lora_batch_v1": True}, summary
    assert set(summary["seconds"]) == {"start_server", "lora_connect", "publish_lora_v1", "lora_batch_v1"}
