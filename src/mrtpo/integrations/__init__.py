"""The training engines, one package each; both call the framework-agnostic core (``mrtpo.step``,
``mrtpo.replay``) and share nothing else.

- :mod:`mrtpo.integrations.trl`: the TRL trainer (``MRTPOConfig``, ``MRTPOTrainer``), ``mrtpo train``'s
  YAML recipes, checkpoints, run logging, accelerate sharding and the configuration matrix.
- :mod:`mrtpo.integrations.verl`: verl's advantage estimators, reward function and compute_advantage hook
  (``adapter``), replay on the actor workers (``worker``), parquet data (``data``), the entry point
  (``main``) and the module verl loads in every process (``plugin``).
"""
