"""The replay kind ``gradient`` (mrtpo.replay.gradient): JS rows for the rule rewards equal to the ``reward``
kind's, P2T rows for the model reward equal to a direct attribution, no context run for the model reward."""

from __future__ import annotations

import pytest
import torch

from mrtpo import replay as replay_mod
from mrtpo.attribution import AttributionStats, P2TOptions, gradient_weights, token_char_ranges
from mrtpo.replay import ReplayBatch
from mrtpo.replay.gradient import differentiable_columns, gradient_replay
from mrtpo.tasks import load_task


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from mrtpo.models.tiny import build_classifier, build_model, build_tokenizer

    base = load_task("toy", size=16, seed=0)
    words = sorted({w for ex in base.load(limit=16) for s in ex.segments for w in s.text.split()})
    tok = build_tokenizer([*words, "yes", "no", "polite", "is", "it"])
    rm_dir = tmp_path_factory.mktemp("rm")
    build_classifier(len(tok), seed=1).save_pretrained(rm_dir)
    tok.save_pretrained(rm_dir)
    task = load_task(
        "toy",
        size=16,
        seed=0,
        model_rewards=[{"name": "rm", "model": str(rm_dir), "rubric": "is it polite", "device": "cpu"}],
    )
    policy = build_model(len(tok), hidden_size=32, seed=2, dtype=torch.float32)
    examples = task.load(limit=3)
    g = torch.Generator().manual_seed(0)
    content = tok.convert_tokens_to_ids(words[:20])
    responses = [
        [content[int(i)] for i in torch.randint(0, 20, (n,), generator=g)] + [tok.eos_token_id]
        for n in (5, 7, 3)
    ]
    return task, tok, policy, examples, responses


def test_rule_rows_replay_and_model_rows_attribute(setup):
    task, tok, policy, examples, responses = setup
    k = len(task.reward_names)
    verifiers = [task.verifiers(ex) for ex in examples]
    ctxs = replay_mod.ContextCache(tok, task.reward_names)([ex.segments for ex in examples])
    adv = torch.ones(3, k)
    adv[1, 0] = 0.0  # a rule pair without advantage: skipped
    adv[2, k - 1] = 0.0  # the model reward of response 2: not attributed
    calls = []

    def replay_rewards(a):
        calls.append(a.clone())
        return replay_mod.for_scheme(policy, ctxs, responses, a, "reward", width=9)

    batch = ReplayBatch(examples, verifiers, tok)
    res = gradient_replay(replay_rewards, responses, adv, batch, width=9, credit_options={"tau": 0.5})
    diff = differentiable_columns(verifiers, k)
    assert diff[:, -1].all() and not diff[:, :-1].any()
    (a,) = calls
    assert (a[:, -1] == 0).all() and torch.equal(a[:, :-1], adv[:, :-1])  # the model reward's C_-k never runs
    ref = replay_mod.for_scheme(policy, ctxs, responses, adv, "reward", width=9)
    assert torch.allclose(res.distances[:, :-1], ref.distances[:, :-1], atol=1e-6)
    assert torch.equal(res.replayed[:, :-1], ref.replayed[:, :-1])
    texts, ranges = zip(*(token_char_ranges(tok, r) for r in responses))
    stats = AttributionStats()
    w, done = gradient_weights(verifiers, examples, texts, ranges, adv, 9, P2TOptions(tau=0.5), stats=stats)
    assert done[:, -1].tolist() == [True, True, False]
    assert torch.allclose(res.distances[:, -1], w[:, -1], atol=1e-6)
    assert res.attributed[:, -1].tolist() == [True, True, False] and not res.attributed[:, :-1].any()
    assert res.replayed[:, -1].tolist() == [True, True, False]
    for j, r in enumerate(responses[:2]):  # each attributed row averages 1 over its tokens (eos included)
        assert res.distances[j, -1, : len(r)].mean().item() == pytest.approx(1.0, abs=1e-5)
        assert (res.distances[j, -1, len(r) :] == 0).all()
    # attribution_batch_size 1 (the default): one forward and one backward per attributed response
    assert res.stats.attributed == 2 and res.stats.scorer_forwards == stats.forwards == 2
    assert res.stats.scorer_backwards == 2 and res.stats.scorer_tokens == stats.tokens > 0
    assert res.skipped is not None and not res.skipped.any()


def test_a_rule_only_batch_is_the_reward_kind(setup):
    _, tok, policy, _, responses = setup
    base = load_task("toy", size=16, seed=0)
    examples = base.load(limit=3)
    verifiers = [base.verifiers(ex) for ex in examples]
    ctxs = replay_mod.ContextCache(tok, base.reward_names)([ex.segments for ex in examples])
    adv = torch.randn(3, len(base.reward_names), generator=torch.Generator().manual_seed(1))
    res = gradient_replay(
        lambda a: replay_mod.for_scheme(policy, ctxs, responses, a, "reward"),
        responses,
        adv,
        ReplayBatch(examples, verifiers, tok),
    )
    ref = replay_mod.for_scheme(policy, ctxs, responses, adv, "reward")
    assert torch.equal(res.distances, ref.distances) and not res.attributed.any()
    assert res.stats.scorer_forwards == 0


def test_without_the_batch_every_row_is_replayed(setup):
    task, tok, policy, examples, responses = setup
    ctxs = replay_mod.ContextCache(tok, task.reward_names)([ex.segments for ex in examples])
    adv = torch.ones(3, len(task.reward_names))
    res = gradient_replay(
        lambda a: replay_mod.for_scheme(policy, ctxs, responses, a, "reward"), responses, adv, None
    )
    ref = replay_mod.for_scheme(policy, ctxs, responses, adv, "reward")
    assert torch.equal(res.distances, ref.distances) and torch.equal(res.replayed, ref.replayed)
    assert res.attributed.shape == (3, len(task.reward_names)) and not res.attributed.any()
