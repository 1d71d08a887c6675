"""examples_support.plumbing.resolve_model / resolve_teacher: the offline tiny folders are built once per node, with
progress there."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

from trl_thundersync.examples_support import plumbing as scripts


def fake_args(world_size: int, local_index: int, log: list):
    @contextlib.contextmanager
    def main_process_first(local, desc):
        log.append(("first", local))
        yield

    return SimpleNamespace(world_size=world_size, local_process_index=local_index,
                           main_process_first=main_process_first)


def test_the_local_main_process_builds_first_and_alone_shows_progress(tmp_path):
    log = []

    def build(progress):
        log.append(("build", progress))
        return tmp_path

    assert scripts._build_once(None, build) == str(tmp_path)
    assert scripts._build_once(fake_args(1, 0, log), build) == str(tmp_path)
    assert log == [("build", True), ("build", True)], "one process: no barrier, progress shown"
    log.clear()
    scripts._build_once(fake_args(2, 0, log), build)
    scripts._build_once(fake_args(2, 1, log), build)
    assert log == [("first", True), ("build", True), ("first", True), ("build", False)]


def test_names_other_than_the_tiny_ones_pass_through():
    assert scripts.resolve_model("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"
    assert scripts.resolve_teacher("/models/teacher") == "/models/teacher"
