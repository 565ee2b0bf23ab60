"""MRTPOConfig (mrtpo.integrations.trl.config): the method block through TRL's own argument parser, and the
JSON-safe dict TRL's trackers store."""

from __future__ import annotations

import json

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
