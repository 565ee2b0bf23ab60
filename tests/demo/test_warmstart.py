"""The demo's supervised warm start: batch layout, loss, schedule, reproducibility from a seed."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from mrtpo.demo.warmstart import DemoBatcher, WarmStartConfig, load_warm_start, train_warm_start
from mrtpo.models.sft import lr_factor, new_model, new_optimizer, response_loss, sft_step
from mrtpo.tasks.toy import build_toy_tokenizer, generate_examples, make_example


@pytest.fixture(scope="module")
def tok():
    return build_toy_tokenizer()


def test_lr_factor_hand_values():
    # warmup 10 of 110 steps: (s + 1) / 10 while warming up, then 0.1 + 0.9 (1 + cos(pi p)) / 2
    assert lr_factor(0, 10, 110) == pytest.approx(0.1)
    assert lr_factor(9, 10, 110) == pytest.approx(1.0)
    assert lr_factor(10, 10, 110) == pytest.approx(1.0)  # p = 0
    assert lr_factor(60, 10, 110) == pytest.approx(0.55)  # p = 0.5: 0.1 + 0.9 * 0.5
    assert lr_factor(110, 10, 110) == pytest.approx(0.1)  # p = 1
    assert lr_factor(85, 10, 110) == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi * 0.75)) / 2)
    # held at 1 until decay_start = 70, then cosine over the last 40 steps: p = (90 - 70) / 40 = 0.5
    assert lr_factor(69, 10, 110, decay_start=70) == 1.0
    assert lr_factor(90, 10, 110, decay_start=70) == pytest.approx(0.55)
    assert lr_factor(110, 10, 110, decay_start=70) == pytest.approx(0.1)


def test_prompt_ids_match_the_chat_template(tok):
    b = DemoBatcher(tok)
    rng = random.Random(0)
    from mrtpo.tasks.toy import demonstrate

    for ex in generate_examples(40, seed=2, min_constraints=2):
        text = tok.apply_chat_template(ex.messages(), tokenize=False, add_generation_prompt=True)
        assert b.prompt_ids(ex) == tok(text, add_special_tokens=False)["input_ids"]
        d = demonstrate(ex, rng)
        assert b.word_ids(d) == tok(d, add_special_tokens=False)["input_ids"]


def test_batch_layout(tok):
    b = DemoBatcher(tok)
    assert (b.prompt_len, b.response_len) == (15, 10)  # 5 + 2 * 5 constraints; 7 words + 2 tags + eos
    ex = make_example({"start": "apple", "length": 3}, "x", order=["length", "start"])
    ids, mask, labels = b.encode([ex], ["apple stone river"])
    assert ids.shape == mask.shape == labels.shape == (1, 25)
    want_prompt = tok.convert_tokens_to_ids(
        ["<|im_start|>", "user", "3", "words", "apple", "first", "<|im_end|>", "<|im_start|>", "assistant"]
    )
    want_resp = [*tok.convert_tokens_to_ids(["apple", "stone", "river"]), tok.eos_token_id]
    pad = tok.pad_token_id
    # 9 prompt tokens left-padded to 15; the response starts at position 15 in every row
    assert ids[0].tolist() == [pad] * 6 + want_prompt + want_resp + [pad] * 6
    assert mask[0].tolist() == [0] * 6 + [1] * 13 + [0] * 6
    assert labels[0].tolist() == [-100] * 15 + want_resp + [-100] * 6


def test_response_loss_matches_a_loop(tok):
    from mrtpo.models.tiny import build_model

    model = build_model(len(tok), hidden_size=32, num_layers=1, max_positions=64, seed=1, dtype=torch.float32)
    b = DemoBatcher(tok)
    ids, mask, labels = b.sample(random.Random(3), 4)
    got = response_loss(model, ids, mask, labels)
    with torch.no_grad():
        logp = model(input_ids=ids, attention_mask=mask).logits.log_softmax(-1)  # [B, W, V]
    terms = [
        -logp[i, t - 1, labels[i, t]].item()
        for i in range(ids.shape[0])
        for t in range(1, ids.shape[1])
        if labels[i, t] != -100
    ]
    assert got.item() == pytest.approx(sum(terms) / len(terms), rel=1e-5)


def test_sft_helpers_build_and_step_as_the_warm_starts_train(tok):
    """new_model: the config's sizes (heads: the tiny model's defaults when the config has none), eos and
    pad of the tokenizer; new_optimizer: AdamW whose rate follows lr_factor; sft_step: one clipped step
    that returns the loss before it."""
    from types import SimpleNamespace

    config = SimpleNamespace(
        hidden_size=32, num_layers=1, seed=1, lr=0.01, weight_decay=0.0, warmup_steps=2, steps=6
    )
    model = new_model(tok, config, max_positions=64)
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (32, 1)
    assert (model.config.num_attention_heads, model.config.num_key_value_heads) == (4, 2)
    assert model.generation_config.eos_token_id == tok.eos_token_id
    assert model.generation_config.pad_token_id == tok.pad_token_id
    assert next(model.parameters()).dtype == torch.float32
    opt, sched = new_optimizer(model, config, decay_start=3)
    assert opt.param_groups[0]["betas"] == (0.9, 0.98)
    rates = []
    ids, mask, labels = DemoBatcher(tok).sample(random.Random(3), 4)
    for _ in range(5):
        rates.append(opt.param_groups[0]["lr"])
        with torch.no_grad():
            before = response_loss(model, ids, mask, labels).item()
        assert sft_step(model, opt, sched, ids, mask, labels) == pytest.approx(before, rel=1e-5)
    assert rates == pytest.approx([0.01 * lr_factor(s, 2, 6, decay_start=3) for s in range(5)])
    with torch.no_grad():
        assert response_loss(model, ids, mask, labels).item() < before  # five steps on one batch


def test_config_errors():
    with pytest.raises(ValueError, match="p_meet"):
        WarmStartConfig(p_meet=1.5)
    with pytest.raises(ValueError, match="steps"):
        WarmStartConfig(steps=0)
    with pytest.raises(ValueError, match="clean_steps"):
        WarmStartConfig(steps=10, clean_steps=11)


@pytest.fixture
def one_thread():
    """One torch thread for the test, restored afterwards so later tests keep conftest's setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_warm_start_is_reproducible_from_its_seed(tmp_path, one_thread):
    small = dict(steps=4, clean_steps=2, batch_size=8, warmup_steps=2, eval_examples=8, eval_every=2)
    m1, t1, info1 = train_warm_start(WarmStartConfig(seed=3, **small), tmp_path / "a", progress=False)
    m2, _, info2 = train_warm_start(WarmStartConfig(seed=3, **small), tmp_path / "b", progress=False)
    m3, _, _ = train_warm_start(WarmStartConfig(seed=4, **small), None, progress=False)
    s1, s2, s3 = m1.state_dict(), m2.state_dict(), m3.state_dict()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)  # bit for bit
    assert not all(torch.equal(s1[k], s3[k]) for k in s1)
    assert info1["final_loss"] == info2["final_loss"]
    assert info1["curve"] == info2["curve"] and [c["step"] for c in info1["curve"]] == [2, 4]
    assert info1["parameters"] == sum(p.numel() for p in m1.parameters())
    for part in ("sampled", "greedy"):
        assert 0.0 <= info1[part]["satisfaction"] <= 1.0
    # the saved folder loads back to the same function
    m4, t4, info4 = load_warm_start(tmp_path / "a")
    ids = torch.tensor([t1.convert_tokens_to_ids(["<|im_start|>", "user", "apple", "first", "<|im_end|>"])])
    with torch.no_grad():
        assert torch.equal(m1(input_ids=ids).logits, m4(input_ids=ids).logits)
    assert info4["final_loss"] == info1["final_loss"]
    assert len(t4) == len(t1) == 72
    text = "<|im_start|> user <b> wrapped 5 words <|im_end|> <|im_start|> assistant "
    assert t4(text)["input_ids"] == t1(text)["input_ids"]  # the word-level tokenizer, not a BPE class
    assert t4.decode(t4("<b> apple </b>")["input_ids"]) == "<b> apple </b>"
    with pytest.raises(FileNotFoundError):
        load_warm_start(tmp_path / "missing")


