"""Agentic environments, in layers: harness, runtimes, task data, environments, task suites (verifiers' split).

    from trl_thundersync.envs.environments import SWERepairEnv, TerminalTaskEnv  # environment_factory=SWERepairEnv
    from trl_thundersync.envs.tasks import swe_dataset, terminal_dataset, load_swe_rows

- `harness/`: the agent loops (paper and TRL protocols), tool-call parsing, tool messages, observation tokens,
  rollout metrics. Tokens in, tokens out; knows nothing of sandboxes or tasks.
- `runtimes/`: where commands run: the `Sandbox` protocol, `make_sandbox`, the bubblewrap backend, the unsandboxed
  local fallback, their shared launcher and bounded output capture, workspaces with a disk quota.
- `environments/`: the shell-task base class and the SWE, terminal, lookup and thermostat environments (TRL
  `environment_factory`).
- `tasks/`: task data: records, the bundled suites (`tasks/swe/`, `tasks/terminal/`, package data), the SWE-bench row
  loader, prompts and datasets, grading, the authenticated pytest channel and its runner.
- `suites/`: one `Suite` record per task suite (its tasks, environment, prompt, reference solution, warm start) and
  the registry that loading, validation (`python -m trl_thundersync.envs.suites.validate`) and held-out evaluation
  iterate over; `register_suite` plugs in a suite of your own.
- `errors.py`: every sandbox and task error (`SandboxError`, `TaskFormatError`, `UnknownTaskError`,
  `TaskSetupError`, `UngradableWorkspace`).

Dependencies point one way: suites → environments → tasks → runtimes; the harness stands alone. Nothing else lives
at this level: each name is imported from its layer (`envs.harness.agent_loop`, `envs.runtimes`, `envs.environments`,
`envs.suites`, ...).
"""
