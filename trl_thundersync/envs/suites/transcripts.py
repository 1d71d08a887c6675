"""Messages of synthetic warm-start episodes, in the chat template's tool-call format (`tiny.agent` renders them)."""

from __future__ import annotations

SUBMITTED = "Submitted. The episode is over; your work will now be graded."  # the environments' reply to submit()


def tool_call(name: str, arguments: dict) -> dict:
    """An assistant message calling one tool."""
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}


def shell_result(stdout: str) -> dict:
    """The tool message of a `run_shell` call that exited 0 and printed `stdout`."""
    return {"role": "tool", "name": "run_shell", "content": f"exit_code: 0\nstdout:\n{stdout}"}


def submitted() -> dict:
    """The tool message of a `submit` call."""
    return {"role": "tool", "name": "submit", "content": SUBMITTED}


def environment_tools(environment) -> list:
    """The `run_shell` and `submit` tools of an environment class (built over no tasks: only their schemas)."""
    env = environment(tasks={})
    return [env.run_shell, env.submit]
