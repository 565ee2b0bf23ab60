"""Evaluations as plug-ins: :mod:`.benchmark` (the ``Benchmark`` base class and its registry),
:mod:`.plugins` (where ``mrtpo eval`` finds benchmarks), the built-in benchmarks :mod:`.sql`,
:mod:`.bfcl` and :mod:`.ifeval` (``ifeval`` and ``ifbench``), and :mod:`.generation` (the model backend
shared by all). Importing this package imports none of them."""
