"""The README stays true to the files it shows: its copy of the quickstart spec is examples/quickstart.yaml."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def test_readme_quickstart_spec_is_the_example_file():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    intro = text.index("A job spec ([examples/quickstart.yaml](examples/quickstart.yaml))")
    block = re.search(r"```yaml\n(.*?)```", text[intro:], re.S)
    assert block, "the README shows the quickstart spec in a yaml block after its link"
    shown = yaml.safe_load(block.group(1))
    assert shown == yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text(encoding="utf-8"))
