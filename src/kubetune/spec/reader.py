"""Reading a job spec's YAML safely: bounded in size, aliases, nesting and types, with file:line errors.

A spec is small, hand-written data, but it also arrives from other people (a pull request, a server
request, a sweep state): a few hundred bytes of YAML aliases ("billion laughs") expand to billions of
values, a deep ``[[[[...`` exhausts the stack, a duplicate key silently drops a value. Everything here
refuses those before any value reaches the spec's models:

* the file: at most :data:`~kubetune.constants.SPEC_MAX_BYTES`, UTF-8 (the byte offset and line of the
  first bad byte are named), exactly one YAML document;
* the values: at most :data:`~kubetune.constants.SPEC_MAX_VALUES` once aliases are expanded (counted
  while the document is composed, so an alias bomb stops after that many values, not after expanding),
  nesting at most :data:`~kubetune.constants.SPEC_MAX_DEPTH` deep, no recursive aliases, no duplicate keys,
  only JSON-like types (``!!binary``, ``!!set``, ``!!omap`` and ``!!pairs`` are refused; dates stay
  strings), no NaN or infinity, no integer too long to parse.

Parsing uses libyaml's event parser when PyYAML has it (fast), composing the nodes in Python (where the
limits are counted); both are PyYAML's, whose safe loader never builds Python objects from tags.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent
from yaml.nodes import MappingNode
from yaml.resolver import Resolver

from .. import constants as C
from ..errors import SpecError

__all__ = ["read_spec_file", "parse_spec_text", "parse_value", "check_shape", "where_written", "Located"]

try:  # libyaml's parser: the scanning is in C; the composing below stays in Python
    from yaml._yaml import CParser as _Parser

    _C_PARSER = True
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml.parser import Parser as _Parser  # type: ignore[assignment]
    from yaml.reader import Reader as _Reader
    from yaml.scanner import Scanner as _Scanner

    _C_PARSER = False

_MERGE_TAG = "tag:yaml.org,2002:merge"


class Located(dict):
    """Where each value of a parsed spec was written: path tuple (keys as strings) -> ``file:line``."""


class _LimitError(yaml.MarkedYAMLError):
    """A spec passed one of the limits above (raised while parsing, so it carries the line)."""


class _Composer(Composer):
    """PyYAML's composer, counting values (aliases by their full expansion) and nesting as it goes."""

    def _init_limits(self) -> None:
        self._values = 0  # values composed so far, aliases counted by what they expand to
        self._depth = 0
        self._sizes: dict[int, int] = {}  # id(node) -> its expanded size, once composed

    def compose_node(self, parent, index):  # noqa: D102 - PyYAML's hook
        if self.check_event(AliasEvent):
            mark = self.peek_event().start_mark
            node = super().compose_node(parent, index)  # the anchored node (or PyYAML's undefined-alias error)
            size = self._sizes.get(id(node))
            if size is None:
                raise _LimitError(None, None, "a recursive alias (an alias inside its own anchor) is not allowed in a job spec", mark)
            self._count(size, mark)
            return node
        mark = self.peek_event().start_mark
        self._depth += 1
        if self._depth > C.SPEC_MAX_DEPTH:
            raise _LimitError(None, None, f"nesting deeper than {C.SPEC_MAX_DEPTH} levels is not allowed in a job spec", mark)
        before = self._values
        self._count(1, mark)
        node = super().compose_node(parent, index)
        self._depth -= 1
        self._sizes[id(node)] = self._values - before
        return node

    def _count(self, n: int, mark) -> None:
        self._values += n
        if self._values > C.SPEC_MAX_VALUES:
            raise _LimitError(
                None, None,
                f"the spec holds more than {C.SPEC_MAX_VALUES:,} values once its aliases are expanded "
                "(an alias bomb, or far more data than a job spec needs)",
                mark,
            )


class _Constructor(SafeConstructor):
    """PyYAML's safe constructor, refusing duplicate keys and types a spec has no use for."""

    def construct_mapping(self, node, deep=False):  # noqa: D102 - PyYAML's hook
        if isinstance(node, MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue  # `<<: *base` merges; keys written next to it win, as YAML says
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark)
                except TypeError:
                    continue  # unhashable: PyYAML reports it below
                if first is not key_node.start_mark:
                    raise _LimitError(
                        None, None,
                        f"duplicate key '{key}' (first at line {first.line + 1}); a key may appear once in a mapping",
                        key_node.start_mark,
                    )
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node):  # noqa: D102 - PyYAML's hook
        try:
            return super().construct_yaml_int(node)
        except ValueError:  # Python refuses to parse integers of more than 4300 digits
            raise _LimitError(None, None, "this integer is too long to be a spec value", node.start_mark) from None

    def construct_unsupported(self, node):
        tag = node.tag.replace("tag:yaml.org,2002:", "!!")
        raise _LimitError(None, None, f"the YAML type {tag} is not allowed in a job spec (use strings, numbers, lists and mappings)", node.start_mark)


