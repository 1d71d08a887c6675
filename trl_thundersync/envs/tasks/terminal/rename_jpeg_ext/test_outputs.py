"""Verifier for rename_jpeg_ext."""

from pathlib import Path

WS = Path.cwd()
RENAMED = {
    "photos/beach.jpg": "img-a",
    "photos/2023/summer/summer trip.jpg": "img-b",
    "photos/2024/PORTRAIT.jpg": "img-c",
}
UNTOUCHED = {"photos/2024/city.jpg": "img-d", "photos/raw/logo.png": "png", "photos/raw/list.jpeg.txt": "notes"}


def files():
    return {str(p.relative_to(WS)) for p in (WS / "photos").rglob("*") if p.is_file()}


def test_no_jpeg_extension_left():
    assert not [f for f in files() if f.lower().endswith(".jpeg")]


def test_renamed_files_present_with_content():
    assert all((WS / name).is_file() and (WS / name).read_text() == text for name, text in RENAMED.items())


def test_other_files_untouched():
    assert all((WS / name).read_text() == text for name, text in UNTOUCHED.items())


def test_no_extra_files():
    assert files() == set(RENAMED) | set(UNTOUCHED)
