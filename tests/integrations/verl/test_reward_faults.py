"""Failing verifiers on verl: compute_score never raises on a failed verdict (it scores the minimum and
lists the failure), the compute_advantage hook applies algorithm.mrtpo.on_verifier_error to the batch
(stop in one line; or count under min, within max_verifier_error_rate), MRTPORayPPOTrainer saves verl's
checkpoint of the last completed step before the error propagates (verl's own _save_checkpoint and
_load_checkpoint, with a stand-in worker group: rollouts need a GPU), and the entry point ends in one line."""

from __future__ import annotations

import json

import pytest
import torch

from mrtpo.tasks.faults import VerifierError
from mrtpo.tasks.toy import build_toy_tokenizer
from tests.tasks.faulty_task import CAUSES, KINDS, FaultyToy

pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl==0.9.1 is not installed")

from omegaconf import OmegaConf
from verl import DataProto

from mrtpo import replay as replay_mod
from mrtpo.integrations.verl import adapter as va
from mrtpo.integrations.verl import data as verl_data
from mrtpo.integrations.verl import main as vmain
from mrtpo.integrations.verl import reward as vreward
from tests.integrations.verl.common import pack_dataproto, score_with_reward_manager

TASK = "tests.tasks.faulty_task:FaultyToy"
KEYS = ["start", "end", "include", "length", "wrap"]
RESPONSES = ["apple stone river", "tiger lemon cloud", "<b> apple </b>", "cloud", "stone", "tiger"]


@pytest.fixture(scope="module")
def tok():
    return build_toy_tokenizer()


@pytest.fixture(autouse=True)
def fresh_tasks():
    """compute_score builds a task once per (name, kwargs): a fresh FaultyToy (call counter) per test."""
    vreward._load_task.cache_clear()
    yield
    vreward._load_task.cache_clear()


