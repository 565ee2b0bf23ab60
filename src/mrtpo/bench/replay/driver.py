"""The parent process of the replay bench: one worker process per variant (:func:`run_bench`), their
comparison (:class:`BenchResult`), and the worker's entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mrtpo.bench.replay.config import GEN_PROMPT_TOKENS, BenchConfig, runnable_kernels
from mrtpo.bench.replay.p2t import p2t_lines
from mrtpo.bench.replay.variants import run_replay_variant


@dataclass
class BenchResult:
    config: BenchConfig
    naive: dict[str, Any]
    mrtpo: dict[str, Any]
    max_abs_diff: float  # mrtpo (float32 projection) vs the float64 reference, over the pairs run
    naive_abs_diff: float = 0.0  # naive (float32) vs the float64 reference
    others: dict[str, dict[str, Any]] = field(default_factory=dict)  # kernel -> the other mrtpo variants
    kernel_diff: dict[str, float] = field(default_factory=dict)  # kernel -> max |d - d_mrtpo| over pairs run
    notes: list[str] = field(default_factory=list)
    p2t: dict[str, Any] | None = None  # the p2t variant (mrtpo.bench.replay.p2t), or None

    @property
    def k_eff(self) -> float:
        return self.mrtpo["k_eff"]

    def checks(self) -> dict[str, tuple[float, str, bool | None]]:
        """Target name -> (value, target text, met); met is None where the run is not at the target's
        setting (time: K = 3; memory: T = 1024; vocabulary work: V = 32,768 on CPU with both kernels)."""
        c = self.config
        time_ratio = self.naive["seconds"] / max(self.mrtpo["seconds"], 1e-12)
        mem_ratio = self.naive["peak_bytes"] / max(self.mrtpo["peak_bytes"], 1)
        cost = self.mrtpo["fpe_per_response"]
        k3, t1024 = c.k == 3, c.t == 1024
        fp32 = c.dtype == "float32"
        out = {
            "time": (time_ratio, ">= 1.3x (set at K = 3)", time_ratio >= 1.3 if k3 else None),
            "memory": (
                mem_ratio,
                ">= 6x (tracked peaks; set at T = 1024)",
                mem_ratio >= 6.0 if t1024 else None,
            ),
            "cost": (cost, f"<= K_eff + 0.25 = {self.k_eff + 0.25:.2f}", cost <= self.k_eff + 0.25),
            "difference": (
                self.max_abs_diff,
                "<= 1e-4 (float32 model)",
                self.max_abs_diff <= 1e-4 if fp32 else None,
            ),
        }
        vocab = self.mrtpo.get("vocab", {})
        if "seconds" in vocab.get("fused", {}) and "seconds" in vocab.get("eager", {}):
            r = vocab["fused"]["passes_seconds"] / max(vocab["eager"]["passes_seconds"], 1e-12)
            at = c.vocab == 32768 and c.device == "cpu"
            out["vocab"] = (
                r,
                "fused <= 0.6x eager on the [chunk, V] passes (set at V = 32768, CPU)",
                r <= 0.6 if at else None,
            )
        for kernel, diff in self.kernel_diff.items():
            out[f"kernel {kernel}"] = (
                diff,
                f"max |d_{kernel} - d_{self.mrtpo.get('kernel', '?')}| <= 1e-6",
                diff <= 1e-6 if fp32 else None,
            )
        return out

    def table(self) -> str:
        c, n, m = self.config, self.naive, self.mrtpo
        mib = 1024 * 1024
        chk = self.checks()

        def ok(name: str) -> str:
            met = chk[name][2]
            return "n/a" if met is None else "ok" if met else "MISSED"

        cols = [("naive", n), (f"mrtpo {m.get('kernel', '')}".strip(), m)]
        cols += [(f"mrtpo {k}", v) for k, v in self.others.items()]
        w = 14

        def row(label: str, values: list[str], tail: str = "") -> str:
            return f"{label:26}" + "".join(f"{v:>{w}}" for v in values) + tail

        def design(v: dict[str, Any]) -> str:
            d = v.get("design_memory")
            return "-" if d is None else f"{d['bytes'] / mib:.1f}"

        lines = [
            f"mrtpo bench replay: random {c.config or 'tiny Qwen2'}, V={c.vocab}, H={c.hidden}, {c.layers} layers, "
            f"{c.dtype}, {c.device}" + (f", {c.threads} threads" if c.device == "cpu" else ""),
            f"N={c.responses} responses (one prompt) x T={c.t} tokens, K={c.k}; context {c.context_tokens} tokens "
            f"({c.prompt_tokens} shared + {c.k} x {c.info_tokens} per reward + {GEN_PROMPT_TOKENS}); "
            f"1 FPE = {c.context_tokens + c.t} tokens",
            f"mrtpo: prefix sharing {'on' if c.prefix_sharing else 'off'}, "
            + (
                "full context from the rollout pass (hidden states computed before the measurement)"
                if c.reuse
                else "full context run again"
            )
            + f", chunk {c.chunk_size} rows, budget {c.token_budget or 'none'}, {c.skip} pairs skipped "
            f"(K_eff = {self.k_eff:.2f}); distance kernels: {', '.join(k for k in c.kernels)}",
            "naive: K+1 forwards per response, full logits [L+T, V], float32 log_softmax + kl_div; "
            "reference: float64 projection of the same passes' hidden states, float64 JSD (not timed)",
            f"peak memory: {m['memory_method']} in an untimed second run; beside it {m['rss_method']} of the "
            "timed run; each variant in a fresh subprocess",
            *self.notes,
            "",
            row("", [name for name, _ in cols] + ["naive/mrtpo"], "   target"),
            row(
                "wall time (s)",
                [f"{v['seconds']:.2f}" for _, v in cols] + [f"{chk['time'][0]:.2f}x"],
                f"   {chk['time'][1]} {ok('time')}",
            ),
            row(
                "peak memory (MiB)",
                [f"{v['peak_bytes'] / mib:.1f}" for _, v in cols] + [f"{chk['memory'][0]:.2f}x"],
                f"   {chk['memory'][1]} {ok('memory')}",
            ),
            row(
                "  RSS growth (MiB)",
                [f"{v['rss_peak_bytes'] / mib:.1f}" for _, v in cols]
                + [f"{n['rss_peak_bytes'] / max(m['rss_peak_bytes'], 1):.2f}x"],
            ),
            row(
                "  design: hidden+chunks",
                [design(v) for _, v in cols],
                "   (MiB; hidden states + chunk buffers)",
            ),
            row(
                "cost (FPE / response)",
                [f"{v['fpe_per_response']:.3f}" for _, v in cols] + [""],
                f"   {chk['cost'][1]} {ok('cost')}",
            ),
            row("forward passes", [f"{v['forward_passes']:d}" for _, v in cols]),
            row("tokens processed", [f"{v['tokens']:d}" for _, v in cols]),
            row(
                "max |d - d_ref|",
                [f"{self.naive_abs_diff:.2e}", f"{self.max_abs_diff:.2e}"]
                + [f"{v.get('max_abs_diff', float('nan')):.2e}" for v in self.others.values()]
                + [""],
                f"   {chk['difference'][1]} {ok('difference')}",
            ),
        ]
        for kernel, diff in self.kernel_diff.items():
            lines.append(
                f"max |d_{kernel} - d_{m.get('kernel', '?')}| = {diff:.2e}   "
                f"{chk[f'kernel {kernel}'][1]} {ok(f'kernel {kernel}')}"
            )
        lim = m.get("limit")
        if lim:
            lines += [
                "",
                f"forward-only limit: {lim['fpe_per_response']:.3f} FPE/response ({lim['tokens']} tokens: one backbone "
                "pass over each context run, on its own tokens + the response, the shared prefix once) = "
                f"{lim['seconds']:.3f} s at 1 FPE = {lim['fpe_seconds'] * 1e3:.1f} ms;",
                "  "
                + ", ".join(
                    f"{name} {v['seconds']:.3f} s = {v['seconds'] / max(lim['seconds'], 1e-12):.2f}x the limit"
                    for name, v in cols
                ),
            ]
        vocab = m.get("vocab")
        if vocab:
            lines += [
                "",
                f"vocabulary work of response 0 ({vocab.get('pairs', 0)} pairs: its C against each C_-k) from the "
                "replay's hidden states, no forwards:",
                f"  {'kernel':8}{'[chunk,V] passes':>18}{'projection':>12}{'from hidden':>13}{'peak [chunk,V] blocks':>23}",
            ]
            for kernel in c.kernels:
                v = vocab.get(kernel, {})
                if "error" in v:
                    lines.append(f"  {kernel:8}{v['error']}")
                elif v:
                    lines.append(
                        f"  {kernel:8}{v['passes_seconds']:>16.3f} s{v['projection_seconds']:>10.3f} s"
                        f"{v['seconds']:>11.3f} s{v['buffers']:>23.2f}"
                    )
            if "vocab" in chk:
                f, e = vocab["fused"], vocab["eager"]
                lines.append(
                    f"  fused / eager: passes {chk['vocab'][0]:.2f}x   {chk['vocab'][1]} {ok('vocab')}; from hidden "
                    f"{f['seconds'] / max(e['seconds'], 1e-12):.2f}x (the projection, the same for both, is "
                    f"{f['projection_seconds'] / max(f['projection_seconds'] + f['passes_seconds'], 1e-12):.0%} of "
                    "the fused work)"
                )
        if self.p2t is not None:
            lines += p2t_lines(self.p2t, m, c)
        lines += [
            "",
            f"{'mrtpo projection':24}{'time (s)':>12}{'vs float32':>12}{'max |d - d_fp32|':>18}"
            f"{'bound':>11}{'max |dz|':>11}",
        ]
        base = m["projections"][c.projections[0]]["seconds"]
        for proj, r in m["projections"].items():
            lines.append(
                f"{proj:24}{r['seconds']:>12.3f}{base / max(r['seconds'], 1e-12):>11.2f}x{r['max_change']:>18.2e}"
                f"{r['bound']:>11.2e}{r['max_logit_error']:>11.2e}"
            )
        lines += [
            "  (bound = 2 max |z' - z| / sqrt(ln 2), z' - z the logit change measured on the first response's "
            "rows; tf32 is float32 on CPU)",
        ]
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "config": asdict(self.config),
            "naive": self.naive,
            "mrtpo": self.mrtpo,
            "others": self.others,
            "max_abs_diff": self.max_abs_diff,
            "naive_abs_diff": self.naive_abs_diff,
            "kernel_diff": self.kernel_diff,
            "notes": self.notes,
            "p2t": self.p2t,
            "checks": {k: {"value": v, "target": t, "met": ok} for k, (v, t, ok) in self.checks().items()},
        }


def run_variant(cfg: BenchConfig, variant: str, out_path: str) -> dict[str, Any]:
    """Run one variant in this process and save its ``[N, K, T]`` rows to ``out_path``: a replay variant
    (:func:`mrtpo.bench.replay.variants.run_replay_variant`: "naive", "mrtpo", "mrtpo:<kernel>") or "p2t"
    (P2T's gradient attribution at these shapes, :func:`mrtpo.bench.replay.p2t.run_p2t`: its weights)."""
    if variant != "p2t":
        return run_replay_variant(cfg, variant, out_path)
    import torch

    from mrtpo.bench.replay.p2t import run_p2t

    out, weights = run_p2t(cfg)
    torch.save({"distances": weights}, out_path)
    return out


def _run_worker(cfg: BenchConfig, variant: str, out_path: str) -> dict[str, Any]:
    env = dict(os.environ)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    cmd = [
        sys.executable,
        "-m",
        "mrtpo.bench.replay",
        "--worker",
        variant,
        "--config",
        json.dumps(asdict(cfg)),
    ]
    cmd += ["--out", out_path]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(
            f"bench worker {variant!r} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_bench(cfg: BenchConfig, *, progress: bool = True) -> BenchResult:
    """Run the variants (naive, then mrtpo with each kernel, then p2t unless ``cfg.p2t`` is off), each in a
    fresh subprocess, and compare their distances. A kernel that cannot run here (``kernel='fused'`` without a C compiler, say) is
    left out with a note that gives the reason."""
    import torch

    kernels, errors = runnable_kernels(cfg)
    notes = [f"kernel {k} left out: {e}" for k, e in errors.items()]
    if not kernels:
        raise ValueError(f"none of the kernels {list(cfg.kernels)} can run here: {'; '.join(notes)}")
    if tuple(kernels) != cfg.kernels:
        cfg = BenchConfig(**{**asdict(cfg), "kernels": tuple(kernels)})
    variants = ["naive", "mrtpo"] + [f"mrtpo:{k}" for k in kernels[1:]] + (["p2t"] if cfg.p2t else [])
    results: dict[str, dict[str, Any]] = {}
    dists: dict[str, torch.Tensor] = {}
    it: Any = variants
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(variants, desc="bench replay", unit="variant")
    with tempfile.TemporaryDirectory(prefix="mrtpo-bench-replay-") as tmp:
        for v in it:
            if progress:
                it.set_postfix_str(v)
            path = str(Path(tmp) / f"{v.replace(':', '-')}.pt")
            results[v] = _run_worker(cfg, v, path)
            dists[v] = torch.load(path)
    run = torch.ones(cfg.responses, cfg.k, dtype=torch.bool)
    for j, k in cfg.skipped():
        run[j, k] = False
    ref = dists["naive"]["reference"]  # [N, K, T] float64

    def worst(d: torch.Tensor, against: torch.Tensor = ref) -> float:
        diff = (against.double() - d.double()).abs()[run]  # [pairs run, T]
        return float(diff.max()) if diff.numel() else 0.0

    main = dists["mrtpo"]["distances"]
    extra = [v for v in variants[2:] if v.startswith("mrtpo:")]
    for v in extra:
        results[v]["max_abs_diff"] = worst(dists[v]["distances"])
    return BenchResult(
        cfg,
        results["naive"],
        results["mrtpo"],
        worst(main),
        worst(dists["naive"]["distances"]),
        others={v.split(":", 1)[1]: results[v] for v in extra},
        kernel_diff={v.split(":", 1)[1]: worst(dists[v]["distances"], main) for v in extra},
        notes=notes,
        p2t=results.get("p2t"),
    )


def worker_main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m mrtpo.bench.replay", description="one variant of the replay bench"
    )
    p.add_argument("--worker", required=True, help="naive, mrtpo, mrtpo:<kernel> or p2t")
    p.add_argument("--config", required=True, help="BenchConfig as JSON")
    p.add_argument("--out", required=True, help="where to save the distances (torch.save)")
    a = p.parse_args(argv)
    cfg = BenchConfig(**json.loads(a.config))
    print(json.dumps(run_variant(cfg, a.worker, a.out)))
    return 0
