"""The instruct laptop run: rule-written demonstrations verified by the task's own checkers, and a short
warm start with a few `mrtpo train` steps of recipes/instruct_laptop.yaml from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mrtpo.tasks.instruct.synth import LAPTOP_TYPES, generate
from mrtpo.tasks.instruct.warmstart import (
    InstructWarmStartConfig,
    build_instruct_tokenizer,
    demonstration_words,
    demonstrations,
    laptop_task,
    main,
)

RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "instruct_laptop.yaml"

# a break the checker itself may not see: extra stars of *** dividers pair up into highlights, a dropped
# keyword may still occur inside another word
LENIENT = {"detectable_format:number_highlighted_sections", "keywords:existence"}


def _scores(task, ex, text):
    n = len(ex.meta["instruction_ids"])
    return [v.score(ex, text) for v in task.verifiers(ex)[:n]]


def test_clean_demonstrations_follow_every_constraint_and_a_break_fails_only_its_own():
    task = laptop_task(InstructWarmStartConfig())
    examples = task.load(limit=200)
    assert {i for e in examples for i in e.meta["instruction_ids"]} == set(LAPTOP_TYPES)
    assert all(2 <= len(e.meta["instruction_ids"]) <= 4 for e in examples)
    broken_failed = {t: [0, 0] for t in LAPTOP_TYPES}
    for ex in examples:
        n = len(ex.meta["instruction_ids"])
        clean = " ".join(demonstration_words(ex))
        assert _scores(task, ex, clean) == [1.0] * n, (ex.meta, clean)
        for k, iid in enumerate(ex.meta["instruction_ids"]):
            s = _scores(task, ex, " ".join(demonstration_words(ex, broken=k)))
            assert [v for j, v in enumerate(s) if j != k] == [1.0] * (n - 1), (ex.meta, k)  # others kept
            broken_failed[iid][0] += s[k] == 0.0
            broken_failed[iid][1] += 1
    for iid, (failed, total) in broken_failed.items():
        assert total > 0
        assert failed == total if iid not in LENIENT else failed >= 0.8 * total, (iid, failed, total)
    # demonstrations() keeps a break only where it fails exactly its constraint
    ex = examples[2]
    clean, broken = demonstrations(task, ex)
    assert [k for k, _ in broken] == list(range(len(ex.meta["instruction_ids"])))
    for k, text in broken:
        assert _scores(task, ex, text) == [float(j != k) for j in range(len(broken))]


def test_the_tokenizer_keeps_the_verdicts_of_demonstrations_and_shares_keyword_tokens():
    task = laptop_task(InstructWarmStartConfig())
    examples = task.load(limit=50)
    texts = [" ".join(demonstration_words(e, broken=b)) for e in examples for b in (None, 0)]
    tok = build_instruct_tokenizer([e.messages()[-1]["content"] for e in examples] + texts)
    for text in texts:  # what the model writes decodes to the text the verifier scored
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids
        assert tok.decode(ids) == text
    ex = next(e for e in examples if "keywords:existence" in e.meta["instruction_ids"])
    word = ex.meta["kwargs"][ex.meta["instruction_ids"].index("keywords:existence")]["keywords"][0]
    prompt_ids = tok(ex.messages()[-1]["content"], add_special_tokens=False)["input_ids"]
    assert tok.convert_tokens_to_ids(word) in prompt_ids  # "['word'," -> [ ' word ' ,


def test_types_option_and_bad_settings():
    two = ["punctuation:no_comma", "detectable_format:title"]
    ex = generate(20, min_constraints=1, max_constraints=2, seed=3, types=two)
    assert {i for e in ex for i in e.meta["instruction_ids"]} == set(two)
    with pytest.raises(ValueError, match="found at most 2 compatible"):
        generate(1, min_constraints=3, max_constraints=3, types=two)
    with pytest.raises(ValueError, match="types must be"):
        generate(2, types=["no:such_type"])
    with pytest.raises(ValueError, match="types must be"):
        generate(2, types="desktop")
    with pytest.raises(ValueError, match="p_break must be in"):
        InstructWarmStartConfig(p_break=2.0)


@pytest.mark.slow
def test_warm_start_then_train(tmp_path):
    from mrtpo.cli.main import main as mrtpo

    warm = tmp_path / "warm"
    argv = ["--out", str(warm), "--steps", "150", "--batch-size", "16", "--train-size", "300"]
    assert main([*argv, "--eval-limit", "32"]) == 0
    info = json.loads((warm / "warmstart.json").read_text())
    # measured: constraint accuracy 0.51 train / 0.49 held-out (sampled) at these settings; the model
    # after one step (--steps 1) scores 0.24 / 0.22: what random words get from forbidden words,
    # no comma and "less than" frequencies
    assert info["train_sampled"]["constraint_accuracy"] > 0.4
    assert info["heldout_sampled"]["constraint_accuracy"] > 0.4

    run = tmp_path / "run"
    argv = ["train", str(RECIPE), "--model.path", str(warm), "--trl.output_dir", str(run)]
    argv += ["--task.options.synthetic_size", "300", "--trl.max_steps", "4"]
    argv += ["--trl.per_device_train_batch_size", "16", "--trl.save_steps", "100"]
    assert mrtpo(argv) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    acc = [r["task/constraint_accuracy"] for r in rows if "task/constraint_accuracy" in r]
    assert len(acc) == 4
    assert sum(acc) / 4 > 0.3  # the warm start's following survives the first RL steps
