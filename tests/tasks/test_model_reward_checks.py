"""Model rewards at real size and checked early: spans from a slow tokenizer, coverage, the fallback of a row
whose attribution raises, gradient checkpointing, the attribution's memory term, the checks at load, the
judge's answer mass, and the fields users set (revision, trust_remote_code, device)."""

from __future__ import annotations

import logging
import math
import time

import pytest
import torch
from transformers.tokenization_python import PythonBackend

from mrtpo import attribution as attr
from mrtpo.prompt import Segment
from mrtpo.tasks import Example
from mrtpo.tasks.faults import score_batch
from mrtpo.tasks.model_reward import ModelReward, parse_model_rewards, prepare_model_rewards
from tests.tasks.test_model_reward import WORDS, LinearScorer


class WordSlow(PythonBackend):
    """A slow (pure Python) word-level tokenizer: transformers gives it no offset mapping."""

    def __init__(self, words, **kw):
        self.vocab = {w: i for i, w in enumerate(["<pad>", "<unk>", "</s>", *words])}
        self.inv = {i: w for w, i in self.vocab.items()}
        super().__init__(pad_token="<pad>", unk_token="<unk>", eos_token="</s>", **kw)

    @property
    def vocab_size(self):
        return len(self.vocab)

    def get_vocab(self):
        return dict(self.vocab)

    def _tokenize(self, text, **kw):
        return text.split()

    def _convert_token_to_id(self, token):
        return self.vocab.get(token, 1)

    def _convert_id_to_token(self, index):
        return self.inv.get(index, "<unk>")

    def convert_tokens_to_string(self, tokens):
        return " ".join(tokens)


def _ex(text="say apple", i=0):
    return Example(f"e{i}", [Segment(text)])


def test_a_slow_tokenizer_gets_spans_from_per_token_decoding():
    """No offsets: the scorer's text "say apple\\n\\ngood apple" decodes as "say apple good apple"; the
    response "good apple" is found there, so its two words get their closed-form influences on their own
    spans (the prompt's "apple" is not mistaken for the response's)."""
    slow = WordSlow(WORDS)
    assert not slow.is_fast and "offset_mapping" not in slow("say apple", return_offsets_mapping=True)
    scorer = LinearScorer(len(slow.vocab), seed=2)
    rm = ModelReward("rm", scorer, tokenizer=slow, device="cpu")
    (res,) = rm.attribute([_ex()], ["good apple"])
    e, u = scorer.emb.weight.detach(), scorer.u.detach()
    want = [((e[slow.vocab[w]] - e[0]) @ u).item() for w in ("good", "apple")]
    assert res.values.tolist() == pytest.approx(want, abs=1e-5)
    # per-token decoding gives a word its joining space: " apple" (the overlap with a policy token is the same)
    assert [("good apple")[a:b] for a, b in res.spans] == ["good", " apple"]


def test_a_response_the_decoding_does_not_contain_is_skipped_never_uniform(caplog):
    """A word the slow tokenizer does not know decodes as <unk>: no scorer token covers the response, so the
    pair is not attributed (skipped 'uncovered', counted, said once) instead of weights of 1 marked as
    attributed; a known response of the same batch is attributed."""
    slow = WordSlow(WORDS)
    rm = ModelReward("rm", LinearScorer(len(slow.vocab), seed=2), tokenizer=slow, device="cpu")
    texts = ["zebra", "good apple"]
    ranges = [[(0, 5)], [(0, 4), (4, 10)]]
    adv = torch.tensor([[1.0], [-1.0]])
    with caplog.at_level(logging.WARNING, logger="mrtpo.attribution"):
        for _ in range(2):
            ga = attr.gradient_attribution([[rm], [rm]], [_ex(), _ex()], texts, ranges, adv, 2)
    assert ga.attributed.tolist() == [[False], [True]]
    assert ga.skipped.tolist() == [[1], [0]]
    assert (ga.weights[0] == 0).all() and ga.weights[1, 0].sum().item() == pytest.approx(2.0)
    assert attr.coverage_counts(ga.attributed, ga.skipped, ["rm"]) == {
        "p2t/rm/attributed": 1,
        "p2t/rm/skipped_uncovered": 1,
        "p2t/rm/skipped_failed": 0,
    }
    assert sum("covers some responses" in r.message for r in caplog.records) == 1


