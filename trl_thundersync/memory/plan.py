"""The memory plan of a GRPO run: bytes per learner process, line by line, for stock TRL, `sync` and `thundersync`.

What a learner process holds (P_t trainable parameters, P all parameters, w bytes per parameter element):

| line                     | bytes                                            | held by                    |
|--------------------------|--------------------------------------------------|----------------------------|
| weights                  | P·w                                              | all three                  |
| gradients (`param.grad`) | P_t·w                                            | all three                  |
| optimizer state          | 2·P_t·w (Adam family), P_t·w (Lion), 0 (SGD)     | all three                  |
| reference model          | P·w (β ≠ 0 without PEFT)                         | all three                  |
| sharded replica          | 4·P, twice with a reference (ZeRO-3 / FSDP2)     | sync, thundersync          |
| batch accumulator        | 4·P_t: the batch direction (FP32)                | sync, thundersync          |
| group statistics         | 4·2k·P_t: G1, G2 of k open groups                | thundersync (sync: below)  |
| source gradient          | 4·P_t: the pass's H_i, before it folds into them | thundersync (sync: below)  |
| release buffers          | 4·m·P_t: m trajectories waiting for their reward | thundersync (content/turn) |
| optional terms           | router, entropy bonus, normalize_then_sum, mask  | sync, thundersync          |

`sync` is this package's schedule="sync": the same learner, run after the batch closed, so it holds no release
buffer (every reward is known), and with `batch_group_members` (the default, on a replicated placement with
`num_iterations=1`) it learns each group as one pass at its reward, advantage-weighted, into the batch accumulator:
no group statistics either (`group_passes`). Otherwise its open groups hold G1, G2 as thundersync's do. The
streamed lines come from `streaming/batch_metrics.streamed_state_bytes`, the function the logged
`thundersync/stats_bound_mb` comes from.

Not planned: activations of a learner pass, the shared prefix's activations (`thundersync/prefix_peak_mb` measures
them), the framework's own memory and the rollout side. Every figure is a prediction; the trainer logs the measured
peak beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..streaming.batch_metrics import streamed_state_bytes

# which lines each schedule holds (`PlanLine.held_by`), in the table's column order
HELD = {"trl": ("all",), "sync": ("all", "streamed"), "thundersync": ("all", "streamed", "thundersync")}


@dataclass(frozen=True)
class MemorySpec:
    """What the plan is computed from: the model's parameter counts and the run's settings (one learner process)."""

    total_params: int  # every parameter of the policy model, trainable or not
    trainable_params: int  # P_t: what the optimizer updates (LoRA: the adapter)
    param_bytes: int  # bytes per parameter element (4 for FP32, 2 for BF16/FP16)
    optimizer: str  # `TrainingArguments.optim` (e.g. "adamw_torch", "sgd")
    batch_size: int  # trajectories per generation batch on this process
    num_generations: int  # members per GRPO group
    release: str  # "content", "reward" or "turn"
    max_open_groups: int | None  # admission cap (None: every group of the batch)
    max_buffered_trajectories: int | None  # release-buffer cap (None: every trajectory of the batch)
    beta: float = 0.0  # KL coefficient: β ≠ 0 without PEFT keeps a reference model
    peft: bool = False  # the reference is the adapter-free base (no second copy)
    sharded: bool = False  # ZeRO-3 / FSDP2 full shard: every rank gathers a replica of θ_k
    micro_batches: int = 1  # steps_per_generation (the entropy bonus keeps one buffer per micro-batch)
    entropy_bonus: bool = False
    router_aux: bool = False
    objective_functions: int = 0  # normalize_then_sum: K reward functions (0: off)
    off_policy_mask: bool = False
    group_passes: bool = True  # sync learns each group in one pass at its reward (no G1, G2; module docstring)


@dataclass(frozen=True)
class PlanLine:
    """One line of the plan."""

    name: str
    bytes: int
    held_by: str  # "all" (stock TRL too), "streamed" (sync and thundersync) or "thundersync"
    detail: str  # how it is computed, for the table


@dataclass(frozen=True)
class MemoryPlan:
    """The predicted bytes of one learner process; `device` is where they live ("cpu", "cuda:0", ...)."""

    spec: MemorySpec
    lines: tuple[PlanLine, ...]
    device: str
    open_groups: int  # the k the streamed statistics are planned for
    buffered: int  # trajectories planned to hold a release buffer

    def total(self, schedule: str) -> int:
        """Planned bytes under "trl" (stock TRL), "sync" or "thundersync"."""
        return sum(line.bytes for line in self.lines if line.held_by in HELD[schedule])

    def table(self) -> str:
        """The plan as a fixed-width table (logged at the start of a run; printed by `python -m ...memory`)."""
        rows = [f"memory plan per learner process on {self.device} (a prediction; activations, the framework and "
                "the rollout side not included)",
                f"  {'line':<18}{'stock TRL':>12}{'sync':>12}{'thundersync':>13}  how"]
        for line in self.lines:
            cells = [human_bytes(line.bytes) if line.held_by in HELD[s] else "" for s in HELD]
            rows.append(f"  {line.name:<18}{cells[0]:>12}{cells[1]:>12}{cells[2]:>13}  {line.detail}")
        totals = [self.total(s) for s in HELD]
        trl, sync, thundersync = (human_bytes(t) for t in totals)
        rows.append(f"  {'total':<18}{trl:>12}{sync:>12}{thundersync:>13}  "
                    f"thundersync/sync = {totals[2] / totals[1]:.2f}x")
        return "\n".join(rows)


def plan_memory(spec: MemorySpec, device: str = "cpu") -> MemoryPlan:
    """The plan of `spec` (see the module docstring for every line)."""
    if spec.batch_size < spec.num_generations or spec.batch_size % spec.num_generations:
        raise ValueError(f"batch_size={spec.batch_size} is not a multiple of num_generations={spec.num_generations}")
    p_all, p_t, w = spec.total_params, spec.trainable_params, spec.param_bytes
    groups = spec.batch_size // spec.num_generations
    open_groups = min(spec.max_open_groups or groups, groups)
    buffered = 0 if spec.release == "reward" else min(spec.max_buffered_trajectories or spec.batch_size,
                                                       spec.batch_size)
    states = optimizer_states(spec.optimizer)
    lines = [PlanLine("weights", p_all * w, "all", f"{p_all:,} params x {w} B"),
             PlanLine("gradients", p_t * w, "all", f"{p_t:,} trainable x {w} B"),
             PlanLine("optimizer state", states * p_t * w, "all", f"{states} x trainable x {w} B ({spec.optimizer})")]
    if spec.beta != 0.0 and not spec.peft:
        lines.append(PlanLine("reference model", p_all * w, "all", f"beta={spec.beta:g}: a frozen copy"))
    if spec.sharded:
        copies = 2 if spec.beta != 0.0 and not spec.peft else 1
        lines.append(PlanLine("sharded replica", copies * 4 * p_all, "streamed",
                              "ZeRO-3/FSDP2: each rank gathers theta_k"))
    stats = streamed_state_bytes(
        p_t, batch_size=spec.batch_size, num_generations=spec.num_generations, open_groups=open_groups,
        release=spec.release, beta=spec.beta, max_buffered=buffered or None, micro_batches=spec.micro_batches,
        router=spec.router_aux, entropy=spec.entropy_bonus, objective_functions=spec.objective_functions,
        off_policy_mask=spec.off_policy_mask)
    group_bytes = 4 * (2 * open_groups + 1) * p_t
    lines.append(PlanLine("batch accumulator", 4 * p_t, "streamed", "4 B x trainable"))
    member_by_member = "thundersync" if spec.group_passes else "streamed"
    lines.append(PlanLine("group statistics", group_bytes - 4 * p_t, member_by_member,
                          f"4 B x 2 x {open_groups} open groups x trainable"))
    lines.append(PlanLine("source gradient", 4 * p_t, member_by_member, "4 B x trainable: one pass's H_i"))
    release = 4 * buffer_vectors(spec) * buffered * p_t
    if release:
        lines.append(PlanLine("release buffers", release, "thundersync",
                              f"4 B x trainable x {buffered} trajectories waiting for their reward ({spec.release})"))
    if stats - group_bytes - release:
        lines.append(PlanLine("optional terms", stats - group_bytes - release, "streamed",
                              "router / entropy bonus / normalize_then_sum / off-policy mask buffers"))
    return MemoryPlan(spec=spec, lines=tuple(lines), device=device, open_groups=open_groups, buffered=buffered)


def optimizer_states(optim: str) -> int:
    """Parameter-sized state tensors per trainable parameter: 2 for the Adam family, 1 for Lion, 0 for plain SGD
    (transformers' "sgd" has no momentum), 2 for anything else (assumed: the plan errs on the large side)."""
    name = optim.lower()
    if name.startswith("sgd"):
        return 0
    if "lion" in name:
        return 1
    return 2


def buffer_vectors(spec: MemorySpec) -> int:
    """Parameter-sized FP32 vectors one trajectory's release buffer holds: H_i, plus K_i under turn release with β,
    plus E_i with the entropy bonus (`streamed_state_bytes`)."""
    vectors = 2 if spec.release == "turn" and spec.beta != 0.0 else 1
    return vectors + (1 if spec.release == "turn" and spec.entropy_bonus else 0)


def human_bytes(n: int) -> str:
    """Bytes as GB above 100 MB, else MB (decimal units, as the table prints them)."""
    return f"{n / 1e9:.3f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"
