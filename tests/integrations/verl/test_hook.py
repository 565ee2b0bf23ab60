"""mrtpo.integrations.verl.hook: verl's reward manager and compute_advantage through the hook, delegation,
install before and after verl's import, verl's own Ray trainer."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from mrtpo import advantages as adv_mod
from mrtpo import credit as credit_mod
from mrtpo import replay as replay_mod
from mrtpo.integrations.verl import adapter as va
from mrtpo.integrations.verl import hook as verl_hook
from tests.integrations.verl.common import (
    EXAMPLES,
    KEYS,
    _score_like_verl,
    _toy_dataproto,
)


def test_reward_manager_and_hook_end_to_end(DataProto, toy_tok, toy_model):
    data = _toy_dataproto(DataProto, toy_tok)
    out = _score_like_verl(data, toy_tok)
    # verdicts by hand (columns start, end, include, length, wrap):
    expected = torch.tensor(
        [
            [1, 1, 1, 1, 1],  # all met
            [1, 1, 1, 0, 0],  # 3 words, no tags
            [0, 1, 0, 0, 1],  # cloud first, no stone, 3 != 4 words, wrapped
            [1, 0, 1, 1, 0],  # e1 lists start tiger, include lemon, length 3 (end, wrap unlisted: 0)
            [1, 0, 0, 0, 0],  # 4 words, no lemon
            [0, 0, 1, 1, 0],  # lemon first
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(va.reward_matrix(data.non_tensor_batch, KEYS), expected)
    totals = out["reward_tensor"].sum(1)
    torch.testing.assert_close(totals, expected.sum(1).float())
    last = data.batch["response_mask"].sum(1) - 1
    assert torch.equal(out["reward_tensor"][torch.arange(6), last], totals)  # at the last valid token

    cfg = {"norm_adv_by_std_in_grpo": True, "mrtpo": {"credit": "reward", "credit_beta": 0.5}}
    calls = []
    distances_for = va.make_distances_for(toy_model, toy_tok)

    def counting(d):  # a DistancesFor that records what the hook asks
        of_batch = distances_for(d)

        def distances(kind, a):
            calls.append((a.clone(), kind))
            return of_batch(kind, a)

        return distances

    va.compute_advantage(data, "mrtpo_gdpo", config=cfg, distances_for=counting)
    mask = data.batch["response_mask"]
    a_ref = adv_mod.compute(
        "gdpo", expected, [f"u{j // 3}" for j in range(6)], reward_min=[0] * 5, reward_max=[1] * 5
    )
    assert len(calls) == 1 and calls[0][1] == "reward"
    torch.testing.assert_close(calls[0][0], a_ref.float())

    # naive reference distances: one response at a time through mrtpo.replay.distances, skipped pairs 0
    d_ref = torch.zeros(6, 5, mask.shape[1])
    for j in range(6):
        ctx = replay_mod.build_contexts(toy_tok, EXAMPLES[j // 3].segments, KEYS)
        resp = data.batch["responses"][j, : int(mask[j].sum())].tolist()
        d = replay_mod.distances(toy_model, [list(ctx.full), *map(list, ctx.leave_one_out)], resp)  # [K, T_j]
        keep = (a_ref[j].abs() > adv_mod.ACTIVE_TOL).float()[:, None]
        d_ref[j, :, : d.shape[1]] = d * keep
    torch.testing.assert_close(data.batch[va.DISTANCES_KEY], d_ref, atol=1e-5, rtol=1e-5)
    assert data.meta_info["mrtpo/replay"]["pairs_skipped"] == int((a_ref.abs() <= adv_mod.ACTIVE_TOL).sum())
    assert data.meta_info["mrtpo/replay"]["pairs_skipped"] > 0  # end and wrap are constant in group e1

    tok_ref = credit_mod.allocate(a_ref.float(), d_ref, mask, beta=0.5)
    torch.testing.assert_close(data.batch["advantages"], tok_ref, atol=1e-5, rtol=1e-5)
    assert torch.equal(data.batch["returns"], data.batch["advantages"])
    assert (data.batch["advantages"][mask == 0] == 0).all()

    # a second call reuses the stored distances (no replay) and gives the same advantages
    before = data.batch["advantages"].clone()
    va.compute_advantage(data, "mrtpo_gdpo", config=cfg, distances_for=counting)
    assert len(calls) == 1 and torch.equal(data.batch["advantages"], before)


def test_hook_delegates_other_estimators(DataProto, toy_tok):
    data = _toy_dataproto(DataProto, toy_tok)
    seen = {}

    def original(data, adv_estimator, gamma, lam, num_repeat, norm_adv_by_std_in_grpo, config):
        seen.update(
            est=adv_estimator, gamma=gamma, lam=lam, n=num_repeat, norm=norm_adv_by_std_in_grpo, cfg=config
        )
        return data

    assert va.compute_advantage(data, "grpo", 0.9, 0.8, 4, False, {"x": 1}, original=original) is data
    assert seen == {"est": "grpo", "gamma": 0.9, "lam": 0.8, "n": 4, "norm": False, "cfg": {"x": 1}}
    with pytest.raises(ValueError, match="not an mrtpo estimator"):
        va.compute_advantage(data, "gae")


# install(): registry and the import hook


def test_install_hooks_a_module_imported_later(core_algos, tmp_path, monkeypatch):
    pkg = tmp_path / "fake_verl_trainer"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "ray_trainer.py").write_text(
        textwrap.dedent(
            """
            def compute_advantage(data, adv_estimator, gamma=1.0, lam=1.0, num_repeat=1,
                                  norm_adv_by_std_in_grpo=True, config=None):
                data["called"] = adv_estimator
                return data

            def fit(data, name):  # calls the module global, as RayPPOTrainer.fit does
                return compute_advantage(data, adv_estimator=name, gamma=1.0, lam=1.0, num_repeat=1,
                                         norm_adv_by_std_in_grpo=True, config=None)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    name = "fake_verl_trainer.ray_trainer"
    try:
        names = va.install(modules=[name])
        assert name not in sys.modules
        assert set(names) == {f"mrtpo_{m}" for m in adv_mod.available()}
        assert all(core_algos.get_adv_estimator_fn(nm) is va.make_estimator(nm[6:]) for nm in names)
        import fake_verl_trainer.ray_trainer as rt

        hooked = rt.compute_advantage
        assert hooked.func is va.compute_advantage and hooked.keywords["distances_for"] is None
        assert rt.fit({}, "grpo") == {"called": "grpo"}  # other names reach the original
        with pytest.raises(ValueError, match="mrtpo estimators need non_tensor_batch\\['uid'\\]"):
            rt.fit(
                type("D", (), {"batch": {"response_mask": torch.ones(1, 1)}, "non_tensor_batch": {}})(),
                "mrtpo_gdpo",
            )
        # a second install rebinds distances_for and keeps verl's original
        fn = object()
        va.install(distances_for=fn, modules=[name])
        assert rt.compute_advantage.keywords == {
            "original": hooked.keywords["original"],
            "distances_for": fn,
            "step_fn": None,
            "run_folder": None,
        }
        assert rt.compute_advantage.keywords["original"].__module__ == name
    finally:
        sys.modules.pop(name, None)
        sys.modules.pop("fake_verl_trainer", None)
        sys.meta_path[:] = [
            f for f in sys.meta_path if not (isinstance(f, verl_hook._AfterImport) and f.name == name)
        ]


