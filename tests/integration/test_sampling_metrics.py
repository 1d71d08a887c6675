"""TRL's `sampling/*` metrics from a run over HTTP rollout servers (`streaming/sampling_difference.py`): every step
logs how far the server's log-probs are from the learner's. The embedded server samples with the same FP32 model
as the learner, so the difference is rounding (measured here: ~1e-7) and the importance-sampling ratio is 1.

Against a real vLLM server the same keys show the bf16/FP32 or kernel gap (`tests/real_vllm`)."""

from __future__ import annotations

import pytest

from benchmarks.parity import cpu_config, load_model, prompt_dataset
from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer
from trl_thundersync.serve.launcher import EmbeddedServers, ServerOptions

pytestmark = pytest.mark.slow

DIFFERENCE = ("sampling/sampling_logp_difference/mean", "sampling/sampling_logp_difference/max")
RATIO = ("sampling/importance_sampling_ratio/min", "sampling/importance_sampling_ratio/mean",
         "sampling/importance_sampling_ratio/max")


def reward_length(completions, **kwargs):
    return [float(len(c)) / 8 for c in completions]


def train(path, tokenizer, out, **overrides) -> list[dict]:
    args = cpu_config(ThunderSyncGRPOConfig, out, max_completion_length=8, per_device_train_batch_size=4,
                      num_generations=2, max_steps=2, **overrides)
    trainer = ThunderSyncGRPOTrainer(model=load_model(path), reward_funcs=[reward_length], args=args,
                                     train_dataset=prompt_dataset(8), processing_class=tokenizer)
    trainer.train()
    return [h for h in trainer.state.log_history if "reward" in h]


@pytest.mark.parametrize("correction", [True, False])
def test_each_step_logs_the_sampler_vs_learner_difference(correction, tmp_path, tokenizer, tiny_model_path):
    """With TRL's vLLM fields and the importance-sampling correction on (TRL's default) the difference and the ratio's
    range are logged as TRL logs them; without the correction TRL logs neither, and the difference is logged under
    `thundersync/sampling/...`."""
    servers = EmbeddedServers.start(load_model(tiny_model_path), tokenizer, replicas=1,
                                    options=ServerOptions(max_in_flight=4))
    try:
        logs = train(tiny_model_path, tokenizer, tmp_path, use_vllm=True, vllm_mode="server",
                     vllm_server_base_urls=servers.urls, vllm_importance_sampling_correction=correction)
    finally:
        servers.close()
    assert len(logs) == 2
    # TRL logs sampling/* only with its correction on; without it the same numbers are ours, under thundersync/
    difference = DIFFERENCE if correction else tuple(f"thundersync/{key}" for key in DIFFERENCE)
    for step in logs:
        assert set(difference) <= step.keys()
        assert correction or not set(DIFFERENCE) & step.keys()  # no TRL key TRL would not log
        assert 0.0 <= step[difference[0]] <= step[difference[1]] < 1e-5, step  # one FP32 model on both sides
        if correction:
            assert step[RATIO[0]] <= step[RATIO[1]] <= step[RATIO[2]]
            assert all(abs(step[key] - 1.0) < 1e-5 for key in RATIO), step
        else:
            assert not set(RATIO) & step.keys()
