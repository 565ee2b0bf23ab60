"""``mrtpo bench train``: per-step time of MRTPO vs GDPO (both through MRTPOTrainer) vs TRL's own
``GRPOTrainer`` in its GDPO mode (``multi_objective_aggregation="normalize_then_sum"``).

Same model initialisation, data, seed and batch for the three runs, on the toy multi-constraint task.
Completions have a fixed length (``min_new_tokens = max_completion_length``) so every run does the
same generation and loss work whatever the policy samples. A step is timed from ``on_step_begin`` to
``on_step_end`` (generation, scoring, advantages, replay, forward, backward, optimizer); the first
``--warmup`` steps are dropped and the median is reported. The clock is the process CPU time on
``--device cpu`` with one torch thread, the default (the CPUs are usually shared: CPU time does not
count other processes' load, and one thread does not spin-wait for a descheduled sibling); the wall
time with ``--threads N`` > 1 (the threads' CPU times would add up) and on ``--device cuda`` (CUDA
synchronised).

``--config`` (a bundled model config: ``tiny``, ``qwen2.5-3b``, ``qwen2.5-7b``) builds the model with
random weights at that config's shapes (bfloat16 on CUDA), vocabulary included; sampling is restricted
to the toy task's words (the other ids are suppressed) so that rewards, advantages and replay behave as
with the small model while every forward projects onto the full vocabulary.

Output: the table only (progress goes to stderr; TRL's per-step log dictionaries are not printed).

The MRTPO run logs no localization ratios (analysis, not the method's cost); both mrtpo runs write no
run files. Targets: GDPO through mrtpo <= 1.05x TRL's GDPO; MRTPO / GDPO <= 1.21x; the replay measured
<= 1.10x its prediction. MRTPO's extra time is its replay, which the replay cost model predicts as
``FPE per response x (one no-grad forward over the batch's rollout sequences)``. That forward is
measured at every MRTPO step, right after the replay and on the same batch (B rows of the batch's mean
rollout length, its own prompt and completion tokens; left out of the step's time), so prediction and
measurement share the moment and the machine's state; the prediction per step is the replay's own FPE
per response (each context run on its own tokens plus the response, the prompt prefix once per
micro-batch when it ran once) times that forward. The command prints the median prediction beside the
measured replay time and the measured MRTPO - GDPO difference; then the forward-only limit of the
replay (each context on its own tokens plus the response, its prompt's common prefix once, whether or not
it ran once: ``ReplayStats.limit_fpe``) times the same forward, and the step-ratio limit that follows,
``(GDPO step + limit) / GDPO step``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def check_credit(name: str) -> None:
    """``--credit`` must name a registered token-level credit scheme (``mrtpo.credit.CREDIT_SCHEMES``;
    ``none`` is the table's GDPO run). Checked at run time: building the parser imports no torch."""
    from mrtpo import credit as credit_mod

    known = [n for n in credit_mod.CREDIT_SCHEMES.names() if credit_mod.scheme(n).token_level]
    if name not in known:
        raise ValueError(f"--credit={name!r} must be a token-level credit scheme: {', '.join(known)}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from mrtpo.plugins import add_plugin_argument

    add_plugin_argument(parser)
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per run (default 8)")
    parser.add_argument("--warmup", type=int, default=2, help="first steps of each run left out (default 2)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="runs per method, interleaved (trl, gdpo, mrtpo, trl, ...); step times pooled (default 2)",
    )
    parser.add_argument("--batch", type=int, default=16, help="responses per step (default 16)")
    parser.add_argument("--generations", type=int, default=8, help="responses per prompt G (default 8)")
    parser.add_argument("--max-completion-length", type=int, default=24, help="response tokens (default 24)")
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument(
        "--layers",
        type=int,
        default=None,
        help="decoder layers (default 2; with --config: the config's, or this many for a slice of its shapes)",
    )
    parser.add_argument(
        "--credit",
        default="reward",
        help="token credit of the MRTPO run: a token-level scheme of mrtpo.credit.CREDIT_SCHEMES (default reward)",
    )
    parser.add_argument(
        "--method",
        default="gdpo",
        help="advantage method of the MRTPO run (mrtpo.advantages.available(): gdpo, rdpo, ...; default gdpo); "
        "the middle row stays GDPO with credit none, TRL's comparison",
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="default cpu")
    parser.add_argument(
        "--config",
        default=None,
        help="bundled model config with random weights (tiny, qwen2.5-1.5b-instruct, qwen2.5-3b, qwen2.5-7b); "
        "replaces --hidden-size (and --layers unless given: a slice of the model with the config's width)",
    )
    parser.add_argument(
        "--bf16", action="store_true", help="TRL's bf16 (accelerate's autocast), as the recipes train"
    )
    parser.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="TRL's gradient checkpointing, as the recipes train",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: 1 on --device cpu, timed by process CPU time; more than 1 is timed "
        "by the wall clock)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None, help="JSON file for the numbers")


def batch_fpe_seconds(model, out, clock) -> float:
    """One FPE of a batch: a no-grad forward of the decoder body over B rollout sequences of the batch's
    mean rollout length (each row its own prompt and completion tokens, the rows' last tokens), as TRL
    runs it (``use_cache`` default)."""
    import torch

    prompt_len = out["prompt_mask"].sum(1).float().mean().item()
    length = round(prompt_len + out["completion_ids"].shape[1])
    seq = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)[:, -length:]  # [B, L + T]
    with torch.no_grad():
        t0 = clock()
        model.get_decoder()(input_ids=seq)
        return clock() - t0


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


@dataclass
class _Bench:
    """What the three runs share: the task, its data and tokenizer, the model builder and the clock."""

    task: Any
    examples: list
    tok: Any
    vocab: int
    suppress: list[int]
    model: Callable[[], Any]
    use_cpu: bool
    cpu_clock: bool

    def clock(self) -> float:
        import time

        if self.cpu_clock:
            return time.process_time()
        if not self.use_cpu:
            import torch

            torch.cuda.synchronize()
        return time.perf_counter()


def _setup(args: argparse.Namespace) -> _Bench:
    """The arguments checked (one line each), torch's threads set, the task, tokenizer and model builder."""
    import torch

    from mrtpo import advantages as adv_mod
    from mrtpo.models.tiny import build_model
    from mrtpo.plugins import import_plugins
    from mrtpo.tasks import load_task
    from mrtpo.tasks.toy import build_toy_tokenizer

    import_plugins(args.plugin)  # a --method or --credit of the user's own
    check_credit(args.credit)

    if args.method not in adv_mod.available():
        raise ValueError(f"--method={args.method!r} must be one of {', '.join(adv_mod.available())}")
    if args.repeats < 1:
        raise ValueError(f"--repeats={args.repeats} must be >= 1")
    if args.steps <= args.warmup:
        raise ValueError(f"--steps={args.steps} must exceed --warmup={args.warmup}")
    if args.layers is not None and args.layers < 1:
        raise ValueError(f"--layers must be >= 1, got {args.layers}")
    if args.batch % args.generations:
        raise ValueError(f"--generations={args.generations} must divide --batch={args.batch}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    use_cpu = args.device == "cpu"
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    threads = args.threads if args.threads is not None else (1 if use_cpu else None)
    if threads is not None:
        torch.set_num_threads(threads)  # default 1: CPU time of one thread, no spin-waiting when shared
    cpu_clock = use_cpu and threads == 1  # several threads: their CPU times add up, so the wall clock

    task = load_task("toy", size=max(64, args.batch), seed=args.seed)
    examples = task.load(limit=max(64, args.batch))
    tok = build_toy_tokenizer()

    suppress: list[int] = []
    vocab = len(tok)
    sliced: dict[str, int] = {}
    if args.config is not None:
        from mrtpo.models.bundled import build_bundled, bundled_config

        vocab = bundled_config(args.config)["vocab_size"]  # raises on an unknown name
        if vocab < len(tok):
            raise ValueError(f"--config {args.config}: vocabulary {vocab} < the toy task's {len(tok)} words")
        suppress = list(range(len(tok), vocab))  # sample the task's words only; project onto all V
        shape = bundled_config(args.config)
        sliced = {} if args.layers is None else {"num_hidden_layers": args.layers}
        if args.layers is not None and "max_window_layers" in shape:
            sliced["max_window_layers"] = min(shape["max_window_layers"], args.layers)
        args.hidden_size = shape["hidden_size"]
        args.layers = shape["num_hidden_layers"] if args.layers is None else args.layers
    elif args.layers is None:
        args.layers = 2

    def model():
        if args.config is not None:
            return build_bundled(args.config, device=args.device, seed=args.seed, **sliced)
        return build_model(
            len(tok),
            hidden_size=args.hidden_size,
            num_layers=args.layers,
            seed=args.seed,
            dtype=torch.float32,
        )

    return _Bench(task, examples, tok, vocab, suppress, model, use_cpu, cpu_clock)


def _say(msg: str) -> None:
    import sys

    print(msg, file=sys.stderr, flush=True)


def _quiet(trainer):
    """No per-step log dictionaries or progress bars on stdout: the output is the table."""
    from transformers import PrinterCallback, ProgressCallback

    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)
    return trainer


def _timed_classes(clock: Callable[[], float]):
    """``(StepTimer, TimedMRTPO)``: a step timer callback and MRTPOTrainer timing its replay, on ``clock``."""
    import contextlib

    from transformers import TrainerCallback

    from mrtpo.bench.memory import RunPeak
    from mrtpo.integrations.trl import MRTPOTrainer

    class StepTimer(TrainerCallback):
        """Step times, less the time the trainer spent on measurements inside the step (``excluded``)."""

        def __init__(self, trainer):
            self.times: list[float] = []
            self.t0 = 0.0
            self.trainer = trainer
            self.excluded0 = 0.0

        def on_step_begin(self, a, state, control, **kw):
            self.excluded0 = getattr(self.trainer, "excluded", 0.0)
            self.t0 = clock()

        def on_step_end(self, a, state, control, **kw):
            spent = getattr(self.trainer, "excluded", 0.0) - self.excluded0
            self.times.append(clock() - self.t0 - spent)

    class TimedMRTPO(MRTPOTrainer):
        """Times the replay (``_replay``, every replay kind) with the bench clock; after each ``_replay`` it times
        one FPE of the batch (:func:`batch_fpe_seconds`), left out of the step time."""

        replay_times: list[float]
        fpe_times: list[float]
        limit_fpe: list[float]
        prompt_tokens: list[float]
        replay_extra: list[int]
        run_peak: RunPeak | None = None
        excluded: float = 0.0

        def _replay(self, out, *a, **kw):
            t0 = clock()
            section = self.run_peak.section() if self.run_peak is not None else contextlib.nullcontext()
            try:
                with section:  # CUDA: replay's peak above what was allocated when it started
                    res = super()._replay(out, *a, **kw)
                self.limit_fpe.append(res.stats.limit_fpe_per_response)
                self.prompt_tokens.append(out["prompt_mask"].sum(1).float().mean().item())
                return res
            finally:
                self.replay_times.append(clock() - t0)
                if getattr(section, "extra", None) is not None:
                    self.replay_extra.append(section.extra)
                t1 = clock()
                self.fpe_times.append(batch_fpe_seconds(self._unwrapped(), out, clock))
                self.excluded += clock() - t1

    return StepTimer, TimedMRTPO


def _runs(args: argparse.Namespace, bench: _Bench, tmp: str, timed_mrtpo: type) -> list[tuple[str, Callable]]:
    """The three runs, ``(name, make trainer)``: TRL's GRPOTrainer in GDPO mode, mrtpo GDPO, mrtpo MRTPO."""
    from trl import GRPOConfig, GRPOTrainer

    from mrtpo.integrations.trl import MRTPOConfig, MRTPOTrainer
    from mrtpo.integrations.trl.data import example_from_row, examples_to_dataset

    task, tok, examples = bench.task, bench.tok, bench.examples
    common = dict(
        per_device_train_batch_size=args.batch,
        num_generations=args.generations,
        max_completion_length=args.max_completion_length,
        generation_kwargs={
            "min_new_tokens": args.max_completion_length,
            **({"suppress_tokens": bench.suppress} if bench.suppress else {}),
        },
        max_steps=args.steps,
        logging_steps=1,
        report_to=[],
        bf16=args.bf16,
        gradient_checkpointing=args.gradient_checkpointing,
        use_cpu=bench.use_cpu,
        save_strategy="no",
        learning_rate=1e-4,
        disable_tqdm=True,
        seed=args.seed,
        multi_objective_aggregation="normalize_then_sum",
    )

    def reward(k):
        def fn(prompts, completions, example, **kw):
            exs = [example_from_row({"example": e}) for e in example]
            return [task.verifiers(e)[k].score(e, c[-1]["content"]) for e, c in zip(exs, completions)]

        fn.__name__ = task.reward_names[k]
        return fn

    def mrtpo_run(trainer_class: type, name: str, method: dict, **options) -> Callable:
        """Make an MRTPOTrainer-like run ``name`` of the method block ``method`` (no run files)."""
        return lambda: trainer_class(
            bench.model(),
            args=MRTPOConfig(output_dir=f"{tmp}/{name}", method=method, run_files=False, **options, **common),
            task=task,
            train_dataset=examples,
            processing_class=tok,
        )

    return [
        (
            "trl_gdpo",
            lambda: GRPOTrainer(
                bench.model(),
                reward_funcs=[reward(k) for k in range(len(task.reward_names))],
                args=GRPOConfig(output_dir=f"{tmp}/trl", **common),
                train_dataset=examples_to_dataset(examples),
                processing_class=tok,
            ),
        ),
        (
            "gdpo",
            mrtpo_run(MRTPOTrainer, "gdpo", {"method": "gdpo", "options": {"eps": 1e-4}, "credit": "none"}),
        ),
        (
            "mrtpo",
            mrtpo_run(
                timed_mrtpo,
                "mrtpo",
                {"method": args.method, "credit": args.credit},
                log_localization=False,  # analysis logging, not part of the method's cost
            ),
        ),
    ]


def _measure(args: argparse.Namespace, bench: _Bench) -> tuple[dict[str, dict], str, float]:
    """The three runs, ``--repeats`` times each after one warm-up: ``(results per run, how the peak memory
    was measured, the median prompt tokens)``."""
    import gc
    import tempfile

    import torch

    from mrtpo.bench.memory import RunPeak

    step_timer, timed_mrtpo = _timed_classes(bench.clock)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        runs = _runs(args, bench, tmp, timed_mrtpo)
        # process warm-up (lazy imports, thread pools, allocator), not measured
        warm = _quiet(runs[0][1]())
        warm.args.max_steps = min(2, args.steps)
        _say("bench train: warm-up ...")
        warm.train()
        del warm
        gc.collect()
        keys = ("steps", "replay", "fpe", "fpe_batch", "limit_fpe", "peak", "replay_extra", "prompt_tokens")
        pooled: dict[str, dict[str, list[float]]] = {n: {k: [] for k in keys} for n, _ in runs}
        peak_method = ""
        for rep in range(args.repeats):
            for name, make in runs:
                trainer = _quiet(make())
                trainer.replay_times, trainer.fpe_times, trainer.limit_fpe = [], [], []
                trainer.prompt_tokens, trainer.replay_extra = [], []
                timer = step_timer(trainer)
                trainer.add_callback(timer)
                _say(f"bench train: {name} ({args.steps} steps, run {rep + 1}/{args.repeats}) ...")
                with RunPeak(args.device) as peak:
                    trainer.run_peak = peak
                    trainer.train()
                peak_method = peak.method
                if peak.peak is not None:
                    pooled[name]["peak"].append(peak.peak)
                pooled[name]["replay_extra"] += trainer.replay_extra
                pooled[name]["prompt_tokens"] += trainer.prompt_tokens
                hist = [h for h in trainer.state.log_history if "replay/fpe" in h][args.warmup :]
                pooled[name]["steps"] += timer.times[args.warmup :]
                pooled[name]["replay"] += trainer.replay_times[args.warmup :]
                pooled[name]["fpe"] += [h["replay/fpe"] for h in hist]
                pooled[name]["fpe_batch"] += trainer.fpe_times[args.warmup :]
                pooled[name]["limit_fpe"] += trainer.limit_fpe[args.warmup :]
                del trainer
                gc.collect()
                if not bench.use_cpu:
                    torch.cuda.empty_cache()
    for name, p in pooled.items():
        results[name] = {
            "step_seconds": _median(p["steps"]),
            "steps": p["steps"],
            "replay_seconds": _median(p["replay"]) if p["replay"] else 0.0,
            "replay_fpe": _median(p["fpe"]) if p["fpe"] else 0.0,
            "peak_bytes": max(p["peak"]) if p["peak"] else None,
        }
    p = pooled["mrtpo"]
    steps_both = list(zip(p["replay"], p["fpe"], p["fpe_batch"]))
    results["mrtpo"]["fpe_batch_seconds"] = _median(p["fpe_batch"]) if p["fpe_batch"] else 0.0
    results["mrtpo"]["replay_extra_bytes"] = max(p["replay_extra"]) if p["replay_extra"] else None
    prompt_tokens = _median(p["prompt_tokens"]) if p["prompt_tokens"] else 0.0
    results["mrtpo"]["predicted_per_step"] = [f * b for _, f, b in steps_both]
    results["mrtpo"]["limit_per_step"] = [f * b for f, b in zip(p["limit_fpe"], p["fpe_batch"])]
    results["mrtpo"]["limit_fpe"] = _median(p["limit_fpe"]) if p["limit_fpe"] else 0.0
    results["mrtpo"]["replay_over_predicted"] = (
        _median([r / max(f * b, 1e-12) for r, f, b in steps_both]) if steps_both else 0.0
    )
    return results, peak_method, prompt_tokens


def _summary(
    args: argparse.Namespace, bench: _Bench, results: dict[str, dict], peak_method: str, prompt_tokens: float
) -> dict[str, Any]:
    """The numbers of ``--output``: the runs, their ratios, the replay's prediction and limit."""
    import torch

    trl_t, gdpo_t, mr = results["trl_gdpo"]["step_seconds"], results["gdpo"]["step_seconds"], results["mrtpo"]
    predicted = _median(mr["predicted_per_step"]) if mr["predicted_per_step"] else 0.0
    limit = _median(mr["limit_per_step"]) if mr["limit_per_step"] else 0.0
    return {
        "device": args.device,
        "clock": "process_time" if bench.cpu_clock else "wall",
        "threads": torch.get_num_threads(),
        "batch": args.batch,
        "generations": args.generations,
        "completion_tokens": args.max_completion_length,
        "config": args.config,
        "hidden_size": args.hidden_size,
        "layers": args.layers,
        "vocab": bench.vocab,
        "bf16": args.bf16,
        "gradient_checkpointing": args.gradient_checkpointing,
        "prompt_tokens": prompt_tokens,
        "peak_method": peak_method,
        "credit": args.credit,
        "method": args.method,
        "runs": results,
        "gdpo_over_trl": gdpo_t / trl_t,
        "mrtpo_over_trl": mr["step_seconds"] / trl_t,
        "mrtpo_over_gdpo": mr["step_seconds"] / gdpo_t,
        "mrtpo_extra_seconds": mr["step_seconds"] - gdpo_t,
        "replay_seconds": mr["replay_seconds"],
        "replay_fpe_per_response": mr["replay_fpe"],
        "predicted_replay_seconds": predicted,
        "replay_over_predicted": mr["replay_over_predicted"],
        "limit_replay_seconds": limit,
        "limit_fpe_per_response": mr["limit_fpe"],
        "step_ratio_limit": (gdpo_t + limit) / gdpo_t,
    }


def _print_table(args: argparse.Namespace, bench: _Bench, summary: dict[str, Any]) -> None:
    import torch

    results, peak_method = summary["runs"], summary["peak_method"]
    trl_t, gdpo_t, mr = results["trl_gdpo"]["step_seconds"], results["gdpo"]["step_seconds"], results["mrtpo"]
    predicted, limit = summary["predicted_replay_seconds"], summary["limit_replay_seconds"]
    kind = "CPU time" if bench.cpu_clock else "wall time"
    threads = f", {torch.get_num_threads()} thread(s)" if bench.use_cpu else ""
    print(
        f"per-step {kind} (median of steps {args.warmup + 1}..{args.steps} of {args.repeats} run(s) per method, "
        f"{args.device}{threads}, {(args.config + ' ') if args.config else ''}{args.hidden_size}-d x {args.layers} "
        f"layers, {args.batch} responses x {args.max_completion_length} tokens):"
    )
    ratio = mr["step_seconds"] / gdpo_t
    print(f"  TRL GRPOTrainer (GDPO mode)  {trl_t * 1e3:9.1f} ms   1.000x")
    print(f"  mrtpo GDPO (credit none)     {gdpo_t * 1e3:9.1f} ms   {gdpo_t / trl_t:.3f}x  (target <= 1.05x)")
    name = "MRTPO" if args.method == "gdpo" else f"{args.method.upper()}"
    label = f"mrtpo {name} (credit {args.credit})"
    print(
        f"  {label:<28} {mr['step_seconds'] * 1e3:9.1f} ms   "
        f"{mr['step_seconds'] / trl_t:.3f}x  = {ratio:.3f}x GDPO (target <= 1.21x)"
    )
    print(
        f"  MRTPO - GDPO: {summary['mrtpo_extra_seconds'] * 1e3:.1f} ms; measured replay "
        f"{mr['replay_seconds'] * 1e3:.1f} ms; predicted replay {predicted * 1e3:.1f} ms "
        f"({mr['replay_fpe']:.2f} FPE/response x {mr['fpe_batch_seconds'] * 1e3:.1f} ms per batch FPE, both "
        "medians; the FPE measured at each step on its batch)"
    )
    print(
        f"  replay measured / predicted: {mr['replay_over_predicted']:.3f}x (median over steps; target <= 1.10x)"
    )
    print(
        f"  forward-only limit of the replay: {mr['limit_fpe']:.2f} FPE/response (each context run once on its own "
        f"tokens + the response, its prompt's common prefix once) = {limit * 1e3:.1f} ms; step-ratio limit "
        f"(GDPO + limit) / GDPO = {summary['step_ratio_limit']:.3f}x"
    )
    peaks = [results[n]["peak_bytes"] for n in ("trl_gdpo", "gdpo", "mrtpo")]
    if all(p is not None for p in peaks):
        extra = mr.get("replay_extra_bytes")
        print(
            "  peak memory (TRL / GDPO / MRTPO): "
            + " / ".join(f"{p / 2**30:.2f} GiB" for p in peaks)
            + (f"; replay's peak above its start {extra / 2**30:.2f} GiB" if extra is not None else "")
            + f" ({peak_method})"
        )
    else:
        print(f"  peak memory: not measured ({peak_method})")


def run(args: argparse.Namespace) -> int:
    """Check the arguments, run the three trainers, print the table (and write ``--output``)."""
    import json

    bench = _setup(args)
    results, peak_method, prompt_tokens = _measure(args, bench)
    summary = _summary(args, bench, results, peak_method, prompt_tokens)
    _print_table(args, bench, summary)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(summary, f, indent=2)
    return 0
