"""Verifier for fix_server_port."""

from pathlib import Path

WS = Path.cwd()
ORIGINAL = """# Application configuration
[server]
host = 0.0.0.0
port = 80800
workers = 4
debug = true

[admin]
host = 127.0.0.1
port = 9090
debug = true

[logging]
level = info
file = /var/log/app.log
""".splitlines()


def lines():
    return (WS / "app.conf").read_text().splitlines()


def section(name):
    current, out = None, {}
    for line in lines():
        if line.startswith("["):
            current = line.strip("[]")
        elif current == name and "=" in line:
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def test_server_port_fixed():
    assert section("server")["port"] == "8080"


def test_server_debug_off():
    assert section("server")["debug"] == "false"


def test_admin_section_unchanged():
    assert section("admin") == {"host": "127.0.0.1", "port": "9090", "debug": "true"}


def test_other_lines_unchanged():
    current = lines()
    assert len(current) == len(ORIGINAL)
    changed = [i for i, (a, b) in enumerate(zip(ORIGINAL, current)) if a != b]
    assert changed == [3, 5]
