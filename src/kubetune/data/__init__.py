"""Datasets: read rows, detect their format, render chat templates, mask the loss, tokenize, pack, inspect.

Importing this package is light (no torch, datasets or pyarrow): those load inside the functions. The
registries (:data:`FORMATS`, :data:`CHAT_TEMPLATES`) import nothing above kubetune's errors, so the spec can
check names against them; ``prepare`` (which takes a spec) loads on first use, which keeps
``kubetune.spec -> kubetune.data.formats`` free of a cycle back into the spec.
"""

from typing import Any

from .formats import FORMATS
from .templates import CHAT_TEMPLATES

__all__ = ["Prepared", "prepare_datasets", "inspect_source", "FORMATS", "CHAT_TEMPLATES"]


def inspect_source(*args, **kwargs):
    """See :func:`kubetune.data.inspect.inspect_source`."""
    from .inspect import inspect_source as _inspect

    return _inspect(*args, **kwargs)


def __getattr__(name: str) -> Any:
    # Prepared and prepare_datasets come from data.prepare, which imports the spec: loaded when first asked for.
    if name in ("Prepared", "prepare_datasets"):
        from . import prepare

        return getattr(prepare, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
