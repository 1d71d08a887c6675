"""On-policy distillation streamed per agentic turn (paper §3.4 Eq. 8–9, Appendix I.2).

records        frozen records between teacher, learner and trainer (the learner's work items and batch timing are
               `streaming.learner_records`; the step trace is `trace.recorder.build_step_trace`)
losses         per-token objectives: the sampled-token OPD advantage loss and GKD's generalized JSD
teacher        the `TeacherScorer` protocol, a local-model teacher, score validation, vocabulary check
teacher_server a teacher behind a vLLM-compatible `/v1/completions` endpoint (prompt log-probabilities)
turn_backward  per-turn student backward, one channel over the shared core `streaming.segment_backward`
learner        one logical batch of turns: ordering, trajectory closure, the gradient sum and token count
pipeline       rollout engine → teacher thread → learner, under the `sync` or `thundersync` schedule
"""
