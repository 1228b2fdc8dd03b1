"""Datasets: read rows, detect their format, render chat templates, mask the loss, tokenize."""

from .prepare import Prepared, prepare_datasets

__all__ = ["Prepared", "prepare_datasets"]
