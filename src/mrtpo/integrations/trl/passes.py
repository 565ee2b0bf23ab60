"""Teacher-forced passes over (context, response) batches used by the trainer's baselines.

Layout shared with TRL: each row is ``[left-padded context | right-padded response]``, so the hidden
state that predicts response token ``t`` sits at sequence position ``L - 1 + t`` (``L`` the padded
context length) and the response block is the last ``T`` positions.

Notation: B responses, L padded context tokens, T padded response tokens, H hidden size.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def left_pad_concat(
    contexts: Sequence[Sequence[int]],
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, L + T]`` input ids and attention mask: contexts left-padded to ``L``, then the responses.

    Args:
        contexts: B context id lists (each non-empty).
        completion_ids: [B, T] long, right padded.
        completion_mask: [B, T] 0/1.
        pad_id: id written at padded context positions.
    """
    b = completion_ids.shape[0]
    if len(contexts) != b:
        raise ValueError(f"contexts has {len(contexts)} rows; expected B={b} (rows of completion_ids)")
    if any(len(c) == 0 for c in contexts):
        raise ValueError("a context is empty; the first response token needs a context token")
    device = completion_ids.device
    L = max(len(c) for c in contexts)
    ids = torch.full((b, L), pad_id, dtype=torch.long, device=device)  # [B, L]
    mask = torch.zeros(b, L, dtype=torch.long, device=device)  # [B, L]
    for i, c in enumerate(contexts):
        ids[i, L - len(c) :] = torch.tensor(list(c), dtype=torch.long, device=device)
        mask[i, L - len(c) :] = 1
    return torch.cat([ids, completion_ids], dim=1), torch.cat(
        [mask, completion_mask.long()], dim=1
    )  # [B, L + T]


@torch.no_grad()
def response_hidden(
    body,
    contexts: Sequence[Sequence[int]],
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    pad_id: int,
    batch_size: int | None = None,
) -> torch.Tensor:
    """Last hidden states (after the final norm) that predict each response token, no gradient.

    Args:
        body: the decoder body (``model.get_decoder()``), returning ``last_hidden_state``.
        contexts: B context id lists.
        completion_ids: [B, T]; completion_mask: [B, T].
        batch_size: rows per forward (None: all at once).

    Returns:
        [B, T, H].
    """
    ids, mask = left_pad_concat(contexts, completion_ids, completion_mask, pad_id)  # [B, L + T]
    t = completion_ids.shape[1]
    step = batch_size or ids.shape[0]
    parts = []
    for s in range(0, ids.shape[0], step):
        out = body(input_ids=ids[s : s + step], attention_mask=mask[s : s + step], use_cache=False)
        parts.append(out.last_hidden_state[:, -t - 1 : -1])  # [b, T, H]
    return torch.cat(parts, dim=0)
