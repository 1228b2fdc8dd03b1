"""A fault injector for tests/distributed, loaded by putting this folder on PYTHONPATH.

In the process whose RANK equals $KT_FAULT_RANK, from optimizer step $KT_FAULT_STEP on, the trainer's
training step raises (KT_FAULT=raise) or never returns (KT_FAULT=hang). Other processes are untouched.
"""

import os
import sys

_RANK = os.environ.get("KT_FAULT_RANK")


def _patch(trainer_cls) -> None:
    at = int(os.environ.get("KT_FAULT_STEP", "2"))
    mode = os.environ.get("KT_FAULT", "raise")
    original = trainer_cls.training_step

    def training_step(self, *args, **kwargs):
        if self.state.global_step >= at:
            if mode == "hang":
                import time

                time.sleep(3600)
            raise RuntimeError(f"injected failure on rank {_RANK} at step {self.state.global_step}")
        return original(self, *args, **kwargs)

    trainer_cls.training_step = training_step


if _RANK is not None and os.environ.get("RANK") == _RANK:
    import importlib.abc
    import importlib.util

    class _PatchTrainer(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "transformers.trainer":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            load = spec.loader.exec_module

            def exec_module(module):
                load(module)
                _patch(module.Trainer)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _PatchTrainer())
