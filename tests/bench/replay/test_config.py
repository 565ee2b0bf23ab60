"""mrtpo.bench.replay.config: bad options name the field; a bundled config sets the model's shape."""

from __future__ import annotations

import pytest

from mrtpo.bench.replay import BenchConfig
from tests.bench.replay.common import TINY


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(t=1), "t=1"),
        (dict(skip=9), "skip=9"),
        (dict(k=0), "k=0"),
        (dict(device="tpu"), "device"),
        (
            dict(config="qwen9"),
            r"unknown model config 'qwen9'; bundled: qwen2\.5-1\.5b-instruct, qwen2\.5-3b, .*, tiny",
        ),
        (dict(projections=("tf32",)), "must start with 'float32'"),
        (dict(dtype="float16"), "dtype='float16'"),
    ],
)
def test_config_errors_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BenchConfig(**{**TINY, **kwargs})


def test_bundled_config_sets_the_model_shape():
    cfg = BenchConfig(k=2, t=8, config="qwen2.5-7b", device="cuda")  # no model is built here
    assert (cfg.vocab, cfg.hidden, cfg.layers, cfg.dtype) == (152064, 3584, 28, "bfloat16")
    assert BenchConfig(k=2, t=8, config="tiny").dtype == "float32"
