"""Verifier for fix_permissions."""

import stat
from pathlib import Path

WS = Path.cwd()


def mode(rel):
    return stat.S_IMODE((WS / rel).stat().st_mode)


def test_secrets_directory_private():
    assert mode("secrets") == 0o700


def test_secret_files_private():
    assert mode("secrets/api.key") == 0o600 and mode("secrets/db.pass") == 0o600


def test_public_files_readable():
    assert mode("public/index.html") == 0o644 and mode("public/style.css") == 0o644


def test_scripts_executable():
    assert mode("scripts/backup.sh") == 0o755 and mode("scripts/deploy.sh") == 0o755


def test_readme_not_executable_and_contents_kept():
    assert mode("scripts/README") == 0o644
    assert (WS / "secrets/api.key").read_text() == "k1" and (WS / "public/index.html").read_text() == "hello"
