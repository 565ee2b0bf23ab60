"""The vLLM test doubles (tests/integrations/trl/vllm_double.py) against what they stand for, so that the two
cannot drift apart: the keyword arguments ``FakeLLM`` accepts against TRL's own call and the real
``vllm.LLM`` / ``vllm.EngineArgs``; the double's ``SamplingParams`` fields and defaults, its method
signatures and its output records against the installed vLLM's.

The check against TRL's call runs everywhere (TRL is installed with the project); the checks against vLLM
run where vLLM is installed (the CPU environment of scripts/cpu_vllm_env.sh, which CI builds and runs them
in) and are skipped elsewhere, saying so.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
import os
import textwrap

import pytest

from tests.integrations.trl import vllm_double as vd

needs_vllm = pytest.mark.skipif(  # MRTPO_REQUIRE_REAL_VLLM=1 (CI, in .venv-vllm): never skipped
    importlib.util.find_spec("vllm") is None and os.environ.get("MRTPO_REQUIRE_REAL_VLLM") != "1",
    reason="vLLM is not installed here; the CPU environment runs these (scripts/cpu_vllm_env.sh)",
)


def _trl_llm_keywords() -> set[str]:
    """The keyword names of the ``LLM(...)`` call in TRL's colocate set-up, read from TRL's source."""
    from trl.generation.vllm_generation import VLLMGeneration

    tree = ast.parse(textwrap.dedent(inspect.getsource(VLLMGeneration._init_vllm)))
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "LLM"
    ]
    assert len(calls) == 1, "TRL's colocate set-up builds one vllm.LLM"
    return {k.arg for k in calls[0].keywords if k.arg is not None}


def test_the_double_accepts_what_trls_colocate_call_passes_and_refuses_others():
    names = _trl_llm_keywords()
    assert {"distributed_executor_backend", "logprobs_mode", "enable_sleep_mode", "model"} <= names
    assert names - {"model"} <= vd.LLM_KEYWORDS
    with pytest.raises(TypeError, match="max_lora_rank"):
        vd.FakeLLM("unused-path", max_lora_rank=8)  # refused before any model is loaded


@needs_vllm
def test_the_doubles_keywords_are_the_real_llms():
    from vllm import LLM, EngineArgs

    params = inspect.signature(LLM.__init__).parameters
    assert list(params)[1] == "model" == list(inspect.signature(vd.FakeLLM.__init__).parameters)[1]
    engine_fields = {f.name for f in dataclasses.fields(EngineArgs)}
    assert sorted(vd.LLM_KEYWORDS - set(params) - engine_fields) == []


@needs_vllm
def test_sampling_params_fields_and_defaults_are_vllms():
    from vllm import SamplingParams

    real, double = SamplingParams(), vd.SamplingParams()
    assert {k: getattr(real, k) for k in vd._SAMPLING_FIELDS} == {
        k: getattr(double, k) for k in vd._SAMPLING_FIELDS
    }
    # every keyword the double accepts, the real one accepts with the same meaning (a value away from the
    # default comes back as given)
    given = {"n": 3, "temperature": 0.7, "top_p": 0.9, "top_k": 5, "min_p": 0.1, "max_tokens": 7, "seed": 11}
    assert (
        {k: getattr(SamplingParams(**given), k) for k in given}
        == given
        == {k: getattr(vd.SamplingParams(**given), k) for k in given}
    )
    with pytest.raises(TypeError):
        vd.SamplingParams(not_a_field=1)


@needs_vllm
def test_method_signatures_and_output_records_are_vllms():
    from vllm import LLM
    from vllm.logprobs import Logprob
    from vllm.outputs import CompletionOutput, RequestOutput
    from vllm.sampling_params import StructuredOutputsParams

    for name in ("generate", "chat", "sleep", "wake_up", "reset_prefix_cache", "get_tokenizer"):
        double = [
            p for p in inspect.signature(getattr(vd.FakeLLM, name)).parameters if p not in ("kw", "kwargs")
        ]
        real = list(inspect.signature(getattr(LLM, name)).parameters)
        assert real[: len(double)] == double, name  # the double's parameters: the real ones, in order
    for double, real in (
        (vd.Logprob, Logprob),
        (vd.CompletionOutput, CompletionOutput),
        (vd.StructuredOutputsParams, StructuredOutputsParams),
    ):
        fields = {f.name for f in dataclasses.fields(real)}
        assert {f.name for f in dataclasses.fields(double)} <= fields, double.__name__
    request = set(inspect.signature(RequestOutput.__init__).parameters)
    assert {f.name for f in dataclasses.fields(vd.RequestOutput)} <= request
