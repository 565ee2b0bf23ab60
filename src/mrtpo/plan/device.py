"""The device a plan times a step on: a GPU's stated figures with stated assumptions, or this machine's CPU,
measured once and cached.

A step's time is, per pass, ``FLOPs / matmul rate + bytes / memory bandwidth`` (whichever is larger for a
decode iteration) plus a fixed time per decoder-layer call and per decode iteration (the framework's
dispatch: Python, kernel launches). :class:`Rates` carries those four figures.

- **GPU** (``--gpu h100|a100|h200``): the vendor's dense bf16 rate times ``--mfu`` (0.4 by default: an
  assumption), the HBM bandwidth times 0.6 for a decode iteration (assumed), no per-call time for vLLM
  (CUDA graphs) and 0.25 ms per decoder-layer call for transformers' eager generate and the training
  passes' micro-batches (assumed). None of these is measured here.
- **CPU** (``--device cpu``): :func:`cpu_profile` measures, at the thread count of the run (``--threads``),
  the float32 matmul rate of batched passes (``[1024, n] @ [n, 2n]``) and of a decode iteration's rows
  (``[16, n] @ [n, 2n]``) for n = 128 .. 2048 (a model's rate is read at its hidden size), the rate of
  causal attention (torch's ``scaled_dot_product_attention``, 16 rows x 4 heads x 64, at 32 .. 512
  positions: 2-4 times below the matmul rate here), the memory bandwidth (a 256 MiB copy), and from
  transformers' ``generate`` of tiny 1- and 2-layer Qwen2 models at 16 rows (hidden sizes 64, 256, 1024;
  24 and 72 new tokens) the time of one decoder-layer call net of its FLOPs (the difference of the two, by
  hidden size), how much it grows per position attended (the difference of the two lengths), and the
  fixed time of one decode iteration (the rest). It takes about 20 s
  once; the figures are cached in ``~/.cache/mrtpo/device/`` (``$XDG_CACHE_HOME`` is honoured) by thread
  count, CPU and torch version, and reused (``refresh`` measures again). Times are CPU time
  (``time.process_time``), but on a machine shared with other jobs that still rises with their load (on
  this 2-core machine a step's CPU time at a load average of 10-14 was 1.5-1.6 times that at 1), so a
  profile times runs under the load it was measured under; with several threads the CPU time is divided
  by their number (an assumption of perfect overlap).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import platform
import time
from pathlib import Path

SIZES = (128, 256, 512, 1024, 2048)
LAYER_SIZES = (64, 256, 1024)
ATTENTION_LENGTHS = (32, 64, 128, 256, 512)
PROFILE_VERSION = 4  # the cache's layout
GPU_DECODE_BANDWIDTH = 0.6  # share of the HBM bandwidth a decode iteration reaches (assumed)
GPU_LAYER_CALL_S = 2.5e-4  # per decoder-layer call of an eager (transformers) pass on a GPU (assumed)


@dataclasses.dataclass(frozen=True)
class Rates:
    """What a pass costs on the device: FLOP/s of the model's matrices (``matmul``), bytes/s of a
    memory-bound pass (``bandwidth``), seconds per decoder-layer call of an eager pass (``layer_call``) and
    per decode iteration beyond its layers (``decode_step``), and for a colocated/served vLLM engine
    (CUDA graphs) none of the two. ``source`` says where the figures come from."""

    matmul: float
    bandwidth: float
    layer_call: float
    decode_step: float
    fp32_matmul: float
    source: str
    measured: bool
    decode_matmul: float = 0.0  # FLOP/s of a decode iteration's few-row matmuls (0: ``matmul``)
    attention: tuple[tuple[int, float], ...] = ()  # (sequence length, FLOP/s of causal attention); (): matmul
    layer_position: float = 0.0  # seconds per decoder-layer call of a decode iteration per cached position

    def attention_rate(self, seq: float) -> float:
        """FLOP/s of causal attention over sequences of ``seq`` positions (the matmul rate without a
        measured table)."""
        if not self.attention:
            return self.matmul
        return _interp(dict(self.attention), max(1, round(seq)))


@dataclasses.dataclass(frozen=True)
class CpuProfile:
    threads: int
    matmul_gflops: dict[int, float]  # float32 [1024, n] @ [n, 2n] at n: batched passes
    decode_gflops: dict[int, float]  # float32 [16, n] @ [n, 2n] at n: a decode iteration's rows
    bandwidth_gbs: float
    layer_call_s: dict[
        int, float
    ]  # one decoder-layer call of a 16-row decode at hidden size n, net of its FLOPs
    decode_step_s: float
    cpu: str
    torch: str
    measured_at: str
    # float32 causal scaled_dot_product_attention, forward, 16 rows x 4 heads x 64, at sequence length T
    attention_gflops: dict[int, float] = dataclasses.field(default_factory=dict)
    # a decode iteration's decoder-layer call: seconds more per cached position, at hidden size n
    layer_position_s: dict[int, float] = dataclasses.field(default_factory=dict)

    def rates(self, hidden: int) -> Rates:
        m = 1e9 * _interp(self.matmul_gflops, hidden)
        attention = tuple((t, 1e9 * g) for t, g in sorted(self.attention_gflops.items()))
        position = _interp(self.layer_position_s, hidden) if self.layer_position_s else 0.0
        return Rates(m, self.bandwidth_gbs * 1e9, _interp(self.layer_call_s, hidden), self.decode_step_s, m,
                     f"this CPU at {self.threads} thread(s), measured {self.measured_at}", True,
                     1e9 * _interp(self.decode_gflops, hidden), attention, position)  # fmt: skip


def _interp(table: dict[int, float], x: int) -> float:
    """``table`` read at ``x``, log-linear between its sizes (clamped at the ends)."""
    pts = sorted((int(k), float(v)) for k, v in table.items())
    lx = math.log(max(pts[0][0], min(pts[-1][0], x)))
    for (a, ra), (b, rb) in itertools.pairwise(pts):
        if lx <= math.log(b):
            w = (lx - math.log(a)) / (math.log(b) - math.log(a))
            return ra + w * (rb - ra)
    return pts[-1][1]


def gpu_rates(gpu, mfu: float, eager: bool) -> Rates:
    """A GPU's figures: its stated bf16 rate x ``mfu``, 0.6 of its HBM bandwidth, and the per-call times
    of an eager pass (``eager``: transformers; else vLLM's CUDA graphs: none). All assumptions."""
    rate = gpu.bf16_tflops * 1e12 * mfu
    call = GPU_LAYER_CALL_S if eager else 0.0
    return Rates(rate, gpu.hbm_tbps * 1e12 * GPU_DECODE_BANDWIDTH, call, 4 * call, gpu.fp32_tflops * 1e12 * mfu,
                 f"{gpu.name}'s stated figures x MFU {mfu:g} (assumed)", False)  # fmt: skip


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mrtpo" / "device"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def ram_gib() -> float:
    """This machine's memory in GiB (/proc/meminfo; 16 where it cannot be read)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return 16.0


def cache_path(threads: int) -> Path:
    import torch

    tag = "".join(c if c.isalnum() else "-" for c in f"{_cpu_name()}-torch{torch.__version__}")
    return cache_dir() / f"cpu-{threads}t-{tag}-v{PROFILE_VERSION}.json"


def _best(fn, repeats: int = 5, threads: int = 1) -> float:
    """The median CPU time of ``repeats`` calls (after one warm-up; the median, as a run's step is read):
    the process's time, not the wall's, so that other jobs on a shared machine count only as far as they
    slow the process's own work (at one thread it is the time on a core)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return sorted(times)[len(times) // 2] / threads


def measure_cpu(threads: int) -> CpuProfile:
    """Measure this CPU at ``threads`` threads (about 20 s; the thread count is restored after)."""
    import torch

    from mrtpo.models.tiny import build_model

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gflops, decode = {}, {}
        for n in SIZES:
            for rows, out in ((1024, gflops), (16, decode)):
                a, b = torch.randn(rows, n), torch.randn(n, 2 * n)
                out[n] = 2 * rows * n * 2 * n / _best(lambda a=a, b=b: a @ b, 10, threads) / 1e9
        x = torch.empty(64 * 2**20)  # 256 MiB
        y = torch.empty_like(x)
        bw = 2 * x.numel() * 4 / _best(lambda x=x, y=y: y.copy_(x), threads=threads) / 1e9
        del x, y
        attention = {}
        sdpa = torch.nn.functional.scaled_dot_product_attention
        for t in ATTENTION_LENGTHS:
            q, k, v = (torch.randn(16, 4, t, 64) for _ in range(3))
            flops = 16 * 4 * 4 * 64 * t * t / 2  # Q K^T and A V over the causal half
            attention[t] = (
                flops / _best(lambda q=q, k=k, v=v: sdpa(q, k, v, is_causal=True), 5, threads) / 1e9
            )
        rows, prompt, short, long = 16, 8, 24, 72
        layer, position, steps = {}, {}, []
        for h in LAYER_SIZES:
            gen = {}
            for layers, new in itertools.product((1, 2), (short, long)):
                m = build_model(64, hidden_size=h, num_layers=layers, seed=0)
                ids = torch.randint(3, 64, (rows, prompt))
                kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=True, pad_token_id=0,
                          attention_mask=torch.ones_like(ids))  # fmt: skip
                with torch.no_grad():
                    gen[layers, new] = (
                        _best(lambda m=m, ids=ids, kw=kw: m.generate(ids, **kw), 3, threads) / new
                    )
            flops = (
                rows * 2 * 9 * h * h
            )  # one layer's matmuls at 16 rows (q, k, v, o: 3 h^2; MLP of 2 h: 6 h^2)
            call = {n: gen[2, n] - gen[1, n] - flops / (1e9 * _interp(decode, h)) for n in (short, long)}
            # one layer call's time grows with the positions it attends to (prompt + half the new tokens)
            position[h] = max((call[long] - call[short]) / ((long - short) / 2), 0.0)
            layer[h] = max(call[short] - position[h] * (prompt + short / 2), 1e-6)
            steps.append(max(gen[1, short] - (gen[2, short] - gen[1, short]), 0.0))
        step = min(steps)
    finally:
        torch.set_num_threads(before)
    return CpuProfile(threads, gflops, decode, bw, layer, step, _cpu_name(), torch.__version__,
                      time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), attention, position)  # fmt: skip


def cpu_profile(threads: int, refresh: bool = False) -> tuple[CpuProfile, Path, bool]:
    """(profile, cache file, whether it was measured now): the cached figures for ``threads`` threads, or
    measured now and cached (``refresh``: measure again)."""
    if threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    path = cache_path(threads)
    if path.is_file() and not refresh:
        try:
            raw = json.loads(path.read_text())
            for key in (
                "matmul_gflops",
                "decode_gflops",
                "layer_call_s",
                "attention_gflops",
                "layer_position_s",
            ):
                raw[key] = {int(k): float(v) for k, v in raw[key].items()}
            return CpuProfile(**raw), path, False
        except (ValueError, TypeError, KeyError):
            pass  # an unreadable cache is measured again
    prof = measure_cpu(threads)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(prof), indent=1) + "\n")
    tmp.replace(path)
    return prof, path, True
