"""Rewards from models (mrtpo.tasks.model_reward): a tiny local reward model and judge, their verdicts against
the model's own forward, batching, bounds, P2T attribution through the scorer, and the task option."""

from __future__ import annotations

import math
import time
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mrtpo.attribution import AttributionStats
from mrtpo.prompt import Segment
from mrtpo.tasks import Example, load_task
from mrtpo.tasks.model_reward import ModelReward, WithModelRewards, parse_model_rewards

WORDS = [
    "apple",
    "river",
    "stone",
    "say",
    "good",
    "bad",
    "yes",
    "no",
    "is",
    "the",
    "response",
    "answer",
    "it",
]


@pytest.fixture(scope="module")
def tok():
    from mrtpo.models.tiny import build_tokenizer

    return build_tokenizer(WORDS)


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory, tok):
    from mrtpo.models.tiny import build_classifier

    path = tmp_path_factory.mktemp("rm")
    build_classifier(len(tok), seed=3).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory, tok):
    from mrtpo.models.tiny import build_model

    path = tmp_path_factory.mktemp("judge")
    build_model(len(tok), hidden_size=32, seed=4, dtype=torch.float32).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def _ex(i=0, text="say apple"):
    return Example(f"e{i}", [Segment(text, rewards={"apple"})])


RESPONSES = ["apple", "river stone apple", "", "good good bad apple river", "it is the answer"]


def test_classifier_verdict_is_the_models_own_score(rm_dir, tok):
    from transformers import AutoModelForSequenceClassification

    rm = ModelReward("rm", rm_dir, device="cpu")
    ref = AutoModelForSequenceClassification.from_pretrained(rm_dir).eval()
    exs = [_ex(i) for i in range(len(RESPONSES))]
    got = rm(RESPONSES, exs)
    for ex, r, p in zip(exs, RESPONSES, got):
        text = tok.apply_chat_template([*ex.messages(), {"role": "assistant", "content": r}], tokenize=False)
        ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            z = ref(input_ids=ids).logits[0, 0].item()  # one sequence, no padding
        assert p == pytest.approx(1 / (1 + math.exp(-z)), abs=1e-5)
        assert rm.verdict(ex, r).value == pytest.approx(p, abs=1e-6)  # a batch of one: the same
    assert min(got) >= 0.0 and max(got) <= 1.0 and len(set(got)) > 1


def test_judge_verdict_is_p_yes_among_yes_and_no(judge_dir, tok):
    from transformers import AutoModelForCausalLM

    judge = ModelReward("polite", judge_dir, kind="judge", rubric="is it good", device="cpu", batch_size=2)
    ref = AutoModelForCausalLM.from_pretrained(judge_dir).eval()
    yes, no = tok.convert_tokens_to_ids(["yes", "no"])
    exs = [_ex(i) for i in range(len(RESPONSES))]
    got = judge(RESPONSES, exs)
    for r, p in zip(RESPONSES, got):
        content = (
            "Read the request and the response, then answer the question about the response with yes or no.\n\n"
            f"Request:\nsay apple\n\nResponse:\n{r}\n\nQuestion: is it good\nAnswer yes or no."
        )
        text = tok.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )
        ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            z = ref(input_ids=ids).logits[0, -1]
        assert p == pytest.approx(torch.softmax(z[[yes, no]], 0)[0].item(), abs=1e-5)


def test_logit_output_is_clipped_to_bounds(rm_dir):
    rm = ModelReward("rm", rm_dir, device="cpu", output="logit", bounds=(-0.01, 0.01))
    raw = rm.log_odds([_ex()] * 3, RESPONSES[:3])
    got = rm(RESPONSES[:3], [_ex()] * 3)
    assert got == pytest.approx([min(max(d, -0.01), 0.01) for d in raw])
    assert rm.bounds == (-0.01, 0.01)


