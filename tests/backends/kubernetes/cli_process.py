"""The real ``kubetune`` entry point in a fresh interpreter, as the Kubernetes CLI tests run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
HEAVY = ("torch", "transformers", "peft", "kubernetes")  # what render, validate and cluster init --render never import


def run_kubetune(*args: str, env: dict | None = None, probe: bool = False) -> subprocess.CompletedProcess:
    """``kubetune ARGS`` (``env`` added to this environment); with ``probe``, stderr ends with ``HEAVY [...]``:
    which of :data:`HEAVY` the command imported."""
    code = (
        "import sys\n"
        f"sys.argv = ['kubetune', *{list(args)!r}]\n"
        "from kubetune.cli import main\n"
        "try:\n    main()\n"
        "except SystemExit as e:\n    code = e.code\nelse:\n    code = 0\n"
        + (f"print('HEAVY', sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)\n" if probe else "")
        + "sys.exit(code)\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120, env={**os.environ, **(env or {})})
