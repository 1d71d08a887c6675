"""Verifier for greet_script."""

import os
import subprocess
from pathlib import Path

WS = Path.cwd()
SCRIPT = WS / "bin" / "greet.sh"


def run(*args):
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=10, cwd=WS)


def test_script_exists_with_shebang():
    assert SCRIPT.read_text().startswith("#!/bin/sh")


def test_script_is_executable():
    assert os.access(SCRIPT, os.X_OK)


def test_greets_name():
    done = run("Ada")
    assert done.returncode == 0 and done.stdout == "Hello, Ada!\n"


def test_name_with_spaces():
    assert run("Ada Lovelace").stdout == "Hello, Ada Lovelace!\n"


def test_usage_without_arguments():
    done = run()
    assert done.returncode == 2 and done.stdout == "" and "usage: greet.sh NAME" in done.stderr
