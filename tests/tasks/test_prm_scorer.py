"""kind: prm (mrtpo.tasks.prm_scorer): a tiny local process reward model (a Qwen2 token classifier built
here) scoring each step at its step token; its verdict against the model's own forward, each token's
influence against a separate gradient of its own step's score, the steps' shares of the credit, and
training through TRL with p2t."""

from __future__ import annotations

import math

import pytest
import torch

from mrtpo import attribution as attr
from mrtpo.prompt import Segment
from mrtpo.tasks import Example
from mrtpo.tasks.model_reward import ModelReward
from mrtpo.tasks.prm_scorer import steps_of

WORDS = ["the", "cat", "sat", "a", "dog", "ran", "say", "it", "w1", "w2", "write", "lot"]


@pytest.fixture(scope="module")
def prm_dir(tmp_path_factory):
    from transformers import Qwen2Config, Qwen2ForTokenClassification

    from mrtpo.models.tiny import build_tokenizer

    tok = build_tokenizer(WORDS)
    tok.add_special_tokens({"additional_special_tokens": ["<step>"]})
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_labels=2,
        pad_token_id=0,
        eos_token_id=2,
        bos_token_id=None,
    )
    torch.manual_seed(11)
    path = tmp_path_factory.mktemp("prm")
    Qwen2ForTokenClassification(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def _ex(text="say it"):
    return Example("e", [Segment(text)])


RESPONSE = "the cat sat\n\na dog ran\n\nthe dog"


def _prm(prm_dir, **kw):
    return ModelReward("prm", prm_dir, kind="prm", step_token="<step>", device="cpu", **kw)


def test_steps_of():
    assert steps_of(RESPONSE) == [(0, 11), (13, 22), (24, 31)]
    assert steps_of("") == [] and steps_of("a\n\n\n\nb") == [(0, 1), (5, 6)]


def test_verdict_is_the_aggregate_of_the_models_step_scores(prm_dir):
    """The scorer text puts <step> after each step; d_s = z_1 − z_0 at each <step> token of the model's own
    forward on the same ids; min, mean and last of them."""
    rm = _prm(prm_dir)
    model, tok = rm._load()
    ids, spans, _ = rm._encode(_ex(), RESPONSE)
    step = tok.convert_tokens_to_ids("<step>")
    at = [t for t, i in enumerate(ids) if i == step]
    assert len(at) == 3
    # the response's own characters: every token of it maps back onto its words
    words = [RESPONSE[a:b] for a, b in spans if a >= 0]
    assert words == ["the", "cat", "sat", "a", "dog", "ran", "the", "dog"]
    with torch.no_grad():
        z = model(input_ids=torch.tensor([ids])).logits[0, at]  # [3, 2]
    d = (z[:, 1] - z[:, 0]).tolist()
    assert rm.log_odds([_ex()], [RESPONSE])[0] == pytest.approx(min(d), abs=1e-5)
    assert _prm(prm_dir, step_aggregate="mean").log_odds([_ex()], [RESPONSE])[0] == pytest.approx(
        sum(d) / 3, abs=1e-5
    )
    assert _prm(prm_dir, step_aggregate="last").log_odds([_ex()], [RESPONSE])[0] == pytest.approx(
        d[-1], abs=1e-5
    )
    assert rm.verdict(_ex(), RESPONSE).value == pytest.approx(1 / (1 + math.exp(-min(d))), abs=1e-5)
    assert rm.verdict(_ex(), "").value == 0.0  # no step: the minimum


def test_each_token_is_attributed_to_its_own_steps_score(prm_dir):
    """I_i = ⟨e_i − e_null, ∂d_s/∂e_i⟩ for token i of step s, each against a separate forward and backward of
    d_s alone; step_scores are σ(d_s)."""
    rm = _prm(prm_dir)
    model, tok = rm._load()
    stats = attr.AttributionStats()
    (res,) = rm.attribute([_ex()], [RESPONSE], stats=stats)
    assert stats.forwards == 1 and stats.backwards == 3
    ids, spans, _ = rm._encode(_ex(), RESPONSE)
    step = tok.convert_tokens_to_ids("<step>")
    at = [t for t, i in enumerate(ids) if i == step]
    emb = model.get_input_embeddings()
    null = emb.weight[0].detach()
    bounds = steps_of(RESPONSE)
    want, scores = [], []
    for s, (lo, hi) in enumerate(bounds):
        x = emb(torch.tensor([ids])).detach().requires_grad_(True)
        z = model(inputs_embeds=x).logits[0, at[s]]
        d = z[1] - z[0]
        (g,) = torch.autograd.grad(d, x)
        infl = ((x[0] - null) * g[0]).sum(-1).detach()
        want += [infl[t].item() for t, (a, b) in enumerate(spans) if a >= 0 and a < hi and b > lo]
        scores.append(torch.sigmoid(d).item())
    assert res.values.tolist() == pytest.approx(want, abs=1e-5)
    assert res.step_scores == pytest.approx(scores, abs=1e-6)


def test_steps_share_the_credit_by_their_scores():
    """Steps of 2 and 3 tokens scored 0.8 and 0.2, T = 5: Â > 0 gives c = 5·(0.8, 0.2)/(2·0.8 + 3·0.2) =
    (1.8182, 0.4545); Â < 0 gives 5·(0.2, 0.8)/(2·0.2 + 3·0.8) = (0.3571, 1.4286) (the step rated badly is
    blamed); the weights keep a mean of 1."""
    up = attr.step_factors([0.8, 0.2], [2, 3], 1.0)
    down = attr.step_factors([0.8, 0.2], [2, 3], -1.0)
    assert up.tolist() == pytest.approx([1.8182, 0.4545], abs=1e-4)
    assert down.tolist() == pytest.approx([0.3571, 1.4286], abs=1e-4)
    assert float((up * torch.tensor([2.0, 3.0])).sum()) == pytest.approx(5.0)

    class Scorer:  # a test double: uniform influence, the PRM's step scores given
        differentiable = True

        def attribute(self, examples, responses, *, scalar="logit_diff", stats=None):
            return [attr.ResponseInfluence(torch.zeros(5), spans, 0.0, step_scores=[0.8, 0.2])]

    text = "a b\n\nc d e"
    spans = [(0, 1), (2, 3), (5, 6), (7, 8), (9, 10)]
    for a_hat, c in ((1.0, up), (-1.0, down)):
        w, done = attr.gradient_weights([[Scorer()]], [None], [text], [spans], torch.tensor([[a_hat]]), 5)
        assert done.all()
        assert w[0, 0].tolist() == pytest.approx([c[0].item()] * 2 + [c[1].item()] * 3, rel=1e-5)
        assert w[0, 0].mean().item() == pytest.approx(1.0, abs=1e-6)


def test_a_prm_needs_a_step_token_of_one_token(prm_dir):
    with pytest.raises(ValueError, match="kind='prm' needs step_token"):
        ModelReward("prm", prm_dir, kind="prm")
    rm = ModelReward("prm", prm_dir, kind="prm", step_token="two words", device="cpu")
    with pytest.raises(ValueError, match="step_token='two words' is 2 tokens"):
        rm.prepare(_ex())


@pytest.mark.slow
def test_a_prm_trains_through_trl_with_p2t(tmp_path, prm_dir):
    """The TRL test task's two rules beside the tiny PRM, credit p2t: the PRM's rows are attributed
    (weights of mean 1 that match a direct gradient_weights of the batch), the rules' rows replayed."""
    from mrtpo.attribution import gradient_weights, token_char_ranges
    from mrtpo.tasks.model_reward import WithModelRewards
    from tests.integrations.trl.test_trainer import TinyTask, make_trainer, tiny_tokenizer

    task = WithModelRewards(TinyTask(), [_prm(prm_dir)])
    tok = tiny_tokenizer()
    tr = make_trainer(tmp_path / "run", task=task, tok=tok, credit="p2t")
    tr.train()
    k = task.reward_names.index("prm")
    seen = 0
    for b in tr.batches:
        adv, mask, d = b["advantages"], b["completion_mask"], b["distances"]
        active = adv.abs() > 1e-8
        texts, ranges = zip(*(token_char_ranges(tok, r) for r in b["completion_ids"]))
        verifiers = [task.verifiers(ex) for ex in b["examples"]]
        w, done = gradient_weights(verifiers, b["examples"], texts, ranges, adv, d.shape[-1])
        assert torch.equal(done[:, k], active[:, k])
        rows = done[:, k]
        seen += int(rows.sum())
        torch.testing.assert_close(d[rows, k], w[rows, k], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            (d[rows, k] * mask[rows]).sum(1), mask[rows].sum(1).float(), atol=1e-4, rtol=0
        )
    assert seen > 0
