"""Supervised warm start of the demo: a tiny model learns to copy constraint words from the prompt.

The warm-started policy must know the response format and be able to copy a word from the prompt,
yet meet each constraint only part of the time when it samples, so RL has headroom. Two phases of
plain supervised fine-tuning on generated demonstrations (:func:`mrtpo.tasks.toy.demonstrate`):

1. ``clean_steps`` steps on demonstrations that meet every listed constraint, at the peak learning
   rate: the model learns to copy. Measured on this machine: with imperfect demonstrations from the
   start (64 per step, keyword-then-value prompts) the probability of the start word at the first
   response position was still 0.035 (chance: 1/46) after 2,500 steps; with clean demonstrations,
   256 per step, sampled responses meet the start constraint more than half the time after 500 to
   700 steps (warm-start seeds 0, 1, 2);
2. the remaining steps on imperfect demonstrations (each listed constraint met with probability
   ``p_meet`` = 0.5), with cosine decay of the learning rate: sampled responses then meet about a
   third of their constraints (measured: 0.34 on held-out prompts at the defaults) while greedy
   decoding still copies the start and include words.

Several warm starts (``mrtpo demo`` trains three) share phase 1 (:func:`train_copy_phase`, from
``seed``) and differ in phase 2 (:func:`train_imperfect_phase`): each draws its imperfect demonstrations
and their order from its own seed (:func:`imperfect_seed`). The RL results then vary with the warm
start as they vary between machines, whose float differences change the warm start and with it every
trajectory, at the cost of one copy phase plus one short phase per warm start.

Prompts list 2–5 constraints, so the leave-one-out contexts of 3–5-constraint prompts look like
training prompts. The loss is cross-entropy on the response tokens and ``<eos>`` (prompt tokens are
not scored); AdamW; a fresh batch every step. Prompts are left-padded and responses right-padded to
fixed lengths, so the response starts at the same position in every row. Everything is drawn from
``seed`` (``random.Random`` for the data, ``torch.manual_seed`` for the initialisation), so a run is
reproducible bit for bit on the same machine, torch build and thread count (a test checks it).
"""

from __future__ import annotations

import json
import pickle
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mrtpo.models.sft import new_model, new_optimizer, save_warm_start, sft_step


