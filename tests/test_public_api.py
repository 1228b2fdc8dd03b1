"""The public API is small and explicit; a change to it must be deliberate."""

import kubetune


def test_public_api_is_explicit():
    assert sorted(kubetune.__all__) == sorted(
        ["Client", "JobRef", "KubetuneError", "SpecError", "TuneJob", "load_spec", "train", "__version__"]
    )
    for name in kubetune.__all__:
        assert hasattr(kubetune, name), name


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
