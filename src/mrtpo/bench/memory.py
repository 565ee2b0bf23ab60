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


class RunPeak:
    """``with RunPeak(device) as m: trainer.train()`` then ``m.peak`` (bytes, absolute) and ``m.method``:
    the peak of a whole run, what a plan of the GPU's memory predicts.

    - CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` at the start (tensors
      alive before, such as the model's weights, count);
    - CPU (Linux): the process's peak resident set (``VmHWM`` of ``/proc/self/status``) after resetting it
      (``/proc/self/clear_refs``); None where that is not available. It counts everything the process
      holds (Python, libraries), so it says little beyond "the run fits".

    A section inside the run (:meth:`section`) may reset CUDA's statistics for a peak of its own; the run's
    peak keeps the larger of what was seen before."""

    def __init__(self, device: str = "cpu") -> None:
        self.device = str(device)
        self.peak: int | None = None
        self.method = ""
        self._seen = 0

    def __enter__(self) -> RunPeak:
        import torch

        gc.collect()
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.method = "torch.cuda.max_memory_allocated over the run"
        else:
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")
                self.method = "peak resident set of the process over the run (VmHWM)"
            except OSError:
                self.method = "not available on this system"
        return self

    def section(self) -> _Section:
        """``with run_peak.section() as s: ...`` then ``s.extra``: the peak above the section's start
        (bytes; CUDA only, None elsewhere)."""
        return _Section(self)

    def __exit__(self, *exc: object) -> None:
        import torch

        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            self.peak = max(self._seen, torch.cuda.max_memory_allocated())
            return
        try:
            with open("/proc/self/status") as f:
                hwm = next(line for line in f if line.startswith("VmHWM:"))
            self.peak = int(hwm.split()[1]) * 1024
        except (OSError, StopIteration, ValueError):
            self.peak = None


class _Section:
    def __init__(self, run: RunPeak) -> None:
        self.run = run
        self.extra: int | None = None

    def __enter__(self) -> _Section:
        import torch

        if self.run.device.startswith("cuda"):
            torch.cuda.synchronize()
            self.run._seen = max(self.run._seen, torch.cuda.max_memory_allocated())
            self._base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        return self

    def __exit__(self, *exc: object) -> None:
        import torch

        if self.run.device.startswith("cuda"):
            torch.cuda.synchronize()
            self.extra = max(0, torch.cuda.max_memory_allocated() - self._base)
