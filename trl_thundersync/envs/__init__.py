"""Agentic environments: the multi-turn agent loop, the sandbox, and the bundled SWE / terminal task suites.

    from trl_thundersync.envs.swe import SWERepairEnv            # environment_factory=SWERepairEnv
    from trl_thundersync.envs.terminal import TerminalTaskEnv
    from trl_thundersync.envs.tasks import swe_dataset, terminal_dataset, load_swe_rows
"""