def test_a_verdict_never_raises_on_model_output_and_is_bounded_in_time(rm_dir):
    rm = ModelReward("rm", rm_dir, device="cpu", max_length=64)
    huge = "apple " * 20_000
    t0 = time.perf_counter()
    v = rm.verdict(_ex(), huge)  # 20,000 tokens: the scorer reads the last 64
    assert 0 <= v.value <= 1 and time.perf_counter() - t0 < 5

    @settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.text(max_size=300))
    def check(text):
        value = rm.verdict(_ex(), text).value
        assert 0.0 <= value <= 1.0

    check()


def test_non_finite_score_gets_the_minimum(rm_dir):
    rm = ModelReward("rm", rm_dir, device="cpu")
    assert rm._value(float("nan")) == (0.0, "classifier gave a non-finite score (nan); the minimum")


class LinearScorer(torch.nn.Module):
    """S = Σ_i ⟨u, e_i⟩ over the unmasked tokens, with the interface of a Hugging Face classifier."""

    def __init__(self, vocab, dim=6, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.emb = torch.nn.Embedding(vocab, dim)
        with torch.no_grad():
            self.emb.weight.copy_(torch.randn(vocab, dim, generator=g))
        self.u = torch.nn.Parameter(torch.randn(dim, generator=g))

    def get_input_embeddings(self):
        return self.emb

    def forward(self, inputs_embeds, attention_mask, position_ids=None):
        s = ((inputs_embeds @ self.u) * attention_mask).sum(1)
        return SimpleNamespace(logits=s[:, None])


def test_attribution_through_the_scorer_is_the_closed_form(tok):
    """A linear scorer: each response token's influence is exactly ⟨e_i − e_null, u⟩, on its own span."""
    scorer = LinearScorer(len(tok))
    rm = ModelReward("rm", scorer, tokenizer=tok, device="cpu", attribution_batch_size=2)
    responses = ["apple river", "stone", "good bad apple"]
    stats = AttributionStats()
    out = rm.attribute([_ex()] * 3, responses, stats=stats)
    e, u = scorer.emb.weight.detach(), scorer.u.detach()
    null = e[tok.pad_token_id]
    for r, res in zip(responses, out):
        words = r.split()
        ids = tok.convert_tokens_to_ids(words)
        assert res.values.tolist() == pytest.approx([((e[i] - null) @ u).item() for i in ids], abs=1e-5)
        assert [r[a:b] for a, b in res.spans] == words
    assert (stats.forwards, stats.backwards, stats.responses, stats.sequences) == (2, 2, 3, 3)
    assert scorer.u.grad is None and not scorer.u.requires_grad  # frozen


def test_attribution_does_not_depend_on_the_batch(rm_dir):
    rm1 = ModelReward("rm", rm_dir, device="cpu", batch_size=1)
    rm4 = ModelReward("rm", rm_dir, device="cpu", batch_size=4, attribution_batch_size=4)
    exs = [_ex(i) for i in range(4)]
    for a, b in zip(rm1.attribute(exs, RESPONSES[:4]), rm4.attribute(exs, RESPONSES[:4])):
        assert a.spans == b.spans
        assert torch.allclose(a.values, b.values, atol=1e-4)
        assert a.scalar == pytest.approx(b.scalar, abs=1e-5)
    # the scalar attributed is the verdict's log-odds
    assert [r.scalar for r in rm1.attribute(exs, RESPONSES[:4])] == pytest.approx(
        rm1.log_odds(exs, RESPONSES[:4]), abs=1e-5
    )


def test_the_policy_as_its_own_judge(tok):
    from mrtpo.models.tiny import build_model

    policy = build_model(len(tok), hidden_size=32, seed=5, dtype=torch.float32).train()
    judge = ModelReward("self", "policy", kind="judge", rubric="is it good", device="cpu")
    with pytest.raises(ValueError, match="model='policy' has no policy attached"):
        judge.verdict(_ex(), "apple")
    task = WithModelRewards(load_task("toy"), [judge])
    task.attach_policy(policy, tok)
    p = judge.verdict(_ex(), "apple").value
    out = judge.attribute([_ex()], ["apple river"])
    assert 0 < p < 1 and len(out[0].values) == 2
    assert policy.training  # its mode is restored
    assert all(q.grad is None and q.requires_grad for q in policy.parameters())  # not frozen, not touched


def test_parse_model_rewards_names_the_field():
    with pytest.raises(
        ValueError, match=r"task.options.model_rewards\[0\]: kind='critic' must be one of classifier, judge"
    ):
        parse_model_rewards([{"name": "rm", "model": "x", "kind": "critic"}])
    with pytest.raises(ValueError, match=r"model_rewards\[1\].name='rm' is already a reward of the task"):
        parse_model_rewards([{"name": "rm", "model": "x"}, {"name": "rm", "model": "y"}])
    with pytest.raises(ValueError, match=r"model_rewards\[0\]: unknown field 'tau'"):
        parse_model_rewards([{"name": "rm", "model": "x", "tau": 2}])
    with pytest.raises(ValueError, match=r"model_rewards\[0\].model is required"):
        parse_model_rewards([{"name": "rm"}])
    with pytest.raises(ValueError, match=r"\[0\]: output='logit' needs bounds"):
        parse_model_rewards([{"name": "rm", "model": "x", "output": "logit"}])
    with pytest.raises(ValueError, match=r"\[0\]: model='policy' is a judge"):
        parse_model_rewards([{"name": "rm", "model": "policy"}])
    with pytest.raises(ValueError, match="already a reward of the task"):
        parse_model_rewards([{"name": "start", "model": "x"}], ["start"])


def test_task_option_adds_model_rewards_after_the_rules(rm_dir, judge_dir):
    task = load_task(
        "toy",
        model_rewards=[
            {"name": "rm", "model": rm_dir, "device": "cpu"},
            {"name": "judge", "model": judge_dir, "kind": "judge", "rubric": "is it good", "device": "cpu"},
        ],
        conditions={"judge": ["start", 1.0]},
    )
    base = load_task("toy")
    assert task.reward_names == [*base.reward_names, "rm", "judge"]
    ex = task.load(limit=2)[0]
    rubric = [s for s in ex.segments if "judge" in s.rewards]
    assert [(s.text, s.privileged) for s in rubric] == [("is it good", True)]
    assert not any("rm" in s.rewards for s in ex.segments)  # no rubric: no information
    vs = task.verifiers(ex)
    assert [v.name for v in vs] == task.reward_names and vs[-1].information(ex) == "is it good"
    assert task.conditions[0].reward == "judge"  # a condition may name a model reward
    scores = [v.score(ex, "apple") for v in vs[-2:]]
    assert all(0 <= s <= 1 for s in scores)
    assert task.metrics([ex], ["apple"], torch.zeros(1, len(task.reward_names))) == base.metrics(
        [ex], ["apple"], torch.zeros(1, len(base.reward_names))
    )


def test_a_scorer_loads_whole_in_a_zero3_run(rm_dir, monkeypatch):
    """While a ZeRO-3 config is registered (TRL's DeepSpeed runs register one), transformers partitions every
    model from_pretrained loads; the scorer loads with the registration hidden, and it is restored after."""
    pytest.importorskip("deepspeed")
    from transformers import AutoModelForSequenceClassification
    from transformers.integrations.deepspeed import (
        HfDeepSpeedConfig,
        is_deepspeed_zero3_enabled,
        unset_hf_deepspeed_config,
    )

    seen = []
    load = AutoModelForSequenceClassification.from_pretrained
    monkeypatch.setattr(
        AutoModelForSequenceClassification,
        "from_pretrained",
        lambda *a, **k: (seen.append(is_deepspeed_zero3_enabled()), load(*a, **k))[1],
    )
    config = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1})
    try:
        assert is_deepspeed_zero3_enabled()
        rm = ModelReward("rm", rm_dir, device="cpu")
        value = rm.verdict(_ex(), "apple").value
        assert seen == [False] and is_deepspeed_zero3_enabled()  # hidden for the load only
        assert 0 < value < 1 and all(p.dim() >= 1 and p.numel() > 0 for p in rm._model.parameters())
    finally:
        unset_hf_deepspeed_config()
        del config
