"""Shared-prefix backward of a GRPO group (`streaming/shared_prefix.py`) equals the full per-member passes: the prompt
forwarded once, continuations over its detached states, boundary adjoints folded like the group statistics and
propagated through the prefix once."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from trl_thundersync.errors import ConfigurationError, NonFiniteGradientError, PrefixMismatchError
from trl_thundersync.streaming.accumulators import GroupStatistics
from trl_thundersync.streaming.flops import ModelShape, learner_flops
from trl_thundersync.streaming.gradient_sinks import FlatGradient
from trl_thundersync.streaming.segment_backward import model_logits
from trl_thundersync.streaming.shared_prefix import (
    GroupPrefix,
    PassWork,
    PrefixAdjoints,
    PrefixFallback,
    PrefixPlan,
    ReferencePrefix,
    full_pass_work,
    model_refusal,
    pass_flop_counter,
    pass_flops,
    plan_prefix,
    prompt_plan,
)
from trl_thundersync.tiny.model import build_tiny_model, build_tiny_tokenizer

TOLERANCE = 1e-5  # FP32: observed ~5e-7 for these groups
EPS = 1e-4
CPU = torch.device("cpu")


@functools.cache
def _model():
    return build_tiny_model(build_tiny_tokenizer(), hidden_size=64, num_layers=2, seed=0)


def _params():
    return [p for p in _model().parameters() if p.requires_grad]


def _members(size: int, prompt: int = 12, shared_completion: int = 0, seed: int = 0) -> list[list[int]]:
    """`size` members over one random prompt, continuations of different lengths (the first `shared_completion`
    completion tokens equal in all of them)."""
    gen = torch.Generator().manual_seed(seed)
    vocab = _model().config.vocab_size
    head = torch.randint(0, vocab, (prompt + shared_completion,), generator=gen).tolist()
    return [head + torch.randint(0, vocab, (3 + 2 * i,), generator=gen).tolist() for i in range(size)]


def _objective(seed: int, coefficient: float = 1.0, free: bool = False):
    """Per-token coefficients (some zero: loss-masked tool tokens) on log π; with `free`, a second channel (a
    log-sum-exp term) into its own sink."""

    def objective(logits: torch.Tensor, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        weights = torch.rand(len(tokens), generator=torch.Generator().manual_seed(seed)) + 0.5
        weights[1::3] = 0.0
        logps = torch.log_softmax(logits.float(), -1).gather(-1, tokens[:, None])[:, 0]
        channels = {"score": (weights * logps).sum() * coefficient}
        if free:
            channels["free"] = 0.3 * torch.logsumexp(logits.float(), -1).sum()
        return channels

    return objective


def _full_gradient(members, prompt_length, objectives, coefficients, model=None) -> dict[str, torch.Tensor]:
    """Σ_i A_i ∇S_i^c per channel, each member forwarded and back-propagated over its whole sequence."""
    model = model if model is not None else _model()
    params, out = [p for p in model.parameters() if p.requires_grad], {}
    for ids, objective, coefficient in zip(members, objectives, coefficients, strict=True):
        logits = model_logits(model, ids, CPU, keep=len(ids) - prompt_length + 1)[:-1]
        for channel, loss in objective(logits, torch.tensor(ids[prompt_length:])).items():
            sink = out.setdefault(channel, FlatGradient(params))
            sink.add(torch.autograd.grad(loss * coefficient, params, retain_graph=True, allow_unused=True), "reference")
    return {c: s.vector for c, s in out.items()}


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("shared_completion", [0, 3])
def test_coefficients_known_upfront_match_full_passes(size, shared_completion):
    """A_i inside each member's objective: the adjoints simply add, one prefix backward into the same sink. With
    shared completion tokens the prefix runs past the prompt and its trailing logits rows are cut too."""
    members = _members(size, shared_completion=shared_completion, seed=size)
    coefficients = [0.7, -1.3, 0.2, 2.0][:size]
    objectives = [_objective(i, a) for i, a in enumerate(coefficients)]
    plan = plan_prefix(3, members, prompt_length=12, window=_model().config.max_position_embeddings)
    assert isinstance(plan, PrefixPlan) and len(plan.ids) == 12 + shared_completion

    prefix = GroupPrefix(_model(), _params(), plan)
    sink, combined = FlatGradient(_params()), None
    for i, (ids, objective) in enumerate(zip(members, objectives, strict=True)):
        adjoint = prefix.member(i, ids, objective, {"score": sink}).adjoints["score"]
        combined = adjoint if combined is None else combined + adjoint
    continuations = sink.vector.clone()
    assert prefix.backward({"score": combined}, {"score": sink}) == len(plan.ids)

    reference = _full_gradient(members, 12, [_objective(i) for i in range(size)], coefficients)["score"]
    assert _relative(sink.vector, reference) <= TOLERANCE
    # the prefix carries a real share of the gradient: leaving its adjoint out is far off
    assert _relative(continuations, reference) > 1e-2


@pytest.mark.parametrize("rewards", [[1.0, 0.0], [1.0, 0.0, 0.5, 3.0], [2.0, float("nan"), 0.5, 1.0]],
                         ids=["2", "4", "4-one-unscorable"])
def test_group_statistics_fold_of_held_adjoints_matches_full_passes(rewards):
    """Content release: members run before any reward (adjoints held per trajectory), rewards bind later in another
    order, G1/G2 fold parameter gradients and adjoints alike; A_i = (R_i − μ)/(σ+eps) applied only then (A = 0 for
    an unscorable member, as in TRL). A second, advantage-free channel goes to its own sink with the plain sum of
    its adjoints."""
    size = len(rewards)
    members = _members(size, seed=10 + size)
    plan = prompt_plan(5, members[0][:12])
    prefix = GroupPrefix(_model(), _params(), plan)
    params, count = _params(), sum(p.numel() for p in _params())
    held, free_sink = {}, FlatGradient(params)
    adjoints = PrefixAdjoints(5, size, prefix.adjoint_size)
    for i, ids in enumerate(members):
        score_sink = FlatGradient(params)
        out = prefix.member(i, ids, _objective(i, free=True), {"score": score_sink, "free": free_sink})
        held[i] = (score_sink.vector, out.adjoints["score"])
        adjoints.hold(i, out.adjoints["score"])
        adjoints.add_free("free", out.adjoints["free"])
    with pytest.raises(ValueError, match="hold adjoints without a reward"):
        adjoints.fold(1.0)
    grads = GroupStatistics(5, size, count)
    for i in reversed(range(size)):  # rewards bind in another order than the passes ran
        grads.add(rewards[i], held[i][0])
        adjoints.bind(i, rewards[i])
    scale = 1.0 / (grads.std + EPS)
    policy, prefix_sink = grads.fold(scale)[0], FlatGradient(params)
    folded = adjoints.fold(scale)
    assert set(folded) == {("score", 0), ("free", 0)}
    prefix.backward(folded, {("score", 0): prefix_sink, ("free", 0): free_sink})

    advantages = [0.0 if math.isnan(r) else (r - grads.mean) * scale for r in rewards]
    reference = _full_gradient(members, 12, [_objective(i, free=True) for i in range(size)], [1.0] * size)
    policy_reference = _full_gradient(members, 12, [_objective(i) for i in range(size)], advantages)["score"]
    assert _relative(policy + prefix_sink.vector, policy_reference) <= TOLERANCE
    assert _relative(free_sink.vector, reference["free"]) <= TOLERANCE
    # a wrong fold is caught: the adjoints summed without their rewards (G2 only) miss the prefix's share
    wrong = GroupPrefix(_model(), _params(), plan)
    for i, ids in enumerate(members):
        wrong.member(i, ids, _objective(i), {"score": FlatGradient(params)})
    wrong_sink = FlatGradient(params)
    wrong.backward({"score": sum(held[i][1] for i in range(size)) * scale}, {"score": wrong_sink})
    assert _relative(policy + wrong_sink.vector, policy_reference) > 1e-2


def test_members_not_sharing_the_prompt_fall_back_naming_the_group():
    members = _members(3)
    rewritten = [members[0], members[1][:4] + [members[1][4] + 1] + members[1][5:], members[2]]
    fallback = plan_prefix(9, rewritten, prompt_length=12)
    assert isinstance(fallback, PrefixFallback) and fallback.group == 9 and "share only 4" in fallback.reason

    assert isinstance(plan_prefix(9, [[5], [5, 6]], prompt_length=1), PrefixFallback)
    prefix = GroupPrefix(_model(), _params(), prompt_plan(9, members[0][:12]))
    with pytest.raises(PrefixMismatchError, match="group 9 member 1"):
        prefix.member(1, rewritten[1], _objective(0), {"score": FlatGradient(_params())})


def test_prefix_longer_than_the_context_window_falls_back():
    members = _members(2)
    assert "context window (8)" in plan_prefix(4, members, prompt_length=12, window=8).reason
    assert isinstance(prompt_plan(4, members[0][:12], window=8), PrefixFallback)
    assert isinstance(prompt_plan(4, members[0][:12], window=12), PrefixPlan)


def test_lora_adapters_only_match_full_passes():
    """With a PEFT adapter only the adapters train; the frozen base still carries the prefix adjoints to them."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(build_tiny_model(build_tiny_tokenizer(), hidden_size=64, num_layers=2, seed=1),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "down_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.1, generator=torch.Generator().manual_seed(0))
    params = [p for p in model.parameters() if p.requires_grad]
    members, coefficients = _members(3, seed=30), [1.5, -0.5, 0.8]
    prefix = GroupPrefix(model, params, plan_prefix(1, members, prompt_length=12))
    sink, combined = FlatGradient(params), 0
    for i, (ids, a) in enumerate(zip(members, coefficients, strict=True)):
        combined = combined + prefix.member(i, ids, _objective(i, a), {"score": sink}).adjoints["score"]
    continuations = sink.vector.clone()
    prefix.backward({"score": combined}, {"score": sink})
    reference = _full_gradient(members, 12, [_objective(i) for i in range(3)], coefficients, model)["score"]
    assert _relative(sink.vector, reference) <= TOLERANCE
    assert _relative(continuations, reference) > 1e-2


