"""When one learner process fails, every process of the job ends, with the cause, within a bounded time (issue 13
item 5). `StreamingLifecycle.train` runs TRL's loop inside a `RankFailureGuard`:

    with RankFailureGuard(rank, world_size, args.ddp_timeout, step=lambda: state.global_step):
        ...  # TRL's training loop: streamed batches, barriers, publications

- The failing process prints one line on stderr before its traceback, `ThunderSync: rank 1 of 2 failed at
  optimizer step 1: RewardFunctionError: ...`, and posts it to the job's rendezvous store (torch.distributed's
  TCP store: the launcher agent's on node 0 under `accelerate launch` / `torchrun`). The first failure posted wins:
  a process whose collective then fails reports the root cause beside its own.
- Every process watches the store (`POLL_S`). When another process posted a failure, or the store itself is gone
  (the launcher of node 0, or rank 0 hosting it, ended), it prints `ThunderSync: rank 0 of 2 stops: ...` and
  interrupts its main thread (SIGINT: a blocking sleep or read returns, the guard turns it into `PeerProcessError`);
  a process that has not ended `STOP_GRACE_S` later (stuck inside a collective's C++ wait) exits with status 1.
- Collectives: every collective of the job (our barrier's reduce, `rollout/publish_role.py`'s broadcasts,
  TRL's gathers) fails after TrainingArguments' `ddp_timeout` (default 1800 s). transformers passes it to the
  process group on GPUs but not with `use_cpu=True`; the guard sets it on the default group either way.

The bound, for a process that fails by raising: POLL_S + STOP_GRACE_S (11 s) for every other process. For one that
dies without raising (SIGKILL, OOM killer, segfault): on its node the launcher stops the others at once (about a
second); on other nodes, a process ends at its next collective — at once over gloo (the sockets close), after
`ddp_timeout` over NCCL — or STORE_LOST_POLLS × POLL_S + STOP_GRACE_S (13 s) after the store went (node 0 died).
A process that hangs without failing is met by the others' collective timeout (`ddp_timeout`), whose failure is
then posted and ends it. Measured in `tests/integration/test_rank_failure.py`.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from ..errors import PeerProcessError

POLL_S = 1.0  # how often each process looks at the store for another's failure
STOP_GRACE_S = 10.0  # after interrupting its main thread, how long a stopping process may take to unwind
# polls in a row that must find the store unreachable before a process stops: without a launcher, rank 0 hosts the
# store and may end its script a moment before a slower rank has left `train()` (torchrun's agents keep the store
# up until every node is done)
STORE_LOST_POLLS = 3
_KEY = "thundersync/rank_failure/{}"  # one key per `train()` call of the job (every process counts the same)
_runs = 0


def bound_collectives(timeout_s: float) -> None:
    """Every later collective on the default process group fails after `timeout_s` seconds instead of waiting for a
    process that is gone or hung (torch's default: 30 min on gloo whatever `ddp_timeout` says, 10 on NCCL)."""
    from torch.distributed.distributed_c10d import _set_pg_timeout  # torch ≥ 2.2 (the project needs ≥ 2.6)

    _set_pg_timeout(timedelta(seconds=timeout_s))


def _job_store() -> Any:
    """torch.distributed's store of this job (None when the process group has none to share)."""
    from torch.distributed.distributed_c10d import _get_default_store

    try:
        return _get_default_store()
    except (RuntimeError, ValueError):
        return None


class RankFailureGuard:
    """Context manager around one process's training run of a job of `world_size` processes (a no-op for one)."""

    def __init__(self, rank: int, world_size: int, ddp_timeout: float, step: Callable[[], int], *,
                 store: Any = None, poll_s: float = POLL_S, grace_s: float = STOP_GRACE_S,
                 hard_exit: Callable[[int], Any] = os._exit) -> None:
        """`step()`: the optimizer step now (named in the report); `store`: the job's store (default: the process
        group's); `hard_exit`: how a process that did not unwind in time ends (a seam for the unit tests)."""
        self.rank, self.world_size, self.ddp_timeout = rank, world_size, ddp_timeout
        self._step, self._poll_s, self._grace_s, self._hard_exit = step, poll_s, grace_s, hard_exit
        self._store: Any = store
        self._key = ""
        self._done = threading.Event()  # set when the run ends here (the watcher stops looking)
        self.peer_failure: str | None = None  # what another process posted, once the watcher saw it
        self._previous_sigint: Any = None  # the SIGINT handler before __enter__ (restored at __exit__)

    def __enter__(self) -> RankFailureGuard:
        global _runs
        if self.world_size <= 1:
            return self
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            bound_collectives(self.ddp_timeout)
        _runs += 1
        self._key = _KEY.format(_runs)
        if self._store is None:
            self._store = _job_store()
        if self._store is not None:
            # the watcher stops this process with SIGINT, which must raise KeyboardInterrupt in the main thread: a
            # handler some library left (SIG_IGN, or one that only sets a flag) would let a blocking call go on
            if threading.current_thread() is threading.main_thread():
                self._previous_sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
            threading.Thread(target=self._watch, name="thundersync-rank-failure", daemon=True).start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._done.set()
        if self._previous_sigint is not None:
            signal.signal(signal.SIGINT, self._previous_sigint)
            self._previous_sigint = None
        if exc is None or self.world_size <= 1:
            return False
        if isinstance(exc, KeyboardInterrupt) and self.peer_failure is not None:  # the watcher's interrupt
            raise PeerProcessError(f"rank {self.rank} of {self.world_size} stopped: {self.peer_failure}") from exc
        message = (str(exc).strip().splitlines() or [""])[0][:500]  # the traceback follows on stderr
        own = (f"rank {self.rank} of {self.world_size} failed at optimizer step {self._step()}: "
               f"{type(exc).__name__}: {message}")
        first = self._post(own)
        if first in (None, own):
            hint = (f"; the other processes stop within {self._poll_s + self._grace_s:.0f} s (or when the launcher "
                    f"stops them; collectives time out after ddp_timeout={self.ddp_timeout:g} s)")
            print(f"ThunderSync: {own}{hint}", file=sys.stderr, flush=True)
        else:
            print(f"ThunderSync: {own} — after {first}", file=sys.stderr, flush=True)
        return False

    def _post(self, report: str) -> str | None:
        """Post `report` unless another process posted first; returns the report that stands (None: no store)."""
        if self._store is None:
            return None
        try:
            return self._store.compare_set(self._key, "", report).decode()
        except Exception:  # the store is gone too (node 0 ended): the report still goes to stderr
            return None

    def _watch(self) -> None:
        """Daemon thread: stop this process once another posted its failure or the job's store is gone."""
        lost = 0  # consecutive polls that found the store unreachable
        while not self._done.wait(self._poll_s):
            try:
                if not self._store.check([self._key]):
                    lost = 0
                    continue
                posted = self._store.get(self._key).decode()
            except Exception as exc:  # any store failure: the process hosting it has ended
                lost += 1
                if lost < STORE_LOST_POLLS:
                    continue
                posted = (f"the job's rendezvous store is unreachable ({type(exc).__name__}: {exc}): the launcher "
                          "of node 0 (or rank 0, its host) has ended")
            if self._done.is_set() or posted.startswith(f"rank {self.rank} of "):
                return
            self._stop_process(posted)
            return

    def _stop_process(self, cause: str) -> None:
        self.peer_failure = cause
        print(f"ThunderSync: rank {self.rank} of {self.world_size} stops: {cause}", file=sys.stderr, flush=True)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        time.sleep(self._grace_s)
        print(f"ThunderSync: rank {self.rank} of {self.world_size} still runs {self._grace_s:g} s after the stop "
              "(blocked in a collective, or in its teardown): exiting with status 1", file=sys.stderr, flush=True)
        self._hard_exit(1)
