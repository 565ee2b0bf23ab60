"""A supervised warm start for the instruct task on CPU: a tiny model that follows some of the
constraints of short synthetic prompts, so ``mrtpo train`` has rewards to raise.

``python -m mrtpo.tasks.instruct.warmstart --out runs/instruct_warm`` (then
``mrtpo train recipes/instruct_laptop.yaml``).

Prompts: :func:`mrtpo.tasks.instruct.synth.generate` restricted to
:data:`~mrtpo.tasks.instruct.synth.LAPTOP_TYPES` (``types="laptop"``), 2 to 4 constraints each, 4 reward
slots. IFEval has no gold responses, so the demonstrations are written by rule from each constraint's
kwargs (:func:`demonstration_words`), one line of space-separated words, e.g. for a title, two keywords
and an end phrase::

    << honeybees >> Here is a short note about honeybees , written for you . It mentions bill and
    negative . Any other questions?

A demonstration is kept only when the task's own verifier scores every constraint 1 (the first of a few
body variants that does). Deliberately imperfect so RL has headroom: with probability ``p_break`` one
constraint, drawn at random, is broken (title left out, a forbidden word written, one placeholder
short, ...), and such a variant is used only when the verifier fails exactly that constraint.

The tokenizer is the project's word-level one (:func:`mrtpo.models.tiny.build_tokenizer`) with
``[``, ``]``, ``'`` and ``,`` split off words, so a keyword in the prompt (``['bill',``) is the same token
as in the response (``bill``). The model, loss, step and schedule are the SQL warm start's
(:mod:`mrtpo.models.sft`); everything is drawn from ``seed``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from mrtpo.models.sft import WarmStartSettings, add_settings_arguments, settings_from_args
from mrtpo.tasks.instruct.synth import TOPICS

SPLIT_CHARS = r"[\[\]',]"
"""Characters the tokenizer splits off words (each its own token)."""

OPENINGS: tuple[tuple[str, ...], ...] = (
    ("Here", "is", "a", "short", "note", "about", "{topic}", ",", "written", "for", "you", "."),
    ("This", "is", "my", "answer", "on", "{topic}", ",", "and", "I", "hope", "you", "like", "it", "."),
    ("Let", "me", "tell", "you", "about", "{topic}", ",", "which", "I", "find", "very", "interesting", "."),
)
"""Body variants of a demonstration (``{topic}``: the prompt's topic words); the first that verifies is used."""

EXTRA_PARAGRAPH = ("There", "is", "more", "to", "say", "about", "{topic}", ".")
POSTSCRIPT = ("thank", "you", "for", "reading", ".")


@dataclass
class InstructWarmStartConfig(WarmStartSettings):
    """Settings of the instruct warm start (defaults: the documented laptop run)."""

    p_break: float = 0.3
    train_size: int = 2000
    heldout_seed: int = 1
    min_constraints: int = 2
    max_constraints: int = 4

    def __post_init__(self) -> None:
        self.check_at_least_one("steps", "batch_size", "train_size")
        self.check_probabilities("p_break")
        if not 1 <= self.min_constraints <= self.max_constraints:
            raise ValueError(
                f"need 1 <= min_constraints ({self.min_constraints}) <= max_constraints ({self.max_constraints})"
            )


def laptop_task(config: InstructWarmStartConfig, *, seed: int | None = None):
    """The instruct task of the laptop run: ``types="laptop"``, ``config``'s constraint counts and
    ``train_size`` prompts from ``seed`` (default ``config.seed``)."""
    from mrtpo.tasks.instruct import InstructTask

    return InstructTask(
        max_constraints=config.max_constraints,
        min_constraints=config.min_constraints,
        synthetic_size=config.train_size,
        seed=config.seed if seed is None else seed,
        types="laptop",
    )


def topic_words(example) -> list[str]:
    """The topic of a synthetic prompt (one of :data:`~mrtpo.tasks.instruct.synth.TOPICS`), as words."""
    task = example.segments[0].text
    found = [t for t in TOPICS if t in task]
    return max(found, key=len).split() if found else ["it"]


def demonstration_words(example, *, variant: int = 0, broken: int | None = None) -> list[str]:
    """The words of a response to ``example`` written from its constraints' kwargs; ``broken``: the slot
    of the one constraint to break on purpose (None: follow all); ``variant``: the body (:data:`OPENINGS`)."""
    ids = list(example.meta["instruction_ids"])
    kw = {iid: dict(k) for iid, k in zip(ids, example.meta["kwargs"])}
    br = ids[broken] if broken is not None else None
    topic = topic_words(example)

    def fill(words):
        return [x for w in words for x in (topic if w == "{topic}" else [w])]

    def has(iid):
        return iid in kw

    n_par = kw.get("length_constraints:number_paragraphs", {}).get("num_paragraphs", 1)
    if br == "length_constraints:number_paragraphs":
        n_par = n_par - 1 if n_par > 1 else 2
    first = fill(OPENINGS[variant % len(OPENINGS)])
    if has("keywords:existence"):
        words = kw["keywords:existence"]["keywords"]
        if br == "keywords:existence":
            words = words[1:]
        first += ["It", "mentions", *" and ".join(words).split(), "."]
    if has("keywords:frequency"):
        f = kw["keywords:frequency"]
        times = f["frequency"] if f["relation"] == "at least" else 0
        if br == "keywords:frequency":
            times = f["frequency"] - 1 if f["relation"] == "at least" else f["frequency"]
        if times:
            first += ["I", "say", *[f["keyword"]] * times, "."]
    if has("detectable_format:number_highlighted_sections"):  # before any *** (its stars would pair up)
        n = kw["detectable_format:number_highlighted_sections"]["num_highlights"]
        n -= br == "detectable_format:number_highlighted_sections"
        if n:
            first += ["Key", "points", *["*", "key", "*"] * n]
    if br == "keywords:forbidden_words":
        first += ["Not", "about", kw["keywords:forbidden_words"]["forbidden_words"][0], "."]
    paragraphs = [first] + [fill(EXTRA_PARAGRAPH) for _ in range(n_par - 1)]
    last = paragraphs[-1]
    if has("detectable_content:number_placeholders"):
        n = kw["detectable_content:number_placeholders"]["num_placeholders"]
        n -= br == "detectable_content:number_placeholders"
        if n:
            last += ["See", *["[", "name", "]"] * n, "."]
    if has("detectable_content:postscript") and br != "detectable_content:postscript":
        last += [kw["detectable_content:postscript"]["postscript_marker"], *POSTSCRIPT]
    out: list[str] = []
    if has("detectable_format:title") and br != "detectable_format:title":
        out += ["<<", *topic, ">>"]
    for i, p in enumerate(paragraphs):
        out += (["***"] if i else []) + p
    if has("startend:end_checker") and br != "startend:end_checker":
        out += kw["startend:end_checker"]["end_phrase"].split()
    if has("startend:quotation") and br != "startend:quotation":
        # quotes attached to the first and last words: the end checker strips quotes, not the space
        out = ['"' + out[0], *out[1:]]
        out[-1] += '"'
    if has("change_case:english_lowercase") and br != "change_case:english_lowercase":
        out = [w.lower() for w in out]
    if has("punctuation:no_comma") and br != "punctuation:no_comma":
        out = [w for w in out if w != ","]
    return out


def _scores(task, example, text: str) -> list[float]:
    """The rewards of the example's constraints (its used slots) for ``text``."""
    n = len(example.meta["instruction_ids"])
    return [v.score(example, text) for v in task.verifiers(example)[:n]]


def demonstrations(task, example) -> tuple[str, list[tuple[int, str]]] | None:
    """``(clean, broken)``: the first body variant whose response the task's verifier scores 1 on every
    constraint, and for each slot k whose rule-broken response fails exactly constraint k, ``(k, text)``.
    None when no variant verifies."""
    n = len(example.meta["instruction_ids"])
    for variant in range(len(OPENINGS)):
        clean = " ".join(demonstration_words(example, variant=variant))
        if all(s == 1.0 for s in _scores(task, example, clean)):
            break
    else:
        return None
    broken = []
    for k in range(n):
        text = " ".join(demonstration_words(example, variant=variant, broken=k))
        if _scores(task, example, text) == [0.0 if j == k else 1.0 for j in range(n)]:
            broken.append((k, text))
    return clean, broken


def build_instruct_tokenizer(texts):
    """The word-level tokenizer (:func:`mrtpo.models.tiny.build_tokenizer`) of every word of ``texts``,
    with :data:`SPLIT_CHARS` split off words (a word-level model then sees a keyword the same in
    ``['bill',`` and in ``bill``)."""
    from tokenizers import Regex, pre_tokenizers

    from mrtpo.models.tiny import build_tokenizer

    pre = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(SPLIT_CHARS), behavior="isolated")]
    )
    words: dict[str, None] = {}
    for text in texts:
        words.update(dict.fromkeys(w for w, _ in pre.pre_tokenize_str(text)))
    tok = build_tokenizer(list(words))
    tok.backend_tokenizer.pre_tokenizer = pre
    return tok


