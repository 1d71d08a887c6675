"""Verifier for archive_csv_reports."""

import tarfile
from pathlib import Path

WS = Path.cwd()
EXPECTED = {
    "data/2024/q1/revenue.csv": "month,revenue\njan,100\nfeb,120\nmar,90\n",
    "data/2024/q1/costs.csv": "month,costs\njan,80\nfeb,85\nmar,70\n",
    "data/2024/q2/revenue.csv": "month,revenue\napr,130\nmay,140\njun,150\n",
    "data/regions.csv": "id,name\n1,north\n2,south\n",
}


def members():
    with tarfile.open(WS / "reports.tar.gz", "r:gz") as tar:
        return {m.name.removeprefix("./"): tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}


def test_archive_is_gzip_tar():
    assert tarfile.is_tarfile(WS / "reports.tar.gz")
    assert (WS / "reports.tar.gz").read_bytes()[:2] == b"\x1f\x8b"


def test_all_csv_files_included():
    assert set(EXPECTED) <= set(members())


def test_no_other_files():
    assert set(members()) <= set(EXPECTED)


def test_contents_intact():
    found = members()
    assert all(found.get(name) == text for name, text in EXPECTED.items())


def test_data_left_in_place():
    assert all((WS / name).read_text() == text for name, text in EXPECTED.items())
    assert (WS / "data/misc/points.CSV").is_file()
