"""Live records: a group of responses scored by a task's verifiers, one response replayed on a model
(:func:`live_record`), in the samples.jsonl format the page and figure read."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from mrtpo.analysis.explain.view import DEFAULT_BETA
from mrtpo.records import SampleRecord, information_spans


def group_advantages(
    method: str, example: Any, verifiers: Sequence[Any], responses: Sequence[str], **options: Any
) -> tuple[list[list[float]], Any]:
    """Rewards and response-level advantages of one group of responses to ``example``.

    Args:
        method: a registered advantage method (:func:`mrtpo.advantages.available`).
        example: the prompt (:class:`mrtpo.tasks.base.Example`).
        verifiers: the K verifiers.
        responses: the G >= 2 responses of the group.
        options: options of the method.

    Returns:
        ``(rewards [G][K], advantages [G, K] tensor)``; one group, bounds from the verifiers.
    """
    import torch

    from mrtpo import advantages

    if len(responses) < 2:
        raise ValueError(f"a group needs at least 2 responses to give advantages; got {len(responses)}")
    rewards = [[float(v.score(example, r)) for v in verifiers] for r in responses]
    adv = advantages.compute(
        method,
        torch.tensor(rewards, dtype=torch.float64),
        [0] * len(responses),
        reward_min=[float(v.bounds[0]) for v in verifiers],
        reward_max=[float(v.bounds[1]) for v in verifiers],
        **options,
    )
    return rewards, adv


def live_record(
    model: Any,
    tokenizer: Any,
    example: Any,
    verifiers: Sequence[Any],
    response: str,
    advantages: Sequence[float],
    *,
    method: str = "gdpo",
    credit_beta: float = DEFAULT_BETA,
    credit: str = "reward",
    rewards: Sequence[float] | None = None,
    progress: bool = False,
    replay_options: Any = None,
) -> dict[str, Any]:
    """Replay ``response`` on ``model`` with ``example``'s verifiers and return a samples.jsonl record.

    The response is tokenized without special tokens (offsets give the display pieces and the checked
    tokens); contexts come from :func:`mrtpo.replay.build_contexts` (the tokenizer's chat template);
    the replay is the credit scheme's, through :func:`mrtpo.replay.for_scheme` as in training, and so are
    the token advantages (the scheme's own, :meth:`mrtpo.credit.CreditScheme.apply`, at ``credit_beta``
    and the scheme's default options). The record carries the replay kind and its row names; the rows
    the kind did not run are null, and a kind whose measure is signed keeps no rows (as in training).

    Args:
        model, tokenizer: a Hugging Face causal LM and its tokenizer.
        example: :class:`mrtpo.tasks.base.Example`.
        verifiers: the K verifiers; their names are the reward names (the tags of the segments).
        response: the response text.
        advantages: [K] response-level advantages Â.
        method: name of the method that gave ``advantages`` (shown).
        credit_beta: β for the record's ``token_advantages``.
        credit: a credit scheme of :data:`mrtpo.credit.CREDIT_SCHEMES` that replays (built-in or a
            plug-in's): its replay kind gives the rows, the scheme the token advantages.
        rewards: [K] reward values (default: scored by the verifiers).
        progress: tqdm bar over replay micro-batches.
        replay_options: :class:`mrtpo.replay.ReplayOptions` (None: the defaults).
    """
    import torch

    from mrtpo import credit as credit_mod
    from mrtpo import replay
    from mrtpo.analysis.localization import checked_token_mask, token_pieces, tokenize_with_offsets
    from mrtpo.checks import check_batch

    names = [v.name for v in verifiers]
    adv = [float(a) for a in advantages]
    if len(adv) != len(names) or not all(math.isfinite(a) for a in adv):
        raise ValueError(f"advantages must be {len(names)} finite numbers (one per verifier); got {adv}")
    ids, offsets = tokenize_with_offsets(tokenizer, response)
    if not ids:
        raise ValueError("the response is empty after tokenization; nothing to explain")
    scheme = credit_mod.scheme(credit)
    kind = scheme.kind
    if kind is None:
        raise ValueError(
            f"credit {credit!r} does not replay: its token advantages are the response level; explain shows "
            "schemes that replay, e.g. reward, joint, cort, rlsd"
        )
    ctx = replay.build_contexts(tokenizer, example.segments, names)
    a = torch.tensor([adv], dtype=torch.float32)  # [1, K]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    res = replay.for_scheme(
        model, [ctx], [ids], a, scheme, options=replay_options, pad_id=pad, progress=progress
    )
    ones = torch.ones(1, len(ids), dtype=torch.bool)  # [1, T]
    a, d, ones, ran = check_batch(
        a, res.distances.float().cpu(), ones, replayed=res.replayed.cpu(), rows=kind.rows(len(names)),
        signed=kind.signed, scheme_name=scheme.name,
    )  # fmt: skip
    s = scheme.apply(
        a, d, ones, float(credit_beta), scheme.resolve_options(), torch.Generator().manual_seed(0)
    )[0]
    rows = None if kind.signed else [d[0, i].tolist() if r else None for i, r in enumerate(ran[0].tolist())]
    checked = {}
    for v in verifiers:
        spans = v.checked_spans(example, response)
        if spans is not None:
            checked[v.name] = checked_token_mask(offsets, spans, len(response))
    if rewards is None:
        rewards = [float(v.score(example, response)) for v in verifiers]
    prompt = tokenizer.apply_chat_template(example.messages(), tokenize=False, add_generation_prompt=True)
    notes = []
    decoded = tokenizer.decode(ids, skip_special_tokens=False)
    if decoded.split() != response.split():
        notes.append(
            f"warning: the tokenizer does not reproduce the response: its {len(ids)} tokens decode to "
            f"{decoded[:80]!r} (unknown words, or a tokenizer that does not match the model)"
        )
    return SampleRecord(
        step=None,
        example_id=getattr(example, "id", None),
        prompt=prompt,
        response=response,
        tokens=token_pieces(response, offsets),
        reward_names=names,
        rewards=[float(r) for r in rewards],
        advantages=adv,
        method=method,
        credit=scheme.name,
        credit_beta=float(credit_beta),
        replay=kind.name,
        rows=kind.row_names(names),
        distances=rows,
        token_advantages=s.tolist(),
        checked_tokens=checked,
        information=information_spans(prompt, example.segments, names) or None,
        notes=notes,
        extra={"replay_stats": res.stats.as_dict()},
    ).to_json()
