"""MRTPO on verl (``verl==0.9.1``, its legacy Ray trainer).

- ``adapter``: the ``mrtpo_*`` advantage estimators, the reward function ``compute_score``, the
  compute_advantage hook and replay on a ``DataProto`` in the calling process;
- ``worker``: replay on the actor workers (FSDP / FSDP2, Ulysses sequence parallelism);
- ``main``: the entry point (``python -m mrtpo.integrations.verl.main``);
- ``plugin``: the module verl imports in every process (``VERL_USE_EXTERNAL_MODULES``);
- ``data``: verl parquet files from mrtpo examples (``python -m mrtpo.integrations.verl.data``).
"""
