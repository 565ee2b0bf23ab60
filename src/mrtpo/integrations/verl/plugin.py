"""Loaded by verl in every process: registers the ``mrtpo_*`` estimators and hooks compute_advantage.

verl imports the modules listed in ``VERL_USE_EXTERNAL_MODULES`` (comma-separated) at the end of
``import verl``; set ::

    export VERL_USE_EXTERNAL_MODULES=mrtpo.integrations.verl.plugin

in the shell that starts training (a local Ray cluster inherits it) or pass it to the Ray workers with
``+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=mrtpo.integrations.verl.plugin``.
Importing this module calls :func:`mrtpo.integrations.verl.adapter.install` without a ``distances_for``: the
response-level methods (``algorithm.mrtpo.credit=none``) work as they are; token credit (the default,
``reward``) needs distances in the batch (docs/verl.md).
"""

from __future__ import annotations

from mrtpo.integrations.verl.adapter import install

ESTIMATORS = install()
