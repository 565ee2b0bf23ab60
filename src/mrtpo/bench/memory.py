"""A peak-memory figure that holds from run to run: the largest total of live tensor allocations.

:class:`TrackedPeak` measures, over a ``with`` block, the peak of the bytes the torch allocator holds
for tensors, counted from the block's start (what was allocated before and is still alive is the
baseline):

- CUDA: the caching allocator's own statistics (``torch.cuda.reset_peak_memory_stats``,
  ``max_memory_allocated``).
- CPU: every allocation and free of torch's CPU allocator as recorded by ``torch.profiler`` with
  ``profile_memory=True`` (ordered by time and summed: the running total's maximum). Intermediates
  inside operators, the buffers of compiled kernels and the allocations of every thread are included;
  memory outside torch's allocator (the Python heap, a library's own ``malloc``) is not.

Unlike the growth of the process's peak RSS, this does not depend on what the C library's ``malloc``
keeps cached or hands back between runs: the same code on the same inputs gives the same figure.
The profiler slows the block down, so a block measured this way is not also timed.
"""

from __future__ import annotations

import gc
from typing import Any


class TrackedPeak:
    """``with TrackedPeak(device) as m: ...`` then ``m.peak`` (bytes above the start) and ``m.method``."""

    def __init__(self, device: str = "cpu") -> None:
        self.device = str(device)
        self.peak = 0
        self.method = ""
        self._prof: Any = None

    def __enter__(self) -> TrackedPeak:
        import torch

        gc.collect()
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
            self.method = "torch.cuda.max_memory_allocated growth (allocator statistics)"
            return self
        from torch.profiler import ProfilerActivity, profile

        self.method = "peak of live CPU tensor allocations (torch.profiler memory events)"
        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        import torch

        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            self.peak = max(0, torch.cuda.max_memory_allocated() - self._base)
            return
        self._prof.__exit__(*exc)
        events = self._prof.profiler.kineto_results.events()
        steps = sorted(
            (e.start_ns(), e.nbytes())
            for e in events
            if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
        )
        cur = peak = 0
        for _, nbytes in steps:
            cur += nbytes
            peak = max(peak, cur)
        self.peak = peak
        self._prof = None
