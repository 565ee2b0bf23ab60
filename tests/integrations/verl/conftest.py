"""Fixtures of the verl tests: verl's core_algos and DataProto (skipping without verl), the toy tokenizer and a
tiny model."""

from __future__ import annotations

import pytest
import torch

from mrtpo.tasks.toy import build_toy_tokenizer
from tests.integrations.verl.common import (
    NEEDS_VERL,
)


@pytest.fixture(scope="module")
def core_algos():
    return pytest.importorskip("verl.trainer.ppo.core_algos", reason=NEEDS_VERL)


@pytest.fixture(scope="module")
def DataProto(core_algos):
    from verl import DataProto

    return DataProto


@pytest.fixture(scope="module")
def toy_tok():
    return build_toy_tokenizer()


@pytest.fixture(scope="module")
def toy_model(toy_tok):
    from mrtpo.models.tiny import build_model

    return build_model(len(toy_tok), hidden_size=32, num_layers=2, seed=0, dtype=torch.float32)