def test_warm_starts_share_the_copy_phase(tmp_path, one_thread):
    """Two warm starts continue one saved copy phase and differ only in their imperfect phase; the same
    warm start twice is the same model, bit for bit, and equals train_warm_start."""
    from mrtpo.demo.warmstart import imperfect_seed, train_copy_phase, train_imperfect_phase

    cfg = WarmStartConfig(
        seed=3, steps=4, clean_steps=2, batch_size=8, warmup_steps=2, eval_examples=8, eval_every=1
    )
    copy = train_copy_phase(cfg, tmp_path, progress=False)
    m0, _, i0 = train_imperfect_phase(cfg, copy, 0, tmp_path / "ws0", progress=False)
    m0b, _, _ = train_imperfect_phase(cfg, copy, 0, None, progress=False)
    m1, _, i1 = train_imperfect_phase(cfg, copy, 1, tmp_path / "ws1", progress=False)
    s0, s0b, s1 = m0.state_dict(), m0b.state_dict(), m1.state_dict()
    assert all(torch.equal(s0[k], s0b[k]) for k in s0)
    assert not all(torch.equal(s0[k], s1[k]) for k in s0)
    # the probe curve of the copy phase (steps 1, 2) is shared; the imperfect phase's (3, 4) is not
    assert i0["curve"][:2] == i1["curve"][:2] and [c["step"] for c in i0["curve"]] == [1, 2, 3, 4]
    assert (i0["warm_start"], i1["warm_start"]) == (0, 1)
    assert json.loads((tmp_path / "ws1" / "warmstart.json").read_text())["warm_start"] == 1
    m, _, _ = train_warm_start(cfg, None, warm_start=1, progress=False)
    assert all(torch.equal(m.state_dict()[k], s1[k]) for k in s1)
    # each imperfect phase draws its own data: distinct seeds, none equal to the copy phase's
    assert len({imperfect_seed(3, w) for w in range(5)} | {3}) == 6
    with pytest.raises(ValueError, match=r"other warm-start settings \(differs in \['p_meet'\]\)"):
        train_imperfect_phase(WarmStartConfig(**{**cfg.__dict__, "p_meet": 0.3}), copy, 0, progress=False)
