"""Moved to `trl_thundersync.envs.harness.observation_tokens`: envs/ is split by layer; this old path works."""

from __future__ import annotations

from .harness.observation_tokens import (
    ControlVocabulary,
    contains_control_text,
    control_vocabulary,
    encode_data,
    split_inside_markers,
    valid_text,
)

__all__ = [
    "ControlVocabulary", "contains_control_text", "control_vocabulary", "encode_data", "split_inside_markers",
    "valid_text",
]
