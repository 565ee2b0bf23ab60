"""The toy multi-constraint task: verifiers, information, spans, demonstrations, satisfaction."""

from __future__ import annotations

import json
import math
import random

import pytest

from mrtpo.tasks import load_task
from mrtpo.tasks.toy import (
    CONSTRAINT_TYPES,
    build_toy_tokenizer,
    demonstrate,
    generate_examples,
    make_example,
    satisfaction,
)

FULL = {"start": "apple", "end": "river", "include": "stone", "length": 4, "wrap": "<b>"}


@pytest.fixture(scope="module")
def task():
    return load_task("toy")


def scores(task, ex, response):
    return [v.score(ex, response) for v in task.verifiers(ex)]


def test_reward_layout(task):
    assert task.reward_names == ["start", "end", "include", "length", "wrap"]
    assert [v.name for v in task.verifiers(make_example(FULL, "x"))] == task.reward_names
    assert all(v.bounds == (0.0, 1.0) for v in task.verifiers(make_example(FULL, "x")))


def test_verifiers_hand_cases(task):
    ex = make_example(FULL, "x")
    # every constraint met: 4 content words, apple first, river last, stone inside, <b> tags
    assert scores(task, ex, "<b> apple stone cloud river </b>") == [1, 1, 1, 1, 1]
    # no tags, 3 content words: start/end/include still met, length (3 != 4) and wrap missed
    assert scores(task, ex, "apple stone river") == [1, 1, 1, 0, 0]
    # wrong close tag; river not last; stone absent; 4 words
    assert scores(task, ex, "<b> apple river cloud lemon </i>") == [1, 0, 0, 1, 0]
    # tag tokens do not count as words for start/end/length; the empty response meets nothing
    assert scores(task, ex, "<i> cloud apple river stone </i>") == [0, 0, 1, 1, 0]
    assert scores(task, ex, "") == [0, 0, 0, 0, 0]
    # unknown words count as content words (model output is never trusted)
    assert scores(task, ex, "apple <unk> stone river") == [1, 1, 1, 1, 0]


def test_length_ranges(task):
    few = make_example({"start": "apple", "length": "few"}, "f")
    many = make_example({"length": "many", "wrap": "<i>"}, "m")
    assert few.messages()[0]["content"].split() == ["apple", "first", "few", "words"]
    # few: at most 4 content words (tags do not count); many: at least 6
    for response, want_few, want_many in (
        ("", 1, 0),
        ("apple stone river cloud", 1, 0),
        ("<b> apple stone river cloud </b>", 1, 0),
        ("apple stone river cloud lemon", 0, 0),  # 5 words: neither
        ("<i> apple stone river cloud lemon tiger </i>", 0, 1),
        ("a b c d e f g h i", 0, 1),
    ):
        assert scores(task, few, response)[3] == want_few, response
        assert scores(task, many, response)[3] == want_many, response
    from mrtpo.tasks.toy.data import length_range

    assert length_range("few") == (0, 4) and length_range(6) == (6, 6)
    with pytest.raises(ValueError, match="length value must be one of"):
        length_range("lots")
    with pytest.raises(ValueError, match="'length' has value 'lots'"):
        make_example({"length": "lots"}, "x")


def test_absent_types_score_zero_without_information(task):
    ex = make_example({"start": "apple", "length": 3}, "x")
    # a perfect response for every type still scores 0 on the unlisted types end, include, wrap
    assert scores(task, ex, "<b> apple stone river </b>") == [1, 0, 0, 1, 0]
    for v in task.verifiers(ex):
        if v.name in ("end", "include", "wrap"):
            assert v.information(ex) == ""
            assert v.checked_spans(ex, "apple stone river") is None


