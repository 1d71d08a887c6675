"""tiny/agent.py: the shared-prompt warm start computes the padded batch's loss and gradient; the build cache
key (recipe, steps, seed) and the folder's model shape decide when a folder is reused."""

from __future__ import annotations

import json
import random

import pytest
import torch

from trl_thundersync.tiny import agent as tiny_agent
from trl_thundersync.tiny.model import build_tiny_model, build_tiny_tokenizer


@pytest.fixture(scope="module")
def setup():
    from trl.chat_template_utils import get_training_chat_template

    tokenizer = build_tiny_tokenizer()
    template = get_training_chat_template(tokenizer) or tokenizer.chat_template
    rng = random.Random(3)
    prompt = rng.choice(tiny_agent._task_prompts())
    episodes = [tiny_agent.tool_use_episode(rng) for _ in range(3)]
    return tokenizer, template, prompt, episodes


def padded_batch_loss(model, tokenizer, template, prompt, episodes):
    """The reference: every full transcript in one right-padded batch, HF's token-mean loss over assistant tokens."""
    rows = [tokenizer.apply_chat_template([{"role": "user", "content": prompt}, *e], tools=[tiny_agent.run_shell,
            tiny_agent.submit], chat_template=template, tokenize=True, return_dict=True,
            return_assistant_tokens_mask=True) for e in episodes]
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[i, :n] = torch.tensor(r["input_ids"])
        attention[i, :n] = 1
        labels[i, :n] = torch.where(torch.tensor(r["assistant_masks"], dtype=torch.bool), ids[i, :n], -100)
    return model(input_ids=ids, attention_mask=attention, labels=labels).loss, rows


def test_render_batch_splits_the_shared_prompt_and_keeps_the_assistant_mask(setup):
    tokenizer, template, prompt, episodes = setup
    batch = tiny_agent.render_batch(tokenizer, template, prompt, episodes)
    _, rows = padded_batch_loss(build_tiny_model(tokenizer), tokenizer, template, prompt, episodes)
    for row, cont, labels in zip(rows, batch.continuation_ids, batch.labels, strict=True):
        n = len(batch.prompt_ids)
        assert tuple(row["input_ids"]) == batch.prompt_ids + cont
        assert [t != -100 for t in labels] == [bool(m) for m in row["assistant_masks"][n:]]
        assert not any(row["assistant_masks"][:n])
    assert batch.label_count == sum(sum(r["assistant_masks"]) for r in rows) > 0


def test_shared_prompt_loss_and_gradient_equal_the_padded_batch(setup):
    tokenizer, template, prompt, episodes = setup
    model = build_tiny_model(tokenizer)
    reference, _ = padded_batch_loss(model, tokenizer, template, prompt, episodes)
    reference.backward()
    expected = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    loss = tiny_agent.batch_loss(model, tiny_agent.render_batch(tokenizer, template, prompt, episodes))
    loss.backward()
    got = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert loss.item() == pytest.approx(reference.item(), rel=1e-6)
    # FP32: the two differ only in summation order (one padded batch vs a shared prompt cache); 1e-5 of the norm
    assert float((got - expected).norm() / expected.norm()) <= 1e-5


def test_a_folder_is_reused_only_under_its_build_key(tmp_path, monkeypatch):
    threads = torch.get_num_threads()
    path = tiny_agent.save_tiny_agent_model(tmp_path / "agent", steps=2)
    assert torch.get_num_threads() == threads, "the warm start restores the thread count"
    record = json.loads((path / tiny_agent.MARKER).read_text())
    assert (record["recipe"], record["steps"], record["seed"]) == (tiny_agent.RECIPE, 2, 0)
    built = (path / "model.safetensors").stat().st_mtime_ns
    calls = []
    monkeypatch.setattr(tiny_agent, "warm_start", lambda *a, **k: calls.append(k) or [1.0, 0.5])
    tiny_agent.save_tiny_agent_model(path, steps=2)
    assert calls == [] and (path / "model.safetensors").stat().st_mtime_ns == built, "same key: reused"
    (path / tiny_agent.MARKER).write_text(json.dumps({**record, "recipe": tiny_agent.RECIPE - 1}))
    tiny_agent.save_tiny_agent_model(path, steps=2)
    assert len(calls) == 1, "a folder built by another recipe is rebuilt"
    tiny_agent.save_tiny_agent_model(path, steps=3)
    assert len(calls) == 2 and json.loads((path / tiny_agent.MARKER).read_text())["steps"] == 3


def test_a_folder_of_another_shape_is_rebuilt(tmp_path, monkeypatch):
    """A folder cached by an older builder (4 heads of 16, which a CPU vLLM cannot serve) is rebuilt, even with a
    matching build record; the rebuilt one has 2 heads of 32 and 1 KV head."""
    path = tiny_agent.save_tiny_agent_model(tmp_path / "agent", steps=2)
    config = json.loads((path / "config.json").read_text())
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (2, 1, 32)
    (path / "config.json").write_text(json.dumps({**config, "num_attention_heads": 4, "num_key_value_heads": 2,
                                                  "head_dim": 16}))
    calls = []
    monkeypatch.setattr(tiny_agent, "warm_start", lambda *a, **k: calls.append(k) or [1.0, 0.5])
    tiny_agent.save_tiny_agent_model(path, steps=2)
    assert len(calls) == 1 and json.loads((path / "config.json").read_text())["head_dim"] == 32


def test_a_tiny_model_folder_of_another_shape_is_rebuilt(tmp_path):
    from trl_thundersync.tiny.model import save_tiny_model

    path = save_tiny_model(tmp_path / "teacher", hidden_size=96, num_layers=3, seed=7)
    config = json.loads((path / "config.json").read_text())
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (3, 1, 32)
    built = (path / "model.safetensors").stat().st_mtime_ns
    assert save_tiny_model(path, hidden_size=96, num_layers=3, seed=7) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == built, "same shape: reused"
    (path / "config.json").write_text(json.dumps({**config, "num_attention_heads": 4, "head_dim": 24}))
    save_tiny_model(path, hidden_size=96, num_layers=3, seed=7)
    assert json.loads((path / "config.json").read_text())["head_dim"] == 32
    save_tiny_model(path, hidden_size=64, num_layers=2)
    assert json.loads((path / "config.json").read_text())["hidden_size"] == 64, "another width: rebuilt"
