"""The configs document themselves as TRL's do: a `Parameters:` section in the class docstring names every field the
config adds to its TRL parent, grouped by topic, and each field's `metadata["help"]` is short (the long explanations
live in docs/*.md)."""

from __future__ import annotations

import dataclasses
import re

import pytest
import trl
from trl.experimental.gkd import GKDConfig

from trl_thundersync import ThunderSyncGKDConfig, ThunderSyncGRPOConfig
from trl_thundersync.trainers.agent_config import AgentLoopFields
from trl_thundersync.trainers.rollout_config import RolloutFields

MAX_HELP_CHARS = 400  # one or two sentences
CONFIGS = [(ThunderSyncGRPOConfig, trl.GRPOConfig), (ThunderSyncGKDConfig, GKDConfig)]


def added_fields(config: type, parent: type) -> list[dataclasses.Field]:
    inherited = {f.name for f in dataclasses.fields(parent)}
    return [f for f in dataclasses.fields(config) if f.name not in inherited]


def documented_names(cls: type) -> set[str]:
    doc = cls.__doc__ or ""
    assert "Parameters:" in doc, f"{cls.__name__} has no Parameters: section"
    section = doc[doc.index("Parameters:"):]
    return set(re.findall(r"\b([a-z][a-z0-9_]+)\b", section))


@pytest.mark.parametrize(("config", "parent"), CONFIGS, ids=lambda c: c.__name__)
def test_every_added_field_is_named_in_the_parameters_section(config, parent):
    missing = {f.name for f in added_fields(config, parent)} - documented_names(config)
    assert not missing, f"{config.__name__}'s docstring does not name {sorted(missing)}"


@pytest.mark.parametrize("mixin", [RolloutFields, AgentLoopFields], ids=lambda c: c.__name__)
def test_every_mixin_field_is_named_in_its_parameters_section(mixin):
    missing = {f.name for f in dataclasses.fields(mixin)} - documented_names(mixin)
    assert not missing, f"{mixin.__name__}'s docstring does not name {sorted(missing)}"


@pytest.mark.parametrize(("config", "parent"), CONFIGS, ids=lambda c: c.__name__)
def test_help_texts_are_short(config, parent):
    grpo_fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)}  # help copied from TRL (GKD's vllm_* fields)
    for f in added_fields(config, parent):
        if f.name in grpo_fields:
            continue
        text = f.metadata.get("help", "")
        assert text, f"{config.__name__}.{f.name} has no help text"
        assert len(text) <= MAX_HELP_CHARS, f"{config.__name__}.{f.name}: help of {len(text)} characters"
