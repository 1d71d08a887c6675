"""The memory plan of a GRPO run: bytes per learner process, line by line, for stock TRL, `sync` and `thundersync`.

What a learner process holds (P_t trainable parameters, P all parameters, w bytes per parameter element), and when:

| line                     | bytes                                            | held by                    | when     |
|--------------------------|--------------------------------------------------|----------------------------|----------|
| framework                | measured before training: resident set − weights | all three                  | always   |
| weights                  | P·w                                              | all three                  | always   |
| reference model          | P·w (β ≠ 0 without PEFT)                         | all three                  | always   |
| optimizer state          | 2·P_t·w (Adam family), P_t·w (Lion), 0 (SGD)     | all three                  | always   |
| gradients (`param.grad`) | P_t·w                                            | all three                  | barrier  |
| sharded replica          | 4·P, twice with a reference (ZeRO-3 / FSDP2)     | sync, thundersync          | always   |
| batch accumulator        | 4·P_t: the batch direction's sum (FP32)          | sync, thundersync          | always   |
| pass gradients           | (w + 4)·P_t: autograd's, and their FP32 sum      | sync, thundersync          | passes   |
| activations              | the largest learner pass (`activations.py`)      | sync, thundersync          | passes   |
| batch direction          | 4·P_t: what the barrier writes into `param.grad` | sync, thundersync          | barrier  |
| group statistics         | 4·2k·P_t: G1, G2 of k open groups                | thundersync (sync: below)  | passes   |
| shared prefix            | one group's prompt graph and K/V adjoints        | sync, thundersync          | passes   |
| open prefixes            | the other k − 1 open groups' prompts             | thundersync                | passes   |
| release buffers          | 4·m·P_t: m trajectories waiting for their reward | thundersync (content/turn) | passes   |
| optional terms           | router, entropy bonus, normalize_then_sum, mask  | sync, thundersync          | passes   |
| allocator (CPU)          | P_t·w: freed gradients the C heap keeps          | sync, thundersync (CPU)    | always   |
| activations (TRL)        | one TRL micro-batch's pass                       | stock TRL                  | always   |

A streamed schedule's peak is the lines held always plus the larger of its two phases: the learner passes (during
the rollouts, `param.grad` is empty: TRL's loop set it to None after the last step) and the barrier (the statistics
are folded and freed, the direction written into `param.grad`). Stock TRL holds every one of its lines at once (its
`param.grad` accumulates over the micro-batches while their activations live).

`sync` is this package's schedule="sync": the same learner, run after the batch closed, so it holds no release
buffer (every reward is known), and with `batch_group_members` (the default, on a replicated placement with
`num_iterations=1`) it learns each group as one pass at its reward, advantage-weighted, into the batch accumulator:
no group statistics either (`group_passes`). Otherwise its open groups hold G1, G2 as thundersync's do. The
streamed lines come from `streaming/batch_metrics.streamed_state_bytes`, the function the logged
`thundersync/stats_bound_mb` comes from.

The framework line is a measurement (the process's resident set before training, less the weights; 0 where not
measured: the command without a model, a CUDA device); every other figure is a prediction. On a CPU learner the
per-parameter gradients of a pass are small allocations that glibc serves from its heap and keeps resident once
freed (measured on the ladder at 43 M parameters: the resident set between steps stays about P_t·w above the live
tensors, and about that much lower with `MALLOC_MMAP_THRESHOLD_=65536`); the `allocator (CPU)` line plans them.
The shared prefix (`shared_prefix`, prompts of at least `shared_prefix_min_prompt_tokens`) is planned per open group
from the longest prompt; `thundersync/prefix_peak_mb` measures it. Not planned: other retained memory and the
rollout side. The trainer logs the measured peak beside the plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..streaming.batch_metrics import streamed_state_bytes

# which lines each schedule holds (`PlanLine.held_by`), in the table's column order
HELD = {"trl": ("all", "trl"), "sync": ("all", "streamed"), "thundersync": ("all", "streamed", "thundersync")}
PHASES = ("passes", "barrier")  # `PlanLine.when`, besides "always"


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
    framework_bytes: int = 0  # measured: the process's resident set before training, less the weights (0: unknown)
    activation_bytes: int = 0  # the largest learner pass (`activations.py`; 0: not planned)
    trl_activation_bytes: int = 0  # one stock-TRL micro-batch's pass
    pass_tokens: int = 0  # the tokens the activations were planned for (for the table)
    prefix_bytes: int = 0  # one open group's shared prefix (`activations.prefix_bytes`; 0: no shared prefix)
    cpu_heap: bool = False  # a CPU learner: the C allocator keeps a pass's freed small tensors resident
    # the paper's layout (§4.3, App. H.2), planned only (the trainer keeps the streamed state on the device today):
    optimizer_shards: int = 1  # ZeRO-1: each of N learner ranks holds 1/N of the optimizer state
    optimizer_state_bytes: int | None = None  # bytes per state element (None: the parameters'; 4: FP32 moments)
    host_state: bool = False  # the FP32 streamed state in pinned host memory, each pass's gradients copied there
    largest_param: int = 0  # elements of the largest trainable parameter (host_state: the device's staging)


@dataclass(frozen=True)
class PlanLine:
    """One line of the plan."""

    name: str
    bytes: int
    held_by: str  # "all" (stock TRL too), "streamed" (sync and thundersync), "thundersync" or "trl" (only)
    detail: str  # how it is computed, for the table
    when: str = "always"  # "always", or one phase of a streamed schedule: "passes" or "barrier"
    where: str = "device"  # "device" or "host" (`MemorySpec.host_state`)


@dataclass(frozen=True)
class MemoryPlan:
    """The predicted bytes of one learner process; `device` is where they live ("cpu", "cuda:0", ...)."""

    spec: MemorySpec
    lines: tuple[PlanLine, ...]
    device: str
    open_groups: int  # the k the streamed statistics are planned for
    buffered: int  # trajectories planned to hold a release buffer

    def total(self, schedule: str, where: str = "device") -> int:
        """Planned peak bytes on the device (or the host) under "trl" (stock TRL: every line at once), "sync" or
        "thundersync" (the lines held always, plus the larger of the passes and the barrier)."""
        held = [line for line in self.lines if line.held_by in HELD[schedule] and line.where == where]
        if schedule == "trl":
            return sum(line.bytes for line in held)
        phases = [sum(line.bytes for line in held if line.when == phase) for phase in PHASES]
        return sum(line.bytes for line in held if line.when == "always") + max(phases)

    def table(self) -> str:
        """The plan as a fixed-width table (logged at the start of a run; printed by `python -m ...memory`)."""
        rows = [f"memory plan per learner process on {self.device} (a prediction, but the measured framework line; "
                "peak = lines held always + the larger phase; the rollout side not included)",
                f"  {'line':<18}{'stock TRL':>12}{'sync':>12}{'thundersync':>13}  {'when':<8} how"]
        for line in self.lines:
            cells = [human_bytes(line.bytes) if line.held_by in HELD[s] else "" for s in HELD]
            name = f"{line.name} [host]" if line.where == "host" else line.name
            rows.append(f"  {name:<18}{cells[0]:>12}{cells[1]:>12}{cells[2]:>13}  {line.when:<8} {line.detail}")
        for where in ("device", "host") if self.spec.host_state else ("device",):
            totals = [self.total(s, where) for s in HELD]
            trl, sync, thundersync = (human_bytes(t) for t in totals)
            label = "peak" if not self.spec.host_state else f"peak ({where})"
            ratio = f"thundersync/sync = {totals[2] / totals[1]:.2f}x" if totals[1] else ""
            rows.append(f"  {label:<18}{trl:>12}{sync:>12}{thundersync:>13}  {'':<8} {ratio}")
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
    state_bytes, shards = spec.optimizer_state_bytes or w, max(1, spec.optimizer_shards)
    framework = ("measured: resident set before training, less the weights" if spec.framework_bytes
                 else "not measured (no process yet)")
    lines = [PlanLine("framework", spec.framework_bytes, "all", framework),
             PlanLine("weights", p_all * w, "all", f"{p_all:,} params x {w} B")]
    if spec.beta != 0.0 and not spec.peft:
        lines.append(PlanLine("reference model", p_all * w, "all", f"beta={spec.beta:g}: a frozen copy"))
    sharded_state = f" / {shards} ranks (ZeRO-1)" if shards > 1 else ""
    lines.append(PlanLine("optimizer state", states * p_t * state_bytes // shards, "all",
                          f"{states} x trainable x {state_bytes} B{sharded_state} ({spec.optimizer})"))
    if spec.host_state:  # the barrier copies this rank's shard of the FP32 direction up for its optimizer step
        lines.append(PlanLine("gradients", 4 * p_t // shards, "all", f"4 B x trainable{sharded_state}: the step's "
                              "shard of the direction", when="barrier"))
    else:
        lines.append(PlanLine("gradients", p_t * w, "all", f"{p_t:,} trainable x {w} B (param.grad)", when="barrier"))
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
    tokens = f"{spec.pass_tokens:,} tokens" if spec.pass_tokens else "not planned"
    state = "host" if spec.host_state else "device"  # where the FP32 streamed state lives
    if spec.host_state:  # each parameter's gradient leaves for the host as autograd produces it
        largest = spec.largest_param or p_t
        pass_gradients = PlanLine("pass gradients", 2 * largest * w, "streamed",
                                  f"2 x the largest parameter ({largest:,}) x {w} B: staged to the host",
                                  when="passes")
    else:
        pass_gradients = PlanLine("pass gradients", (w + 4) * p_t, "streamed",
                                  f"({w} + 4) B x trainable: autograd's and their FP32 sum", when="passes")
    lines += [PlanLine("batch accumulator", 4 * p_t, "streamed", "4 B x trainable", where=state),
              pass_gradients,
              PlanLine("activations", spec.activation_bytes, "streamed", f"the largest pass: {tokens}",
                       when="passes"),
              PlanLine("batch direction", 4 * p_t, "streamed", "4 B x trainable, written into param.grad",
                       when="barrier", where=state)]
    member_by_member = "thundersync" if spec.group_passes else "streamed"
    lines.append(PlanLine("group statistics", group_bytes - 4 * p_t, member_by_member,
                          f"4 B x 2 x {open_groups} open groups x trainable", when="passes", where=state))
    if spec.prefix_bytes:  # sync holds one group's prefix at a time, thundersync one per open group
        lines.append(PlanLine("shared prefix", spec.prefix_bytes, "streamed",
                              "one group's prompt: its forward graph and key/value adjoints", when="passes"))
        if open_groups > 1:
            lines.append(PlanLine("open prefixes", (open_groups - 1) * spec.prefix_bytes, "thundersync",
                                  f"{open_groups - 1} more open groups' prompts", when="passes"))
    release = 4 * buffer_vectors(spec) * buffered * p_t
    if release:
        lines.append(PlanLine("release buffers", release, "thundersync",
                              f"4 B x trainable x {buffered} trajectories waiting for their reward ({spec.release})",
                              when="passes", where=state))
    if stats - group_bytes - release:
        lines.append(PlanLine("optional terms", stats - group_bytes - release, "streamed",
                              "router / entropy bonus / normalize_then_sum / off-policy mask buffers",
                              when="passes", where=state))
    if spec.cpu_heap:
        lines.append(PlanLine("allocator (CPU)", w * p_t, "streamed",
                              "a pass's per-parameter gradients, freed into the C heap, stay resident"))
    lines.append(PlanLine("activations (TRL)", spec.trl_activation_bytes, "trl", "one TRL micro-batch's pass"))
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
