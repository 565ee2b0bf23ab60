"""P2T's attribution (mrtpo.attribution): the closed form of a linear scorer, the first-order meaning of the
influence, the token weights, the steps and the character-span mapping between two tokenizers."""

from __future__ import annotations

import math

import pytest
import torch

from mrtpo import attribution as attr


def test_linear_scorer_influence_is_the_closed_form():
    """S = Σ_i ⟨u, e_i⟩ has ∂S/∂e_i = u, so I_i = ⟨e_i − e_null, u⟩ exactly."""
    g = torch.Generator().manual_seed(0)
    e = torch.randn(3, 5, 4, generator=g)
    u = torch.randn(4, generator=g)
    null = torch.randn(4, generator=g)
    s, infl = attr.attribute(lambda x: (x @ u).sum(-1), e, null)
    assert torch.allclose(s, (e @ u).sum(-1))
    assert torch.allclose(infl, (e - null) @ u, atol=1e-6)
    # one hand value: e_0 = (1, 2, 0, 0), e_null = (0, 1, 0, 0), u = (3, -1, 0, 0): ⟨(1, 1), (3, -1)⟩ = 2
    e1 = torch.tensor([[[1.0, 2.0, 0.0, 0.0]]])
    _, i1 = attr.attribute(
        lambda x: (x @ torch.tensor([3.0, -1.0, 0, 0])).sum(-1), e1, torch.tensor([0.0, 1.0, 0, 0])
    )
    assert i1.item() == pytest.approx(2.0)


def test_influence_is_the_first_order_change_of_replacing_a_token_by_null():
    """For a smooth nonlinear scorer, I_i = lim (S(e with e_i moved ε toward e_i − e_null) − S(e)) / ε."""
    g = torch.Generator().manual_seed(1)
    w1 = torch.randn(6, 8, generator=g, dtype=torch.float64)
    w2 = torch.randn(8, generator=g, dtype=torch.float64)

    def score(x):  # [B, L, 6] -> [B]: mean-pooled MLP with a token interaction
        h = torch.tanh(x @ w1)
        return (h.mean(1) @ w2) + (h[:, 0] * h[:, -1]).sum(-1)

    e = torch.randn(2, 4, 6, generator=g, dtype=torch.float64)
    null = torch.randn(6, generator=g, dtype=torch.float64)
    _, infl = attr.attribute(score, e, null)
    eps = 1e-6
    for b in range(2):
        for i in range(4):
            moved = e.clone()
            moved[b, i] += eps * (e[b, i] - null)
            fd = (score(moved)[b] - score(e)[b]) / eps
            assert infl[b, i].item() == pytest.approx(fd.item(), rel=1e-4, abs=1e-6)


def test_attribute_counts_its_cost_and_leaves_parameters_alone():
    lin = torch.nn.Linear(4, 1)
    stats = attr.AttributionStats()
    e = torch.randn(2, 3, 4)
    attr.attribute(lambda x: lin(x).sum((1, 2)), e, torch.zeros(4), stats=stats, tokens=5)
    assert (stats.forwards, stats.backwards, stats.sequences, stats.tokens, stats.padded_tokens) == (
        1,
        1,
        2,
        5,
        6,
    )
    assert lin.weight.grad is None and lin.bias.grad is None
    total = attr.AttributionStats().add(stats).add(stats)
    assert total.forwards == 2 and total.tokens == 10


def test_scalars_and_log_odds():
    z = torch.tensor([[0.5, 2.0], [1.0, -1.0]])
    d = attr.log_odds(z)  # label 1 vs label 0
    assert d.tolist() == pytest.approx([1.5, -2.0])
    assert attr.log_odds(torch.tensor([[0.7]])).tolist() == pytest.approx([0.7])
    # a judge's vocabulary logits: yes = 2, no = 0, others ignored
    v = torch.tensor([[1.0, 9.0, 3.0, -4.0]])
    assert attr.log_odds(v, positive=2, negatives=[0]).item() == pytest.approx(2.0)
    assert attr.verdict_scalar(d, "prob").tolist() == pytest.approx(
        [1 / (1 + math.exp(-1.5)), 1 / (1 + math.exp(2))]
    )
    assert attr.verdict_scalar(d, "logprob")[1].item() == pytest.approx(math.log(1 / (1 + math.exp(2))))
    with pytest.raises(ValueError, match="scalar='odds' must be one of logit_diff, prob, logprob"):
        attr.verdict_scalar(d, "odds")


