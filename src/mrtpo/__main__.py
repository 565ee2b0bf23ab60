"""``python -m mrtpo``: the ``mrtpo`` command."""

import sys

from mrtpo.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
