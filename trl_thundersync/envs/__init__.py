"""Agentic environments, in layers: harness, runtimes, task data, environments, task suites (verifiers' split).

    from trl_thundersync.envs.swe import SWERepairEnv            # environment_factory=SWERepairEnv
    from trl_thundersync.envs.terminal import TerminalTaskEnv
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
  the registry that loading, validation (`python -m trl_thundersync.envs.validate`) and held-out evaluation iterate
  over; `register_suite` plugs in a suite of your own.
- `errors.py`: every sandbox and task error (`SandboxError`, `TaskFormatError`, `UnknownTaskError`,
  `TaskSetupError`, `UngradableWorkspace`).

Dependencies point one way: suites → environments → tasks → runtimes; the harness stands alone. The modules left at this
level (`swe`, `terminal`, `validate`, `sandbox`, `sandbox_api`, `agent_loop`, `trl_tool_loop`: the paths users and
docs imported) only re-export their names from the layer they moved to, so imports written before the split keep
working.
"""
