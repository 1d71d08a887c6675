"""Cgroup discovery and per-command cgroups of the sandbox (`envs/runtimes/cgroup.py`).

Discovery is checked on synthetic /proc/self/cgroup and mountinfo text over fake mount points (cgroup v1 as on the
development host, and v2, which the host does not have); the real per-command cgroups are checked as root.
Run: python -m pytest tests/unit/envs/runtimes/test_sandbox_cgroup.py -q
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trl_thundersync.envs.runtimes.cgroup import CommandCgroup, cgroup_parents, find_parents


def mountinfo_line(mount_id: int, root: str, point: Path, fstype: str, options: str) -> str:
    return f"{mount_id} 23 0:{mount_id} {root} {point} rw,relatime - {fstype} {fstype} {options}"


def test_cgroup_v1_hierarchies_are_found_per_controller(tmp_path: Path) -> None:
    (tmp_path / "pids").mkdir()
    memory = tmp_path / "memory" / "job" / "abc"
    memory.mkdir(parents=True)
    (tmp_path / "cpu").mkdir()
    proc_cgroup = "8:pids:/\n4:memory:/job/abc\n1:cpu:/\n0::/\n"
    mountinfo = "\n".join([
        mountinfo_line(32, "/", tmp_path / "cpu", "cgroup", "rw,cpu"),
        mountinfo_line(35, "/", tmp_path / "memory", "cgroup", "rw,memory"),
        mountinfo_line(39, "/", tmp_path / "pids", "cgroup", "rw,pids"),
    ])
    assert find_parents(proc_cgroup, mountinfo) == {"pids": tmp_path / "pids", "memory": memory}


@pytest.mark.parametrize(("delegated", "expected"), [("cpu pids memory", {"pids", "memory"}), ("pids", {"pids"}),
                                                     ("", set())])
def test_cgroup_v2_needs_each_controller_in_subtree_control(tmp_path: Path, delegated: str, expected: set) -> None:
    own = tmp_path / "unified" / "service"
    own.mkdir(parents=True)
    (own / "cgroup.subtree_control").write_text(delegated + "\n")
    found = find_parents("0::/service\n", mountinfo_line(41, "/", tmp_path / "unified", "cgroup2", "rw"))
    assert found == {controller: own for controller in expected}


def test_a_cgroup_outside_the_mounted_subtree_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "pids").mkdir()
    mountinfo = mountinfo_line(39, "/container", tmp_path / "pids", "cgroup", "rw,pids")
    assert find_parents("8:pids:/elsewhere\n", mountinfo) == {}


@pytest.mark.skipif(os.geteuid() != 0, reason="root only: creates real cgroups")
def test_command_cgroup_sets_both_caps_and_is_removed() -> None:
    parents = cgroup_parents()
    cgroup = CommandCgroup(parents, 7, 64 << 20)
    try:
        assert (cgroup.paths["pids"] / "pids.max").read_text().strip() == "7"
        memory = cgroup.paths["memory"]
        if (memory / "memory.max").exists():  # v2
            assert (memory / "memory.max").read_text().strip() == str(64 << 20)
        else:
            assert (memory / "memory.limit_in_bytes").read_text().strip() == str(64 << 20)
            if (memory / "memory.memsw.limit_in_bytes").exists():
                assert (memory / "memory.memsw.limit_in_bytes").read_text().strip() == str(64 << 20)
        assert cgroup.oom_kills() == 0
        assert cgroup.join_prefix()[-1] == "--"
    finally:
        cgroup.remove()
    assert not any(path.exists() for path in cgroup.paths.values())
