"""Harness: the agent side of an episode, tokens in and tokens out; it never sees a sandbox or a task.

- `agent_loop.py`: the paper's multi-turn loop (`agent_protocol="paper"`, `AgentLimits`) and the shared pieces
  (`ToolRunner`, `AgentTrajectory`, `GenerateFn`, `turn_event`).
- `trl_tool_loop.py`: TRL 1.16's episode, one trajectory at a time (`agent_protocol="trl"`, `TRLLoopLimits`).
- `tool_calls.py`: parse one turn's tool call, render a tool result, truncate observations (paper protocol).
- `tool_messages.py`: token ids of a turn's tool messages as TRL renders them (TRL protocol).
- `observation_tokens.py`: environment text to token ids that are never control tokens.
- `metrics.py`: batch metrics of agentic rollouts (`tools/*`, `agent/*`, `completions/*`).

Modules are imported one by one (`from trl_thundersync.envs.harness.agent_loop import AgentLimits`): this package
imports nothing itself, so reading the limits does not load TRL's chat-template tools.
"""
