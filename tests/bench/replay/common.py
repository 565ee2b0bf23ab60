"""The tiny bench setting of the replay bench tests."""

from __future__ import annotations

# K = 2 rewards, T = 16, N = 2 responses, 8 shared prompt tokens, 4 tokens per reward segment:
# context L = 8 + 2 * 4 + 3 = 19 tokens, C_-k 15 tokens; 1 FPE = L + T = 35 tokens.
TINY = dict(
    k=2,
    t=16,
    responses=2,
    vocab=256,
    hidden=16,
    layers=1,
    prompt_tokens=8,
    info_tokens=4,
    threads=1,
    prefix_min_saved=0,
)
