r"""A supervised warm start for the tools task on CPU: a tiny model that writes ToolRL's format and, part of
the time, the right calls, on BFCL's own questions (the ``bfcl-eval`` wheel's data), so ``mrtpo train``
has rewards to raise.

``python -m mrtpo.tasks.tools.warmstart --out runs/tools_warm`` (then ``mrtpo train recipes/tools_laptop.yaml``).

Data: :func:`mrtpo.tasks.tools.bfcl_rows.write_bfcl_splits` converts BFCL's ``simple_python`` and
``multiple`` questions into RLLA rows and writes ``OUT/data/train.json`` (480 rows) and
``OUT/data/held_out.json`` (120 rows: every fifth row of each category), which the recipe trains on.

The model is the project's tiny Qwen2 (:func:`mrtpo.models.tiny.build_model`) on a word-level tokenizer
(:func:`build_tools_tokenizer`) of every word of the rows plus the format tokens. ToolRL's format needs
newlines (``</think>\n<tool_call>\n``), so the tokenizer keeps each newline as a token of its own and
decoding joins words with one space and newlines with none. A demonstration's words are::

    <think> </think> \n <tool_call> \n { « name » : « math.factorial » , « parameters » : { « number » : 5 } } \n </tool_call>

which decodes to ``<think> </think>\n<tool_call>\n{ "name" : "math.factorial" , ... }\n</tool_call>``: the
tokenizer splits quotes, braces, brackets, colons and commas off the words, so a function or parameter
name and a value are the same token in the prompt (``Name: math.factorial``, ``{"number": ...``, "the
factorial of 5") as in the call, and the call's strings are written between the quote tokens ``«`` and
``»``, which decode to ``"`` without the spaces beside them (:func:`call_words`). JSON allows the spaces
left around its punctuation; the verifier reads the same call.

Demonstrations are the train split's gold calls, deliberately imperfect so RL has headroom: with
probability ``p_break`` one of the seven format tokens (the four tags, the three newlines) is left out
(format 0), and with probability ``p_wrong`` one parameter of one call is left out (correctness below
3). Model, step and learning-rate schedule are the SQL warm start's (:mod:`mrtpo.models.sft`), the loss
the same cross-entropy with the LM head on the response tokens only
(:func:`~mrtpo.models.sft.labelled_response_loss`); everything is drawn from ``seed``.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mrtpo.models.sft import WarmStartSettings, add_settings_arguments, settings_from_args

NL = "\n"
FORMAT_WORDS = ("<think>", "</think>", NL, "<tool_call>", NL, NL, "</tool_call>")
"""The demonstration's format tokens, in order: the tags and the newlines the format reward needs."""


@dataclass
class ToolsWarmStartConfig(WarmStartSettings):
    """Settings of the tools warm start (defaults: the documented laptop run)."""

    batch_size: int = 16
    eval_limit: int = 48
    p_break: float = 0.3
    p_wrong: float = 0.2
    max_new_tokens: int = 64

    def __post_init__(self) -> None:
        self.check_at_least_one("steps", "batch_size", "eval_limit", "max_new_tokens")
        self.check_probabilities("p_break", "p_wrong")


OPEN, CLOSE = "«", "»"
"""The response's quote tokens: a JSON string's opening and closing quote (both decode to ``"``)."""

_PUNCT = r'[\n"{}\[\]:,]'
"""What the tokenizer splits off as tokens of their own (besides splitting at spaces)."""


def call_words(value: Any) -> list[str]:
    """The words of ``value``'s JSON as a demonstration writes them: braces, brackets, colons and commas
    as words, a string as :data:`OPEN`, its JSON-escaped text split at spaces, :data:`CLOSE`.

    >>> call_words({"name": "f", "parameters": {"x": [1, 2], "s": "New York"}})[:8]
    ['{', '«', 'name', '»', ':', '«', 'f', '»']
    """
    if isinstance(value, dict):
        out = ["{"]
        for i, (k, v) in enumerate(value.items()):
            out += [","] * (i > 0) + call_words(k) + [":"] + call_words(v)
        return [*out, "}"]
    if isinstance(value, list):
        out = ["["]
        for i, v in enumerate(value):
            out += [","] * (i > 0) + call_words(v)
        return [*out, "]"]
    if isinstance(value, str):
        return [OPEN, *json.dumps(value, ensure_ascii=False)[1:-1].split(), CLOSE]
    return [json.dumps(value)]


