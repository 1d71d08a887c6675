"""The per-batch progress bar of `ThunderSyncGRPOTrainer`: trajectories scored, turns, tool calls, mean reward."""

from __future__ import annotations


class RolloutProgress:
    """A per-batch progress bar: trajectories scored, turns, tool calls and the running mean reward."""

    def __init__(self, total: int, version: int, disable: bool) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, desc=f"rollouts @v{version}", leave=False, disable=disable, dynamic_ncols=True)
        self.turns = self.calls = 0
        self.rewards: list[float] = []

    def update(self, source) -> None:
        agent = source.rollout.agent
        if agent is not None:
            self.turns += agent.turns
            self.calls += agent.tool_calls
        if source.scorable:
            self.rewards.append(source.reward)
        postfix = {"reward": f"{sum(self.rewards) / len(self.rewards):.3g}" if self.rewards else "-"}
        if agent is not None:
            postfix.update(turns=self.turns, tool_calls=self.calls)
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
