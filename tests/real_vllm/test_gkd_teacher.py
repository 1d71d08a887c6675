"""ThunderSyncGKDTrainer (on-policy distillation, `objective="opd"`) with the teacher served by a real `vllm serve`:
every turn's teacher log-probs come from vLLM's `prompt_logprobs`, and the update equals the same run with the same
teacher as a local `teacher_model` (FP32 on both sides; the turns arrive in another order)."""

from __future__ import annotations

import torch
from datasets import Dataset
from transformers import AutoTokenizer

from benchmarks.parity import CaptureGrads, load_model, relative_error
from tests.real_vllm.conftest import restore_base
from trl_thundersync import ThunderSyncGKDConfig, ThunderSyncGKDTrainer
from trl_thundersync.tiny.model import save_tiny_model


def messages(n: int = 8) -> Dataset:
    return Dataset.from_dict({"messages": [[{"role": "user", "content": f"What is {i} + {i}?"},
                                            {"role": "assistant", "content": f"{i} + {i} = {2 * i}."}]
                                           for i in range(n)]})


def distill(student_path, tokenizer, out, **overrides) -> tuple[ThunderSyncGKDTrainer, list[torch.Tensor]]:
    fields = dict(output_dir=str(out), use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=4,
                  max_steps=2, max_new_tokens=10, lmbda=1.0, logging_steps=1, save_strategy="no", disable_tqdm=True,
                  seed=0, learning_rate=1e-2, optim="sgd", max_grad_norm=1e9, rollout_max_in_flight=4,
                  objective="opd", rollout_engine="local_process")
    teacher = overrides.pop("teacher_model", None)
    fields.update(overrides)
    capture = CaptureGrads()
    trainer = ThunderSyncGKDTrainer(model=load_model(student_path), teacher_model=teacher,
                                    args=ThunderSyncGKDConfig(**fields), processing_class=tokenizer,
                                    train_dataset=messages(), callbacks=[capture])
    trainer.train()
    return trainer, capture.directions


def test_a_vllm_teacher_gives_the_local_teachers_update(real_vllm, tmp_path):
    restore_base(real_vllm, tmp_path)  # the server must serve the model the local teacher loads
    student = str(save_tiny_model(tmp_path / "student", seed=3))
    tokenizer = AutoTokenizer.from_pretrained(student)
    served, served_dirs = distill(student, tokenizer, tmp_path / "served", teacher_server_url=real_vllm.url)
    local, local_dirs = distill(student, tokenizer, tmp_path / "local", teacher_model=load_model(real_vllm.model))
    assert served.policy_version == local.policy_version == 2 and len(served_dirs) == len(local_dirs) == 2
    assert local_dirs[0].norm() > 0  # the teacher and the student differ: there is something to distill
    # 1e-5: ARCHITECTURE invariant 3's FP32 bound; vLLM's prompt log-probs match transformers FP32 to ≤ 1e-6 here
    for mine, theirs in zip(served_dirs, local_dirs, strict=True):
        assert relative_error(mine, theirs) <= 1e-5
    params = [torch.cat([p.detach().reshape(-1) for p in t.model.parameters()]) for t in (served, local)]
    assert relative_error(*params) <= 1e-5

