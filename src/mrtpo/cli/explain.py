"""``mrtpo explain``: per-token credit of one response under the response-level method and MRTPO.

Two sources:

- a training run's saved samples, no model needed::

      mrtpo explain --samples RUN/samples.jsonl [--top 2] [--reward format ...]
      mrtpo explain --samples RUN/samples.jsonl --index 3 [--index -1 ...]

  Without ``--index`` the records with the largest |Â| = Σ_k |Â[k]| are explained (a record whose
  group scored alike has Â = 0 and no credit to show); a line says how many records have credit.

- a live model, a task's verifiers and one example::

      mrtpo explain --model PATH --task toy --example 0 [--response TEXT] [--advantages 0.5,-1,0,...]

  The example is a row index of the task's data (``--data`` / ``--split``), a JSON row
  (``Example.to_dict`` format) or a file holding one. The response is ``--response`` /
  ``--response-file``, or sampled from the model.

Where the response-level advantages Â come from (live mode): a single response has no group, so
Â is either given (``--advantages``, K comma-separated numbers in the task's reward order), or
computed on a group: the explained response plus ``--group-size - 1`` responses sampled from the
model (temperature ``--temperature``, default 1.0), scored by the verifiers and normalized with
``--method`` (default gdpo) as one group, exactly as in training. Without ``--advantages`` the group
is sampled (``--group-size`` default 8). Samples from a run carry the Â the trainer used.

Output (``--out``): explain.html (self-contained), explain.png, explain.json (the numbers), and in
live mode record.jsonl (the record in the samples.jsonl format, re-explainable with ``--samples``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(parser) -> None:
    from mrtpo.plugins import add_plugin_argument

    add_plugin_argument(parser)
    src = parser.add_argument_group("from saved samples")
    src.add_argument("--samples", default=None, help="samples.jsonl of a training run (or a record.jsonl)")
    src.add_argument(
        "--index",
        type=int,
        action="append",
        default=None,
        help="record to explain (0-based line among records; negative counts from the end); "
        "repeat for several (default: the records with the largest |Â|, see --top)",
    )
    src.add_argument(
        "--top",
        type=int,
        default=1,
        help="without --index: explain this many records, those with the largest |Â| = Σ_k |Â[k]| "
        "(default: 1)",
    )
    parser.add_argument(
        "--reward",
        action="append",
        default=None,
        help="show this reward (repeatable; default: all); the totals stay over every reward",
    )
    live = parser.add_argument_group("live on a model")
    live.add_argument("--model", default=None, help="local model folder or hub id (a Hugging Face causal LM)")
    live.add_argument(
        "--task",
        default=None,
        help="task name (mrtpo.tasks.load_task), e.g. toy, sql, instruct, tools, or module:Class of your own",
    )
    live.add_argument(
        "--example",
        default=None,
        help="row index into the task's data, a JSON example row, or a file holding one",
    )
    live.add_argument(
        "--data", default=None, help="data source of the task (path); default: the task's built-in data"
    )
    live.add_argument("--split", default="train", help="data split (default: train)")
    live.add_argument("--response", default=None, help="the response text (default: sampled from the model)")
    live.add_argument("--response-file", default=None, help="a file holding the response text")
    live.add_argument(
        "--advantages",
        default=None,
        help="K comma-separated response-level advantages in the task's reward order "
        "(default: computed on a sampled group, see --group-size)",
    )
    live.add_argument(
        "--group-size",
        type=int,
        default=8,
        help="group size G when Â is computed: the response plus G-1 samples (default: 8)",
    )
    live.add_argument("--method", default="gdpo", help="response-level advantage method (default: gdpo)")
    live.add_argument(
        "--credit",
        default="reward",
        help="credit scheme whose replay and weights give the MRTPO columns: reward (default), joint, "
        "scaled, cort, or a plug-in's scheme",
    )
    live.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default: 1.0)")
    live.add_argument("--top-p", type=float, default=1.0)
    live.add_argument("--max-new-tokens", type=int, default=256)
    live.add_argument("--seed", type=int, default=0, help="sampling seed")
    live.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    live.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda when available)")
    parser.add_argument(
        "--credit-beta",
        type=float,
        default=None,
        help="allocation strength β of the MRTPO columns (default: the record's credit_beta, else 0.5)",
    )
    parser.add_argument("--beta", dest="old_beta", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="explain", help="output folder (default: ./explain)")
    parser.add_argument("--tokens-per-line", type=int, default=32, help="PNG: tokens per heat-strip line")
    parser.add_argument("--max-tokens", type=int, default=384, help="PNG: tokens shown at most")


def _parse_advantages(text: str, k: int, names: list[str]) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--advantages {text!r} must be comma-separated numbers") from None
    if len(vals) != k:
        raise ValueError(f"--advantages has {len(vals)} values; expected K={k} ({', '.join(names)})")
    return vals


def _load_example(task, spec: str, data: str | None, split: str):
    from mrtpo.tasks.base import Example

    s = spec.strip()
    if s.lstrip("-").isdigit():
        i = int(s)
        rows = task.load(data, split=split, limit=None if i < 0 else i + 1)
        if not -len(rows) <= i < len(rows):
            raise ValueError(f"--example {i} is out of range: the {split} data has {len(rows)} examples")
        return rows[i]
    path = Path(s)
    if not s.startswith("{") and path.exists():
        s = path.read_text(encoding="utf-8")
    try:
        row = json.loads(s)
    except json.JSONDecodeError as e:
        raise ValueError(f"--example is neither a row index, a JSON example nor a file: {e.msg}") from None
    if not isinstance(row, dict):
        raise ValueError("--example JSON must be an object (Example.to_dict format)")
    return Example.from_dict(row)


def _step(record) -> str:
    step = record.get("step") if isinstance(record, dict) else None
    return f"step {step}, " if step is not None else ""


def pick_records(records: list, indices: list[int] | None, top: int, rewards: list[str] | None, source: str):
    """The indices to explain and the lines that say why.

    Without ``indices``: the ``top`` records with the largest |Â| = Σ_k |Â[k]| over ``rewards`` (all
    rewards when None), the earlier record first on a tie; a line says how many records have credit and
    which were picked (record 0 when none has). With ``indices``: those, and a line for each that has no
    credit.
    """
    from mrtpo.analysis.explain import credit_magnitude

    over = f" for {', '.join(rewards)}" if rewards else ""
    mags = [credit_magnitude(r, rewards) if isinstance(r, dict) else 0.0 for r in records]
    lines = []
    if indices:
        for i in indices:
            if -len(records) <= i < len(records) and mags[i] == 0.0:
                lines.append(
                    f"{source} #{i} ({_step(records[i])}no credit): Â = 0 for every reward{over} "
                    "(its group's responses scored alike); run without --index to pick records with credit"
                )
        return list(indices), lines
    if top < 1:
        raise ValueError(f"--top must be >= 1, got {top}")
    with_credit = sum(m > 0 for m in mags)
    if not with_credit:
        lines.append(
            f"{source}: none of the {len(records)} records has credit (Â = 0 for every reward{over}: each "
            "group's responses scored alike); explaining #0"
        )
        return [0], lines
    order = sorted(range(len(records)), key=lambda i: (-mags[i], i))[: min(top, with_credit)]
    picked = ", ".join(f"#{i} ({_step(records[i])}|Â| = {mags[i]:.3g})" for i in order)
    lines.append(
        f"{source}: {with_credit} of {len(records)} records have credit (Â ≠ 0{over}); "
        f"explaining the largest |Â| = Σ_k |Â[k]|: {picked}"
    )
    return order, lines


def _explain_samples(args):
    from mrtpo.analysis.explain import check_rewards, explain_records, select_records
    from mrtpo.io import read_jsonl

    records = read_jsonl(args.samples)
    if not records:
        raise ValueError(f"{args.samples} has no record")
    if not any(isinstance(r, dict) and "tokens" in r for r in records):  # checked before any is picked
        hint = (
            " (it looks like a metrics.jsonl: use the samples.jsonl beside it)"
            if any(isinstance(r, dict) and "step" in r and "reward_names" not in r for r in records)
            else ""
        )
        raise ValueError(
            f"{args.samples} holds no sample record (no record has 'tokens'){hint}: --samples reads a run's "
            "samples.jsonl"
        )
    source = Path(args.samples).name
    rewards = None
    if args.reward:
        known = list(
            dict.fromkeys(n for r in records if isinstance(r, dict) for n in r.get("reward_names") or [])
        )
        rewards = check_rewards(args.reward, known, args.samples)
    indices, lines = pick_records(records, args.index, args.top, rewards, source)
    for line in lines:
        print(line)
    chosen = select_records(records, indices, source=args.samples)
    names = [f"{source} #{i}" for i in indices]
    run_dir = Path(args.samples).resolve().parent
    return explain_records(
        chosen,
        args.out,
        credit_beta=args.credit_beta,
        names=names,
        tokens_per_line=args.tokens_per_line,
        max_tokens=args.max_tokens,
        run=f"run {run_dir.name}",
        rewards=rewards,
        from_scratch=_from_scratch(run_dir),
    )


def _from_scratch(run_dir: Path) -> bool | None:
    """Whether the run in ``run_dir`` started from random weights (its run.json's model is ``tiny``); None
    when its run.json is absent or unreadable."""
    import json

    try:
        model = json.loads((run_dir / "run.json").read_text()).get("model")
    except (OSError, ValueError, AttributeError):
        return None
    return None if model is None else model == "tiny"


def _explain_live(args):
    import torch

    from mrtpo.analysis.explain import check_rewards, explain_records, group_advantages, live_record
    from mrtpo.eval.generation import SamplingConfig, TransformersGenerator
    from mrtpo.io import write_jsonl
    from mrtpo.models.loading import load_model_and_tokenizer
    from mrtpo.tasks import load_task

    missing = [f"--{n}" for n in ("model", "task", "example") if getattr(args, n) is None]
    if missing:
        raise ValueError(f"live mode needs {', '.join(missing)} (or use --samples)")
    if args.response is not None and args.response_file is not None:
        raise ValueError("give --response or --response-file, not both")
    task = load_task(args.task)
    example = _load_example(task, args.example, args.data, args.split)
    verifiers = task.verifiers(example)
    names = [v.name for v in verifiers]
    adv = _parse_advantages(args.advantages, len(names), names) if args.advantages is not None else None
    if adv is None and args.group_size < 2:
        raise ValueError(f"--group-size must be >= 2 to compute advantages, got {args.group_size}")
    response = args.response
    if args.response_file is not None:
        response = Path(args.response_file).read_text(encoding="utf-8")

    model, tok = load_model_and_tokenizer(args.model, dtype=args.dtype, device=args.device)
    notes = []
    n_sample = (
        (0 if response is not None else 1) if adv is not None else args.group_size - (response is not None)
    )
    sampled = []
    if n_sample:
        cfg = SamplingConfig(
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            batch_size=min(n_sample, 8),
            seed=args.seed,
        )
        sampled = TransformersGenerator(model, tok, cfg).generate(
            [example.messages()] * n_sample, progress=True
        )
    if response is None:
        nonempty = [i for i, r in enumerate(sampled) if r.strip()]
        if not nonempty:
            raise ValueError(f"all {len(sampled)} sampled responses are empty; give --response")
        response = sampled.pop(
            nonempty[0]
        )  # the first non-empty sample is explained, the rest fill the group
        notes.append(f"response sampled at temperature {args.temperature} (seed {args.seed})")
    rewards = None
    if adv is None:
        group = [response, *sampled]
        rewards_g, adv_g = group_advantages(args.method, example, verifiers, group)
        adv, rewards = adv_g[0].tolist(), rewards_g[0]
        notes.append(
            f"Â: {args.method} over a group of {len(group)} (this response + {len(group) - 1} sampled at "
            f"temperature {args.temperature}); group reward means "
            + ", ".join(f"{n} {sum(r[k] for r in rewards_g) / len(group):.3g}" for k, n in enumerate(names))
        )
    else:
        notes.append("Â given (--advantages)")
    beta = 0.5 if args.credit_beta is None else args.credit_beta
    with torch.no_grad():
        record = live_record(
            model,
            tok,
            example,
            verifiers,
            response,
            adv,
            method=args.method,
            credit_beta=beta,
            credit=args.credit,
            rewards=rewards,
            progress=True,
        )
    record["notes"] = [
        *notes,
        *record.get("notes", []),
        f"model {args.model}, task {args.task}, example {example.id}",
    ]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "record.jsonl", [record])
    if args.reward:
        check_rewards(args.reward, names, f"task {args.task}")
    return explain_records(
        [record],
        out,
        credit_beta=beta,
        rewards=args.reward,
        names=[f"{args.task} example {example.id}"],
        tokens_per_line=args.tokens_per_line,
        max_tokens=args.max_tokens,
    )


def run(args) -> int:
    from mrtpo.plugins import import_plugins

    import_plugins(args.plugin)  # before --method / --task are looked up
    if getattr(args, "old_beta", None) is not None:
        raise ValueError("--beta is now --credit-beta (the allocation strength β)")
    if args.samples is not None:
        if args.model is not None:
            raise ValueError("give --samples or --model, not both")
        html_path, png_path = _explain_samples(args)
    elif args.model is not None or args.task is not None:
        html_path, png_path = _explain_live(args)
    else:
        raise ValueError("give --samples RUN/samples.jsonl, or --model, --task and --example")
    print(f"wrote {html_path} and {png_path}")
    return 0
