"""Which learner process publishes θ to rollout servers that several processes share, and how the others learn
that it did (issue 13 item 1; TRL 1.16 does the same in `trl/generation/vllm_generation.py`: the main process
pushes the weights, then `accelerator.wait_for_everyone()`).

    role = distributed_role(rank=accelerator.process_index, world_size=accelerator.num_processes)
    engine = VLLMServerEngine(urls, tokenizer, sampling, role=role)   # every rank: its own client, its own requests
    engine.publish(model, k + 1)   # rank 0 pushes θ_{k+1} to every server; every rank returns once they acknowledged

- The main process (rank 0) is the only one that builds a `WeightPublisher` and pushes θ (full weights, or the LoRA
  adapter, loaded once per version); it starts the embedded servers and shares their URLs.
- The followers never publish. `publish()` on a follower waits in `run_on_main` for rank 0's outcome — a collective
  every process enters, so it is also the barrier: no rank sends a request of batch k+1 before every server
  acknowledged θ_{k+1}. Then each follower's engine carries version k+1 and keeps refusing a server that reports
  another (the engine's stale check on every response).
- Failure: when rank 0's publication (or server start) raises, rank 0 shares the cause before re-raising it, and
  every follower raises `RolloutError` naming it — nobody waits at the barrier for a publication that will not come.
  Bound: a rank 0 that dies without raising (killed, segfault) shares nothing; the followers then wait in the
  collective until the launcher ends them (`accelerate launch` / `torchrun` stop every rank of a node when one
  exits with an error, within seconds), until the collective fails (gloo: at once, the sockets close) or until
  the process group's timeout: TrainingArguments' `ddp_timeout` (default 1800 s), which the trainers' failure
  guard sets for every collective of `train()`, these included, on CPU too (`trainers/rank_failure.py`, which also
  ends the other processes, with the cause, when one raises anywhere in `train()`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import ConfigurationError, RolloutError

T = TypeVar("T")


@dataclass(frozen=True)
class PublishRole:
    """This process's part in publishing to shared rollout servers."""

    rank: int  # this learner process's index (accelerate's `process_index`); rank 0 is the main process
    world_size: int  # learner processes sharing the servers (accelerate's `num_processes`)
    share: Callable[[Any], Any]  # collective every process enters with a value; each gets back the main process's

    @property
    def main(self) -> bool:
        """True on the one process that builds the publisher, pushes θ and starts embedded servers."""
        return self.rank == 0


def _identity(value: Any) -> Any:
    return value


SINGLE_PROCESS = PublishRole(rank=0, world_size=1, share=_identity)


@dataclass(frozen=True)
class MainFailed:
    """What rank 0 shares instead of its result when the step it ran for everyone raised."""

    what: str  # the step, e.g. "publishing policy version 3"
    cause: str  # rank 0's exception, "Type: message"


def run_on_main(role: PublishRole, what: str, produce: Callable[[], T]) -> T:
    """Run `produce()` on the main process and hand its value to every process (a barrier: all return together).

    On the main process a failure is shared with the followers (`MainFailed`) and re-raised; a follower raises
    `RolloutError` with rank 0's cause. Every process must call this the same number of times, in the same order.
    """
    if role.main:
        try:
            value = produce()
        except BaseException as exc:
            if role.world_size > 1:
                role.share(MainFailed(what, f"{type(exc).__name__}: {exc}"))
            raise
        return role.share(value)
    shared = role.share(None)
    if isinstance(shared, MainFailed):
        raise RolloutError(f"the main process (rank 0) failed {shared.what}, so rank {role.rank} stops too: "
                           f"{shared.cause}")
    return shared


def distributed_role(rank: int, world_size: int) -> PublishRole:
    """The role of learner process `rank` of `world_size`, sharing through torch.distributed (which accelerate
    initialized); one process needs no collective."""
    if world_size == 1:
        return SINGLE_PROCESS
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ConfigurationError(f"{world_size} learner processes share the rollout servers, but torch.distributed "
                                 "is not initialized: start them with `accelerate launch` or `torchrun`")
    if dist.get_world_size() != world_size or dist.get_rank() != rank:
        raise ConfigurationError(f"rank {rank} of {world_size} does not match torch.distributed's rank "
                                 f"{dist.get_rank()} of {dist.get_world_size()}")

    def share(value: Any) -> Any:
        box = [value]
        dist.broadcast_object_list(box, src=0)  # pickled; tiny (a version, a cause, a few URLs)
        return box[0]

    return PublishRole(rank=rank, world_size=world_size, share=share)