_Constructor.add_constructor("tag:yaml.org,2002:int", _Constructor.construct_yaml_int)
_Constructor.add_constructor("tag:yaml.org,2002:timestamp", SafeConstructor.construct_yaml_str)  # dates stay strings
for _tag in ("binary", "set", "omap", "pairs"):
    _Constructor.add_constructor(f"tag:yaml.org,2002:{_tag}", _Constructor.construct_unsupported)

if _C_PARSER:

    class _Loader(_Composer, _Constructor, Resolver, _Parser):  # type: ignore[misc,valid-type]
        def __init__(self, text: str) -> None:
            _Parser.__init__(self, text)
            _Composer.__init__(self)
            _Constructor.__init__(self)
            Resolver.__init__(self)
            self._init_limits()

        # libyaml's parser also composes; these keep the composing (and its limits) in Python
        get_single_node = Composer.get_single_node
        check_node = Composer.check_node
        get_node = Composer.get_node

else:  # pragma: no cover

    class _Loader(_Reader, _Scanner, _Parser, _Composer, _Constructor, Resolver):  # type: ignore[no-redef]
        def __init__(self, text: str) -> None:
            _Reader.__init__(self, text)
            _Scanner.__init__(self)
            _Parser.__init__(self)
            _Composer.__init__(self)
            _Constructor.__init__(self)
            Resolver.__init__(self)
            self._init_limits()


# --- entry points --------------------------------------------------------------------------------
def read_spec_file(path: Path) -> tuple[Any, Located]:
    """Read and parse the spec file ``path`` within the limits above.

    Returns:
        The parsed data (None for an empty file) and where each of its values was written.

    Raises:
        SpecError: the file is missing, too big, not UTF-8, not YAML or past a limit, naming file:line.
    """
    if not path.exists():
        raise SpecError(f"spec file not found: {path}", hint="pass the path of a YAML job spec, e.g. examples/quickstart.yaml")
    if not path.is_file():
        kind = "a directory" if path.is_dir() else "not a regular file (a device, pipe or socket)"
        raise SpecError(f"{path} is {kind}; a job spec is a YAML file", hint="pass the path of a YAML job spec, e.g. examples/quickstart.yaml")
    try:
        with path.open("rb") as f:
            raw = f.read(C.SPEC_MAX_BYTES + 1)  # never more, whatever the file claims to be
    except OSError as e:
        raise SpecError(f"{path}: cannot read the spec file: {e.strerror or e}") from None
    if len(raw) > C.SPEC_MAX_BYTES:
        raise SpecError(
            f"{path}: the spec file is larger than {C.SPEC_MAX_BYTES // 1024} KiB; a job spec is a short YAML file",
            hint="keep data out of the spec: point dataset.source at a data file instead",
        )
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise SpecError(
            f"{path}:{line}: the spec file is not UTF-8 text (byte {e.start}: 0x{raw[e.start]:02x})",
            hint="save the file as UTF-8",
        ) from None
    return parse_spec_text(text, str(path))


def parse_spec_text(text: str, label: str = "<spec>") -> tuple[Any, Located]:
    """Parse spec YAML ``text`` (named ``label`` in errors) within the limits above.

    Returns:
        The parsed data and where each of its values was written (path -> ``label:line``).

    Raises:
        SpecError: not YAML, more than one document, or past a limit, naming ``label:line``.
    """
    try:
        return _parse(text, label)
    except yaml.YAMLError as e:
        raise _yaml_error(e, label, text) from None


def parse_value(text: str) -> Any:
    """An override's value (``--set KEY=VALUE``) as YAML: a scalar or a flow collection, like ``helm --set``.

    Text that is not valid YAML stays the text itself (``--set name=a:b`` means the string).

    Raises:
        SpecError: the value is valid YAML but past a limit (aliases, nesting, size, duplicate keys).
    """
    if text == "":
        return ""
    try:
        return _parse(text, "value")[0]
    except _LimitError as e:
        raise _yaml_error(e, f"value '{text[:40]}{'...' if len(text) > 40 else ''}'") from None
    except yaml.YAMLError:
        return text