def test_hook_in_verls_own_ray_trainer(DataProto, toy_tok):
    rt = pytest.importorskip("verl.trainer.ppo.ray_trainer", reason="verl's ray_trainer imports (verl extra)")
    from omegaconf import OmegaConf

    original = getattr(rt.compute_advantage, "__mrtpo_original__", rt.compute_advantage)
    try:
        va.install()
        assert rt.compute_advantage.func is va.compute_advantage
        assert rt.compute_advantage.keywords["original"] is original
        data = _toy_dataproto(DataProto, toy_tok)
        _score_like_verl(data, toy_tok)
        kw = {"gamma": 1.0, "lam": 1.0, "num_repeat": 3, "norm_adv_by_std_in_grpo": True}
        cfg = OmegaConf.create(
            {"norm_adv_by_std_in_grpo": True, "gdpo_reward_keys": KEYS, "mrtpo": {"credit": "none"}}
        )
        # mrtpo_grpo through the hook == verl's GRPO, which the hook hands to verl's own function
        ours = (
            rt.compute_advantage(data, adv_estimator="mrtpo_grpo", config=cfg, **kw)
            .batch["advantages"]
            .clone()
        )
        verl_grpo = rt.compute_advantage(data, adv_estimator=rt.AdvantageEstimator.GRPO, config=cfg, **kw)
        torch.testing.assert_close(ours, verl_grpo.batch["advantages"], atol=2e-6, rtol=1e-6)
        # group e0 totals [5, 3, 2]: mean 3.3333, std 1.5275 -> [1.0911, -0.2182, -0.8729];
        # group e1 totals [3, 1, 2]: mean 2, std 1 -> [1, -1, 0]
        torch.testing.assert_close(
            ours[:, 0], torch.tensor([1.0911, -0.2182, -0.8729, 1.0, -1.0, 0.0]), atol=1e-4, rtol=0
        )
        # mrtpo_gdpo with token whitening == verl's gdpo (its reward keys are the same reward_extra_info columns)
        cfg.mrtpo = {"credit": "none", "options": {"whiten": "token"}}
        ours = (
            rt.compute_advantage(data, adv_estimator="mrtpo_gdpo", config=cfg, **kw)
            .batch["advantages"]
            .clone()
        )
        verl_gdpo = rt.compute_advantage(data, adv_estimator="gdpo", config=cfg, **kw).batch["advantages"]
        torch.testing.assert_close(ours, verl_gdpo, atol=1e-5, rtol=1e-5)
    finally:
        rt.compute_advantage = original
