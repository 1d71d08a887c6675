"""The README lists every field `trl.GRPOConfig` adds to `TrainingArguments`, each with its status."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import transformers
import trl

README = Path(__file__).resolve().parents[4] / "README.md"


def table_fields() -> set[str]:
    text = README.read_text()
    start = text.index("Every <code>trl.GRPOConfig</code> field")
    table = text[start:text.index("</details>", start)]
    listed: set[str] = set()
    for line in table.splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            listed.update(re.findall(r"`([a-z0-9_]+)`", first_cell))
    return listed


def test_every_grpo_config_field_has_a_row():
    own = {f.name for f in dataclasses.fields(trl.GRPOConfig)} - {
        f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    listed = table_fields()
    assert not own - listed, f"GRPOConfig fields missing from the README table: {sorted(own - listed)}"
    assert not listed - own, f"README table rows that are not GRPOConfig fields: {sorted(listed - own)}"
