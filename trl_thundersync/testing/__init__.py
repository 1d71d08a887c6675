"""Moved: the tiny offline model builders are `trl_thundersync.tiny` (`tiny.model`, `tiny.agent`, `tiny.moe`); the
test-only fixtures (parity harness, scripted and replaying generators, fake teacher) live in `tests/fixtures/`.
`trl_thundersync.testing.tiny` and `.tiny_agent` stay importable for scripts written against the old paths."""
