"""Localization statistics (distance share on checked tokens, token share, ratio, top-k share) and the
mapping from checked character spans to token indices."""

from __future__ import annotations

import math
import random

import pytest

from mrtpo.analysis.localization import (
    aggregate_localization,
    aggregate_top_k,
    checked_token_mask,
    decode_offsets,
    distance_share,
    pair_localization,
    token_pieces,
    token_share,
    tokenize_with_offsets,
    top_k_share,
    uniform_top_k_share,
)


def test_pair_statistics_hand_computed():
    # d = [0.1, 0.3, 0.2, 0.4], checked tokens 1 and 3: Σd = 1.0, Σ_C d = 0.3 + 0.4 = 0.7
    # distance share 0.7, token share 2/4 = 0.5, ratio 0.7 / 0.5 = 1.4
    # top-1 = 0.4 / 1.0, top-2 = (0.4 + 0.3) / 1.0 = 0.7, top-10 = 1 (k >= T)
    d, c = [0.1, 0.3, 0.2, 0.4], [0, 1, 0, 1]
    assert distance_share(d, c) == pytest.approx(0.7, abs=1e-15)
    assert token_share(c) == 0.5
    assert top_k_share(d, 1) == pytest.approx(0.4, abs=1e-15)
    assert top_k_share(d, 2) == pytest.approx(0.7, abs=1e-15)
    assert top_k_share(d, 10) == 1.0
    p = pair_localization(d, c, top_k=(1, 2, 10))
    assert (p.tokens, p.checked) == (4, 2)
    assert p.distance_share == pytest.approx(0.7, abs=1e-15)
    assert p.token_share == 0.5
    assert p.ratio == pytest.approx(1.4, abs=1e-14)
    assert p.top_k == pytest.approx({1: 0.4, 2: 0.7, 10: 1.0}, abs=1e-15)


def test_aggregation_is_ratio_of_means():
    # pair A: ds 0.7, ts 0.5 (ratio 1.4); pair B: d = [0.5, 0.5, 0, 0, 0], checked token 0:
    # ds 0.5 / 1.0 = 0.5, ts 1/5 = 0.2 (ratio 2.5).
    # Dist. = (0.7 + 0.5) / 2 = 0.6, Tok. = (0.5 + 0.2) / 2 = 0.35, Ratio = 0.6 / 0.35 = 1.7142857...
    # (a mean of per-pair ratios would give (1.4 + 2.5) / 2 = 1.95)
    a = pair_localization([0.1, 0.3, 0.2, 0.4], [0, 1, 0, 1])
    b = pair_localization([0.5, 0.5, 0.0, 0.0, 0.0], [1, 0, 0, 0, 0])
    s = aggregate_localization([a, b])
    assert s.n == 2
    assert s.distance_share == pytest.approx(0.6, abs=1e-15)
    assert s.token_share == pytest.approx(0.35, abs=1e-15)
    assert s.ratio == pytest.approx(0.6 / 0.35, abs=1e-14)
    assert s.ratio != pytest.approx(1.95)


def test_undefined_pairs_are_skipped():
    assert pair_localization([0.0, 0.0, 0.0], [1, 0, 0]) is None  # Σd = 0
    assert math.isnan(distance_share([0.0, 0.0], [1, 0]))
    no_span = pair_localization([0.1, 0.2], [0, 0])  # nothing checked: only top-k is defined
    assert not no_span.has_span_share and math.isnan(no_span.ratio) and no_span.token_share == 0.0
    unknown = pair_localization([0.1, 0.2], None, top_k=(1,))
    assert not unknown.has_span_share and unknown.top_k[1] == pytest.approx(2 / 3)
    a = pair_localization([0.1, 0.3, 0.2, 0.4], [0, 1, 0, 1])
    s = aggregate_localization([a, None, no_span, unknown])
    assert s.n == 1 and s.ratio == pytest.approx(1.4)
    empty = aggregate_localization([None])
    assert empty.n == 0 and math.isnan(empty.ratio)
    # top-k counts every pair with Σd > 0 (no span needed): top-1 of a = 0.4, of no_span = 0.2/0.3,
    # of unknown = 0.2/0.3; uniform references 1/4, 1/2, 1/2
    tk = aggregate_top_k([a, None, no_span, unknown], [1])
    assert tk[1][0] == pytest.approx((0.4 + 2 / 3 + 2 / 3) / 3)
    assert tk[1][1] == pytest.approx((0.25 + 0.5 + 0.5) / 3)
    assert tk[1][2] == 3


