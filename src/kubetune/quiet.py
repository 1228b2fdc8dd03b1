"""Third-party notices that tell a kubetune user nothing they can act on, kept out of terminals and logs.

kubetune reports its own progress (stages, steps, tokens/s, ETA) and its own warnings (``warning:`` lines,
warning events, the ``kubetune.*`` loggers). The libraries under it add notices of their own: an optional
package they looked for and did without, deprecations that only their own callers (peft, trl, transformers
itself) can fix, and tqdm bars, which a log file keeps as lines of carriage returns. Each filter here names
one notice of one library, so everything else, kubetune's warnings included, still shows; ``--debug``
(``KUBETUNE_DEBUG=1``) keeps them all.

Only kubetune's own entry points call these (the CLI, the worker, the KFP stages): a program that imports
kubetune as a library keeps its own warning, logging and progress-bar settings.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

from . import constants as C

__all__ = ["quiet_library_notices", "disable_library_progress_bars", "LIBRARY_WARNINGS", "LIBRARY_LOG_NOTICES", "PROGRESS_BAR_ENV"]

# (category, regex the warning's message starts with): raised inside libraries, for code kubetune does not own.
LIBRARY_WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    # transformers 5 renamed the property; peft (PeftModel) and trl still read the old name when they wrap a model.
    (FutureWarning, r"`is_gradient_checkpointing` is deprecated"),
)

# logger name -> substrings of the one notice dropped from it (other records of that logger pass).
LIBRARY_LOG_NOTICES: dict[str, tuple[str, ...]] = {
    # bitsandbytes' CPU backend (peft imports bitsandbytes even for plain LoRA) looks for the optional `kernels`
    # package at import, to fetch a 4-bit kernel from the Hub; without it, it uses its own kernel.
    "bitsandbytes.backends.cpu.ops": ("kernels-community", "pip install kernels"),
}

# The libraries' own switches for their tqdm bars (read when each library is imported).
PROGRESS_BAR_ENV = ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS")


class _DropNotice(logging.Filter):
    def __init__(self, needles: tuple[str, ...]) -> None:
        super().__init__()
        self.needles = needles

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # a record that cannot be formatted is the logging module's to report
            return True
        return not any(n in text for n in self.needles)


def _on(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE")


def _debug() -> bool:
    return os.environ.get(C.ENV_DEBUG) == "1"


def quiet_library_notices() -> None:
    """Drop the library notices listed in :data:`LIBRARY_WARNINGS` and :data:`LIBRARY_LOG_NOTICES` in this process
    (nothing with ``KUBETUNE_DEBUG=1``). Safe to call more than once."""
    if _debug():
        return
    for category, message in LIBRARY_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    for name, needles in LIBRARY_LOG_NOTICES.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropNotice) for f in logger.filters):
            logger.addFilter(_DropNotice(needles))


def disable_library_progress_bars() -> None:
    """Turn off the tqdm bars of huggingface_hub, transformers and datasets through their own switches: the
    environment variables they read at import (inherited by the processes this one starts; a value the user set
    wins) and, for a library already imported, its ``disable_progress_bar(s)()`` (nothing with ``KUBETUNE_DEBUG=1``)."""
    if _debug():
        return
    for name in PROGRESS_BAR_ENV:
        os.environ.setdefault(name, "1")
    hub = _on("HF_HUB_DISABLE_PROGRESS_BARS")  # transformers' bars follow huggingface_hub's switch
    if hub and "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if hub and "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    if _on("HF_DATASETS_DISABLE_PROGRESS_BARS") and "datasets" in sys.modules:
        from datasets.utils import logging as ds_logging

        ds_logging.disable_progress_bar()
