"""ReplayOptions: replay's engine options, checked once; each engine's config names a bad field its way."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mrtpo import replay


def test_defaults_and_every_field_checked():
    opts = replay.ReplayOptions()
    assert (opts.token_budget, opts.chunk_size, opts.prefix_min_saved, opts.sharding) == (
        16384,
        256,
        128,
        "none",
    )
    bad = {
        "token_budget": (0, "token_budget=0 must be a positive integer or None"),
        "chunk_size": (True, "chunk_size=True must be a positive integer"),
        "prefix_min_saved": (-1, "prefix_min_saved=-1 must be a non-negative integer"),
        "prefix_sharing": ("yes", "prefix_sharing='yes' must be True or False"),
        "projection_dtype": ("fp8", "projection_dtype='fp8' must be one of float32, tf32, bfloat16"),
        "distance_kernel": ("cuda", "distance_kernel='cuda' must be one of"),
        "sharding": ("zero3", "sharding='zero3' must be one of auto, none, gather, lockstep"),
    }
    for name, (value, message) in bad.items():
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            replay.ReplayOptions(**{name: value})
    assert ("auto", *replay.SHARDING) == replay.SHARDING_SETTINGS
    # "auto" is a setting of a configuration: an engine resolves it to a mode before replaying
    auto = replay.ReplayOptions(sharding="auto")
    assert auto.resolved("gather") == replay.ReplayOptions(sharding="gather")
    with pytest.raises(ValueError, match="sharding='auto' must be one of none, gather, lockstep"):
        auto.resolved("auto")


def test_a_replay_block_is_read_once_for_every_engine():
    """ReplayOptions.from_mapping: the one reader of a ``replay`` block (sharding "auto" by default), a bad or
    unknown key named as the engine spells it."""
    opts = replay.ReplayOptions.from_mapping({"chunk_size": 64, "token_budget": None}, label="replay.")
    assert (opts.chunk_size, opts.token_budget, opts.sharding, opts.prefix_min_saved) == (
        64,
        None,
        "auto",
        128,
    )
    assert replay.ReplayOptions.from_mapping(opts.as_dict()) == opts
    assert tuple(replay.ReplayOptions().as_dict()) == replay.REPLAY_FIELDS
    with pytest.raises(
        ValueError, match=r"^unknown field 'replay\.chunk' \(did you mean 'replay\.chunk_size'\?\)"
    ):
        replay.ReplayOptions.from_mapping({"chunk": 64})
    with pytest.raises(
        ValueError, match=r"^algorithm\.mrtpo\.replay\.chunk_size=0 must be a positive integer$"
    ):
        replay.ReplayOptions.from_mapping({"chunk_size": 0}, label="algorithm.mrtpo.replay.")


def test_from_fields_reads_an_engines_spelling_and_names_its_field():
    trl_like = SimpleNamespace(replay_token_budget=None, replay_chunk_size=64, replay_prefix_sharing=False)
    opts = replay.ReplayOptions.from_fields(trl_like, sharding="lockstep", prefix="replay_", label="replay_")
    assert (opts.token_budget, opts.chunk_size, opts.prefix_sharing, opts.sharding) == (
        None,
        64,
        False,
        "lockstep",
    )
    assert opts.projection_dtype == "float32"  # a field the config lacks keeps its default
    with pytest.raises(
        ValueError, match=r"^algorithm\.mrtpo\.replay\.chunk_size=0 must be a positive integer$"
    ):
        replay.ReplayOptions.from_fields(
            SimpleNamespace(chunk_size=0), sharding="none", label="algorithm.mrtpo.replay."
        )
