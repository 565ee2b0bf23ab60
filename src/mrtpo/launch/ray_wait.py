"""``python -m mrtpo.launch.ray_wait --nodes N --address IP:PORT``: the step of a verl launch on several
nodes that waits, on the head node, until every node has joined the Ray cluster (``mrtpo launch`` prints it
between ``ray start --head`` and verl's entry point)."""

from __future__ import annotations

import sys
import time


def wait_ray(nodes: int, address: str, timeout: float = 900.0, poll: float = 5.0, count=None) -> int:
    """Wait until ``nodes`` Ray nodes are alive in the cluster at ``address`` (``count``: a function
    returning the number alive, for tests); 0 when they are, 1 (with one line) after ``timeout``."""
    if count is None:

        def count() -> int:
            import ray

            if not ray.is_initialized():
                ray.init(address=address, logging_level="ERROR")
            return sum(1 for n in ray.nodes() if n.get("Alive"))

    t0 = time.monotonic()
    seen = 0
    while True:
        seen = count()
        if seen >= nodes:
            print(f"mrtpo launch: {seen} of {nodes} Ray nodes are up", file=sys.stderr)
            return 0
        if time.monotonic() - t0 > timeout:
            print(f"mrtpo launch: only {seen} of {nodes} Ray nodes joined {address} within {timeout:.0f} s; "
                  "start the other nodes with mrtpo launch ... --node-rank R", file=sys.stderr)  # fmt: skip
            return 1
        time.sleep(poll)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m mrtpo.launch.ray_wait",
        description="wait until every node of a Ray cluster is up",
    )
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--address", required=True)
    p.add_argument("--timeout", type=float, default=900.0)
    a = p.parse_args(argv)
    return wait_ray(a.nodes, a.address, a.timeout)


if __name__ == "__main__":
    sys.exit(main())
