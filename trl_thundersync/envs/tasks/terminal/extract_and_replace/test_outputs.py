"""Verifier for extract_and_replace."""

from pathlib import Path

WS = Path.cwd()


def test_extracted_layout():
    assert all((WS / "src" / rel).is_file() for rel in ("docs/intro.txt", "docs/done.txt", "docs/guide.md",
                                                         "notes/todo.txt"))


def test_txt_files_replaced():
    assert (WS / "src/docs/intro.txt").read_text() == "DONE: write intro\nSee DONE list.\n"
    assert (WS / "src/notes/todo.txt").read_text() == "DONE DONE\n"
    assert (WS / "src/docs/done.txt").read_text() == "nothing to do\n"


def test_markdown_untouched():
    assert (WS / "src/docs/guide.md").read_text() == "# TODO heading\nTODO in markdown stays\n"


def test_archive_kept():
    assert (WS / "bundle.tar.gz").is_file()
