"""The ``mrtpo`` command line. Each command lives in its own module with ``add_arguments(parser)`` and
``run(args)``; heavy imports happen inside ``run`` only, so ``mrtpo --help`` stays fast."""