@pytest.mark.parametrize("seed", range(8))
def test_uniform_distances_give_ratio_exactly_one(seed):
    rng = random.Random(seed)
    pairs = []
    for _ in range(12):
        t = rng.randint(1, 300)
        c = rng.choice([0.3, 0.1, 1e-7, 0.7071067811865476, rng.random()])  # values whose sums round
        checked = [int(rng.random() < 0.3) for _ in range(t)]
        checked[rng.randrange(t)] = 1
        p = pair_localization([c] * t, checked, top_k=(1, 5, 17))
        assert p.distance_share == p.token_share  # exactly
        assert p.ratio == 1.0
        for k in (1, 5, 17):
            assert p.top_k[k] == uniform_top_k_share(t, k) == min(k, t) / t
        pairs.append(p)
    s = aggregate_localization(pairs)
    assert s.ratio == 1.0 and s.distance_share == s.token_share
    tk = aggregate_top_k(pairs, [1, 5, 17])
    assert all(v[0] == v[1] for v in tk.values())


def _naive(d, c, ks):
    total = sum(d)
    ds = sum(x for x, m in zip(d, c) if m) / total
    ts = sum(c) / len(c)
    top = {k: sum(sorted(d, reverse=True)[:k]) / total for k in ks}
    return ds, ts, ds / ts, top


@pytest.mark.parametrize("seed", range(5))
def test_matches_a_naive_loop(seed):
    rng = random.Random(100 + seed)
    t = rng.randint(2, 50)
    d = [rng.random() ** 3 for _ in range(t)]
    c = [int(rng.random() < 0.4) for _ in range(t)]
    c[0] = 1
    ds, ts, ratio, top = _naive(d, c, (1, 3, 7))
    p = pair_localization(d, c, top_k=(1, 3, 7))
    assert p.distance_share == pytest.approx(ds, rel=1e-12)
    assert p.token_share == pytest.approx(ts, rel=1e-12)
    assert p.ratio == pytest.approx(ratio, rel=1e-12)
    assert p.top_k == pytest.approx(top, rel=1e-12)


def test_bad_input_names_the_token():
    with pytest.raises(ValueError, match=r"distances\[2\] = -0.1"):
        pair_localization([0.1, 0.2, -0.1], [1, 0, 0])
    with pytest.raises(ValueError, match=r"distances\[0\] = nan"):
        top_k_share([float("nan")], 1)
    with pytest.raises(ValueError, match=r"checked has shape \(2,\); expected \[T\] = \[3\]"):
        pair_localization([0.1, 0.2, 0.3], [1, 0])
    with pytest.raises(ValueError, match=r"checked\[1\] = 2"):
        distance_share([0.1, 0.2], [0, 2])
    with pytest.raises(ValueError, match="k=0"):
        top_k_share([0.1], 0)


def test_checked_token_mask_from_offsets():
    # "the apple is": tokens [0, 3) [4, 9) [10, 12)
    offsets = [(0, 3), (4, 9), (10, 12)]
    assert checked_token_mask(offsets, [(4, 9)]) == [0, 1, 0]
    assert checked_token_mask(offsets, [(2, 5)]) == [1, 1, 0]  # overlaps [2, 3) and [4, 5)
    assert checked_token_mask(offsets, [(3, 4)]) == [0, 0, 0]  # only the space between tokens
    assert checked_token_mask(offsets, [(5, 5)]) == [0, 0, 0]  # an empty span reads nothing
    assert checked_token_mask(offsets, [(0, 1), (11, 12)]) == [1, 0, 1]
    assert checked_token_mask(offsets, []) == [0, 0, 0]
    with pytest.raises(ValueError, match=r"spans\[0\] = \(5, 3\)"):
        checked_token_mask(offsets, [(5, 3)])
    with pytest.raises(ValueError, match=r"spans\[1\] = \(0, 13\); expected 0 <= start <= end <= 12"):
        checked_token_mask(offsets, [(0, 1), (0, 13)], text_length=12)