def demonstration(calls: Sequence[dict], rng: random.Random, *, p_break: float, p_wrong: float) -> list[str]:
    """The response taught for a row whose gold calls are ``calls``, as words (newlines are words):
    the calls in the format, imperfect with the given probabilities (module docstring)."""
    calls = [{"name": c["name"], "parameters": dict(c["parameters"])} for c in calls]
    with_params = [c for c in calls if c["parameters"]]
    if with_params and rng.random() < p_wrong:
        c = rng.choice(with_params)
        del c["parameters"][rng.choice(list(c["parameters"]))]
    body: list[str] = []
    for c in calls:
        body += [*call_words(c), NL]
    words = ["<think>", "</think>", NL, "<tool_call>", NL, *body, "</tool_call>"]
    if rng.random() < p_break:
        tags = [0, 1, 2, 3, 4, len(words) - 2, len(words) - 1]  # the seven format tokens
        del words[rng.choice(tags)]
    return words


def _pre_tokenizer():
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"[^\S\n]+"), behavior="removed"),
            pre_tokenizers.Split(Regex(_PUNCT), behavior="isolated"),
        ]
    )


def text_words(text: str) -> list[str]:
    r"""The words :func:`build_tools_tokenizer` splits ``text`` into.

    >>> text_words('Name: f\nParameters: {"x": 1}')
    ['Name', ':', 'f', '\n', 'Parameters', ':', '{', '"', 'x', '"', ':', '1', '}']
    """
    return [w for w, _ in _pre_tokenizer().pre_tokenize_str(text)]


def build_tools_tokenizer(words: Sequence[str]):
    """The tiny word-level tokenizer (:func:`mrtpo.models.tiny.build_tokenizer`) of ``words``, a newline and
    the quote tokens, splitting text at spaces and splitting off newlines, quotes, braces, brackets,
    colons and commas; decoding joins words with one space, drops the spaces beside a newline and turns
    ``« x »`` into ``"x"``."""
    from tokenizers import decoders

    from mrtpo.models.tiny import build_tokenizer

    tok = build_tokenizer([NL, OPEN, CLOSE, *words])
    backend = tok.backend_tokenizer
    backend.pre_tokenizer = _pre_tokenizer()
    backend.decoder = decoders.Sequence(
        [
            decoders.WordPiece(prefix="##", cleanup=False),  # joins words with spaces
            decoders.Fuse(),
            decoders.Replace(" \n", "\n"),
            decoders.Replace("\n ", "\n"),
            decoders.Replace(OPEN + " ", '"'),
            decoders.Replace(" " + CLOSE, '"'),
            decoders.Replace(OPEN, '"'),
            decoders.Replace(CLOSE, '"'),
        ]
    )
    return tok


def rows_vocabulary(examples) -> list[str]:
    """Every word of ``examples``' segments (the privileged reference included; split as the tokenizer
    splits) and of their gold calls as demonstrations write them, plus :data:`FORMAT_WORDS`, in
    first-seen order (newlines excluded)."""
    words: dict[str, None] = {}
    for ex in examples:
        for seg in ex.segments:
            words.update(dict.fromkeys(text_words(seg.text)))
        for call in ex.meta["reference_calls"] or []:
            words.update(dict.fromkeys(call_words(call)))
    words.update(dict.fromkeys(FORMAT_WORDS))
    words.pop(NL, None)
    return list(words)


def evaluate(model, tok, task, examples, *, temperature: float, max_new_tokens: int, seed: int = 0):
    """Mean of each tools reward over sampled (``temperature > 0``) or greedy responses to ``examples``."""
    from mrtpo.models.generation import SamplingConfig, TransformersGenerator

    cfg = SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature, batch_size=16, seed=seed)
    was_training = model.training
    model.eval()
    responses = TransformersGenerator(model, tok, cfg).generate(
        [e.messages() for e in examples], progress=False
    )
    model.train(was_training)
    out = {}
    for k, name in enumerate(task.reward_names):
        out[name] = sum(task.verifiers(e)[k].score(e, r) for e, r in zip(examples, responses)) / len(examples)
    return out


