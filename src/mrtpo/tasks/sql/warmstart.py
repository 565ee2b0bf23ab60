"""A supervised warm start for the SQL task on CPU: a tiny model that writes the response format and,
part of the time, a query that runs and returns the gold result, so ``mrtpo train`` has rewards to raise.

``python -m mrtpo.tasks.sql.warmstart --out runs/sql_warm`` (then ``mrtpo train recipes/sql_laptop.yaml``).

The model is the project's tiny Qwen2 (:func:`mrtpo.models.tiny.build_model`) on a word-level tokenizer
(:func:`mrtpo.models.tiny.build_tokenizer`) of every word of the data's prompts and gold queries plus
the response's tags; its responses are whitespace-separated words, so a demonstration reads::

    <think> </think> <answer> ```sql SELECT title FROM courses ORDER BY capacity DESC ``` </answer>

which the format verifier accepts (whitespace between the tags and around the code block is allowed).

Demonstrations are the training split's questions with their gold queries, deliberately imperfect so
RL has headroom: with probability ``p_break`` one of the six format tokens is left out (format 0), and
with probability ``p_wrong`` the query is another question's query on the same database (it runs, but
usually returns another result). The model, loss, step and learning-rate schedule are the demo's
(:mod:`mrtpo.models.sft`): cross-entropy on the response tokens and ``<eos>``, AdamW, linear warm-up then
cosine decay; everything is drawn from ``seed``.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from pathlib import Path

from mrtpo.models.sft import WarmStartSettings, add_settings_arguments, settings_from_args

FORMAT_WORDS = ("<think>", "</think>", "<answer>", "```sql", "```", "</answer>")
"""The response's format tokens, in order (the tokenizer keeps each as one word)."""


@dataclass
class SqlWarmStartConfig(WarmStartSettings):
    """Settings of the SQL warm start (defaults: the documented laptop run)."""

    steps: int = 400
    p_break: float = 0.3
    p_wrong: float = 0.1

    def __post_init__(self) -> None:
        self.check_at_least_one("steps", "batch_size")
        self.check_probabilities("p_break", "p_wrong")


def demonstration(example, rng: random.Random, *, p_break: float, p_wrong: float, others: list[str]) -> str:
    """The response taught for ``example``: the gold query in the format, imperfect with the given
    probabilities (``others``: gold queries of the same database, for the wrong-query case)."""
    sql = example.meta["gold_sql"]
    if others and rng.random() < p_wrong:
        sql = rng.choice(others)
    words = [
        FORMAT_WORDS[0],
        FORMAT_WORDS[1],
        FORMAT_WORDS[2],
        FORMAT_WORDS[3],
        *sql.split(),
        *FORMAT_WORDS[4:],
    ]
    if rng.random() < p_break:
        drop = rng.choice([0, 1, 2, 3, len(words) - 2, len(words) - 1])  # one of the six format tokens
        del words[drop]
    return " ".join(words)


def build_sql_tokenizer(examples):
    """A word-level tokenizer of every word in ``examples``' segments (gold queries included: the
    privileged reference segment holds them) plus :data:`FORMAT_WORDS`."""
    from mrtpo.models.tiny import build_tokenizer

    words: dict[str, None] = {}
    for ex in examples:
        for seg in ex.segments:
            words.update(dict.fromkeys(seg.text.split()))
        words.update(dict.fromkeys(ex.meta["gold_sql"].split()))
    words.update(dict.fromkeys(FORMAT_WORDS))
    return build_tokenizer(list(words))


def evaluate(model, tok, task, examples, *, temperature: float, seed: int = 0) -> dict[str, float]:
    """Mean of each SQL reward over sampled (``temperature > 0``) or greedy responses to ``examples``."""
    from mrtpo.models.generation import SamplingConfig, TransformersGenerator

    cfg = SamplingConfig(max_new_tokens=40, temperature=temperature, batch_size=64, seed=seed)
    was_training = model.training
    model.eval()
    responses = TransformersGenerator(model, tok, cfg).generate(
        [e.messages() for e in examples], progress=False
    )
    model.train(was_training)
    rows = task.score(examples, responses)
    return {name: sum(r[k] for r in rows) / len(rows) for k, name in enumerate(task.reward_names)}


def train_sql_warm_start(config: SqlWarmStartConfig, out_dir: str | Path | None = None, *, source=None):
    """Train the warm start on ``source``'s train split (None: the shipped ``sql_tiny``); evaluate its
    sampled (temperature 1) and greedy rewards on the first ``eval_limit`` train and dev questions;
    save model, tokenizer and ``warmstart.json`` to ``out_dir``. Returns ``(model, tokenizer, info)``."""

    from mrtpo.models.sft import save_warm_start, train_on_demonstrations
    from mrtpo.tasks.sql import SqlTask

    task = SqlTask(workers=1)
    try:
        train = task.load(source, split="train")
        dev = task.load(source, split="dev")
        tok = build_sql_tokenizer(train + dev)
        vocab = tok.get_vocab()

        def word_ids(text: str) -> list[int]:
            return [vocab.get(w, tok.unk_token_id) for w in text.split()]

        prompts = [
            word_ids(tok.apply_chat_template(e.messages(), tokenize=False, add_generation_prompt=True))
            for e in train
        ]
        by_db: dict[str, list[str]] = {}
        for e in train:
            by_db.setdefault(e.meta["db_id"], []).append(e.meta["gold_sql"])

        def respond(j: int, rng) -> list[int]:
            e = train[j]
            others = [q for q in by_db[e.meta["db_id"]] if q != e.meta["gold_sql"]]
            return word_ids(
                demonstration(e, rng, p_break=config.p_break, p_wrong=config.p_wrong, others=others)
            )

        def evaluations(model) -> dict:
            n = config.eval_limit
            return {
                "train_sampled": evaluate(model, tok, task, train[:n], temperature=1.0, seed=config.seed),
                "train_greedy": evaluate(model, tok, task, train[:n], temperature=0.0),
                "dev_sampled": evaluate(model, tok, task, dev[:n], temperature=1.0, seed=config.seed),
            }

        model, info = train_on_demonstrations(
            tok,
            config,
            prompts,
            respond,
            max_positions=512,
            evaluate=evaluations,
        )
    finally:
        task.close()
    if out_dir is not None:
        save_warm_start(out_dir, model, tok, info)
    return model, tok, info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m mrtpo.tasks.sql.warmstart",
        description="Warm-start a tiny model for the SQL task on CPU (then: mrtpo train recipes/sql_laptop.yaml).",
    )
    p.add_argument("--out", required=True, help="folder for the model, tokenizer and warmstart.json")
    p.add_argument("--source", default=None, help="a Spider-format folder (default: the shipped sql_tiny)")
    add_settings_arguments(p, SqlWarmStartConfig())
    args = p.parse_args(argv)
    try:
        config = settings_from_args(SqlWarmStartConfig, args)
        _, _, info = train_sql_warm_start(config, args.out, source=args.source)
    except (ValueError, FileNotFoundError) as e:
        p.exit(2, f"error: {e}\n")
    print(
        f"warm start saved to {args.out} in {info['seconds']:.0f} s ({info['parameters']:,} parameters); "
        f"sampled rewards on {config.eval_limit} train questions: "
        + ", ".join(f"{k} {v:.2f}" for k, v in info["train_sampled"].items())
        + "; dev: "
        + ", ".join(f"{k} {v:.2f}" for k, v in info["dev_sampled"].items())
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