def test_offsets_fast_tokenizer_and_incremental_decoding_agree(tiny_tokenizer):
    text = "the w3 of w12"
    ids, fast = tokenize_with_offsets(tiny_tokenizer, text)
    assert len(ids) == 4
    assert fast == [(0, 3), (4, 6), (7, 9), (10, 13)]
    # decoding prefixes: "the" / "the w3" / "the w3 of" / "the w3 of w12" -> ends 3, 6, 9, 13
    slow = decode_offsets(tiny_tokenizer, ids, text)
    assert slow == [(0, 3), (3, 6), (6, 9), (9, 13)]
    span = [(text.index("w3"), text.index("w3") + 2)]
    assert checked_token_mask(fast, span) == checked_token_mask(slow, span) == [0, 1, 0, 0]
    assert token_pieces(text, fast) == ["the ", "w3 ", "of ", "w12"]
    assert "".join(token_pieces(text, slow)) == text


def test_incremental_decoding_maps_onto_a_different_text(tiny_tokenizer):
    text = "the  w3 of w12"  # two spaces: decoding the ids gives "the w3 of w12"
    ids, fast = tokenize_with_offsets(tiny_tokenizer, text)
    slow = decode_offsets(tiny_tokenizer, ids, text)
    assert all(0 <= s <= e <= len(text) for s, e in slow)
    for word, t in (("w3", 1), ("of", 2), ("w12", 3)):
        a = text.index(word)
        expect = [int(i == t) for i in range(4)]
        assert checked_token_mask(slow, [(a, a + len(word))]) == expect
        assert checked_token_mask(fast, [(a, a + len(word))]) == expect


class _ByteTokenizer:
    """One token per UTF-8 byte; decoding a partial character gives U+FFFD (as byte-level BPE does)."""

    def decode(self, ids, skip_special_tokens=False):
        return bytes(ids).decode("utf-8", errors="replace")


def test_incremental_decoding_with_split_characters():
    text = "aé b"
    ids = list(text.encode("utf-8"))  # [a, 0xC3, 0xA9, space, b]
    offsets = decode_offsets(_ByteTokenizer(), ids, text)
    # the first byte of é decodes to U+FFFD, which the full text does not have: empty range; the
    # second byte completes é and takes character 1
    assert offsets == [(0, 1), (1, 1), (1, 2), (2, 3), (3, 4)]
    assert checked_token_mask(offsets, [(1, 2)]) == [0, 0, 1, 0, 0]


def test_position_shares_hand_values_and_uniform():
    from fractions import Fraction

    from mrtpo.analysis.localization import aggregate_position_shares, position_shares

    # T = 2 tokens, B = 4 parts: each token covers two parts; d = [1, 3]: 1/8, 1/8, 3/8, 3/8
    assert position_shares([1.0, 3.0], 4).tolist() == [0.125, 0.125, 0.375, 0.375]
    # T = 3, B = 2: token 1 straddles the middle; d = [3, 2, 1] (sum 6): [3 + 1, 1 + 1] / 6
    assert position_shares([3.0, 2.0, 1.0], 2) == pytest.approx([4 / 6, 2 / 6])
    # uniform distances: exactly 1 / B per part, whatever T and B
    for t in range(1, 12):
        for b in (1, 2, 3, 5, 10):
            assert position_shares([0.3] * t, b).tolist() == [1 / b] * b
    assert position_shares([0.0, 0.0], 3) is None and position_shares([], 3) is None
    # naive reference with exact fractions: overlap of [t/T, (t+1)/T) and [b/B, (b+1)/B), times T
    d = [0.2, 0.0, 0.7, 0.1, 0.5, 0.3, 0.9]
    for b_parts in (3, 5, 10):
        want = []
        for b in range(b_parts):
            lo, hi = Fraction(b, b_parts), Fraction(b + 1, b_parts)
            acc = 0.0
            for t, x in enumerate(d):
                ov = max(Fraction(0), min(hi, Fraction(t + 1, len(d))) - max(lo, Fraction(t, len(d))))
                acc += x * float(ov * len(d))
            want.append(acc / sum(d))
        assert position_shares(d, b_parts) == pytest.approx(want, abs=1e-12)
    with pytest.raises(ValueError, match="parts"):
        position_shares([1.0], 0)
    mean, n = aggregate_position_shares(
        [position_shares([1.0, 3.0], 2), None, position_shares([1.0, 1.0], 2)], 2
    )
    assert n == 2 and mean.tolist() == [(0.25 + 0.5) / 2, (0.75 + 0.5) / 2]
