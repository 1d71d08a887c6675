"""Verifier for unique_client_ips."""

from pathlib import Path

WS = Path.cwd()
EXPECTED = {
    "10.0.0.14", "10.0.0.16", "10.0.0.17", "10.0.0.18", "10.0.0.2", "10.0.0.20", "10.0.0.5", "10.0.1.1",
    "10.0.1.14", "10.0.1.17", "10.0.1.18", "10.0.1.3", "10.0.1.4", "10.0.1.5", "10.0.1.7", "10.0.1.9", "10.0.2.1",
    "10.0.2.13", "10.0.2.2", "10.0.2.25", "10.0.2.26", "10.0.2.4", "10.0.2.6", "172.16.0.10", "192.168.1.7",
}


def ips():
    return (WS / "ips.txt").read_text().split()


def test_every_ip_listed_once():
    listed = ips()
    assert len(listed) == len(set(listed)) and set(listed) == EXPECTED


def test_sorted_numerically():
    listed = ips()
    assert listed == sorted(EXPECTED, key=lambda ip: tuple(int(part) for part in ip.split(".")))


def test_top_ip():
    assert (WS / "top_ip.txt").read_text().strip() == "192.168.1.7"