def _batch(tok, kind="none", fail_at=(), n=6):
    """A DataProto of ``n`` responses (groups of 3) scored by verl's reward manager with compute_score on
    FaultyToy, reward_extra_info copied into non_tensor_batch as verl's trainer does."""

    task_kwargs = {"kind": kind, "fail_at": list(fail_at), "size": 8}
    examples = FaultyToy(**task_kwargs).load(limit=n // 3)
    rows = [
        verl_data.example_row(examples[j // 3], TASK, index=j // 3, task_kwargs=task_kwargs) for j in range(n)
    ]
    prompts = [replay_mod.tokenize_messages(tok, examples[j // 3].messages()) for j in range(n)]
    resp = [
        tok(RESPONSES[j % 6], add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for j in range(n)
    ]
    return score_with_reward_manager(pack_dataproto(DataProto, prompts, resp, rows, 3), tok), examples


def _cfg(**node):  # the response-level method: these batches carry no replay distances
    return OmegaConf.create({"norm_adv_by_std_in_grpo": True, "mrtpo": {"credit": "none", **node}})


@pytest.mark.parametrize("kind", KINDS)
def test_compute_score_scores_the_minimum_and_lists_the_failure(kind):
    task_kwargs = {"kind": kind, "fail_at": [2], "size": 8}
    (ex,) = FaultyToy(**task_kwargs).load(limit=1)
    info = verl_data.example_row(ex, TASK, task_kwargs=task_kwargs)["extra_info"]
    first = va.compute_score("mrtpo/faulty", "apple", None, info)  # verdict 1 of 'start': fine
    assert first[va.ERRORS_KEY] == ""
    second = va.compute_score("mrtpo/faulty", "apple", None, info)  # verdict 2: the fault
    assert json.loads(second[va.ERRORS_KEY]) == [["start", CAUSES[kind]]]
    assert second["start"] == 0.0  # the minimum, in place of the failed verdict
    assert {k: second[k] for k in KEYS[1:]} == {k: first[k] for k in KEYS[1:]}
    assert second["score"] == sum(second[k] for k in KEYS)


@pytest.mark.parametrize("kind", KINDS)
def test_default_policy_stops_the_batch_in_one_line(tok, kind):
    data, examples = _batch(tok, kind, fail_at=[5])  # the 5th response: row 4, example 1
    with pytest.raises(VerifierError) as e:
        va.compute_advantage(data, "mrtpo_gdpo", config=_cfg())
    assert str(e.value) == f"verifier 'start' failed on example {examples[1].id!r}: {CAUSES[kind]}"
    assert e.value.fault.row == 4 and e.value.fault.col == 0
    # verl's own estimators too: the policy is the batch's, whatever computes the advantages
    with pytest.raises(VerifierError):
        va.compute_advantage(data, "grpo", config=_cfg(), original=lambda data, **kw: data)


@pytest.mark.parametrize("kind", KINDS)
def test_min_policy_trains_on_the_minimum_and_counts(tok, kind):
    data, _ = _batch(tok, kind, fail_at=[1, 4])  # rows 0 and 3
    clean, _ = _batch(tok, "none")
    va.compute_advantage(
        data, "mrtpo_gdpo", config=_cfg(on_verifier_error="min", max_verifier_error_rate=0.1)
    )
    assert data.meta_info[va.VERIFIER_ERRORS_META] == {
        "verifier_errors/start": 2.0,
        **{f"verifier_errors/{k}": 0.0 for k in KEYS[1:]},
        "verifier_error_rate": 2 / 30,
    }
    r, r_clean = va.reward_matrix(data.non_tensor_batch, KEYS), va.reward_matrix(clean.non_tensor_batch, KEYS)
    expected = r_clean.clone()
    expected[[0, 3], 0] = 0.0
    assert torch.equal(r, expected)  # the failed verdicts trained as the minimum, the rest as scored
    assert torch.isfinite(data.batch["advantages"]).all()
    # 4 of 30 verdicts (13%) is more than the default 10%
    data, _ = _batch(tok, kind, fail_at=[1, 2, 4, 5])
    with pytest.raises(
        VerifierError, match=r"^4 of 30 verdicts of one batch failed \(13\.3% > algorithm\.mrtpo"
    ):
        va.compute_advantage(data, "mrtpo_gdpo", config=_cfg(on_verifier_error="min"))


def test_policy_fields_name_the_key():
    with pytest.raises(
        ValueError, match=r"^field 'algorithm\.mrtpo\.on_verifier_error': 'skip' is not one of"
    ):
        va.VerlMRTPOConfig.from_algorithm(_cfg(on_verifier_error="skip"))
    with pytest.raises(ValueError, match=r"^field 'algorithm\.mrtpo\.max_verifier_error_rate': 1\.5 is not"):
        va.VerlMRTPOConfig.from_algorithm(_cfg(max_verifier_error_rate=1.5))


# --------------------------------------------------------------------------------------------------
# MRTPORayPPOTrainer: the checkpoint of the last completed step, and resuming from it


class Workers:
    """The actor worker group's checkpoint calls (verl's FSDP workers write the model and optimizer)."""

    def __init__(self):
        self.saved, self.loaded = [], []

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        from pathlib import Path

        Path(local_path).mkdir(parents=True, exist_ok=True)
        (Path(local_path) / "model.pt").write_text(str(global_step))
        self.saved.append((local_path, global_step))

    def load_checkpoint(self, local_path, del_local_after_load=False):
        self.loaded.append(local_path)


def _trainer(tmp_path, on_error="min"):
    from torchdata.stateful_dataloader import StatefulDataLoader

    tr = vmain.MRTPORayPPOTrainer.__new__(vmain.MRTPORayPPOTrainer)
    tr.config = OmegaConf.create(
        {
            "trainer": {"default_local_dir": str(tmp_path), "default_hdfs_dir": None, "resume_mode": "auto",
                        "del_local_ckpt_after_load": False},
            "actor_rollout_ref": {"actor": {"checkpoint": {"async_save": False}}},
            "algorithm": {"adv_estimator": "mrtpo_gdpo", "norm_adv_by_std_in_grpo": True,
                          "mrtpo": {"on_verifier_error": on_error, "credit": "none"}},
        }
    )  # fmt: skip
    tr.use_critic = False
    tr.actor_rollout_wg = Workers()
    tr.train_dataloader = StatefulDataLoader(list(range(20)), batch_size=2)
    tr.drawn, tr.logged = [], []
    return tr


def _verl_loop(self):
    """verl's fit() as far as these pieces go: resume, then per step draw a batch, score it, compute the
    advantages through the hook, update the actor, log its metrics."""
    self.global_steps = 0
    self._load_checkpoint()
    self.global_steps += 1
    for batch in self.train_dataloader:
        self.drawn.append(batch.tolist())
        data = self.batches[self.global_steps]
        va.compute_advantage(data, "mrtpo_gdpo", config=self.config.algorithm)
        out = self._update_actor(data)
        self.logged.append(dict(out.meta_info["metrics"]))
        if self.global_steps >= 4:
            return
        self.global_steps += 1


@pytest.fixture
def verl_loop(monkeypatch):
    monkeypatch.setattr(vmain.RayPPOTrainer, "fit", _verl_loop)
    monkeypatch.setattr(
        vmain.RayPPOTrainer,
        "_update_actor",
        lambda self, batch: DataProto(meta_info={"metrics": {"actor/loss": [0.5]}}),
    )


def test_trainer_saves_the_last_completed_step_and_resumes_from_it(tok, tmp_path, verl_loop):
    clean, _ = _batch(tok, "none")
    counted, _ = _batch(tok, "nan", fail_at=[2])  # step 2: one failed verdict, counted (policy min)
    broken, examples = _batch(tok, "raise", fail_at=[1, 2, 3, 4])  # step 3: 4 of 30 > 10%: stop
    tr = _trainer(tmp_path)
    tr.batches = {1: clean, 2: counted, 3: broken}
    with pytest.raises(VerifierError) as e:
        tr.fit()
    assert (e.value.step, e.value.checkpoint) == (2, str(tmp_path / "global_step_2"))
    assert tr.drawn == [[0, 1], [2, 3], [4, 5]]
    assert tr.logged[1]["verifier_errors/start"] == [1.0] and tr.logged[1]["actor/loss"] == [0.5]
    assert tr.logged[0]["verifier_errors/start"] == [0.0]
    assert tr.actor_rollout_wg.saved == [(str(tmp_path / "global_step_2" / "actor"), 2)]
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "2"
    line = vmain.stop_line(e.value)
    assert line == (
        f"mrtpo verl: stopped after step 2: 4 of 30 verdicts of one batch failed (13.3% > "
        f"algorithm.mrtpo.max_verifier_error_rate=0.1); first: verifier 'start' failed on example "
        f"{examples[0].id!r}: raised TimeoutError: judge timed out; saved {tmp_path / 'global_step_2'}; resume "
        "with the same command (trainer.resume_mode=auto, verl's default, continues from the newest checkpoint "
        "of trainer.default_local_dir)"
    )
    # resume (the verifier fixed): verl's _load_checkpoint takes global_step_2 and its data loader state,
    # so step 3 draws the failed step's batch again, then step 4 the next
    again = _trainer(tmp_path)
    again.batches = {3: clean, 4: clean}
    again.fit()
    assert again.actor_rollout_wg.loaded == [str(tmp_path / "global_step_2" / "actor")]
    assert again.drawn == [[4, 5], [6, 7]] and again.global_steps == 4


@pytest.mark.parametrize("kind", KINDS)
def test_default_policy_saves_and_resumes_for_every_fault_kind(tok, tmp_path, verl_loop, kind):
    clean, _ = _batch(tok, "none")
    broken, examples = _batch(tok, kind, fail_at=[2])  # step 2: one failed verdict stops the run
    tr = _trainer(tmp_path, on_error="raise")
    tr.batches = {1: clean, 2: broken}
    with pytest.raises(VerifierError) as e:
        tr.fit()
    assert (e.value.step, e.value.checkpoint) == (1, str(tmp_path / "global_step_1"))
    assert tr.actor_rollout_wg.saved == [(str(tmp_path / "global_step_1" / "actor"), 1)]
    assert vmain.stop_line(e.value).startswith(
        f"mrtpo verl: stopped after step 1: verifier 'start' failed on example {examples[0].id!r}: "
        f"{CAUSES[kind]}; saved {tmp_path / 'global_step_1'}; resume with the same command"
    )
    again = _trainer(tmp_path, on_error="raise")  # the verifier fixed: step 2 draws its batch again
    again.batches = {2: clean, 3: clean, 4: clean}
    again.fit()
    assert again.actor_rollout_wg.loaded == [str(tmp_path / "global_step_1" / "actor")]
    assert again.drawn == [[2, 3], [4, 5], [6, 7]] and again.global_steps == 4


def test_a_failure_in_the_first_step_saves_nothing(tok, tmp_path, verl_loop):
    broken, _ = _batch(tok, "none", fail_at=[1, 2, 3, 4])
    tr = _trainer(tmp_path)
    tr.batches = {1: broken}
    with pytest.raises(VerifierError) as e:
        tr.fit()
    assert (e.value.step, e.value.checkpoint) == (0, None) and tr.actor_rollout_wg.saved == []
    assert vmain.stop_line(e.value).endswith("; no checkpoint was written (no step had completed)")


def test_entry_point_ends_in_one_line(monkeypatch, capsys):
    import ray.exceptions

    error = VerifierError("verifier 'start' failed on example 'e1': returned None")
    error.step, error.checkpoint = 7, "/ckpt/global_step_7"
    wrapped = ray.exceptions.RayTaskError("TaskRunner.run", "Traceback ...", error).as_instanceof_cause()
    assert vmain.verifier_error(wrapped) is not None
    found = vmain.verifier_error(wrapped)
    assert (found.step, found.checkpoint) == (7, "/ckpt/global_step_7")
    assert vmain.verifier_error(RuntimeError("other")) is None

    def fail(config, task_runner_class=None):
        raise wrapped

    import verl.trainer.main_ppo

    monkeypatch.setattr(verl.trainer.main_ppo, "run_ppo", fail)
    for name in ("select_legacy_trainer", "check_config"):
        monkeypatch.setattr(vmain, name, lambda config: None)
    monkeypatch.setattr("verl.utils.device.auto_set_device", lambda config: None)
    monkeypatch.setattr("verl.utils.config.validate_config", lambda **kw: None)
    cfg = OmegaConf.create({"algorithm": {}, "critic": {}, "trainer": {}})
    monkeypatch.setattr("verl.trainer.ppo.utils.need_critic", lambda config: False)
    monkeypatch.setattr("verl.trainer.ppo.utils.need_reference_policy", lambda config: False)
    with pytest.raises(SystemExit) as e:
        vmain.run(cfg)
    assert e.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "mrtpo verl: stopped after step 7: verifier 'start' failed on example 'e1': returned None; saved "
        "/ckpt/global_step_7; resume with the same command (trainer.resume_mode=auto, verl's default, continues "
        "from the newest checkpoint of trainer.default_local_dir)"
    ]
