"""DeepSpeed on the CPU (``DS_ACCELERATOR=cpu``): all-reduce through gloo rather than DeepSpeed's shared-memory kernel.

DeepSpeed's CPU accelerator compiles a C++ extension, ``deepspeed_shm_comm``, the first time a process group
starts (about 200 s of two busy cores, measured from the build's ``.ninja_log`` here). Every process of the
launch waits on torch's lock file meanwhile, and a launch that is stopped during the compile (Ctrl-C, a
timeout) leaves that lock behind: every later DeepSpeed run on the machine then waits on it forever, silently.
The kernel only speeds up all-reduce between processes on one host; mrtpo's CPU runs are tests and tiny
models, where gloo's all-reduce is enough. So mrtpo marks the kernel unavailable before DeepSpeed starts,
unless ``MRTPO_DEEPSPEED_SHM=1`` asks for it. GPU runs are not touched.
"""

from __future__ import annotations

import importlib.util
import os

SHM_OP = "deepspeed_shm_comm"


def use_gloo_allreduce_on_cpu(environ: dict[str, str] | None = None) -> bool:
    """Mark DeepSpeed's shared-memory all-reduce kernel unavailable when DeepSpeed runs on the CPU.

    Returns True when it did (``DS_ACCELERATOR=cpu``, DeepSpeed installed, ``MRTPO_DEEPSPEED_SHM`` not 1);
    False, touching nothing, otherwise. Call before ``deepspeed.initialize`` / the trainer's first step.
    """
    env = os.environ if environ is None else environ
    if env.get("DS_ACCELERATOR") != "cpu" or env.get("MRTPO_DEEPSPEED_SHM") == "1":
        return False
    if importlib.util.find_spec("deepspeed") is None:
        return False
    import deepspeed.ops

    compatible = deepspeed.ops.__compatible_ops__  # probed once per process, then read by build_shm_op
    compatible[SHM_OP] = False
    return True
