"""`benchmarks/per_sample_design.py` on a small group: the per-sample gradients from one padded pass are each
member's own (gradient and boundary adjoint), the padded pass's are their sum; timings are printed, not asserted."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.per_sample_design import Group, PerSampleHooks, main
from trl_thundersync.tiny.model import build_tiny_model, build_tiny_tokenizer


def test_per_sample_rows_are_each_members_gradient(tmp_path, capsys):
    out = tmp_path / "per_sample.json"
    result = main(["--prompt", "12", "--members", "3", "--completion", "6", "--hidden", "64", "--layers", "1",
                   "--repeats", "1", "--out", str(out)])
    assert result["per_sample_relative_error"] <= 1e-5 and result["padded_relative_error"] <= 1e-5
    assert json.loads(out.read_text())["wall_s"].keys() == {"one_by_one", "padded", "per_sample"}
    assert "per_sample" in capsys.readouterr().out


def test_hooks_restore_the_model_and_refuse_modules_without_a_rule():
    model = build_tiny_model(build_tiny_tokenizer(), hidden_size=64, num_layers=1, seed=0)
    before = {n: p for n, p in model.named_parameters()}
    group = Group(model, list(range(8, 20)), [list(range(30, 36)), list(range(40, 44))])
    group.per_sample()
    assert {n: p for n, p in model.named_parameters()} == before  # the norm weights are Parameters again
    model.model.layers[0].register_parameter("gate_scale", torch.nn.Parameter(torch.ones(1)))
    model.model.layers[0].gate_scale.requires_grad_(True)
    with pytest.raises(TypeError, match="no per-sample rule for Qwen3DecoderLayer"), PerSampleHooks(model, 2):
        pass
    assert all(isinstance(m.weight, torch.nn.Parameter) for m in model.modules() if type(m).__name__.endswith("Norm"))
