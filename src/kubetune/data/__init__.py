"""Datasets: read rows, detect their format, render chat templates, mask the loss, tokenize, pack, inspect.

Importing this package is light (no torch, datasets or pyarrow): those load inside the functions.
"""

from .formats import FORMATS
from .prepare import Prepared, prepare_datasets
from .templates import CHAT_TEMPLATES

__all__ = ["Prepared", "prepare_datasets", "inspect_source", "FORMATS", "CHAT_TEMPLATES"]


def inspect_source(*args, **kwargs):
    """See :func:`kubetune.data.inspect.inspect_source`."""
    from .inspect import inspect_source as _inspect

    return _inspect(*args, **kwargs)
