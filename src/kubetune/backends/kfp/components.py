"""The pipeline's components: lightweight Python components, each a thin call into :mod:`.stages`.

KFP ships each function's source into its task (container or local subprocess), so a body may only use
its arguments and what it imports itself; the work lives in kubetune's own stage functions. This module
keeps ``from __future__ import annotations`` off on purpose: the kfp SDK reads these annotations as types.
"""

from kfp.dsl import Artifact, Dataset, Input, Metrics, Model, Output

__all__ = ["fetch", "train", "merge", "publish", "publish_merged", "custom"]


def fetch(
    spec: str,
    model_uri: str,
    dataset_uri: str,
    eval_dataset_uri: str,
    run_dir: str,
    model: Output[Model],
    dataset: Output[Dataset],
    eval_dataset: Output[Dataset],
):
    """kubetune fetch: the base model and the datasets, as artifacts (local dirs, tarballs, hf://, s3://, ...)."""
    from kubetune.backends.kfp.stages import fetch_stage

    fetch_stage(spec, run_dir, model_uri=model_uri, dataset_uri=dataset_uri, eval_dataset_uri=eval_dataset_uri,
                model_dir=model.path, dataset_dir=dataset.path, eval_dir=eval_dataset.path)


def train(
    spec: str,
    run_dir: str,
    model: Input[Model],
    dataset: Input[Dataset],
    eval_dataset: Input[Dataset],
    trained: Output[Model],
    metrics: Output[Metrics],
) -> str:
    """kubetune train: prepare the data and fine-tune (TRL/PEFT); the adapter or full model is the output."""
    import json

    from kubetune.backends.kfp.stages import train_stage

    result = train_stage(spec, run_dir, model_dir=model.path, dataset_dir=dataset.path, eval_dir=eval_dataset.path,
                         trained_dir=trained.path)
    for key, value in result.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            metrics.log_metric(key, value)
    return json.dumps(result, default=str)


def merge(
    spec: str,
    run_dir: str,
    model: Input[Model],
    trained: Input[Model],
    merged: Output[Model],
):
    """kubetune merge: the base model with the trained adapter merged into it."""
    from kubetune.backends.kfp.stages import merge_stage

    merge_stage(spec, run_dir, model_dir=model.path, trained_dir=trained.path, merged_dir=merged.path)


def publish(
    spec: str,
    run_dir: str,
    metrics_json: str,
    trained: Input[Model],
    run: Output[Artifact],
):
    """kubetune publish: result.json, upload to output.uri, the run record (status, events, DONE) as an artifact."""
    from kubetune.backends.kfp.stages import publish_stage

    publish_stage(spec, run_dir, metrics_json=metrics_json, trained_dir=trained.path, record_dir=run.path)


def publish_merged(
    spec: str,
    run_dir: str,
    metrics_json: str,
    trained: Input[Model],
    merged: Input[Model],
    run: Output[Artifact],
):
    """kubetune publish (with merge): as publish, with the merged model in the run record and output.uri."""
    from kubetune.backends.kfp.stages import publish_stage

    publish_stage(spec, run_dir, metrics_json=metrics_json, trained_dir=trained.path, merged_dir=merged.path,
                  record_dir=run.path)


def custom(
    spec: str,
    entrypoint_code: str,
    run_dir: str,
    run: Output[Artifact],
) -> str:
    """kubetune custom: the user's training function (spec.entrypoint) on every process; the run record as an artifact."""
    import json

    from kubetune.backends.kfp.stages import custom_stage

    return json.dumps(custom_stage(spec, run_dir, entrypoint_code=entrypoint_code, record_dir=run.path), default=str)