def test_models_the_prefix_cut_cannot_serve_are_refused_with_the_reason():
    assert model_refusal(_model()) is None
    model = build_tiny_model(build_tiny_tokenizer(), hidden_size=64, num_layers=2, seed=2)
    model.config.layer_types = ["full_attention", "sliding_attention"]
    assert "sliding_attention" in model_refusal(model)
    model.config.layer_types = ["full_attention"] * 2
    model.activation_checkpointing_enable()
    assert "checkpointing" in model_refusal(model)
    with pytest.raises(ConfigurationError, match="group 8: no shared-prefix pass"):
        GroupPrefix(model, [p for p in model.parameters() if p.requires_grad], prompt_plan(8, [1, 2, 3]))


class _AnySink:
    """Takes parameter gradients without checking them, so the adjoint check is what must refuse."""

    def add(self, grads, where: str) -> None:
        return None


def test_non_finite_adjoints_raise_naming_the_group():
    members = _members(2)
    prefix = GroupPrefix(_model(), _params(), prompt_plan(6, members[0][:12]))
    with pytest.raises(NonFiniteGradientError, match="group 6 member 0"):
        prefix.member(0, members[0], _objective(0, coefficient=float("nan")), {"score": _AnySink()})
    adjoint = prefix.member(1, members[1], _objective(1), {"score": _AnySink()}).adjoints["score"]
    adjoint[3] = float("inf")
    with pytest.raises(NonFiniteGradientError, match="group 6 shared prefix"):
        prefix.backward({"score": adjoint}, {"score": FlatGradient(_params())})
    assert prefix.closed and prefix.held_bytes() == 0