def test_probability_saturates_where_the_log_odds_do_not():
    """A confident verdict: ∂σ(d)/∂e = σ'(d) ∂d/∂e is tiny, so softmax(I/τ) is nearly uniform under ``prob``."""
    u = torch.tensor([1.0, 0.0])
    e = torch.tensor([[[8.0, 0.0], [0.0, 0.0], [2.0, 0.0]]])  # d = 10: σ'(10) ≈ 4.5e-5
    null = torch.zeros(2)
    m = torch.ones(1, 3, dtype=torch.bool)
    w = {}
    for scalar in attr.SCALARS:
        _, i = attr.attribute(lambda x, s=scalar: attr.verdict_scalar((x @ u).sum(-1), s), e, null)
        w[scalar] = attr.influence_weights(i, m)
    assert w["logit_diff"][0, 0] > 2.9  # e^8 / (e^8 + 1 + e^2) · 3
    assert (w["prob"] - 1).abs().max() < 1e-3


def test_influence_weights_hand_values_and_mean_one():
    infl = torch.tensor([[0.0, math.log(3.0), 0.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    w = attr.influence_weights(infl, mask)
    assert w.tolist()[0] == pytest.approx([3 / 5, 9 / 5, 3 / 5, 0.0])  # 3 · (1, 3, 1) / 5
    # τ = 2 halves the log-ratios: weights ∝ (1, √3, 1)
    w2 = attr.influence_weights(infl, mask, tau=2.0)[0, :3]
    assert w2.tolist() == pytest.approx(
        [3 / (2 + math.sqrt(3)), 3 * math.sqrt(3) / (2 + math.sqrt(3)), 3 / (2 + math.sqrt(3))]
    )
    # segments: mass kept per segment; a one-token segment gets exactly 1
    seg = torch.tensor([[0, 0, 1, 1]])
    w3 = attr.influence_weights(
        torch.tensor([[0.0, math.log(3.0), 7.0, 0.0]]), torch.ones(1, 4), segments=seg
    )
    assert w3.tolist()[0] == pytest.approx(
        [0.5, 1.5, 2 * math.exp(7) / (math.exp(7) + 1), 2 / (math.exp(7) + 1)]
    )
    single = attr.influence_weights(
        torch.tensor([[4.0, -3.0]]), torch.ones(1, 2), segments=torch.tensor([[0, 1]])
    )
    assert single.tolist() == [[1.0, 1.0]]


def test_influence_weights_are_stable_at_extreme_values():
    g = torch.Generator().manual_seed(2)
    infl = torch.randn(5, 9, generator=g) * 1e4
    mask = torch.rand(5, 9, generator=g) > 0.3
    mask[0] = False  # a row without valid tokens: all 0
    w = attr.influence_weights(infl, mask, tau=1e-3, segments=torch.arange(9).repeat(5, 1) // 4)
    assert torch.isfinite(w).all() and (w[~mask] == 0).all() and (w[0] == 0).all()
    mean = (w * mask).sum(1) / mask.sum(1).clamp(min=1)
    assert torch.allclose(mean[1:], torch.ones(4), atol=1e-5)
    assert attr.influence_weights(infl, mask, tau=1e9)[mask].sub(1).abs().max() < 1e-3  # τ → ∞: uniform


def test_influence_weights_refuse_bad_input():
    with pytest.raises(ValueError, match="tau=0 must be a finite number > 0"):
        attr.influence_weights(torch.zeros(1, 2), torch.ones(1, 2), tau=0)
    with pytest.raises(ValueError, match=r"influence\[0, 1\] = nan on a valid token"):
        attr.influence_weights(torch.tensor([[0.0, float("nan")]]), torch.ones(1, 2))


def test_step_segments_split_on_blank_lines():
    text = "ab cd\n\nef\n\n\n\ngh"
    # tokens: "ab", " cd", "\n\n" (inside the separator), "ef", "\n\n\n\n", "gh", <eos> (empty span)
    ranges = [(0, 2), (2, 5), (5, 7), (7, 9), (9, 13), (13, 15), (15, 15)]
    assert attr.step_segments(ranges, text) == [0, 0, 0, 1, 1, 2, 2]
    # a token across a step boundary goes where most of its characters are; its text order stays
    assert attr.step_segments([(0, 4), (4, 9)], "abc\n\nd") == [0, 1]
    assert attr.step_segments([(0, 3)], "abc") == [0]


# --------------------------------------------------------------------------------------------------
# Character spans between two tokenizers
# --------------------------------------------------------------------------------------------------

TEXT = "substitute the value\n\nthe cat sat"


@pytest.fixture(scope="module")
def two_tokenizers():
    from mrtpo.models.tiny import build_bpe_tokenizer, build_tokenizer

    word = build_tokenizer(["substitute", "the", "value", "cat", "sat"])
    bpe = build_bpe_tokenizer(["the cat sat on the mat", "substitute the value"], merges=8)
    return word, bpe


def _ranges(tok, text):
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    return enc["input_ids"], [tuple(x) for x in enc["offset_mapping"]]


def test_the_two_tokenizers_split_differently(two_tokenizers):
    word, bpe = two_tokenizers
    _, wr = _ranges(word, TEXT)
    _, br = _ranges(bpe, TEXT)
    assert len(wr) == 6 and len(br) > 2 * len(wr)
    assert wr[0] == (0, 10) and br[0] == (0, 1)  # "substitute" is one word token, several BPE pieces


def test_a_spike_on_one_word_lands_on_that_word_both_ways(two_tokenizers):
    """All of the influence on the scorer's tokens of one word arrives on exactly the policy tokens of that
    word, whichever tokenizer is the scorer's."""
    word, bpe = two_tokenizers
    _, wr = _ranges(word, TEXT)
    _, br = _ranges(bpe, TEXT)
    start = TEXT.index("value")
    span = (start, start + len("value"))
    inside = lambda r: r[0] >= span[0] and r[1] <= span[1] and r[1] > r[0]  # noqa: E731

    # scorer = BPE, policy = word level: the pieces of "value" carry 1, 2, ... (sum s)
    vb = torch.tensor([float(i + 1) if inside(r) else 0.0 for i, r in enumerate(br)])
    s = vb.sum().item()
    lengths = torch.tensor([b - a for a, b in br], dtype=torch.float32)
    density = (vb * lengths).sum() / lengths[vb > 0].sum()
    mean = attr.transfer(vb, br, wr, how="mean")
    total = attr.transfer(vb, br, wr, how="sum")
    k = wr.index(span)
    assert [i for i, x in enumerate(mean.tolist()) if x != 0] == [k]
    assert mean[k].item() == pytest.approx(density.item())  # the per-character density of "value"
    assert total[k].item() == pytest.approx(s) and total.sum().item() == pytest.approx(s)  # mass kept

    # scorer = word level, policy = BPE: influence 5 on "value" lands on its pieces only
    vw = torch.tensor([5.0 if r == span else 0.0 for r in wr])
    mean = attr.transfer(vw, wr, br, how="mean")
    total = attr.transfer(vw, wr, br, how="sum")
    pieces = [i for i, r in enumerate(br) if inside(r)]
    assert [i for i, x in enumerate(mean.tolist()) if x != 0] == pieces
    assert all(
        mean[i].item() == pytest.approx(5.0) for i in pieces
    )  # a piece inside the word takes its value
    assert total.sum().item() == pytest.approx(5.0)
    assert [total[i].item() for i in pieces] == pytest.approx(
        [5.0 * (br[i][1] - br[i][0]) / 5 for i in pieces]
    )


def test_transfer_matches_a_naive_overlap_loop(two_tokenizers):
    word, bpe = two_tokenizers
    _, wr = _ranges(word, TEXT)
    _, br = _ranges(bpe, TEXT)
    g = torch.Generator().manual_seed(3)
    for src, dst in ((br, wr), (wr, br)):
        v = torch.randn(len(src), generator=g)
        for how in attr.TRANSFERS:
            got = attr.transfer(v, src, dst, how=how)
            for t, (a, b) in enumerate(dst):
                ov = [max(0, min(b, e) - max(a, s)) for s, e in src]
                if how == "mean":
                    want = sum(o * x for o, x in zip(ov, v.tolist())) / sum(ov) if sum(ov) else 0.0
                else:
                    want = sum(o / max(1, e - s) * x for o, (s, e), x in zip(ov, src, v.tolist()))
                assert got[t].item() == pytest.approx(want, abs=1e-5)


def test_transfer_gives_uncovered_and_special_tokens_zero():
    got = attr.transfer([2.0], [(0, 3)], [(0, 3), (3, 3), (3, 6)])
    assert got.tolist() == [2.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="source spans must be"):
        attr.transfer([1.0, 1.0], [(3, 4), (0, 1)], [(0, 1)])
    with pytest.raises(ValueError, match="transfer='max' must be one of mean, sum"):
        attr.transfer([1.0], [(0, 1)], [(0, 1)], how="max")


def test_token_char_ranges_of_generated_ids(two_tokenizers):
    """Ranges of ids that came from generation (an end-of-sequence token included) in the decoded text."""
    word, bpe = two_tokenizers
    for tok in (word, bpe):
        ids = tok(TEXT, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        text, ranges = attr.token_char_ranges(tok, ids)
        assert "".join(text.split()) == "".join(TEXT.split())  # the word-level decoder drops the blank line
        assert ranges[-1][0] == ranges[-1][1]  # <eos>: an empty range
        for (a, b), i in zip(ranges[:-1], ids[:-1]):
            assert text[a:b].strip() == tok.decode([i]).strip()


# --------------------------------------------------------------------------------------------------
# P2T's weights of a batch: scorer on its tokenizer, weights on the policy's
# --------------------------------------------------------------------------------------------------


class _FakeScorer:
    """A differentiable verifier whose influence is given: one value per scorer token of the response."""

    differentiable = True

    def __init__(self, tok, per_token):
        self.tok, self.per_token, self.calls = tok, per_token, 0

    def attribute(self, examples, responses, *, scalar="logit_diff", stats=None):
        self.calls += 1
        out = []
        for r in responses:
            enc = self.tok(r, add_special_tokens=False, return_offsets_mapping=True)
            spans = [tuple(o) for o in enc["offset_mapping"]]
            out.append(
                attr.ResponseInfluence(torch.tensor([self.per_token(r[a:b]) for a, b in spans]), spans)
            )
        return out


class _Rule:
    name = "rule"


def test_gradient_weights_on_the_policys_tokens(two_tokenizers):
    """The scorer tokenizes with BPE, the policy word by word: each policy word takes the per-character
    density of its pieces' influence, then w = T · softmax(sign(Â) · I' / τ); rules and inactive pairs are
    left out."""
    word, bpe = two_tokenizers
    scorer = _FakeScorer(bpe, lambda piece: float(len(piece)))  # influence = the piece's length
    texts = ["substitute the value", "the cat\n\nsat"]
    ranges = [_ranges(word, t)[1] for t in texts]
    adv = torch.tensor([[1.0, 0.5], [0.0, -2.0]])
    verifiers = [[_Rule(), scorer], [_Rule(), scorer]]
    stats = attr.AttributionStats()
    w, done = attr.gradient_weights(verifiers, [None, None], texts, ranges, adv, 5, stats=stats)
    assert done.tolist() == [[False, True], [False, True]] and scorer.calls == 1
    assert (w[:, 0] == 0).all()
    for j, text in enumerate(texts):
        _, br = _ranges(bpe, text)
        dens = []
        for a, b in ranges[j]:
            ov = [(max(0, min(b, e) - max(a, s)), e - s) for s, e in br]
            dens.append(sum(o * n for o, n in ov) / sum(o for o, _ in ov))  # Σ ov · len / Σ ov
        sign = 1.0 if adv[j, 1] > 0 else -1.0  # row 1's advantage is -2: the weights follow -I'
        want = torch.softmax(sign * torch.tensor(dens), 0) * len(dens)
        assert w[j, 1, : len(dens)].tolist() == pytest.approx(want.tolist(), rel=1e-5)
        assert (w[j, 1, len(dens) :] == 0).all()
    # steps: "the cat" and "sat" keep their own mass (2 and 1 tokens)
    w2, _ = attr.gradient_weights(
        verifiers, [None, None], texts, ranges, adv, 5, attr.P2TOptions(segments="steps")
    )
    assert w2[1, 1, :2].sum().item() == pytest.approx(2.0) and w2[1, 1, 2].item() == pytest.approx(1.0)
    # inactive advantage: not attributed
    w3, done3 = attr.gradient_weights(
        verifiers, [None, None], texts, ranges, torch.tensor([[1.0, 0.0], [1.0, 0.0]]), 5
    )
    assert not done3.any() and (w3 == 0).all()


def test_weights_follow_the_advantages_direction():
    """A response of 10 tokens: token 2 raised the scorer's verdict (I = +4), token 5 lowered it (I = −4), the
    others are neutral (I = 0); τ = 1, β = 1, so S_t = Â · w_t. By hand, with Z = e^4 + e^−4 + 8 = 62.6164:

        Â = +1: w = 10 · softmax(+I): helpful 10 e^4 / Z = 8.7195, harmful 10 e^−4 / Z = 0.0029, others 0.1597
        Â = −1: w = 10 · softmax(−I): harmful 8.7195, helpful 0.0029, others 0.1597

    so Â = +1 gives the helpful token the most credit (+8.7195) and Â = −1 gives the harmful token the most
    blame (−8.7195); without the sign, Â = −1 would put −8.7195 on the helpful token."""
    from mrtpo.credit import allocate

    text = "a b c d e f g h i j"  # ten one-character words
    ranges = [[(2 * t, 2 * t + 1) for t in range(10)]]
    infl = {"c": 4.0, "f": -4.0}

    class Scorer:  # a test double: the given influence on each word
        differentiable = True

        def attribute(self, examples, responses, *, scalar="logit_diff", stats=None):
            spans = ranges[0]
            return [attr.ResponseInfluence(torch.tensor([infl.get(text[a:b], 0.0) for a, b in spans]), spans)]

    z = math.exp(4) + math.exp(-4) + 8
    high, low, rest = 10 * math.exp(4) / z, 10 * math.exp(-4) / z, 10 / z
    assert (round(high, 4), round(low, 4), round(rest, 4)) == (8.7195, 0.0029, 0.1597)
    mask = torch.ones(1, 10, dtype=torch.bool)
    for a_hat, helpful, harmful in ((1.0, high, low), (-1.0, low, high)):
        adv = torch.tensor([[a_hat]])
        w, done = attr.gradient_weights([[Scorer()]], [None], [text], ranges, adv, 10)
        assert done.all()
        assert w[0, 0, 2].item() == pytest.approx(helpful, rel=1e-5)
        assert w[0, 0, 5].item() == pytest.approx(harmful, rel=1e-5)
        assert w[0, 0, [0, 1, 3, 4, 6, 7, 8, 9]].tolist() == pytest.approx([rest] * 8, rel=1e-5)
        s = allocate(adv, w, mask, beta=1.0, credit="p2t")[0]
        assert s.mean().item() == pytest.approx(a_hat, abs=1e-6)  # credit moved, never created
        extreme = int(s.argmax()) if a_hat > 0 else int(s.argmin())
        assert extreme == (2 if a_hat > 0 else 5)
        assert s[extreme].item() == pytest.approx(a_hat * high, rel=1e-5)


def test_p2t_options_refuse_bad_values():
    with pytest.raises(ValueError, match="segments='lines' must be one of response, steps"):
        attr.P2TOptions(segments="lines")
    with pytest.raises(ValueError, match="tau=-1 must be a finite number > 0"):
        attr.P2TOptions(tau=-1)


def test_linear_scorer_on_another_tokenizer_end_to_end(two_tokenizers):
    """A ModelReward whose linear scorer reads BPE tokens, weights on a word-level policy's tokens: each
    word's influence is the density of the closed-form influences ⟨e_i − e_null, u⟩ of its pieces."""
    from mrtpo.prompt import Segment
    from mrtpo.tasks import Example
    from mrtpo.tasks.model_reward import ModelReward
    from tests.tasks.test_model_reward import LinearScorer

    word, bpe = two_tokenizers
    scorer = LinearScorer(len(bpe), seed=7)
    rm = ModelReward("rm", scorer, tokenizer=bpe, device="cpu")
    text = "substitute the value"
    ranges = [_ranges(word, text)[1]]
    ex = Example("e", [Segment("say it")])
    w, done = attr.gradient_weights(
        [[rm]], [ex], [text], ranges, torch.ones(1, 1), 3, attr.P2TOptions(tau=2.0)
    )
    ids, br = _ranges(bpe, text)
    e, u = scorer.emb.weight.detach(), scorer.u.detach()
    closed = [((e[i] - e[bpe.pad_token_id]) @ u).item() for i in ids]
    dens = []
    for a, b in ranges[0]:
        ov = [max(0, min(b, t) - max(a, s)) for s, t in br]
        dens.append(sum(o * c for o, c in zip(ov, closed)) / sum(ov))
    assert done.all()
    assert w[0, 0].tolist() == pytest.approx(
        (torch.softmax(torch.tensor(dens) / 2.0, 0) * 3).tolist(), rel=1e-4
    )
