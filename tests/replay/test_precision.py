"""Replay in the precisions users train with, and on PEFT models.

- Under ``torch.autocast`` (bf16, fp16: what TRL's ``bf16`` / ``fp16`` turn on through accelerate) and
  with bfloat16 weights, replay's forwards run in that precision and its distances stay within the
  stated bound of a float32 replay of the same weights: ``|d - d32| <= 2 g(delta)`` with ``delta`` the
  largest logit difference between the two precisions on the response's tokens
  (:func:`mrtpo.distance.js_error_bound`). The projection itself is float32 inside any autocast.
- A model whose forward runs under autocast while replay's does not is refused with a message naming
  autocast (the mismatch TRL's bf16 default caused).
- PEFT: a LoRA adapter on the head (and ``modules_to_save``) is applied; replay equals a naive reference
  from the PeftModel's own logits, and the base model's with the adapter disabled.
"""

from __future__ import annotations

import math

import pytest
import torch

from mrtpo import replay as R
from mrtpo.distance import js_error_bound
from mrtpo.head import head_of
from mrtpo.integrations.trl.matrix import _naive_js


def _model(vocab=40, seed=0, tie=True, dtype=torch.float32):
    from mrtpo.models.tiny import build_model

    return build_model(vocab, hidden_size=32, num_layers=2, seed=seed, tie_embeddings=tie, dtype=dtype)


def _requests(vocab=40, n=3, t=7, k=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        shared = torch.randint(3, vocab, (6,), generator=g).tolist()
        infos = [torch.randint(3, vocab, (4,), generator=g).tolist() for _ in range(k)]
        full = shared + [x for b in infos for x in b]
        loo = [shared + [x for i, b in enumerate(infos) if i != j for x in b] for j in range(k)]
        out.append(R.ReplayRequest(torch.randint(3, vocab, (t,), generator=g).tolist(), full, loo))
    return out


def _logits(model, ctx, resp, amp=None):
    ids = torch.tensor([[*ctx, *resp[:-1]]])
    with torch.no_grad(), torch.autocast("cpu", dtype=amp, enabled=amp is not None):
        return model(input_ids=ids).logits[0, len(ctx) - 1 :].double()


@pytest.mark.parametrize("amp", [torch.bfloat16, torch.float16])
def test_autocast_replay_is_within_the_bound_of_float32(amp):
    model = _model()
    reqs = _requests()
    d32 = R.replay(model, reqs).distances.double()
    with torch.autocast("cpu", dtype=amp):
        d = R.replay(model, reqs).distances.double()
    worst_ratio = 0.0
    for j, r in enumerate(reqs):
        zp, zp16 = _logits(model, r.full, r.response), _logits(model, r.full, r.response, amp)
        for k, other in enumerate(r.others):
            zq, zq16 = _logits(model, other, r.response), _logits(model, other, r.response, amp)
            torch.testing.assert_close(d32[j, k], _naive_js(zp, zq), atol=1e-6, rtol=0)  # fp32: exact
            delta = max((zp - zp16).abs().max().item(), (zq - zq16).abs().max().item())
            err = (d[j, k] - d32[j, k]).abs().max().item()
            assert delta > 1e-5  # the half-precision forwards did run (else the check would be empty)
            assert err <= js_error_bound(delta) + 1e-5
            worst_ratio = max(worst_ratio, err / js_error_bound(delta))
    assert 0 < worst_ratio < 1


def test_bfloat16_weights_replay_is_within_the_bound_of_their_float32_copy():
    model16 = _model(dtype=torch.bfloat16)
    model32 = _model(dtype=torch.bfloat16).float()  # the same bf16 values, computed in float32
    reqs = _requests()
    d = R.replay(model16, reqs).distances.double()
    d32 = R.replay(model32, reqs).distances.double()
    for j, r in enumerate(reqs):
        zp, zp16 = _logits(model32, r.full, r.response), _logits(model16, r.full, r.response)
        for k, other in enumerate(r.others):
            zq, zq16 = _logits(model32, other, r.response), _logits(model16, other, r.response)
            delta = max((zp - zp16).abs().max().item(), (zq - zq16).abs().max().item())
            assert (d[j, k] - d32[j, k]).abs().max().item() <= js_error_bound(delta) + 1e-5


def test_the_projection_is_float32_inside_autocast():
    model = _model()
    head = head_of(model)
    h = torch.randn(5, 32)
    exact = (h.double() @ model.lm_head.weight.double().T).float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = head.logits(h)
    assert z.dtype == torch.float32
    torch.testing.assert_close(z, exact, atol=1e-5, rtol=1e-6)


def test_a_forward_under_autocast_with_replay_outside_it_is_refused_naming_autocast():
    """accelerate wraps ``model.forward`` in autocast for TRL's bf16; replay called outside that context
    would compare float32 body passes with bf16 logits (TRL's default before: every run stopped here)."""
    model = _model(seed=3)
    forward = model.forward

    def autocast_forward(*a, **kw):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return forward(*a, **kw)

    model.forward = autocast_forward
    with pytest.raises(ValueError, match="autocast"):
        R.replay(model, _requests())
    with torch.autocast("cpu", dtype=torch.bfloat16):  # inside the same context: accepted
        assert R.replay(model, _requests()).distances.abs().max() > 0


def test_js_error_bound_hand_values():
    # 2 sqrt(delta (e^{2 delta} - 1) / (2 ln 2)); delta = 0.01: e^{0.02} - 1 = 0.0202013
    # -> 2 sqrt(0.01 * 0.0202013 / 1.3862944) = 2 * 0.0120716 = 0.0241432
    assert js_error_bound(0.01) == pytest.approx(0.0241432, rel=1e-5)
    assert js_error_bound(0.0) == 0.0
    assert js_error_bound(1e-4) == pytest.approx(
        2e-4 / math.sqrt(math.log(2)), rel=1e-3
    )  # ~ 2 delta / sqrt(ln 2)


# --------------------------------------------------------------------------------------------------
# PEFT
# --------------------------------------------------------------------------------------------------

peft = pytest.importorskip("peft")


def _peft(model, **kw):
    cfg = peft.LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, task_type="CAUSAL_LM", **kw)
    return peft.get_peft_model(model, cfg)


