"""The README's shell blocks, run top to bottom as a newcomer runs them: every command must succeed.

The README is the user's path: its ```bash / ```sh / ```console blocks are extracted in order and run, one
shell for all of them (so `source .venv/bin/activate` holds for the commands after it), in a copy of the
repository, as a user would in a fresh clone after `make setup`. The user's shell is imitated: no
KUBETUNE_HOME (the kubetune home is the default one, under a temporary HOME), the venv's bin not on PATH
until the README activates it. A ```console block shows ``$ command`` lines followed by what the command
prints: those lines must appear in its output.

A command escapes this only through the lists below, each entry with its reason.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"

# Commands not run here, with why. Only what a test machine cannot have or must not do belongs here.
SKIP = {
    "make test": "runs the whole test suite, this test included (recursion; half an hour on 2 cores)",
}
# Commands run in another form, with why.
REPLACE = {
    # `make quickstart` depends on `setup`, which installs .venv when pyproject.toml is newer than it; in the
    # copy every file is new, and the .venv is the one running this test: -o (--old-file) tells make that
    # .venv/bin/kubetune is up to date, so the quickstart runs exactly as written without reinstalling anything.
    "make quickstart": "make -o .venv/bin/kubetune quickstart",
}
# Commands the README shows failing on purpose, with the exit code it promises.
EXPECTED_EXIT = {
    "kubetune validate examples/quickstart.yaml --set training.learnig_rate=1e-4": 2,  # how a mistake is reported
}
SHELL_LANGS = ("bash", "sh", "shell", "console")
# Copied into the tour's repository: everything but what a fresh clone does not have.
_NOT_COPIED = shutil.ignore_patterns(".git", ".venv", "runs", ".kubetune-home", "__pycache__", ".pytest_cache", "*.egg-info", "kubetune.schema.json")


@dataclass
class Command:
    line: int  # README line number
    text: str  # as the README writes it (comments included)
    expected: list[str]  # console blocks: the output lines shown under it

    @property
    def key(self) -> str:
        """The command without comments or extra spaces (what the lists above name)."""
        return " ".join(shlex.split(self.text, comments=True))


def readme_commands(text: str) -> list[Command]:
    """The commands of the README's shell blocks, in order (continuation lines joined)."""
    out: list[Command] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w+)\s*$", lines[i])
        i += 1
        if not m:
            continue
        lang, body, start = m.group(1), [], i
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1
        if lang not in SHELL_LANGS:
            continue
        j = 0
        while j < len(body):
            raw, no = body[j], start + j + 1
            j += 1
            if lang == "console":
                if not raw.startswith("$ "):
                    if out and out[-1].line >= start and raw.strip():
                        out[-1].expected.append(raw.strip())
                    continue
                raw = raw[2:]
            while raw.rstrip().endswith("\\") and j < len(body):
                raw = raw.rstrip()[:-1] + " " + body[j].strip()
                j += 1
            if not raw.strip() or raw.lstrip().startswith("#"):
                continue
            assert "<<" not in raw, f"README.md:{no}: here-documents are not supported by this test"
            out.append(Command(no, raw.strip(), []))
    return out


def test_the_readme_blocks_are_found():
    cmds = readme_commands(README.read_text(encoding="utf-8"))
    keys = [c.key for c in cmds]
    assert keys[:2] == ["make quickstart", "make test"], keys
    assert "kubetune run examples/quickstart.yaml" in keys
    assert all(k in keys for k in (*SKIP, *REPLACE, *EXPECTED_EXIT)), "a list above names a command the README no longer has"


def _user_env(tmp: Path, venv_bin: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBETUNE_HOME", "XDG_CACHE_HOME", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p) != venv_bin)
    env["HOME"] = str(tmp / "home")
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(tmp / "repo" / "src"))
    return env


@pytest.mark.slow
def test_the_readme_tour_runs_top_to_bottom(tmp_path):
    venv = Path(sys.prefix)
    if venv == Path(sys.base_prefix) or not (venv / "bin" / "activate").is_file() or not (venv / "bin" / "kubetune").is_file():
        pytest.skip("needs the tests to run from a virtual environment with kubetune installed (make setup's .venv)")
    if shutil.which("make") is None:
        pytest.skip("needs make (the README's first command)")
    repo = tmp_path / "repo"
    shutil.copytree(REPO, repo, ignore=_NOT_COPIED)
    (repo / ".venv").symlink_to(venv)  # what `make setup` created; its kubetune imports the copy (PYTHONPATH)
    (tmp_path / "home").mkdir()
    out_dir = tmp_path / "out"
    out_dir.mkdir()

    cmds = readme_commands(README.read_text(encoding="utf-8"))
    script = ["cd " + shlex.quote(str(repo))]
    for n, c in enumerate(cmds):
        if c.key in SKIP:
            continue
        text = REPLACE.get(c.key, c.text)
        want = EXPECTED_EXIT.get(c.key, 0)
        o, rc = out_dir / f"{n}.out", out_dir / f"{n}.rc"
        script.append(f"{{ {text}\n}} >{shlex.quote(str(o))} 2>&1 </dev/null; echo $? >{shlex.quote(str(rc))}")
        script.append(f'[ "$(cat {shlex.quote(str(rc))})" = {want} ] || exit 0')  # stop at the first failure
    proc = subprocess.run(["bash", "-c", "\n".join(script)], env=_user_env(tmp_path, venv / "bin"), timeout=1500,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr

    for n, c in enumerate(cmds):
        if c.key in SKIP:
            continue
        rc_file, out = out_dir / f"{n}.rc", (out_dir / f"{n}.out")
        assert rc_file.is_file(), f"README.md:{c.line}: `{c.text}` did not run (an earlier command failed)"
        output = out.read_text(errors="replace")
        want = EXPECTED_EXIT.get(c.key, 0)
        assert int(rc_file.read_text()) == want, f"README.md:{c.line}: `{c.text}` exited {rc_file.read_text().strip()}, not {want}:\n{output[-3000:]}"
        for line in c.expected:
            assert line in output, f"README.md:{c.line}: `{c.text}` should print {line!r}; it printed:\n{output[-3000:]}"
