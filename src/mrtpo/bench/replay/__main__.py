"""``python -m mrtpo.bench.replay --worker VARIANT --config JSON --out PATH``: one variant of the bench."""

import sys

from mrtpo.bench.replay.driver import worker_main

sys.exit(worker_main())