@dataclass
class WarmStartConfig:
    """Settings of the supervised warm start."""

    seed: int = field(default=0, metadata={"help": "seed of the initialisation and the generated data"})
    steps: int = field(
        default=1000,
        metadata={
            "help": "optimizer steps of a warm start, the shared copy phase included (one fresh batch each)"
        },
    )
    clean_steps: int = field(
        default=800,
        metadata={
            "help": "the copy phase (shared by the demo's warm starts): first steps on demonstrations that meet "
            "every constraint (the model learns to copy); the rest use p_meet, and the learning rate decays "
            "over them"
        },
    )
    batch_size: int = field(default=256, metadata={"help": "demonstrations per step"})
    lr: float = field(default=5e-3, metadata={"help": "peak AdamW learning rate"})
    warmup_steps: int = field(default=50, metadata={"help": "linear warm-up steps"})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay"})
    p_meet: float = field(
        default=0.5,
        metadata={"help": "probability a demonstration meets each listed constraint (after clean_steps)"},
    )
    min_constraints: int = field(default=2, metadata={"help": "fewest constraints in a training prompt"})
    max_constraints: int = field(default=5, metadata={"help": "most constraints in a training prompt"})
    hidden_size: int = field(default=64, metadata={"help": "model width d"})
    num_layers: int = field(default=2, metadata={"help": "transformer layers"})
    num_heads: int = field(default=4, metadata={"help": "attention heads"})
    num_kv_heads: int = field(default=2, metadata={"help": "key/value heads"})
    eval_examples: int = field(
        default=256, metadata={"help": "test prompts (3–5 constraints) for the final check"}
    )
    eval_every: int = field(
        default=100,
        metadata={
            "help": "every this many steps, record the sampled satisfaction on 64 test prompts (0: off)"
        },
    )

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError(
                f"steps and batch_size must be >= 1, got steps={self.steps}, batch_size={self.batch_size}"
            )
        if not 0.0 <= self.p_meet <= 1.0:
            raise ValueError(f"p_meet must be in [0, 1], got {self.p_meet}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0 <= self.clean_steps <= self.steps:
            raise ValueError(f"clean_steps must be in [0, steps={self.steps}], got {self.clean_steps}")


class DemoBatcher:
    """Builds padded token batches of (prompt, demonstration) pairs for the warm start.

    Rows are ``[pad ... pad, prompt, response, <eos>, pad ...]``: prompts left-padded to
    ``prompt_len``, responses right-padded to ``response_len`` (longest response + ``<eos>``).
    """

    def __init__(self, tokenizer, *, p_meet: float = 0.5, min_constraints: int = 2, max_constraints: int = 5):
        from mrtpo.tasks.toy.data import CONSTRAINT_TYPES, LENGTHS

        self.tok = tokenizer
        self._vocab = tokenizer.get_vocab()
        self.p_meet = p_meet
        self.min_constraints, self.max_constraints = min_constraints, max_constraints
        # longest prompt: chat frame (<|im_start|> user ... <|im_end|> <|im_start|> assistant = 5) + 2 per constraint
        self.prompt_len = 5 + 2 * len(CONSTRAINT_TYPES)
        self.response_len = max(LENGTHS) + 2 + 1  # words + two tags + <eos>

        # the chat template rendered once around a placeholder: rendering it per row costs as much as
        # a training step of the tiny model
        frame = self.tok.apply_chat_template(
            [{"role": "user", "content": "\x00"}], tokenize=False, add_generation_prompt=True
        )
        head, tail = frame.split("\x00")
        self._head, self._tail = self.word_ids(head), self.word_ids(tail)

    def word_ids(self, text: str) -> list[int]:
        """Ids of a text under the word-level toy tokenizer (one token per whitespace-separated word;
        the same ids as ``tokenizer(text)``, a test checks it, about 50 times faster)."""
        return [self._vocab.get(w, self.tok.unk_token_id) for w in text.split()]

    def prompt_ids(self, example) -> list[int]:
        """Token ids of the rollout prompt with the generation prompt (what the policy sees)."""
        (message,) = example.messages()
        return [*self._head, *self.word_ids(message["content"]), *self._tail]

    def encode(self, examples, responses):
        """Tensors ``input_ids, attention_mask, labels``: each [B, prompt_len + response_len] long;
        ``labels`` is -100 except on response tokens and ``<eos>``."""
        import torch

        pad, eos = self.tok.pad_token_id, self.tok.eos_token_id
        width = self.prompt_len + self.response_len
        ids = torch.full((len(examples), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        labels = torch.full_like(ids, -100)
        for i, (ex, resp) in enumerate(zip(examples, responses, strict=True)):
            p = self.prompt_ids(ex)
            r = [*self.word_ids(resp), eos]
            if len(p) > self.prompt_len or len(r) > self.response_len:
                raise ValueError(
                    f"example {ex.id}: prompt {len(p)} / response {len(r)} tokens exceed the batch layout"
                )
            start = self.prompt_len - len(p)
            ids[i, start : self.prompt_len] = torch.tensor(p)
            ids[i, self.prompt_len : self.prompt_len + len(r)] = torch.tensor(r)
            mask[i, start : self.prompt_len + len(r)] = 1
            labels[i, self.prompt_len : self.prompt_len + len(r)] = torch.tensor(r)
        return ids, mask, labels

    def sample(self, rng: random.Random, n: int):
        """``n`` fresh examples with demonstrations, encoded (see :meth:`encode`)."""
        from mrtpo.tasks.toy.data import demonstrate, make_example, sample_constraints

        examples, responses = [], []
        for i in range(n):
            constraints, order = sample_constraints(
                rng, rng.randint(self.min_constraints, self.max_constraints)
            )
            ex = make_example(constraints, f"sft-{i}", order)
            examples.append(ex)
            responses.append(demonstrate(ex, rng, self.p_meet))
        return self.encode(examples, responses)


def evaluate_policy(
    model, tokenizer, examples, *, temperature: float = 1.0, seed: int = 0, batch_size: int = 128
):
    """Per-constraint satisfaction of sampled (``temperature > 0``) or greedy responses.

    Returns ``{"satisfaction": ..., "all_met": ..., "<type>": share met among prompts listing it}``.
    """
    from mrtpo.eval.generation import SamplingConfig, TransformersGenerator

    cfg = SamplingConfig(max_new_tokens=12, temperature=temperature, batch_size=batch_size, seed=seed)
    was_training = model.training
    model.eval()
    responses = TransformersGenerator(model, tokenizer, cfg).generate(
        [e.messages() for e in examples], progress=False
    )
    model.train(was_training)
    return score_responses(examples, responses), responses


def score_responses(examples, responses) -> dict[str, float]:
    """Per-constraint satisfaction of ``responses`` to the toy ``examples``: the task's metrics
    (``local``, ``all_met``, ...), per type the share met among prompts listing it (NaN when none lists
    it), and ``satisfaction`` (the mean share of a prompt's own constraints met)."""
    import torch

    from mrtpo.tasks.toy import ToyTask, satisfaction

    task = ToyTask()
    rewards = torch.tensor([[v.score(e, r) for v in task.verifiers(e)] for e, r in zip(examples, responses)])
    out = dict(task.metrics(examples, responses, rewards))
    for k, name in enumerate(task.reward_names):
        rows = [j for j, e in enumerate(examples) if name in e.meta["constraints"]]
        out[name] = float(rewards[rows, k].mean()) if rows else float("nan")
    sat = satisfaction(examples, rewards)
    out["satisfaction"] = sum(sat) / len(sat)
    return out


def imperfect_seed(config_seed: int, warm_start: int) -> int:
    """Seed of the demonstrations of warm start ``warm_start``'s imperfect phase (distinct per warm start,
    and from the copy phase's data stream ``random.Random(config_seed)``)."""
    return 1_000_003 * (warm_start + 1) + config_seed


def _phase(config, tok, state=None, warm_start: int = 0, *, progress: bool):
    """One phase of a warm start, under the torch seed ``config.seed``: the copy phase (``state`` None:
    a new model and optimizer, demonstrations from ``random.Random(config.seed)`` that meet every
    constraint) or warm start ``warm_start``'s imperfect phase (the model and optimizer loaded from
    ``state``, a saved copy phase; demonstrations from :func:`imperfect_seed`), one optimizer step on a
    fresh batch each. Returns ``(model, opt, sched, curve, losses)``."""
    import torch

    from mrtpo.tasks.toy import generate_examples

    if state is None:
        p_meet, seed, steps = 1.0, config.seed, range(config.clean_steps)
        desc = "warm start: copy phase (SFT)"
    else:
        p_meet, seed = config.p_meet, imperfect_seed(config.seed, warm_start)
        steps = range(config.clean_steps, config.steps)
        desc = f"warm start {warm_start}: imperfect phase (SFT)"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = new_model(tok, config, max_positions=64)
        if state is not None:
            model.load_state_dict(state["model"])
        opt, sched = new_optimizer(model, config, decay_start=config.clean_steps)
        if state is not None:
            opt.load_state_dict(state["optimizer"])
            sched.load_state_dict(state["scheduler"])
        batcher = DemoBatcher(
            tok, p_meet=p_meet, min_constraints=config.min_constraints, max_constraints=config.max_constraints
        )
        rng = random.Random(seed)
        probe_set = generate_examples(64, seed=30_000 + config.seed) if config.eval_every else []
        curve: list[dict] = [] if state is None else list(state["curve"])
        losses: list[float] = [] if state is None else list(state["losses"])
        it = steps
        if progress:
            from tqdm.auto import tqdm

            it = tqdm(steps, desc=desc, unit="step")
        model.train()
        for step in it:
            batcher.p_meet = 1.0 if step < config.clean_steps else config.p_meet
            ids, mask, labels = batcher.sample(rng, config.batch_size)
            losses.append(sft_step(model, opt, sched, ids, mask, labels))
            if progress and len(losses) % 50 == 0:
                it.set_postfix(loss=f"{sum(losses[-50:]) / 50:.3f}")
            if config.eval_every and (step + 1) % config.eval_every == 0:
                probe, _ = evaluate_policy(model, tok, probe_set, temperature=1.0, seed=step)
                curve.append({"step": step + 1, "loss": sum(losses[-50:]) / len(losses[-50:]), **probe})
                model.train()
    return model, opt, sched, curve, losses


def train_copy_phase(config: WarmStartConfig, out_dir: str | Path, *, progress: bool = True) -> Path:
    """The shared first phase of the demo's warm starts: ``clean_steps`` steps on demonstrations that
    meet every constraint (the model learns to copy), from ``config.seed``.

    Saves ``out_dir/copy_phase.pt`` (model, optimizer and scheduler state, the data stream's state, the
    losses and the probe curve: tensors and plain data only) for :func:`train_imperfect_phase`, which
    loads it with ``torch.load(weights_only=True)`` (no pickled object is rebuilt: a file that holds one
    is refused); returns its path.
    """
    import torch

    from mrtpo.tasks.toy import build_toy_tokenizer

    tok = build_toy_tokenizer()
    t0 = time.perf_counter()
    model, opt, sched, curve, losses = _phase(config, tok, progress=progress)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "copy_phase.pt"
    torch.save(
        {
            "config": asdict(config),
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(),
            "losses": losses,
            "curve": curve,
            "seconds": time.perf_counter() - t0,
        },
        path,
    )
    return path


def train_imperfect_phase(
    config: WarmStartConfig,
    copy_phase: str | Path,
    warm_start: int,
    out_dir: str | Path | None = None,
    *,
    progress: bool = True,
):
    """Warm start ``warm_start``: the saved copy phase (:func:`train_copy_phase`), then the remaining
    ``steps - clean_steps`` steps on imperfect demonstrations drawn from
    :func:`imperfect_seed` ``(config.seed, warm_start)``, with the learning rate decaying over them.

    Warm starts that differ in ``warm_start`` share the copy phase and differ in the data and order of
    their imperfect phase. Saves the model, tokenizer and ``warmstart.json`` to ``out_dir``.

    Returns:
        ``(model, tokenizer, info)``; ``info``: config, warm_start, seconds (this phase and the copy
        phase), final loss, the sampled and greedy per-constraint satisfaction on held-out 3–5-constraint
        prompts, the probe curve (with ``eval_every``).
    """
    import torch

    from mrtpo.tasks.toy import build_toy_tokenizer, generate_examples

    try:  # tensors and plain data only: loading runs no code of the file's (no pickle)
        state = torch.load(Path(copy_phase), weights_only=True)
    except pickle.UnpicklingError as e:
        first = " ".join(str(e).split())[:200]
        raise ValueError(
            f"{copy_phase} is not a copy phase this demo wrote: it holds objects other than tensors and "
            f"plain data, which are not loaded (weights_only=True: {first})"
        ) from None
    if state["config"] != asdict(config):
        changed = sorted(k for k in state["config"] if state["config"][k] != asdict(config).get(k))
        raise ValueError(f"{copy_phase} was trained with other warm-start settings (differs in {changed})")
    tok = build_toy_tokenizer()
    t0 = time.perf_counter()
    model, _, _, curve, losses = _phase(config, tok, state, warm_start, progress=progress)
    seconds = time.perf_counter() - t0
    model.eval()
    test = generate_examples(config.eval_examples, seed=10_000 + config.seed)
    sampled, _ = evaluate_policy(model, tok, test, temperature=1.0, seed=config.seed)
    greedy, _ = evaluate_policy(model, tok, test, temperature=0.0, seed=config.seed)
    info = {
        "config": asdict(config),
        "warm_start": warm_start,
        "seconds": seconds,
        "copy_phase_seconds": state["seconds"],
        "parameters": sum(p.numel() for p in model.parameters()),
        "final_loss": sum(losses[-50:]) / len(losses[-50:]),
        "sampled": sampled,
        "greedy": greedy,
        "curve": curve,
    }
    if out_dir is not None:
        save_warm_start(out_dir, model, tok, info)
    return model, tok, info


def train_warm_start(
    config: WarmStartConfig,
    out_dir: str | Path | None = None,
    *,
    warm_start: int = 0,
    progress: bool = True,
):
    """One warm start: :func:`train_copy_phase` then :func:`train_imperfect_phase` (``warm_start``),
    saved to ``out_dir`` (the copy phase's state is not kept).

    Returns:
        ``(model, tokenizer, info)`` (see :func:`train_imperfect_phase`).
    """
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        copy = train_copy_phase(config, tmp, progress=progress)
        return train_imperfect_phase(config, copy, warm_start, out_dir, progress=progress)


def load_warm_start(path: str | Path):
    """``(model, tokenizer, info)`` of a folder written by :func:`train_warm_start`."""
    from mrtpo.models.loading import load_model_and_tokenizer

    path = Path(path)
    if not (path / "warmstart.json").exists():
        raise FileNotFoundError(f"{path} is not a warm-start folder (no warmstart.json)")
    model, tok = load_model_and_tokenizer(str(path), dtype="float32", device="cpu")
    tok.padding_side = "left"
    return model, tok, json.loads((path / "warmstart.json").read_text())


def heldout_examples(n: int):
    """The held-out prompts of the final evaluation (the same for every run)."""
    from mrtpo.tasks.toy import generate_examples

    return generate_examples(n, seed=20_000, prefix="heldout")
