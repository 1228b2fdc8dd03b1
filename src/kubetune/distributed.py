"""Compatibility entry point: ``python -m kubetune.distributed`` is ``python -m kubetune.launch``.

kubetune's launcher (torchrun plus the first failing rank's reason, the spec's timeouts and preemption) lives
in :mod:`kubetune.launch`; what a rank does about the others lives in :mod:`kubetune.training.distributed`.
This module stays because pods rendered by older kubetune versions (and scripts written for them) run
``python -m kubetune.distributed``: it takes the same command line and behaves the same. Nothing inside
kubetune imports it; new code uses :mod:`kubetune.launch`.
"""

from __future__ import annotations

import sys

from .launch import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
