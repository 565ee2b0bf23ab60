"""MRTPO on verl (``verl==0.9.1``, its legacy Ray trainer).

- ``adapter``: every public name of the modules below, where verl's config and users name them
  (``reward.custom_reward_function.path=pkg://mrtpo.integrations.verl.adapter``);
- ``config``: the ``algorithm.mrtpo`` node (``VerlMRTPOConfig``) and the names shared with verl;
- ``reward``: the reward function ``compute_score`` and the examples and tasks in ``extra_info``;
- ``credit``: the reward matrix of a batch and the core's credit step on it (``batch_credit``);
- ``estimators``: the ``mrtpo_*`` advantage estimators in verl's registry;
- ``hook``: verl's ``compute_advantage`` with the batch passed on, and ``install``;
- ``replay``: replay on a ``DataProto`` in the calling process (``replay_distances``, ``make_distances_for``);
- ``worker``: replay on the actor workers (FSDP / FSDP2, Ulysses sequence parallelism);
- ``main``: the entry point (``python -m mrtpo.integrations.verl.main``);
- ``plugin``: the module verl imports in every process (``VERL_USE_EXTERNAL_MODULES``);
- ``data``: verl parquet files from mrtpo examples (``python -m mrtpo.integrations.verl.data``).
"""