def spread(rows: Sequence, n: int) -> list:
    """``n`` rows spread evenly over ``rows`` (every category represented), in order."""
    step = max(1, len(rows) // n)
    return list(rows[::step][:n])


def train_tools_warm_start(
    config: ToolsWarmStartConfig,
    out_dir: str | Path,
    *,
    data_dir=None,
    categories: Sequence[str] | None = None,
):
    """Write the BFCL rows of ``categories`` (None: simple_python and multiple) to ``out_dir/data``, train
    the warm start on the train split, evaluate its sampled (temperature 1) and greedy rewards on ``eval_limit`` train and held-out rows, save model,
    tokenizer and ``warmstart.json`` to ``out_dir``. Returns ``(model, tokenizer, info)``."""

    from mrtpo.models.sft import labelled_response_loss, save_warm_start, train_on_demonstrations
    from mrtpo.tasks.tools import ToolsTask
    from mrtpo.tasks.tools.bfcl_rows import DEFAULT_CATEGORIES, write_bfcl_splits

    out = Path(out_dir)
    counts = write_bfcl_splits(out / "data", categories or DEFAULT_CATEGORIES, data_dir=data_dir)
    task = ToolsTask()
    train = task.load(str(out / "data"), split="train")
    held = task.load(str(out / "data"), split="held_out")
    tok = build_tools_tokenizer(rows_vocabulary(train + held))
    vocab = tok.get_vocab()

    def encode(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    prompts = [
        encode(tok.apply_chat_template(e.messages(), tokenize=False, add_generation_prompt=True))
        for e in train
    ]

    def respond(j: int, rng) -> list[int]:
        words = demonstration(
            train[j].meta["reference_calls"], rng, p_break=config.p_break, p_wrong=config.p_wrong
        )
        return [vocab.get(w, tok.unk_token_id) for w in words]

    def evaluations(model) -> dict:
        n, m = config.eval_limit, config.max_new_tokens
        scores = {}
        for name, rows in (("train", train), ("held_out", held)):
            rows = spread(rows, n)
            scores[f"{name}_sampled"] = evaluate(
                model, tok, task, rows, temperature=1.0, max_new_tokens=m, seed=config.seed
            )
            scores[f"{name}_greedy"] = evaluate(model, tok, task, rows, temperature=0.0, max_new_tokens=m)
        return scores

    model, info = train_on_demonstrations(
        tok,
        config,
        prompts,
        respond,
        max_positions=2048,
        loss_fn=labelled_response_loss,
        evaluate=evaluations,
        extra={"rows": counts},
    )
    save_warm_start(out, model, tok, info)
    return model, tok, info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m mrtpo.tasks.tools.warmstart",
        description="Warm-start a tiny model for the tools task on BFCL rows, on CPU "
        "(then: mrtpo train recipes/tools_laptop.yaml).",
    )
    p.add_argument("--out", required=True, help="folder for the model, tokenizer, warmstart.json and data/")
    p.add_argument(
        "--bfcl-data", default=None, help="a folder laid out like bfcl_eval/data (default: the wheel's)"
    )
    p.add_argument(
        "--categories",
        nargs="+",
        default=None,
        help="BFCL categories to convert (default: simple_python multiple)",
    )
    add_settings_arguments(p, ToolsWarmStartConfig())
    args = p.parse_args(argv)
    try:
        config = settings_from_args(ToolsWarmStartConfig, args)
        _, _, info = train_tools_warm_start(
            config, args.out, data_dir=args.bfcl_data, categories=args.categories
        )
    except (ValueError, FileNotFoundError) as e:
        p.exit(2, f"error: {e}\n")

    def show(scores: dict) -> str:
        return ", ".join(f"{k} {v:.2f}" for k, v in scores.items())

    print(
        f"warm start saved to {args.out} in {info['seconds']:.0f} s ({info['parameters']:,} parameters); "
        f"sampled rewards on {config.eval_limit} train rows: {show(info['train_sampled'])}; "
        f"held-out: {show(info['held_out_sampled'])}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