class _FailingOn(ModelReward):
    """A test double around a real ModelReward: its attribution raises ``error`` whenever ``bad`` is among
    the responses (as an out-of-memory error of one long row would)."""

    def __init__(self, *a, bad, error, **k):
        super().__init__(*a, **k)
        self.bad, self.error, self.calls = bad, error, 0

    def attribute(self, examples, responses, **kw):
        self.calls += 1
        if self.bad in responses:
            raise self.error
        return super().attribute(examples, responses, **kw)


@pytest.mark.parametrize("error", [torch.cuda.OutOfMemoryError("CUDA out of memory"), RuntimeError("boom")])
def test_a_row_whose_attribution_raises_falls_back_to_replay_credit(error, caplog):
    """attribution_batch_size 2: the chunk holding the bad row raises, is redone row by row, and only the bad
    row is skipped ('failed', logged once); the others match a scorer that never fails. Through the replay
    kind, the failed row is replayed (its advantage goes to replay) and never stops the step."""
    from mrtpo import attribution

    attribution._logged.discard("failed:rm")
    tok = WordSlow(WORDS)
    scorer = LinearScorer(len(tok.vocab), seed=4)
    rm = _FailingOn(
        "rm", scorer, tokenizer=tok, device="cpu", attribution_batch_size=2, bad="bad", error=error
    )
    ok = ModelReward("rm", scorer, tokenizer=tok, device="cpu")
    texts = ["good apple", "bad", "river stone", "apple"]
    ranges = [[(0, 4), (4, 10)], [(0, 3)], [(0, 5), (5, 11)], [(0, 5)]]
    adv = torch.ones(4, 1)
    exs = [_ex(i=i) for i in range(4)]
    with caplog.at_level(logging.WARNING, logger="mrtpo.attribution"):
        ga = attr.gradient_attribution([[rm]] * 4, exs, texts, ranges, adv, 2)
        attr.gradient_attribution([[rm]] * 4, exs, texts, ranges, adv, 2)
    ref = attr.gradient_attribution([[ok]] * 4, exs, texts, ranges, adv, 2)
    assert ga.attributed[:, 0].tolist() == [True, False, True, True]
    assert ga.skipped[:, 0].tolist() == [0, 2, 0, 0]
    keep = [0, 2, 3]
    torch.testing.assert_close(ga.weights[keep], ref.weights[keep])
    assert sum("such rows take replay credit" in r.message for r in caplog.records) == 1
    assert type(error).__name__ in caplog.text

    from mrtpo.replay.gradient import gradient_replay
    from mrtpo.replay.requests import ReplayBatch, ReplayResult, ReplayStats

    seen = []

    def replay_rewards(a):  # a test double of the engine's replay: records which advantages it replays
        seen.append(a.clone())
        return ReplayResult(torch.full((4, 1, 2), 0.5), torch.full((4,), 2), ReplayStats(), a.abs() > 0)

    ids = [[tok.vocab[w] for w in t.split()] for t in texts]  # the policy's tokens (the same slow tokenizer)
    res = gradient_replay(replay_rewards, ids, adv, ReplayBatch(exs, [[rm]] * 4, tok), width=2)
    assert seen[0][:, 0].tolist() == [0.0, 1.0, 0.0, 0.0]  # only the failed row is replayed
    assert res.skipped[:, 0].tolist() == [0, 2, 0, 0] and res.replayed.all()
    assert res.distances[1, 0].tolist() == [0.5, 0.5]