def test_information_is_the_constraint_text(task):
    ex = make_example(FULL, "x", order=["wrap", "length", "start", "include", "end"])
    info = {v.name: v.information(ex) for v in task.verifiers(ex)}
    assert info == {
        "start": "apple first",
        "end": "river last",
        "include": "stone included",
        "length": "4 words",
        "wrap": "<b> wrapped",
    }
    full = ex.messages()[0]["content"]
    # (built with a join, not a literal list: the prompt order is wrap, length, start, include, end)
    assert (
        full.split()
        == " ".join(["<b> wrapped", "4 words", "apple first", "stone included", "river last"]).split()
    )
    # leave-one-out context C_-k drops exactly that constraint's text
    for k in CONSTRAINT_TYPES:
        loo = ex.messages(drop=frozenset({k}))[0]["content"]
        assert loo.split() == [w for w in full.split() if w not in info[k].split()]


def test_checked_spans(task):
    ex = make_example(FULL, "x")
    r = "<b> apple stone cloud stone river </b>"
    # character offsets: <b> 0-3, apple 4-9, stone 10-15, cloud 16-21, stone 22-27, river 28-33, </b> 34-38
    spans = {v.name: v.checked_spans(ex, r) for v in task.verifiers(ex)}
    assert spans == {
        "start": [(4, 9)],
        "end": [(28, 33)],
        "include": [(10, 15), (22, 27)],
        "length": [(0, 38)],
        "wrap": [(0, 3), (34, 38)],
    }
    assert r[4:9] == "apple" and r[28:33] == "river" and r[34:38] == "</b>"
    # include word missing: no span; empty response: no span for any constraint
    assert next(v for v in task.verifiers(ex) if v.name == "include").checked_spans(ex, "apple river") == []
    assert all(v.checked_spans(ex, "") == [] for v in task.verifiers(ex))


def test_satisfaction_ignores_absent_columns(task):
    a = make_example({"start": "apple", "end": "river", "length": 3}, "a")
    b = make_example({"wrap": "<q>"}, "b")
    rewards = [
        [1, 0, 0, 1, 0],  # a: start and length met of its 3 -> 2/3
        [1, 1, 1, 1, 0],  # b: only wrap is listed and it is missed -> 0 (the 1s are in absent columns)
    ]
    assert satisfaction([a, b], rewards) == pytest.approx([2 / 3, 0.0])
    m = task.metrics([a, b], ["", ""], rewards)
    assert m["satisfaction"] == pytest.approx((2 / 3 + 0) / 2)  # 0.3333
    assert m["all_met"] == 0.0
    assert task.metrics([a], [""], [[1, 1, 0, 1, 0]])["all_met"] == 1.0
    # local: only start/end/include/wrap count (a: start met of start, end -> 1/2; b: wrap missed -> 0);
    # met/<type>: share met among the responses whose prompt lists the type
    assert m["local"] == pytest.approx((1 / 2 + 0) / 2)
    assert {k: v for k, v in m.items() if k.startswith("met/")} == {
        "met/start": 1.0,
        "met/end": 0.0,
        "met/length": 1.0,
        "met/wrap": 0.0,
    }
    only_length = make_example({"length": "few"}, "c")
    (no_counted_type,) = satisfaction([only_length], [[0, 0, 0, 1, 0]], ("start", "wrap"))
    assert math.isnan(no_counted_type)  # the example lists none of the counted types
    assert "local" not in task.metrics([only_length], [""], [[0, 0, 0, 1, 0]])
    with pytest.raises(ValueError, match=r"rewards\[0\] has 4 columns; expected K=5"):
        satisfaction([a], [[1, 0, 0, 1]])


def test_satisfaction_matches_verifiers_on_tensor(task):
    import torch

    exs = generate_examples(50, seed=3)
    rng = random.Random(0)
    resp = [demonstrate(e, rng) for e in exs]
    rew = torch.tensor([scores(task, e, r) for e, r in zip(exs, resp)])  # [50, 5]
    # naive reference: recount each example's own verdicts
    ref = []
    for e, r in zip(exs, resp):
        own = [v.score(e, r) for v in task.verifiers(e) if v.name in e.meta["constraints"]]
        ref.append(sum(own) / len(own))
    assert satisfaction(exs, rew) == pytest.approx(ref)