def test_work_counts_the_prefix_once_and_its_flops_follow_the_ledger():
    members = _members(4)
    prefix = GroupPrefix(_model(), _params(), prompt_plan(0, members[0][:12]))
    kv_bytes = sum(t.numel() * t.element_size() for t in prefix.outputs)
    assert prefix.held_bytes() >= kv_bytes > 0  # its key/values at least, plus the activations the graph saved
    for i, ids in enumerate(members):
        prefix.member(i, ids, _objective(i), {"score": FlatGradient(_params())})
    prefix.discard()
    continuations = [len(ids) - 12 for ids in members]
    assert prefix.work == [PassWork(12, 0, 0), *[PassWork(c, 12, 1) for c in continuations]]

    shape = ModelShape.from_config(_model().config)
    assert pass_flops(shape, PassWork(40, 0, 1)) == learner_flops(shape, 40)
    assert pass_flops(shape, PassWork(40, 0, 1), 1000) == learner_flops(shape, 40, 1000)
    assert pass_flop_counter(_model(), _params())(PassWork(40, 5, 2)) == pass_flops(shape, PassWork(40, 5, 2))
    assert pass_flop_counter(object(), []) is None
    shared = pass_flops(shape, PassWork(12, 0, 1)) + sum(pass_flops(shape, w) for w in prefix.work[1:])
    full = sum(pass_flops(shape, w) for w in full_pass_work([len(ids) for ids in members]))
    assert shared < full


@pytest.mark.parametrize("shared_completion", [0, 3])
def test_reference_prefix_gives_each_member_its_full_forward_logits(shared_completion):
    """The KL reference gets the same treatment: its prefix forwarded once (no graph), members' rows as their own
    full no-grad forwards give them."""
    members = _members(3, shared_completion=shared_completion, seed=20)
    plan = plan_prefix(2, members, prompt_length=12)
    reference = ReferencePrefix(_model(), plan)
    for i, ids in enumerate(members):
        with torch.no_grad():
            full = model_logits(_model(), ids, CPU, keep=len(ids) - 12 + 1)[:-1]
        rows = reference.logits(i, ids)
        assert rows.shape == full.shape and not rows.requires_grad
        assert float((rows - full).abs().max()) <= TOLERANCE * float(full.abs().max())
    assert [w.tokens for w in reference.work] == [len(plan.ids), *[len(ids) - len(plan.ids) for ids in members]]
    assert reference.logits(3, list(plan.ids)).shape[0] == shared_completion  # only the prefix's trailing rows
    with pytest.raises(PrefixMismatchError, match="group 2 member 4"):
        reference.logits(4, [members[0][0] + 1, *members[0][1:]])