def test_gradient_checkpointing_recomputes_and_gives_the_same_influence(rm_dir):
    """With checkpointing every layer runs twice per attribution (forward, then recomputed in the backward),
    in eval mode (no dropout); the influence is the same as without."""
    on = ModelReward("rm", rm_dir, device="cpu")
    off = ModelReward("rm", rm_dir, device="cpu", gradient_checkpointing=False)
    exs, rs = [_ex("say the")] * 2, ["the good word", "say it"]
    counts = {}
    for name, rm in (("on", on), ("off", off)):
        model, _ = rm._load()
        attn = model.model.layers[0].self_attn
        n = [0]
        h = attn.register_forward_pre_hook(lambda *a, n=n: n.__setitem__(0, n[0] + 1))
        res = rm.attribute(exs, rs)
        h.remove()
        counts[name] = (n[0], res)
        assert not model.training and not model.model.layers[0].training  # left in eval mode
    assert counts["on"][0] == 4 and counts["off"][0] == 2  # 2 rows, attribution_batch_size 1
    for a, b in zip(counts["on"][1], counts["off"][1], strict=True):
        torch.testing.assert_close(a.values, b.values, atol=1e-5, rtol=1e-4)


def test_attribution_activation_bytes_by_hand():
    """A 7B-shaped scorer (28 layers, H = 3584, I = 18944) at 2,048 tokens in bf16: 5H + 3I = 74,752 values
    per token per layer. Batch 8 without checkpointing: 8 · 2048 · (28 · 74752 · 2 + 2 · 3584 · 4) bytes =
    69,055,021,056 (64.3 GiB); batch 1 with it: 2048 · ((28 · 3584 + 74752) · 2 + 28672) = 775,946,240
    (0.72 GiB)."""
    shape = {"layers": 28, "hidden": 3584, "intermediate": 18944, "tokens": 2048}
    full = attr.attribution_activation_bytes(**shape, batch=8, checkpointing=False)
    assert full == 69_055_021_056
    assert attr.attribution_activation_bytes(**shape) == 775_946_240
    assert attr.attribution_activation_bytes(**shape) < 1 << 30  # fits 1 GiB beside the weights


def test_saved_activations_follow_the_memory_term(rm_dir):
    """The bytes autograd saves in a tiny scorer's attribution forward, with and without checkpointing,
    against attribution_activation_bytes at its shapes (float32): each within a factor 2."""
    rows = []
    for ckpt in (False, True):
        rm = ModelReward("rm", rm_dir, device="cpu", gradient_checkpointing=ckpt)
        rm._load()
        seen: dict[int, int] = {}

        def pack(t, seen=seen):
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            rm.attribute([_ex("say the " * 40)], ["the good word " * 40])
        cfg = rm._model.config
        tokens = len(rm._encode(_ex("say the " * 40), "the good word " * 40)[0])
        params = {p.untyped_storage().data_ptr() for p in rm._model.parameters()}
        saved = sum(n for ptr, n in seen.items() if ptr not in params)
        term = attr.attribution_activation_bytes(
            layers=cfg.num_hidden_layers,
            hidden=cfg.hidden_size,
            intermediate=cfg.intermediate_size,
            tokens=tokens,
            dtype_bytes=4,
            checkpointing=ckpt,
        )
        # checkpointing: autograd keeps each layer's input (what this hook sees); the layer recomputed in the
        # backward saves its own activations inside the checkpoint (hidden from the hook), so the hook is
        # compared with the term less that one layer's 5H + 3I values per token
        seen_part = term - (0 if not ckpt else tokens * (5 * cfg.hidden_size + 3 * cfg.intermediate_size) * 4)
        rows.append((saved, term))
        assert seen_part / 2 <= saved <= seen_part * 2, (ckpt, saved, seen_part)
    assert rows[1][0] < rows[0][0]  # checkpointing saves less


