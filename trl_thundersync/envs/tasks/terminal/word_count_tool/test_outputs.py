"""Verifier for word_count_tool: runs the agent's wc.py on inputs created here."""

import hashlib
import json
import subprocess
from pathlib import Path

WS = Path.cwd()
INPUTS = Path(__file__).parent / "inputs"


def count(text: str):
    INPUTS.mkdir(exist_ok=True)
    path = INPUTS / f"case-{hashlib.sha1(text.encode()).hexdigest()[:12]}.txt"
    path.write_text(text, encoding="utf-8")
    done = subprocess.run(["python3", str(WS / "wc.py"), str(path)], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_simple_text():
    assert count("hello world\nsecond line here\n") == {"lines": 2, "words": 5, "chars": 29}


def test_no_trailing_newline():
    assert count("one two\nthree") == {"lines": 1, "words": 3, "chars": 13}


def test_unicode_characters_not_bytes():
    assert count("café naïve\n日本語 テキスト\n") == {"lines": 2, "words": 4, "chars": 20}


def test_whitespace_runs_and_tabs():
    assert count("  a\t\tb  \n\n c \n") == {"lines": 3, "words": 3, "chars": 14}


def test_missing_file_exit_status():
    done = subprocess.run(["python3", str(WS / "wc.py"), str(INPUTS / "does-not-exist.txt")], capture_output=True,
                          text=True, timeout=20)
    assert done.returncode == 1 and done.stderr.strip() and not done.stdout.strip()
