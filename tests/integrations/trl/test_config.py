"""MRTPOConfig (mrtpo.integrations.trl.config): the method block through TRL's own argument parser, and the
JSON-safe dict TRL's trackers store."""

from __future__ import annotations

import json

import pytest

from mrtpo.method import MethodConfig


def test_trls_argument_parser_reads_the_method_block(tmp_path):
    from transformers import HfArgumentParser

    from mrtpo import MRTPOConfig

    (args,) = HfArgumentParser(MRTPOConfig).parse_args_into_dataclasses(
        [
            f"--output_dir={tmp_path}",
            "--use_cpu",
            "--bf16=false",
            "--report_to=none",
            '--method={"credit": "joint", "credit_beta": 0.25}',
            "--loss=policy",
            "--replay_chunk_size=64",
            "--seed=7",
        ]
    )
    assert args.method == MethodConfig(credit="joint", credit_beta=0.25, seed=7)
    assert args.replay_chunk_size == 64
    as_dict = json.loads(args.to_json_string())  # what TensorBoard's callback stores
    assert as_dict["method"] == args.method.to_dict() and "advantage_method" not in as_dict


def test_the_replay_fields_are_the_core_replay_block():
    """TRL's ``replay_*`` fields (``mrtpo train``'s ``replay:`` section) are the fields of the one replay block,
    mrtpo.replay.ReplayOptions, with its defaults (the fields are declared without importing torch, so this
    test keeps them equal), and they are read as one ReplayOptions."""
    import dataclasses

    from mrtpo import replay
    from mrtpo.integrations.trl import MRTPOConfig
    from mrtpo.integrations.trl.fields import CONFIG_KEYS, MRTPOFields

    trl = {
        f.name[len("replay_") :]: f.default
        for f in dataclasses.fields(MRTPOFields)
        if f.name.startswith("replay_")
    }
    core = replay.ReplayOptions.from_mapping({}).as_dict()  # a configuration's defaults: sharding "auto"
    assert trl == core
    assert {CONFIG_KEYS[f"replay_{k}"] for k in core} == {f"replay.{k}" for k in replay.REPLAY_FIELDS}
    args = MRTPOConfig(
        output_dir="/tmp/unused", replay_prefix_min_saved=0, replay_chunk_size=64, use_cpu=True
    )
    assert args.replay_options() == replay.ReplayOptions(prefix_min_saved=0, chunk_size=64, sharding="auto")
    assert args.replay_options("gather").sharding == "gather"
    with pytest.raises(ValueError, match=r"^replay_prefix_min_saved=-1 must be a non-negative integer$"):
        MRTPOConfig(output_dir="/tmp/unused", replay_prefix_min_saved=-1, use_cpu=True)
