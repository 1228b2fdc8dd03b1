"""The public API is small and explicit; a change to it must be deliberate."""

import kubetune


def test_public_api_is_explicit():
    assert sorted(kubetune.__all__) == sorted(
        ["Client", "JobRef", "train", "report", "report_checkpoint", "context", "RunContext", "TuneJob", "load_spec", "JobStatus", "JobState", "EventType", "KubetuneError",
         "SpecError", "DataError", "SourceError", "BackendError", "JobNotFound", "RunDirInUse", "TrainError", "__version__"]
    )
    for name in kubetune.__all__:
        assert hasattr(kubetune, name), name


def test_every_error_class_is_exported_and_drawn_in_the_tree():
    import inspect

    from kubetune import errors

    classes = {n for n, c in vars(errors).items() if inspect.isclass(c) and issubclass(c, errors.KubetuneError)}
    assert classes == set(errors.__all__)
    assert classes <= set(kubetune.__all__)
    assert all(getattr(kubetune, n) is getattr(errors, n) for n in classes)
    tree = errors.__doc__
    assert all(f" {n} " in tree for n in classes), "draw every error class in the tree of errors.py's docstring"


def test_status_and_event_types_are_the_run_directory_s():
    from kubetune import constants, events

    assert kubetune.JobStatus is events.JobStatus and kubetune.EventType is events.EventType
    assert kubetune.JobState is constants.JobState


def test_train_stays_callable_after_the_engine_loads():
    # kubetune.train is the one-call function; no subpackage may shadow it once the engine is imported
    import importlib

    for mod in ("kubetune.training.sft", "kubetune.training.builtin", "kubetune.worker", "kubetune.data.prepare"):
        importlib.import_module(mod)
    assert callable(kubetune.train) and kubetune.train.__module__ == "kubetune.client"


def test_train_one_call(tmp_path, capitals):
    status = kubetune.train(
        "builtin://tiny-chat",
        str(capitals),
        method="lora",
        name="one-call",
        training={"max_steps": 2, "batch_size": 4, "save_steps": 2, "max_seq_length": 64},
        output={"dir": str(tmp_path / "run")},
    )
    assert status.state == "succeeded", status.reason
    assert (tmp_path / "run" / "adapter" / "adapter_config.json").is_file()
    assert status.step == 2


def test_importing_kubetune_is_light_and_the_api_loads_on_first_use():
    """`import kubetune` (and so `kubetune --help`) builds no pydantic models; Client and load_spec load when used."""
    import subprocess
    import sys

    code = (
        "import sys, kubetune\n"
        "assert 'kubetune.spec' not in sys.modules and 'pydantic' not in sys.modules, sorted(sys.modules)\n"
        "from kubetune import *\n"
        "assert Client.__module__ == 'kubetune.client' and load_spec.__module__.startswith('kubetune.spec')\n"
        "assert kubetune.TuneJob is TuneJob and callable(train)\n"
        "import kubetune.cli.main\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
