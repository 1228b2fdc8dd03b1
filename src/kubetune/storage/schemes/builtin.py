"""``builtin://NAME``: the tiny models the training package generates (once) for demos and tests."""

from __future__ import annotations

from pathlib import Path

from ... import constants as C
from .._common import TransferStats, copy_tree
from ..location import Location
from . import FETCH, FetchOptions, Scheme, register

__all__ = ["BuiltinScheme"]


class BuiltinScheme(Scheme):
    """``builtin://tiny-chat``: made under ``$KUBETUNE_HOME/models`` by :func:`kubetune.training.builtin.materialize`."""

    names = (C.BUILTIN_SCHEME,)
    operations = frozenset({FETCH})

    def parse(self, uri: str, scheme: str, rest: str, revision: str | None) -> Location:
        """``builtin://NAME``: the name is the host."""
        return Location(uri=uri, scheme=scheme, host=rest.strip("/"))

    def fetch(self, loc: Location, dest: Path | None, stats: TransferStats, options: FetchOptions) -> Path:
        """The generated model's folder, or a copy of it in ``dest``."""
        from ...training.builtin import materialize  # the training package owns model code (an allowed upward call)

        result = materialize(loc.host)
        if dest is not None:
            copy_tree(result, dest, stats)
            return dest
        return result


register(BuiltinScheme())
