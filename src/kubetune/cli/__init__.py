"""The ``kubetune`` command line: one module per command group (the only package that imports typer/rich)."""

from .main import app, main

__all__ = ["app", "main"]
