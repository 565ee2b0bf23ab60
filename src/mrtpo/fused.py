"""The fused Jensen–Shannon kernels behind ``kernel="fused"`` of :mod:`mrtpo.distance`.

Two row-wise operations on logit blocks ``z: [R, V]`` (float32 or bfloat16), each with the logit
transform ``softcap(scale · (z + bias))`` applied on the fly (:class:`mrtpo.head.LogitHead`'s)::

    lse(z)[:, r]     = (m_r, log Σ_v exp(z[r, v] − m_r)),  m_r = max_v z[r, v]      [2, R] float32
    jsd(zp, zq)[r]   = ½ Σ_v [p_v log1p(a_v) + q_v log1p(−a_v)]              [R] float64 (nats)
                       p = exp(zp − lse(zp)), q = exp(zq − lse(zq)), a = tanh((log p − log q) / 2)

the cancellation-free JSD of :func:`mrtpo.distance.js_distance`. Computing ``lse`` of each block
(pass 1) and then the terms (pass 2) reads each ``[R, V]`` block twice and writes no ``[R, V]``
buffer, where the eager path makes about twelve elementwise passes and holds up to ten buffers.

Implementations:

- **CPU, native**: ``csrc/jsd.c``, compiled with the system C compiler (``$CC``, else ``cc``/``gcc``/
  ``clang``) at first use into ``$MRTPO_KERNEL_CACHE`` (default ``~/.cache/mrtpo/kernels``; one file per
  source, flags and CPU) and loaded with :mod:`ctypes`. Pass 1 is an online log-sum-exp (row blocks of
  1024 values kept in L1), pass 2 the terms; rows are split over ``torch.get_num_threads()`` threads.
  The library is checked against the eager formula on load; a failed build or check makes it
  unavailable, with the reason (:func:`native_status`).
- **GPU, compiled**: :func:`lse_torch` and :func:`jsd_torch` through ``torch.compile`` (Triton kernels;
  inductor turns the max/exp-sum pattern of ``lse_torch`` into one online-softmax pass).

Core module: torch and the standard library only.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["FusedUnavailable", "jsd_rows", "jsd_torch", "lse_rows", "lse_torch", "native_status"]

_SOURCE = Path(__file__).with_name("csrc") / "jsd.c"
_A_MAX = 1.0 - torch.finfo(torch.float32).eps / 2


class FusedUnavailable(RuntimeError):
    """The fused kernel cannot run here (no C compiler, a failed build or self-check, no torch.compile)."""


# --------------------------------------------------------------------------------------------------
# The torch formulation (compiled for GPUs; also the readable statement of what the native kernel does)
# --------------------------------------------------------------------------------------------------


def _transform(z: Tensor, bias: Tensor | None, scale: float, softcap: float | None) -> Tensor:
    z = z.float()  # [R, V]
    if bias is not None:
        z = z + bias
    if scale != 1.0:
        z = z * scale
    if softcap is not None:
        z = torch.tanh(z / softcap) * softcap
    return z


def lse_torch(
    z: Tensor, bias: Tensor | None = None, scale: float = 1.0, softcap: float | None = None
) -> Tensor:
    """``z: [R, V]`` -> ``[2, R]`` float32: the transformed rows' maxima ``m`` and ``log Σ exp(z − m)``
    (their sum is the log-sum-exp; NaN for a row with +inf or NaN, or with every entry −inf, as
    ``log_softmax`` gives). Kept apart so that ``log p = (z − m) − log Σ`` stays exact near the maximum
    for large logits."""
    z = _transform(z, bias, scale, softcap)  # [R, V]
    m = z.amax(dim=-1, keepdim=True)  # [R, 1]
    s = (z - m).exp().sum(dim=-1, keepdim=True)  # [R, 1]  (inductor: one online pass with the max)
    return torch.cat([m, s.log()], dim=-1).T  # [2, R]


def jsd_torch(
    zp: Tensor,
    zq: Tensor,
    lse_p: Tensor,
    lse_q: Tensor,
    bias: Tensor | None = None,
    scale: float = 1.0,
    softcap: float | None = None,
) -> Tensor:
    """``zp, zq: [R, V]``, their :func:`lse_torch` ``[2, R]`` -> ``[R]`` float32 JSD in nats (module
    docstring)."""
    lp = (_transform(zp, bias, scale, softcap) - lse_p[0, :, None]) - lse_p[1, :, None]  # [R, V] log p
    lq = (_transform(zq, bias, scale, softcap) - lse_q[0, :, None]) - lse_q[1, :, None]  # [R, V] log q
    a = torch.tanh((lp - lq) * 0.5).nan_to_num(0.0).clamp(-_A_MAX, _A_MAX)  # [R, V]
    return (lp.exp() * torch.log1p(a) + lq.exp() * torch.log1p(-a)).sum(dim=-1) * 0.5


_COMPILED: dict[str, object] = {}
_COMPILE_ERROR: list[str] = []


def _run_compiled(name: str, *args):
    """``lse_torch`` / ``jsd_torch`` through ``torch.compile``; if compiling fails (no working Triton, a
    compiler error), the same functions run uncompiled from then on (same values, more memory), and the
    failure is logged once."""
    plain = {"lse": lse_torch, "jsd": jsd_torch}[name]
    if _COMPILE_ERROR:
        return plain(*args)
    fn = _COMPILED.get(name)
    if fn is None:
        fn = _COMPILED[name] = torch.compile(plain, dynamic=None)
    try:
        return fn(*args)
    except Exception as e:  # torch._dynamo / inductor / triton errors have no common public base
        import logging

        _COMPILE_ERROR.append(f"{type(e).__name__}: {e}")
        logging.getLogger(__name__).warning(
            "fused JS kernel: torch.compile failed (%s); running it uncompiled", _COMPILE_ERROR[0][:300]
        )
        return plain(*args)


# --------------------------------------------------------------------------------------------------
# The native CPU kernel
# --------------------------------------------------------------------------------------------------

_LOCK = threading.Lock()
_NATIVE: ctypes.CDLL | None = None
_NATIVE_ERROR: str | None = None


def _cpu_id() -> str:
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features", "model name")):
                flags += line
            if line.strip() == "":
                break
    except OSError:
        pass
    return f"{platform.machine()}|{platform.processor()}|{flags}"


# -ffast-math (vectorized expf/tanhf/log1pf through libmvec) on the compile step only: linking a shared
# library with it would pull in crtfastmath.o, which turns on flush-to-zero for the whole process.
# -ffp-contract=off: no fused multiply-adds, so that swapping p and q gives the same sum exactly.
_FLAGS = ["-O3", "-ffast-math", "-ffp-contract=off", "-fPIC", "-pthread"]


def _compile(cc: str, src: Path, out: Path, native_arch: bool) -> None:
    obj = out.with_suffix(".o")
    flags = _FLAGS + (["-march=native"] if native_arch else [])
    subprocess.run(
        [cc, *flags, "-c", str(src), "-o", str(obj)], check=True, capture_output=True, text=True, timeout=120
    )
    subprocess.run(
        [cc, "-shared", str(obj), "-o", str(out), "-lm", "-pthread"],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _declare(lib: ctypes.CDLL) -> None:
    p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
    lib.mrtpo_lse.argtypes = [p, i64, i64, i64, i32, p, f32, f32, p, i32]
    lib.mrtpo_lse.restype = None
    lib.mrtpo_jsd.argtypes = [p, i64, p, i64, i64, i64, i32, p, f32, f32, p, p, p, i32]
    lib.mrtpo_jsd.restype = None


def _self_check() -> None:
    """The native kernel against the torch formulation on a small block with −inf, p = q and a one-hot
    row; raises FusedUnavailable on a mismatch (a miscompiled library must never give distances)."""
    g = torch.Generator().manual_seed(0)
    zp = torch.randn(5, 1500, generator=g) * 4  # more than one 1024-value block per row
    zq = zp + 0.3 * torch.randn(5, 1500, generator=g)
    zp[0, :700] = float("-inf")
    zq[1] = zp[1]
    zp[2] = float("-inf")
    zp[2, 3] = 0.0  # one-hot
    want = jsd_torch(zp, zq, lse_torch(zp), lse_torch(zq)).double()
    lib = _NATIVE
    got = jsd_rows(zp, zq, lse_rows(zp, _native_lib=lib), lse_rows(zq, _native_lib=lib), _native_lib=lib)
    if not torch.allclose(got, want, atol=1e-6, rtol=1e-4):
        raise FusedUnavailable(
            f"native JS kernel self-check failed (max diff {(got - want).abs().max():.3g})"
        )


def _load_native() -> ctypes.CDLL:
    global _NATIVE, _NATIVE_ERROR
    with _LOCK:
        if _NATIVE is not None:
            return _NATIVE
        if _NATIVE_ERROR is not None:
            raise FusedUnavailable(_NATIVE_ERROR)
        try:
            cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
            if not cc:
                raise FusedUnavailable("no C compiler found (set CC, or install gcc or clang)")
            src = _SOURCE.read_bytes()
            version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
            key = hashlib.sha256(src + " ".join(_FLAGS).encode() + version.encode() + _cpu_id().encode())
            key = key.hexdigest()[:20]
            cache = Path(os.environ.get("MRTPO_KERNEL_CACHE") or Path.home() / ".cache" / "mrtpo" / "kernels")
            lib_path = cache / f"jsd-{key}.so"
            if not lib_path.is_file():
                cache.mkdir(parents=True, exist_ok=True)
                with tempfile.TemporaryDirectory(dir=cache) as tmp:
                    out = Path(tmp) / "jsd.so"
                    try:
                        _compile(cc, _SOURCE, out, native_arch=True)
                    except subprocess.CalledProcessError:
                        _compile(cc, _SOURCE, out, native_arch=False)  # a compiler without -march=native
                    os.replace(out, lib_path)  # atomic: concurrent builders never see a partial file
            lib = ctypes.CDLL(str(lib_path))
            _declare(lib)
            _NATIVE = lib
            try:
                _self_check()
            except FusedUnavailable:
                _NATIVE = None
                raise
        except FusedUnavailable as e:
            _NATIVE_ERROR = str(e)
            raise
        except (OSError, subprocess.SubprocessError) as e:
            detail = getattr(e, "stderr", "") or str(e)
            _NATIVE_ERROR = f"native JS kernel could not be built: {detail.strip()[-500:]}"
            raise FusedUnavailable(_NATIVE_ERROR) from e
        return _NATIVE


def native_status() -> tuple[bool, str]:
    """``(available, how)``: whether the native CPU kernel builds and passes its self-check here, and the
    library path or the reason it does not."""
    try:
        lib = _load_native()
    except FusedUnavailable as e:
        return False, str(e)
    return True, str(lib._name)


def _rows_arg(z: Tensor) -> tuple[Tensor, int, int]:
    """``z: [R, V]`` as the kernel reads it: (tensor, row stride in elements, bf16 flag)."""
    if z.dtype not in (torch.float32, torch.bfloat16):
        z = z.float()
    if z.dim() != 2 or z.stride(1) != 1:
        z = z.contiguous()
    return z, z.stride(0), int(z.dtype == torch.bfloat16)


def _bias_arg(bias: Tensor | None, vocab: int) -> Tensor | None:
    if bias is None:
        return None
    b = bias.detach().to(torch.float32).contiguous()
    if b.shape != (vocab,):
        raise ValueError(f"bias has shape {tuple(b.shape)}; expected ({vocab},)")
    return b


def _ptr(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def lse_rows(
    z: Tensor,
    bias: Tensor | None = None,
    scale: float = 1.0,
    softcap: float | None = None,
    *,
    _native_lib: ctypes.CDLL | None = None,
) -> Tensor:
    """Pass 1: ``z: [R, V]`` (float32/bfloat16, CPU) -> ``[2, R]`` float32 row maxima and log-sums, as
    :func:`lse_torch` (native kernel)."""
    lib = _native_lib or _load_native()
    z, ld, bf16 = _rows_arg(z)
    rows, vocab = z.shape
    b = _bias_arg(bias, vocab)
    out = torch.empty(2, rows, dtype=torch.float32)
    lib.mrtpo_lse(
        z.data_ptr(), ld, rows, vocab, bf16, _ptr(b), float(scale), float(softcap or 0.0), out.data_ptr(),
        torch.get_num_threads(),
    )  # fmt: skip
    return out


def jsd_rows(
    zp: Tensor,
    zq: Tensor,
    lse_p: Tensor,
    lse_q: Tensor,
    bias: Tensor | None = None,
    scale: float = 1.0,
    softcap: float | None = None,
    *,
    _native_lib: ctypes.CDLL | None = None,
) -> Tensor:
    """Pass 2: ``zp, zq: [R, V]`` with their :func:`lse_rows` ``[2, R]`` -> ``[R]`` float64 JSD in nats
    (NaN where a row maximum is NaN)."""
    lib = _native_lib or _load_native()
    zp, ldp, bf16 = _rows_arg(zp)
    zq, ldq, bf16_q = _rows_arg(zq)
    if zp.shape != zq.shape or bf16 != bf16_q:
        raise ValueError(f"zp {tuple(zp.shape)} {zp.dtype} and zq {tuple(zq.shape)} {zq.dtype} must match")
    rows, vocab = zp.shape
    b = _bias_arg(bias, vocab)
    lp = lse_p.to(torch.float32).contiguous()  # [2, R]
    lq = lse_q.to(torch.float32).contiguous()  # [2, R]
    if lp.shape != (2, rows) or lq.shape != (2, rows):
        raise ValueError(f"lse_p {tuple(lp.shape)} and lse_q {tuple(lq.shape)} must be [2, R] = [2, {rows}]")
    out = torch.empty(rows, dtype=torch.float64)
    lib.mrtpo_jsd(
        zp.data_ptr(), ldp, zq.data_ptr(), ldq, rows, vocab, bf16, _ptr(b), float(scale),
        float(softcap or 0.0), lp.data_ptr(), lq.data_ptr(), out.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    return out


# --------------------------------------------------------------------------------------------------
# One entry point per device
# --------------------------------------------------------------------------------------------------


def check(device: torch.device) -> None:
    """Raise :class:`FusedUnavailable` (with the reason) when the fused kernel cannot run on ``device``."""
    if device.type == "cpu":
        _load_native()
    elif device.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError as e:
            raise FusedUnavailable("the fused kernel on CUDA needs triton (torch.compile)") from e
    else:
        raise FusedUnavailable(f"no fused JS kernel for device {device.type!r} (cpu and cuda only)")


def lse(z: Tensor, bias: Tensor | None, scale: float, softcap: float | None) -> Tensor:
    """Pass 1 on ``z``'s device: ``[R, V]`` -> ``[2, R]`` float32 (row maxima, log-sums)."""
    if z.device.type == "cpu":
        return lse_rows(z, bias, scale, softcap)
    return _run_compiled("lse", z, bias, scale, softcap)


def jsd(
    zp: Tensor,
    zq: Tensor,
    lse_p: Tensor,
    lse_q: Tensor,
    bias: Tensor | None,
    scale: float,
    softcap: float | None,
) -> Tensor:
    """Pass 2 on the blocks' device: ``[R, V]`` x ``[R, V]`` -> ``[R]`` JSD in nats (float32 or float64)."""
    if zp.device.type == "cpu":
        return jsd_rows(zp, zq, lse_p, lse_q, bias, scale, softcap)
    return _run_compiled("jsd", zp, zq, lse_p, lse_q, bias, scale, softcap)
