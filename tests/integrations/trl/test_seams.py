"""The TRL surface MRTPOTrainer depends on: the private GRPOTrainer methods it overrides are exactly
``TRL_SEAMS``, each exists in the installed TRL and accepts the arguments the override forwards. Run
against every supported TRL version by scripts/test_trl_versions.sh."""

from __future__ import annotations

import inspect

import pytest

pytest.importorskip("trl")


def test_the_overridden_private_methods_are_named_in_one_place():
    from trl import GRPOTrainer

    from mrtpo.integrations.trl.trainer import TRL_SEAMS, MRTPOTrainer

    overridden = {
        name
        for name, value in vars(MRTPOTrainer).items()
        if name.startswith("_")
        and not name.startswith("__")
        and callable(value)
        and hasattr(GRPOTrainer, name)
    }
    assert overridden == set(TRL_SEAMS)


@pytest.mark.parametrize(
    "name, params",
    [
        ("_calculate_rewards", ["inputs", "prompts", "completions", "completion_ids_list"]),
        ("_generate_and_score_completions", ["inputs"]),
        ("_compute_loss", ["model", "inputs"]),
        ("_get_train_sampler", ["dataset"]),
        ("_issue_warnings_after_load", ["load_result"]),
    ],
)
def test_each_seam_exists_with_the_forwarded_parameters(name, params):
    from trl import GRPOTrainer

    sig = inspect.signature(getattr(GRPOTrainer, name))
    assert list(sig.parameters)[1 : 1 + len(params)] == params


def test_logps_seam_takes_positional_inputs_and_a_batch_size():
    """The capture hook forwards (model, input_ids, attention_mask, logits_to_keep, ...) positionally and
    the CoRT pass calls it with batch_size=; TRL returns (logps, entropies, aux)."""
    from trl import GRPOTrainer

    sig = inspect.signature(GRPOTrainer._get_per_token_logps_and_entropies)
    names = list(sig.parameters)
    assert names[1] == "model"
    kinds = {p.kind for p in sig.parameters.values()}
    assert "batch_size" in names or inspect.Parameter.VAR_KEYWORD in kinds
    assert names[2:5] == ["input_ids", "attention_mask", "logits_to_keep"] or (
        inspect.Parameter.VAR_POSITIONAL in kinds
    )