def test_generated_examples():
    a = generate_examples(300, seed=7)
    assert [e.to_dict() for e in a] == [e.to_dict() for e in generate_examples(300, seed=7)]
    assert [e.to_dict() for e in a] != [e.to_dict() for e in generate_examples(300, seed=8)]
    counts = {len(e.meta["constraints"]) for e in a}
    assert counts == {3, 4, 5}
    for e in a:
        c = e.meta["constraints"]
        words = [c[k] for k in ("start", "end", "include") if k in c]
        assert len(set(words)) == len(words)
        assert c.get("length", "few") in ("few", "many")  # generated length constraints are ranges
        assert sorted(next(iter(s.rewards)) for s in e.segments) == sorted(c)
        assert all(len(s.rewards) == 1 for s in e.segments)
    assert {len(e.meta["constraints"]) for e in generate_examples(200, seed=0, min_constraints=2)} == {
        2,
        3,
        4,
        5,
    }


def test_demonstrations_meet_each_constraint_with_p(task):
    exs = generate_examples(2000, seed=11, min_constraints=2)
    rng = random.Random(5)
    met = {k: [] for k in CONSTRAINT_TYPES}
    for e in exs:
        r = demonstrate(e, rng, p_meet=0.5)
        for v in task.verifiers(e):
            if v.name in e.meta["constraints"]:
                met[v.name].append(v.score(e, r))
    for k, xs in met.items():
        # ~1100 listed per type; binomial sd sqrt(.25/1100) = 0.015, so 0.5 +- 0.06 is 4 sd
        assert len(xs) > 900
        assert abs(sum(xs) / len(xs) - 0.5) < 0.06, k
    # p_meet = 1 meets every listed constraint, p_meet = 0 none (the coin flip decides the verdict)
    for p, want in ((1.0, 1.0), (0.0, 0.0)):
        for e in exs[:300]:
            r = demonstrate(e, rng, p_meet=p)
            assert satisfaction([e], [scores(task, e, r)]) == [want], (e.meta, r)


def test_tokenizer_covers_prompts_and_demonstrations():
    tok = build_toy_tokenizer()
    assert len(tok) == 72  # 8 specials + 5 keywords + 5 lengths + few/many + 6 tags + 46 content words
    rng = random.Random(0)
    for e in generate_examples(100, seed=1):
        text = tok.apply_chat_template(e.messages(), tokenize=False, add_generation_prompt=True)
        text += demonstrate(e, rng)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids
        assert len(ids) == len(text.split())  # one token per word


def test_load_builtin_and_file(task, tmp_path):
    train, test = task.load(), task.load(split="test")
    assert len(train) == 4096 and len(test) == 1024
    assert {e.id for e in train}.isdisjoint({e.id for e in test})
    assert len(task.load(limit=5)) == 5
    path = tmp_path / "toy.jsonl"
    path.write_text("\n".join(json.dumps(e.to_dict()) for e in train[:4]))
    assert [e.to_dict() for e in task.load(str(path))] == [e.to_dict() for e in train[:4]]
    with pytest.raises(FileNotFoundError):
        task.load(str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="split"):
        task.load(split="dev")


def test_bad_constraints_raise():
    with pytest.raises(ValueError, match="'length' has value 9"):
        make_example({"length": 9}, "x")
    with pytest.raises(ValueError, match="constraint type must be one of"):
        make_example({"title": "apple"}, "x")
    with pytest.raises(ValueError, match="distinct"):
        make_example({"start": "apple", "end": "apple"}, "x")
    with pytest.raises(ValueError, match="min_constraints"):
        generate_examples(3, min_constraints=4, max_constraints=3)
