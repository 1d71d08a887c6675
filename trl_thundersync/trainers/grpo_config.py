"""`ThunderSyncGRPOConfig`: `trl.GRPOConfig` plus the streaming fields; refuses what cannot stream exactly."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

from ..errors import ConfigurationError, UnsupportedOptionError
from ..streaming.normalization import SUPPORTED_LOSS_TYPES

SCHEDULES = ("thundersync", "sync")
ROLLOUT_ENGINES = ("auto", "local_process", "local_thread", "trl", "embedded_server", "vllm_server")
WEIGHT_PUBLISHERS = ("auto", "nccl", "lora", "http")


@dataclass
class ThunderSyncGRPOConfig(GRPOConfig):
    schedule: str = field(
        default="thundersync",
        metadata={
            "help": "'thundersync' runs each trajectory's backward as soon as its reward is known; 'sync' waits until "
            "the whole batch closed (the paper's Sync baseline). Same code, same update."
        },
    )
    max_open_groups: int | None = field(
        default=None,
        metadata={
            "help": "Admission cap: at most this many GRPO groups hold gradient statistics at once, bounding their "
            "memory to 4·(2k+1)·P bytes. None = every group of the batch may be open."
        },
    )
    rollout_engine: str = field(
        default="auto",
        metadata={
            "help": "'local_process': the embedded engine in a worker process, no HTTP; 'local_thread': the same "
            "engine in a thread (fights the learner for the GIL; for measurements); 'embedded_server': "
            "`rollout_num_servers` embedded HTTP servers (python -m trl_thundersync.serve) started for the run, or "
            "the ones at `vllm_server_base_urls`, driven by the vLLM client; 'vllm_server': vLLM servers "
            "(use_vllm=True, vllm_mode='server'); 'trl': TRL's own batch generation (used automatically for "
            "rollout_func); 'auto' picks 'vllm_server' with use_vllm=True, else 'trl' for rollout_func, else "
            "'embedded_server' (the default: the production client code over HTTP, servers started for the run)."
        },
    )
    vllm_server_base_urls: list[str] | None = field(
        default=None,
        metadata={
            "help": "Base URLs of several rollout servers (data-parallel replicas), e.g. ['http://10.0.0.5:8000', "
            "'http://10.0.0.6:8000']. Overrides vllm_server_base_url / host / port. Each trajectory stays on one "
            "replica (prefix cache); new trajectories go to the least-loaded one."
        },
    )
    vllm_weight_publisher: str = field(
        default="auto",
        metadata={
            "help": "How θ_{k+1} reaches the servers after each optimizer step: 'nccl' (TRL's weight-transfer "
            "client, full weights, GPU), 'lora' (the adapter hot-loaded as `policy-v{k}`; needs a PEFT policy and "
            "servers started with --enable-lora), 'http' (a safetensors file, embedded servers); 'auto': 'http' for "
            "embedded servers, 'nccl' for vLLM."
        },
    )
    rollout_num_servers: int = field(
        default=1, metadata={"help": "embedded_server without URLs: how many servers (replicas) to start."}
    )
    rollout_request_timeout: float = field(
        default=600.0, metadata={"help": "Seconds one generation request (one turn) may take on a server."}
    )
    rollout_restart_timeout: float = field(
        default=300.0,
        metadata={"help": "Seconds a failed server may take to come back before the batch fails (its requests are "
                  "then sent again with the same seeds)."},
    )
    rollout_retries: int = field(
        default=3, metadata={"help": "Times one request is sent again after its server failed and came back."}
    )
    rollout_max_in_flight: int = field(
        default=16, metadata={"help": "Trajectories the embedded engine decodes concurrently."}
    )
    rollout_num_threads: int = field(
        default=1, metadata={"help": "torch threads of the embedded rollout worker process."}
    )
    learner_num_threads: int | None = field(
        default=None,
        metadata={
            "help": "torch intra-op threads of the learner on CPU. None: when the embedded engine runs in a worker "
            "process, the cores it leaves free (cpu_count − rollout_num_threads, at least 1), so learner and "
            "rollout threads do not oversubscribe the CPU; otherwise torch's default."
        },
    )
    agent_max_turns: int | None = field(
        default=None,
        metadata={"help": "Agent loop: generation turns per trajectory. None: max_tool_calling_iterations + 1, or 8."},
    )
    agent_max_tokens_per_turn: int | None = field(
        default=None, metadata={"help": "Agent loop: generated tokens per turn. None: max_completion_length."}
    )
    agent_max_completion_tokens: int | None = field(
        default=None,
        metadata={"help": "Agent loop: model-generated tokens per trajectory, all turns. None: max_completion_length."},
    )
    agent_max_context_tokens: int = field(
        default=8192, metadata={"help": "Agent loop: prompt + everything appended (actions and observations)."}
    )
    agent_max_observation_tokens: int = field(
        default=256,
        metadata={"help": "Agent loop: tool-result tokens kept per observation (equal head and tail, marker between)."},
    )
    agent_tool_timeout: float = field(
        default=60.0, metadata={"help": "Agent loop: seconds a tool call may take before it becomes an error observation."}
    )
    trace: bool = field(
        default=True,
        metadata={"help": "Record a per-step trace (rollouts, tool calls, learner items, barrier, publication) as JSON "
                  "lines in <output_dir>/thundersync_trace/steps.jsonl."},
    )
    peak_flops_per_s: float | None = field(
        default=None,
        metadata={"help": "Peak FLOP/s of one trainer device (e.g. 989e12 for H100/H200 dense BF16); enables the "
                  "trainer active MFU metric (paper Appendix B)."},
    )
    allow_unscorable_groups: bool = field(
        default=False,
        metadata={
            "help": "If every reward function returns None for a whole group, raise (default) or, when True, give the "
            "group zero advantage as trl.GRPOTrainer does."
        },
    )

    def __post_init__(self) -> None:
        try:
            super().__post_init__()
        except ConfigurationError:
            raise
        except ValueError as exc:  # TRL's own checks (batch sizes, generation fields): same text, typed
            raise ConfigurationError(
                f"{exc} (ThunderSync: one generation batch of per_device_train_batch_size × steps_per_generation × "
                "processes rows is one logical batch of whole GRPO groups)"
            ) from exc
        self._refuse_unstreamable()
        if self.schedule not in SCHEDULES:
            raise ConfigurationError(f"schedule={self.schedule!r} is not one of {SCHEDULES}")
        if self.rollout_engine not in ROLLOUT_ENGINES:
            raise ConfigurationError(f"rollout_engine={self.rollout_engine!r} is not one of {ROLLOUT_ENGINES}")
        if self.max_open_groups is not None and self.max_open_groups < 1:
            raise ConfigurationError(f"max_open_groups={self.max_open_groups} must be ≥ 1 (or None for no cap)")
        if self.learner_num_threads is not None and self.learner_num_threads < 1:
            raise ConfigurationError(f"learner_num_threads={self.learner_num_threads} must be ≥ 1 (or None)")
        for name in ("agent_max_turns", "agent_max_tokens_per_turn", "agent_max_completion_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigurationError(f"{name}={value} must be ≥ 1 (or None for the default)")
        if self.agent_max_context_tokens < 1 or self.agent_max_observation_tokens < 2 or self.agent_tool_timeout <= 0:
            raise ConfigurationError(
                f"agent_max_context_tokens={self.agent_max_context_tokens}, agent_max_observation_tokens="
                f"{self.agent_max_observation_tokens} and agent_tool_timeout={self.agent_tool_timeout} must be positive "
                "(observations keep at least one head and one tail token)"
            )
        if self.rollout_max_in_flight < 1:
            raise ConfigurationError(f"rollout_max_in_flight={self.rollout_max_in_flight} must be ≥ 1")
        self._check_servers()

    def resolved_rollout_engine(self, uses_rollout_func: bool) -> str:
        """The engine `rollout_engine='auto'` stands for."""
        if self.rollout_engine != "auto":
            return self.rollout_engine
        if self.use_vllm:
            return "vllm_server"
        return "trl" if uses_rollout_func else "embedded_server"

    def server_urls(self) -> list[str] | None:
        """Rollout server URLs: `vllm_server_base_urls`, else (use_vllm) TRL's single-server fields; None: start
        embedded servers."""
        if self.vllm_server_base_urls:
            return list(self.vllm_server_base_urls)
        if not self.use_vllm:
            return None
        if self.vllm_server_base_url:
            return [self.vllm_server_base_url]
        return [f"http://{self.vllm_server_host}:{self.vllm_server_port}"]

    def _check_servers(self) -> None:
        if self.vllm_weight_publisher not in WEIGHT_PUBLISHERS:
            raise ConfigurationError(
                f"vllm_weight_publisher={self.vllm_weight_publisher!r} is not one of {WEIGHT_PUBLISHERS}"
            )
        if self.rollout_num_servers < 1 or self.rollout_retries < 0:
            raise ConfigurationError(f"rollout_num_servers={self.rollout_num_servers} must be ≥ 1 and "
                                     f"rollout_retries={self.rollout_retries} ≥ 0")
        if self.rollout_request_timeout <= 0 or self.rollout_restart_timeout <= 0:
            raise ConfigurationError(f"rollout_request_timeout={self.rollout_request_timeout} and "
                                     f"rollout_restart_timeout={self.rollout_restart_timeout} must be > 0")
        urls = self.vllm_server_base_urls
        if urls is not None and (not urls or len(set(urls)) != len(urls)):
            raise ConfigurationError(f"vllm_server_base_urls={urls} must name at least one server, each once")
        engine = self.rollout_engine
        if self.use_vllm and engine not in ("auto", "vllm_server"):
            raise ConfigurationError(f"use_vllm=True generates on vLLM servers, but rollout_engine={engine!r}; "
                                     "leave rollout_engine='auto' (or set use_vllm=False)")
        if engine == "vllm_server" and not self.use_vllm:
            raise ConfigurationError("rollout_engine='vllm_server' needs use_vllm=True and vllm_mode='server' (TRL's "
                                     "fields); for the embedded server use rollout_engine='embedded_server'")
        if urls and engine not in ("auto", "vllm_server", "embedded_server"):
            raise ConfigurationError(f"vllm_server_base_urls is set but rollout_engine={engine!r} does not use "
                                     "servers; set rollout_engine='embedded_server' or use_vllm=True")
        if urls and engine == "auto" and not self.use_vllm:
            raise ConfigurationError("vllm_server_base_urls is set: also set use_vllm=True, vllm_mode='server' for "
                                     "vLLM servers, or rollout_engine='embedded_server' for embedded ones")

    def agent_limits(self):
        """The agent loop's budgets, with the TRL fields as defaults."""
        from ..envs.agent_loop import AgentLimits

        turns = self.agent_max_turns
        if turns is None:
            turns = self.max_tool_calling_iterations + 1 if self.max_tool_calling_iterations is not None else 8
        return AgentLimits(
            max_turns=turns,
            max_tokens_per_turn=self.agent_max_tokens_per_turn or self.max_completion_length,
            max_completion_tokens=self.agent_max_completion_tokens or self.max_completion_length,
            max_context_tokens=self.agent_max_context_tokens,
            max_observation_tokens=self.agent_max_observation_tokens,
            tool_timeout_s=self.agent_tool_timeout,
        )

    def _refuse_unstreamable(self) -> None:
        def refuse(name: str, value, why: str) -> None:
            raise UnsupportedOptionError(f"ThunderSyncGRPOConfig: {name}={value!r} is not supported: {why}")

        if self.loss_type not in SUPPORTED_LOSS_TYPES:
            refuse("loss_type", self.loss_type, f"supported loss types are {SUPPORTED_LOSS_TYPES}")
        if self.num_iterations != 1:
            refuse("num_iterations", self.num_iterations,
                   "more than one update per generation batch trains on samples from an older policy; use 1")
        if self.steps_per_generation != self.gradient_accumulation_steps:
            refuse("steps_per_generation", self.steps_per_generation,
                   f"one generation batch must feed exactly one optimizer step, so it must equal "
                   f"gradient_accumulation_steps={self.gradient_accumulation_steps}")
        if self.top_entropy_quantile < 1.0:
            refuse("top_entropy_quantile", self.top_entropy_quantile,
                   "the entropy quantile is taken over a micro-batch that is only known at the barrier; use 1.0")
        if self.off_policy_mask_threshold is not None:
            refuse("off_policy_mask_threshold", self.off_policy_mask_threshold,
                   "off-policy masking has nothing to mask at zero staleness; leave it None")
        if self.entropy_coef != 0.0 or self.use_adaptive_entropy:
            refuse("entropy_coef", self.entropy_coef, "the entropy bonus is not streamed yet; use 0.0")
        if self.multi_objective_aggregation != "sum_then_normalize":
            refuse("multi_objective_aggregation", self.multi_objective_aggregation,
                   "only 'sum_then_normalize' is streamed so far")
        if self.delta is not None and self.delta < 1.0:
            refuse("delta", self.delta, "a two-sided clip below 1 cuts the on-policy gradient; use None or ≥ 1")
        if self.use_vllm and self.vllm_mode != "server":
            refuse("vllm_mode", self.vllm_mode, "ThunderSync generates on rollout servers in other processes while "
                   "the learner runs; use vllm_mode='server' (or use_vllm=False for the embedded engine)")
        if self.use_vllm and self.vllm_importance_sampling_correction and self.loss_type == "vespo":
            refuse("vllm_importance_sampling_correction", self.vllm_importance_sampling_correction,
                   "with loss_type='vespo' TRL folds the ratio into VESPO's gamma weights, which is not streamed; set "
                   "it to False or pick another loss_type")
        if self.use_liger_kernel:
            refuse("use_liger_kernel", self.use_liger_kernel, "the Liger GRPO loss bypasses the streamed learner")