@pytest.mark.parametrize(
    "kw",
    [
        {"target_modules": ["q_proj", "v_proj", "lm_head"]},  # LoRA on the head itself
        {"target_modules": ["q_proj", "v_proj"], "modules_to_save": ["lm_head"]},
    ],
    ids=["lora_head", "modules_to_save"],
)
def test_replay_of_a_peft_model_uses_the_adapted_policy(kw):
    torch.manual_seed(0)
    model = _peft(_model(tie=False, seed=5), **kw)
    if "modules_to_save" in kw:  # make the trainable head copy differ from the original head
        with torch.no_grad():
            model.base_model.model.lm_head.modules_to_save["default"].weight.mul_(1.5)
    reqs = _requests()
    d = R.replay(model, reqs).distances.double()
    for j, r in enumerate(reqs):
        zp = _logits(model, r.full, r.response)
        for k, other in enumerate(r.others):
            torch.testing.assert_close(
                d[j, k], _naive_js(zp, _logits(model, other, r.response)), atol=1e-6, rtol=0
            )
    # TRL's reference model of a PEFT policy: the same object with the adapter disabled
    with model.disable_adapter():
        d_ref = R.replay(model, reqs).distances.double()
        base = model.get_base_model()
        for j, r in enumerate(reqs):
            zp = _logits(base, r.full, r.response)
            for k, other in enumerate(r.others):
                want = _naive_js(zp, _logits(base, other, r.response))
                torch.testing.assert_close(d_ref[j, k], want, atol=1e-6, rtol=0)
    assert (d - d_ref).abs().max() > 1e-3  # the adapter changes the distances


def test_lora_on_the_head_is_merged_with_autograd():
    """The OPSD student reads the head through full_parameters: the adapter's matrices get gradients."""
    model = _peft(_model(tie=False, seed=6), target_modules=["lm_head"])
    head = head_of(model)
    lora = model.base_model.model.lm_head
    h = torch.randn(3, 32)
    with head.full_parameters() as (w, b):
        z = head.logits(h, w, b)
    torch.testing.assert_close(z, model.base_model.model.lm_head(h), atol=1e-5, rtol=1e-5)
    z.sum().backward()
    assert (
        lora.lora_A["default"].weight.grad.abs().max() > 0
        and lora.lora_B["default"].weight.grad.abs().max() > 0
    )