def evaluate(model, tok, task, examples, *, temperature: float, seed: int = 0, max_new_tokens: int = 96):
    """``constraint_accuracy`` (met constraints / all constraints) and ``prompt_accuracy`` of sampled
    (``temperature > 0``) or greedy responses to ``examples`` (:meth:`InstructTask.metrics`), and
    ``by_type``: the share of each instruction type's constraints met."""
    from mrtpo.models.generation import SamplingConfig, TransformersGenerator

    cfg = SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature, batch_size=64, seed=seed)
    was_training = model.training
    model.eval()
    responses = TransformersGenerator(model, tok, cfg).generate(
        [e.messages() for e in examples], progress=False
    )
    model.train(was_training)
    rows = [[v.score(e, r) for v in task.verifiers(e)] for e, r in zip(examples, responses, strict=True)]
    by_type: dict[str, list[float]] = {}
    for e, row in zip(examples, rows, strict=True):
        for iid, v in zip(e.meta["instruction_ids"], row):
            by_type.setdefault(iid, []).append(v)
    out = dict(task.metrics(examples, responses, rows))
    out["by_type"] = {iid: sum(v) / len(v) for iid, v in sorted(by_type.items())}
    return out


def train_instruct_warm_start(config: InstructWarmStartConfig, out_dir: str | Path | None = None):
    """Train the warm start on the laptop prompts (seed ``config.seed``), evaluate it on the first
    ``eval_limit`` of them and of held-out prompts (seed ``heldout_seed``), save model, tokenizer and
    ``warmstart.json`` to ``out_dir``. Returns ``(model, tokenizer, info)``."""

    from mrtpo.models.sft import save_warm_start, train_on_demonstrations

    task = laptop_task(config)
    train = task.load()
    heldout = laptop_task(config, seed=config.heldout_seed).load(limit=config.eval_limit)
    demos = [demonstrations(task, e) for e in train]
    usable = [j for j, d in enumerate(demos) if d is not None]
    if not usable:
        raise ValueError("no prompt has a demonstration that verifies")
    texts = [e.messages()[-1]["content"] for e in train + heldout]
    texts += [d[0] for d in demos if d] + [t for d in demos if d for _, t in d[1]]
    tok = build_instruct_tokenizer(texts)

    def ids_of(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    prompts = {
        j: ids_of(tok.apply_chat_template(train[j].messages(), tokenize=False, add_generation_prompt=True))
        for j in usable
    }

    def respond(j: int, rng) -> list[int]:
        clean, broken = demos[j]
        return ids_of(rng.choice(broken)[1] if broken and rng.random() < config.p_break else clean)

    def evaluations(model) -> dict:
        n = config.eval_limit
        return {
            "train_sampled": evaluate(model, tok, task, train[:n], temperature=1.0, seed=config.seed),
            "train_greedy": evaluate(model, tok, task, train[:n], temperature=0.0),
            "heldout_sampled": evaluate(model, tok, task, heldout, temperature=1.0, seed=config.seed),
        }

    model, info = train_on_demonstrations(
        tok,
        config,
        prompts,
        respond,
        pick=lambda rng: rng.choice(usable),
        max_positions=512,
        evaluate=evaluations,
        extra={"prompts_with_demonstration": len(usable)},
    )
    if out_dir is not None:
        save_warm_start(out_dir, model, tok, info)
    return model, tok, info


def evaluate_saved(path: str | Path, config: InstructWarmStartConfig) -> dict[str, dict[str, float]]:
    """Sampled (temperature 1, seed ``config.seed``) metrics of the model saved in ``path`` (a warm start
    or an ``mrtpo train`` output folder) on the first ``eval_limit`` train and held-out prompts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not Path(path, "config.json").is_file():
        raise ValueError(f"--evaluate: no saved model in {path}")
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    n = config.eval_limit
    train = laptop_task(config).load(limit=n)
    heldout = laptop_task(config, seed=config.heldout_seed).load(limit=n)
    task = laptop_task(config)
    return {
        "train_sampled": evaluate(model, tok, task, train, temperature=1.0, seed=config.seed),
        "heldout_sampled": evaluate(model, tok, task, heldout, temperature=1.0, seed=config.seed),
    }


def _line(info: dict, n: int) -> str:
    fmt = ", ".join
    return (
        f"sampled on {n} train prompts: "
        + fmt(f"{k} {v:.3f}" for k, v in info["train_sampled"].items() if k != "by_type")
        + "; held-out: "
        + fmt(f"{k} {v:.3f}" for k, v in info["heldout_sampled"].items() if k != "by_type")
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m mrtpo.tasks.instruct.warmstart",
        description="Warm-start a tiny model for the instruct task on CPU "
        "(then: mrtpo train recipes/instruct_laptop.yaml).",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--out", help="folder for the model, tokenizer and warmstart.json")
    what.add_argument(
        "--evaluate", metavar="MODEL", help="only evaluate a saved model (e.g. runs/instruct_laptop)"
    )
    p.add_argument(
        "--json", metavar="FILE", help="with --evaluate: also write the metrics (by type too) here"
    )
    add_settings_arguments(p, InstructWarmStartConfig())
    args = p.parse_args(argv)
    try:
        config = settings_from_args(InstructWarmStartConfig, args)
        if args.evaluate:
            metrics = evaluate_saved(args.evaluate, config)
            if args.json:
                Path(args.json).write_text(json.dumps(metrics, indent=2))
            print(f"{args.evaluate}: " + _line(metrics, config.eval_limit))
            return 0
        _, _, info = train_instruct_warm_start(config, args.out)
    except ValueError as e:
        p.exit(2, f"error: {e}\n")
    print(
        f"warm start saved to {args.out} in {info['seconds']:.0f} s ({info['parameters']:,} parameters); "
        + _line(info, config.eval_limit)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
