"""kubetune as a llama-stack post-training provider (docs/llama-stack.md).

* :mod:`.mapping`: llama-stack's ``TrainingConfig`` / ``LoraFinetuningConfig`` / dataset rows -> a kubetune spec, and
  kubetune's states, events and checkpoints -> llama-stack's job status (plain dicts: the jobs server uses it
  without llama-stack installed);
* :mod:`.config`: the two providers' configs; :mod:`.inline` (``inline::kubetune``: runs jobs through
  :class:`kubetune.Client` on any backend) and :mod:`.remote` (``remote::kubetune``: forwards to a kubetune server);
* :mod:`.runconfig`: the llama-stack run config ``kubetune llama-stack config`` prints, and the provider specs
  (``providers.d/``) llama-stack's ``external_providers_dir`` loads.
"""