# --------------------------------------------------------------------------------------------------
# Checked at the start: one line each, before the first generation
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    """A causal LM (no classification head) saved with a tokenizer."""
    from mrtpo.models.tiny import build_model, build_tokenizer

    tok = build_tokenizer(WORDS)
    path = tmp_path_factory.mktemp("lm")
    build_model(len(tok), hidden_size=32, seed=1, dtype=torch.float32).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def _refusal(tmp_path, entry, monkeypatch=None):
    """The trainer's one-line refusal of a task with the model reward ``entry``, and how long it took."""
    from mrtpo.tasks.model_reward import WithModelRewards
    from tests.integrations.trl.test_trainer import TinyTask, make_trainer

    t0 = time.perf_counter()
    with pytest.raises(ValueError) as e:
        make_trainer(tmp_path / "run", task=WithModelRewards(TinyTask(), [entry]), max_steps=1)
    return str(e.value), time.perf_counter() - t0


def test_bad_model_rewards_are_one_line_at_trainer_start(tmp_path, lm_dir, monkeypatch):
    """A missing folder, a hub id that is not cached while offline, a causal LM given as a classifier and a
    judge without a rubric: each refused by the trainer's init (before any generation) in one line naming
    the reward, in under 10 s."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cases = [
        ({"name": "rm", "model": str(tmp_path / "nowhere"), "device": "cpu"}, "does not exist"),
        ({"name": "rm", "model": "mrtpo-tests/not-a-cached-model", "device": "cpu"}, "HF_HUB_OFFLINE is set"),
        ({"name": "rm", "model": lm_dir, "device": "cpu"}, "initialised at random (score.weight)"),
        ({"name": "rm", "model": lm_dir, "kind": "judge", "device": "cpu"}, "a judge needs a rubric"),
    ]
    for entry, why in cases:
        msg, seconds = _refusal(tmp_path, entry)
        assert "\n" not in msg and why in msg, msg
        assert msg.startswith("model reward 'rm'") or msg.startswith("task.options.model_rewards"), msg
        assert seconds < 10, (entry, seconds)


def test_prepare_loads_once_and_sets_the_pad_token(tmp_path):
    """A tokenizer without a pad token gets its end-of-sequence token (as TRL does), and the classifier's
    config the same id; prepare loads the scorer before any verdict."""
    from mrtpo.models.tiny import build_classifier, build_tokenizer

    tok = build_tokenizer(WORDS)
    eos = tok.eos_token_id
    tok.pad_token = None
    assert tok.pad_token_id is None and eos is not None
    model = build_classifier(len(tok), seed=2)
    model.config.pad_token_id = None
    path = tmp_path / "rm"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    rm = ModelReward("rm", str(path), device="cpu")
    prepare_model_rewards([rm], _ex())
    assert rm._model is not None
    assert rm.scorer.tokenizer.pad_token_id == eos and rm._model.config.pad_token_id == eos


def test_a_judge_that_does_not_answer_is_a_failed_verdict(tmp_path, lm_dir):
    """P(yes or no) over the judge's vocabulary below min_answer_mass fails the verdict (a fault naming the
    mass and the floor), in a batch too; above the floor it scores."""
    rubric = "is it good"
    strict = ModelReward("j", lm_dir, kind="judge", rubric=rubric, device="cpu", min_answer_mass=0.999)
    d = strict.log_odds([_ex()], ["apple"])
    mass = strict.last_answer_mass[0]
    assert 0 < mass < 0.999
    with pytest.raises(ValueError, match=r"below min_answer_mass=0.999"):
        strict.verdict(_ex(), "apple")
    _, faults = score_batch([[strict], [strict]], [_ex(), _ex(i=1)], ["apple", "good"], ["j"])
    assert len(faults) == 2 and "min_answer_mass" in faults[0].cause
    loose = ModelReward("j", lm_dir, kind="judge", rubric=rubric, device="cpu", min_answer_mass=mass / 2)
    assert loose.verdict(_ex(), "apple").value == pytest.approx(
        1 / (1 + torch.exp(-torch.tensor(d[0]))).item()
    )


def test_the_judges_answer_mass_is_kept_once_per_verdict_for_the_step_log(lm_dir, rm_dir):
    """Each verdict's P(yes or no) is kept until taken (the trainer logs their mean and min per step): a batch
    call keeps one per response; a batch that fails the floor is redone row by row and still keeps one per
    response (the batch's own are dropped), each equal to a direct forward's."""
    from mrtpo.tasks.model_reward import answer_mass_metrics, answer_mass_parts, judge_columns

    exs, texts = [_ex(), _ex(i=1)], ["apple", "good"]
    ref = ModelReward("j", lm_dir, kind="judge", rubric="is it good", device="cpu", min_answer_mass=0.0)
    want = []
    for ex, t in zip(exs, texts):
        ref.log_odds([ex], [t])
        want += ref.last_answer_mass
    assert len(want) == 2 and all(0 < m < 1 for m in want) and want[0] != want[1]
    for floor, failed in ((0.0, 0), (0.999, 2)):
        j = ModelReward("j", lm_dir, kind="judge", rubric="is it good", device="cpu", min_answer_mass=floor)
        _, faults = score_batch([[j], [j]], exs, texts, ["j"])
        assert len(faults) == failed
        assert judge_columns([ModelReward("rm", rm_dir, device="cpu"), j]) == [1]  # a classifier is no judge
        parts = answer_mass_parts([[j], [j]], [0])
        assert parts[0][:2] == pytest.approx([want[0] + want[1], 2.0], rel=1e-5)
        assert parts[0][2] == pytest.approx(min(want), rel=1e-5)
        assert j.take_answer_mass() == (0.0, 0, math.inf)  # taken
        assert answer_mass_metrics(parts, ["j"]) == {
            "judge/j/answer_mass": pytest.approx((want[0] + want[1]) / 2, rel=1e-5),
            "judge/j/answer_mass_min": pytest.approx(min(want), rel=1e-5),
        }
    assert answer_mass_metrics([[0.0, 0.0, math.inf]], ["j"]) == {}  # no verdict: nothing logged


def test_the_fields_users_expect():
    (rm,) = parse_model_rewards(
        [{"name": "rm", "model": "/x", "revision": "v1", "trust_remote_code": True, "device": "cuda:1"}]
    )
    assert (rm.revision, rm.trust_remote_code, rm.device) == ("v1", True, "cuda:1")
    (default,) = parse_model_rewards([{"name": "rm", "model": "/x"}])
    assert default.trust_remote_code is False and default.attribution_batch_size == 1
    for field, value, why in (
        ("trust_remote_code", "yes", "must be true or false"),
        ("revision", "", "must be a branch, tag or commit"),
        ("attribution_batch_size", 0, "must be an integer >= 1"),
        ("min_answer_mass", 1.5, "must be a number in [0, 1)"),
        ("device", "gpu please", "must be 'auto' or a torch device"),
    ):
        with pytest.raises(ValueError) as e:
            parse_model_rewards([{"name": "rm", "model": "/x", field: value}])
        assert str(e.value).startswith(f"task.options.model_rewards[0]: {field}=") and why in str(e.value)


def test_rest_on_cpu_moves_the_scorer_for_each_call_only(rm_dir, monkeypatch):
    """rest_on_cpu: the scorer is on the CPU between calls and on its device during one (recorded through
    a spy on ``Module.to``); the verdict is the same as a scorer that stays put."""
    rm = ModelReward("rm", rm_dir, device="cpu", rest_on_cpu=True)
    model, _ = rm._load()
    moves = []
    to = type(model).to
    monkeypatch.setattr(
        type(model), "to", lambda self, *a, **k: (moves.append(str(a[0])), to(self, *a, **k))[1]
    )
    v = rm.verdict(_ex(), "apple").value
    assert moves == ["cpu", "cpu"]  # to the device ("cpu" here), then back
    assert v == pytest.approx(ModelReward("rm", rm_dir, device="cpu").verdict(_ex(), "apple").value, abs=1e-6)
