"""The ThunderSync configs take TRL's configs' arguments the way TRL does: positionally in TRL's order, and as a plain
TRL config converted field by field (`from_trl`), with every refusal applied to the converted values."""

from __future__ import annotations

import inspect
from dataclasses import fields

import pytest
from trl import GRPOConfig
from trl.experimental.gkd import GKDConfig

from trl_thundersync import ThunderSyncGKDConfig, ThunderSyncGRPOConfig
from trl_thundersync.errors import ConfigurationError, UnsupportedOptionError


@pytest.mark.parametrize("trl_cls, cls", [(GRPOConfig, ThunderSyncGRPOConfig), (GKDConfig, ThunderSyncGKDConfig)])
def test_positional_arguments_are_trls(trl_cls, cls, tmp_path):
    trl_params = list(inspect.signature(trl_cls).parameters)
    assert list(inspect.signature(cls).parameters)[:len(trl_params)] == trl_params
    assert cls(str(tmp_path), use_cpu=True).output_dir == str(tmp_path)  # TRL's own default: GRPOConfig("<m>-GRPO")


GRPO_VALUES = [
    dict(),
    dict(generation_batch_size=16, per_device_train_batch_size=8, gradient_accumulation_steps=2),  # steps derived
    dict(gradient_accumulation_steps=2, steps_per_generation=2),
    dict(report_to="all", lr_scheduler_type="cosine", lr_scheduler_kwargs='{"num_cycles": 0.5}', eval_strategy="steps",
         eval_steps=5, per_device_eval_batch_size=8, warmup_steps=0.1, hub_token="secret",
         accelerator_config={"split_batches": False}),
    dict(use_transformers_paged=True, vllm_importance_sampling_cap=3.0, scale_rewards=True, bf16=False, fp16=False),
    dict(gradient_checkpointing_kwargs={"use_reentrant": False}, optim="sgd", save_strategy="no", max_steps=3,
         logging_strategy="epoch", output_dir=None, loss_type="cispo", beta=0.04, max_completion_length=None,
         mask_truncated_completions=True),
]


@pytest.mark.parametrize("values", GRPO_VALUES, ids=range(len(GRPO_VALUES)))
def test_plain_grpo_config_converts_every_field(values, tmp_path, recwarn):
    plain = GRPOConfig(**{"output_dir": str(tmp_path), "use_cpu": True, **values})
    before = len(recwarn)
    if values.get("max_completion_length", 1) is None:  # stock TRL accepts it; ThunderSync's engines need a budget
        with pytest.raises(ConfigurationError, match="max_completion_length=None"):
            ThunderSyncGRPOConfig.from_trl(plain)
        return
    converted = ThunderSyncGRPOConfig.from_trl(plain)
    assert type(converted) is ThunderSyncGRPOConfig
    assert [f.name for f in fields(GRPOConfig) if getattr(converted, f.name) != getattr(plain, f.name)] == []
    assert not [w for w in recwarn.list[before:] if issubclass(w.category, FutureWarning)]  # not shown twice


def test_plain_configs_keep_every_refusal(tmp_path):
    base = dict(output_dir=str(tmp_path), use_cpu=True)
    with pytest.raises(UnsupportedOptionError, match="top_entropy_quantile=0.5"):
        ThunderSyncGRPOConfig.from_trl(GRPOConfig(**base, top_entropy_quantile=0.5))
    with pytest.raises(UnsupportedOptionError, match="steps_per_generation=2"):
        ThunderSyncGRPOConfig.from_trl(GRPOConfig(**base, steps_per_generation=2))
    with pytest.raises(UnsupportedOptionError, match="use_liger_kernel=True"):
        ThunderSyncGKDConfig.from_trl(GKDConfig(**base, use_liger_kernel=True))
    mixed = ThunderSyncGKDConfig.from_trl(GKDConfig(**base, gradient_accumulation_steps=2, lmbda=0.5))
    assert mixed.on_policy_normalizer == "num_items_in_batch"  # stock GKD's count: mixed windows stream exactly
    converted = ThunderSyncGKDConfig.from_trl(GKDConfig(**base, lmbda=0.7, beta=0.2, max_new_tokens=12))
    assert (converted.lmbda, converted.beta, converted.max_new_tokens) == (0.7, 0.2, 12)


def test_a_subclass_with_fields_of_its_own_is_refused_by_name(tmp_path):
    from dataclasses import dataclass

    @dataclass
    class MyConfig(GRPOConfig):
        my_field: int = 3

    with pytest.raises(UnsupportedOptionError, match="my_field"):
        ThunderSyncGRPOConfig.from_trl(MyConfig(output_dir=str(tmp_path), use_cpu=True))