def check_shape(data: Any, label: str = "", located: Located | None = None) -> None:
    """Refuse spec data that is too big or too deep, contains itself, or holds NaN, infinity, integers beyond
    64 bits or NUL characters.

    YAML files are bounded while they are parsed; this bounds data handed over in Python (a dict, an
    override) the same way, walking at most :data:`~kubetune.constants.SPEC_MAX_VALUES` values.

    Args:
        data: the spec data.
        label: the file it came from, for messages.
        located: where each value was written (:func:`parse_spec_text`), to name ``file:line`` too.

    Raises:
        SpecError: naming the path of the offending value.
    """
    count = 0
    problems: list[str] = []
    stack: list[tuple[Any, tuple, int]] = [(data, (), 1)]
    while stack:
        value, path, depth = stack.pop()
        count += 1
        where = ".".join(str(p) for p in path) or "(spec)"
        line = where_written(path, located)
        where = f"{line}: {where}" if line else where
        if count > C.SPEC_MAX_VALUES:
            raise SpecError(f"{_prefix(label)}the spec holds more than {C.SPEC_MAX_VALUES:,} values (or refers to itself); a job spec is small")
        if depth > C.SPEC_MAX_DEPTH:
            raise SpecError(f"{_prefix(label)}{where}: nesting deeper than {C.SPEC_MAX_DEPTH} levels (or a value that contains itself)")
        if isinstance(value, float) and not math.isfinite(value):
            problems.append(f"{where}: {value} is not allowed (a spec holds finite numbers only)")
        elif isinstance(value, int) and not -(2**63) <= value < 2**63:  # JSON/Kubernetes integers are 64-bit
            problems.append(f"{where}: an integer beyond 64 bits is not allowed")
        elif isinstance(value, str) and "\x00" in value:
            problems.append(f"{where}: a NUL character is not allowed in a spec value")
        elif isinstance(value, dict):
            for k in value:
                if isinstance(k, str) and "\x00" in k:
                    problems.append(f"{where}: a NUL character is not allowed in a key")
            stack.extend((v, path + (k,), depth + 1) for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            stack.extend((v, path + (i,), depth + 1) for i, v in enumerate(value))
    if problems:
        problems.sort()
        raise SpecError(f"invalid job spec{' ' + label if label else ''}:\n  " + "\n  ".join(problems), problems=problems)


def where_written(path: tuple, located: Located | None) -> str:
    """``file:line`` of the value at ``path``, or of its nearest section that has one."""
    if not located:
        return ""
    key = tuple(str(p) for p in path)
    for n in range(len(key), 0, -1):
        if key[:n] in located:
            return located[key[:n]]
    return ""


# --- helpers -------------------------------------------------------------------------------------
def _parse(text: str, label: str) -> tuple[Any, Located]:
    if len(text) > C.SPEC_MAX_BYTES:
        raise _LimitError(None, None, f"larger than {C.SPEC_MAX_BYTES // 1024} KiB; a job spec is a short YAML document", None)
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()
    located = Located()
    if node is not None:
        _locate(node, (), label, located, set())
    return data, located


def _prefix(label: str) -> str:
    return f"{label}: " if label else ""


def _yaml_error(e: yaml.YAMLError, label: str, text: str = "") -> SpecError:
    mark = getattr(e, "problem_mark", None)
    where = f"{label}:{mark.line + 1}" if mark is not None else label
    if isinstance(e, yaml.reader.ReaderError):  # a control character; the reader counts characters, not lines
        line = text[: e.position].count("\n") + 1
        code = e.character if isinstance(e.character, int) else ord(e.character)
        return SpecError(f"{label}:{line}: not valid YAML: the control character U+{code:04X} is not allowed")
    if isinstance(e, _LimitError):
        hint = None
        if "values once its aliases" in str(e.problem):
            hint = "a spec holds settings, not data: keep data in dataset files, and write values out rather than through YAML aliases"
        return SpecError(f"{where}: {e.problem}", hint=hint)
    problem = getattr(e, "problem", None)
    if problem == "but found another document" or getattr(e, "context", None) == "expected a single document in the stream":
        return SpecError(f"{where}: a job spec is one YAML document, and this file holds more than one ('---' separates them)")
    ctx = getattr(e, "context_mark", None)
    context = f" ({e.context} at line {ctx.line + 1})" if ctx is not None and getattr(e, "context", None) else ""
    return SpecError(f"{where}: not valid YAML: {problem or e}{context}")


def _locate(node, path: tuple, label: str, out: Located, seen: set[int]) -> None:
    """Record the line of every value under ``node`` (each aliased node once: its first path)."""
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, MappingNode):
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG or not hasattr(key_node, "value") or not isinstance(key_node.value, str):
                continue
            sub = path + (key_node.value,)
            out.setdefault(sub, f"{label}:{key_node.start_mark.line + 1}")
            _locate(value_node, sub, label, out, seen)
    elif isinstance(node.value, list):
        for i, item in enumerate(node.value):
            sub = path + (str(i),)
            out.setdefault(sub, f"{label}:{item.start_mark.line + 1}")
            _locate(item, sub, label, out, seen)
