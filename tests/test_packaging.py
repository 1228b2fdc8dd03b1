"""Packaging: declared dependencies are the imported ones, floors agree with constraints.txt (what the suite
passed with, and what the images install), and a missing extra is one clear message, not a traceback."""

from __future__ import annotations

import ast
import importlib.metadata as md
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[_norm(name)] = version.strip()
    return pins


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _declared() -> dict[str, list[Requirement]]:
    """extra ('' for the core) -> its requirements on other distributions."""
    out = {"": [Requirement(r) for r in PROJECT["dependencies"]]}
    for extra, reqs in PROJECT["optional-dependencies"].items():
        out[extra] = [Requirement(r) for r in reqs if not r.startswith("kubetune")]
    return out


def test_constraints_pin_every_declared_dependency_within_its_range():
    """The core and every extra the test extra installs are pinned; an extra the suite does not install
    (tracking: mlflow, wandb) is pinned only where something else brought it."""
    pins = _pins()
    tested = {""} | {Requirement(r).extras.pop() for r in PROJECT["optional-dependencies"]["test"] if r.startswith("kubetune[")} | {"serve"}
    assert "kubetune" not in pins and not any("+" in v for v in pins.values())  # no local labels: +cpu would not match CUDA
    for extra, reqs in _declared().items():
        for req in reqs:
            name = _norm(req.name)
            if req.marker is not None and not req.marker.evaluate():
                continue
            if name not in pins:
                assert extra not in tested, f"{req} ({extra or 'core'}) is not in constraints.txt: run `make constraints`"
                continue
            assert req.specifier.contains(pins[name], prereleases=True), f"constraints.txt pins {name}=={pins[name]}, outside {req} ({extra or 'core'})"


def test_every_imported_package_is_declared_and_no_declared_one_is_unused():
    imported: set[str] = set()
    for path in (REPO / "src" / "kubetune").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.add(node.module.split(".")[0])
    third_party = {m for m in imported if m not in sys.stdlib_module_names and m != "kubetune"}
    providers = md.packages_distributions()
    declared = {_norm(r.name) for reqs in _declared().values() for r in reqs}
    undeclared = {m for m in third_party if not declared & {_norm(d) for d in providers.get(m, [m])}}
    # vllm is run by `kubetune serve --engine vllm` when the user installed it (GPU only; docs/serving.md).
    # habana_frameworks (Gaudi's PyTorch bridge) and amdsmi (ROCm's management library) come with the vendor's
    # base image and driver stack, never from PyPI: kubetune uses them where present (docs/accelerators.md).
    assert undeclared <= {"vllm", "habana_frameworks", "amdsmi"}, f"imported but not declared in pyproject.toml: {sorted(undeclared)}"
    modules_of = {}
    for module, dists in providers.items():
        for d in dists:
            modules_of.setdefault(_norm(d), set()).add(module)
    core_unused = {_norm(r.name) for r in _declared()[""]} - {d for d, mods in modules_of.items() if mods & third_party}
    # accelerate: transformers' Trainer needs it at run time (TRL imports it); kubetune never does.
    assert core_unused <= {"accelerate"}, f"declared but never imported: {sorted(core_unused)}"


@pytest.mark.parametrize(
    ("argv", "extra"),
    [(["serve", "builtin://tiny-chat"], "serve"), (["server", "keys", "list"], "server"), (["server"], "server")],
    ids=["serve", "server-keys", "server"],
)
def test_a_missing_extra_is_one_message_naming_it(argv, extra, tmp_path):
    blocked = ["fastapi", "sqlalchemy"]
    code = (
        "import sys\n"
        f"for m in {blocked!r}: sys.modules[m] = None  # as if not installed\n"
        f"sys.argv = ['kubetune', *{argv!r}]\n"
        "from kubetune.cli import main\n"
        "main()\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert f"needs the '{extra}' extra" in r.stderr and f"pip install 'kubetune[{extra}]'" in r.stderr
    assert "Traceback" not in r.stderr


def test_an_optional_package_imported_deep_inside_a_command_names_its_extra():
    from kubetune.extras import missing_extra

    try:
        import kubetune_no_such_module  # noqa: F401
    except ModuleNotFoundError as e:
        assert missing_extra(e) is None  # not an extra's: the traceback stays (a bug)
    err = missing_extra(ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib"))
    assert err is not None and "pip install 'kubetune[sweep]'" in str(err)
