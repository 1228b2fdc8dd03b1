"""Hyperparameter sweeps: plan (values, trials), run (submit and follow), state (sweep.json), report."""

from .run import *  # noqa: F401,F403
from .run import __all__  # noqa: F401
