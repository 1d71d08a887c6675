"""The loss-type table (`streaming/loss_types.py`): every TRL `loss_type` has an entry, an unknown name is refused
naming the field, and the table gives the normalizers, values and metrics the per-name rules gave before it."""

import dataclasses
import re
import typing

import pytest
from trl import GRPOConfig

from trl_thundersync.errors import ConfigurationError, UnknownLossTypeError
from trl_thundersync.streaming.loss_types import LOSS_TYPES, SUPPORTED_LOSS_TYPES, loss_type
from trl_thundersync.streaming.normalization import LossNormalization


def trl_loss_types() -> set[str]:
    """The names TRL's `GRPOConfig.loss_type` accepts: its `Literal` when the field is typed with one, else the
    quoted names of its help text's "Supported values are ..." sentence."""
    field = {f.name: f for f in dataclasses.fields(GRPOConfig)}["loss_type"]
    hint = typing.get_type_hints(GRPOConfig)["loss_type"]
    if typing.get_origin(hint) is typing.Literal:
        return set(typing.get_args(hint))
    choices = field.metadata.get("choices")
    if choices:
        return set(choices)
    sentence = re.search(r"Supported values are (.*?)\.\s", field.metadata["help"]).group(1)
    return set(re.findall(r"'(\w+)'", sentence))


def test_every_trl_loss_type_has_an_entry():
    names = trl_loss_types()
    assert len(names) >= 8 and "dapo" in names  # the parse found TRL's list, not nothing
    assert names == set(SUPPORTED_LOSS_TYPES)
    for name in names:
        assert loss_type(name).name == name


def test_an_unknown_name_is_refused_naming_the_field():
    with pytest.raises(UnknownLossTypeError, match="loss_type='nope'.*supported loss types"):
        loss_type("nope")
    with pytest.raises(ConfigurationError, match="loss_type='nope'"):
        LossNormalization("nope", 4, 1, 16)


# The per-name rules the trainer and the core applied before the table (the seven string tuples), written out:
# the table must reproduce each of them.
PER_SEQUENCE_MEAN = ("grpo", "sapo")
LOG_PROB_VALUED = ("cispo", "vespo")
CLIPPED_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
POLICY_METRIC_BEFORE_GA = ("cispo", "dapo", "vespo")


def old_bucket_scales(name, b, ga, max_len, w, tokens, global_tokens):
    if name in ("grpo", "sapo", "luspo"):
        return {k: 1.0 / b for k in tokens}
    if name == "dr_grpo":
        return {k: 1.0 / (b * max_len) for k in tokens}
    if name == "bnpo":
        if ga == 1:
            return {k: 1.0 / max(sum(tokens.values()), 1) for k in tokens}
        return {k: 1.0 / (max(n, 1) * ga) for k, n in tokens.items()}
    assert name in ("dapo", "cispo", "vespo")
    return {k: w / max(global_tokens, 1) for k in tokens}


@pytest.mark.parametrize("name", SUPPORTED_LOSS_TYPES)
@pytest.mark.parametrize("ga, tokens", [(1, {0: 7}), (2, {0: 5, 1: 0}), (3, {0: 4, 1: 9, 2: 2})])
def test_the_table_reproduces_the_per_name_rules(name, ga, tokens):
    entry = LOSS_TYPES[name]
    norm = LossNormalization(name, 6, ga, 16, num_processes=2)
    assert norm.kind is entry
    for n in (0, 1, 5):
        assert norm.sequence_weight(n) == (1.0 / max(n, 1) if name in PER_SEQUENCE_MEAN else 1.0)
    assert norm.bucket_scales(tokens, 31) == old_bucket_scales(name, 6, ga, 16, 2, tokens, 31)
    assert norm.uses_buckets == (name == "bnpo" and ga > 1)
    assert entry.log_prob_valued == (name in LOG_PROB_VALUED)
    assert (entry.value_gate == "sapo") == (name == "sapo")
    assert (entry.policy_coefficient == "epsilon_high_clamp") == (name == "cispo")
    assert (entry.clip_metrics == "clip_ratio") == (name in CLIPPED_LOSSES)
    assert (entry.clip_metrics == "cispo") == (name == "cispo")
    assert entry.policy_metric_per_micro_batch == (name in POLICY_METRIC_BEFORE_GA)
    assert entry.streams_vllm_correction == (name != "vespo")
