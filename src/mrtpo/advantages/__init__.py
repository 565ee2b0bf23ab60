"""Response-level multi-reward advantages: rewards [N, K] -> per-reward advantages [N, K] (docs/design.md §3).

:func:`compute` is the front door: it validates the inputs once into a :class:`Batch` and calls the
method registered under that name in :data:`ADVANTAGES`. A method is a plain function of the batch
with typed keyword options::

    @register("gdpo")
    def gdpo(b: Batch, *, eps: Positive = EPS, whiten: Whiten = "response") -> Tensor:  # [N, K]

Its options are read from the signature: an unknown option is an error listing the known ones, and a
value is checked against its annotation (``Positive``, ``NonNegative``, ``float``, ``int``, ``str``,
``bool`` or a ``Literal`` of choices). The row sum ``Â[j, :].sum()`` is the method's response
advantage; MRTPO (``mrtpo.credit``) spreads each column over the tokens relevant to that reward.

Conventions shared by all methods:

- ``eps`` (option, default 1e-6) is added to every std in a denominator. TRL's GDPO uses 1e-4.
- "std" is the unbiased sample std unless a docstring says "population".
- Group z-score (:func:`group_zscore`): a group of size 1 has mean 0 and std 1 (verl's convention), so
  its z-score is ``r / (1 + eps)``; a reward constant within a group of two or more responses gets
  exactly 0 there.
- Batch whitening (:func:`whiten_columns`, "GDPO batch normalization") is over responses by default;
  option ``whiten="token"`` weights every response by its token count (``lengths: [N]``), as verl's
  ``masked_whiten`` does. GDPO, SAW, DARA, SA-MRPO and GD²PO accept it.
- Degenerate denominators: when the quantity whose std is the denominator is constant (std at most 1e-9
  times the largest term, i.e. only rounding), the affected advantages are exactly 0 instead of
  ``(rounding noise) / eps``. This matters for the per-reward split: with rewards [[1, 0], [0, 1]] in
  one group the summed reward is constant, GRPO's usual advantage is 0, and the split would otherwise
  be ±0.5 / 1e-6 per column. Row sums are unaffected (they are 0 either way). The batch whitening of
  GDPO, SAW, DARA, SA-MRPO and RDPO keeps the parts instead when only its denominator is degenerate
  (the summed term is the same for every response: in every group the totals tie while the rewards
  vary): it divides them by sqrt(Σ_k var_batch(t_k)) (:func:`whiten_columns`), so their row sums stay 0
  and token credit still sees each reward's advantage.
- Large rewards: standard deviations are taken of values scaled by a power of two (exact), so rewards
  up to ~1e307 do not overflow their squares; a result that is still not finite raises ValueError.
- Input checks raise ``ValueError`` naming the field: non-finite rewards name row, column and group
  (``rewards[7, 2] is nan (group 3)``); shapes of ``group_ids``, ``weights``, bounds and ``lengths``
  are checked against N and K; unknown options list the method's options.
- Computation is in float64; the result is float64 for float64 rewards, else float32, on the rewards'
  device.

Notation:
    N responses in the batch, K rewards, P groups (prompts); g(j) is the group of response j.
    r[j, k] reward k of response j; w[k] reward weight (``weights``, default 1).
    mean_group / std_group: over the responses of one group; mean_batch / std_batch: over all N.
    A[j, k] group z-score of reward k; Â[j, k] the returned advantage.
"""

from mrtpo.advantages.batch import BOUND_SLACK, Batch, make_batch
from mrtpo.advantages.formulas import (
    ACTIVE_TOL,
    DEGENERATE_RTOL,
    DVAO_TOL,
    EPS,
    SAW_DELTA,
    GroupStats,
    dara_scales,
    gd2po_keep,
    group_correlation_sum,
    group_stats,
    group_zscore,
    sa_mrpo_weights,
    saw_weights,
    whiten_columns,
)
from mrtpo.advantages.methods import corr_grpo, dara, dvao, gd2po, gdpo, grpo, sa_mrpo, saw
from mrtpo.advantages.rdpo import (
    RDPO_EIG_RTOL,
    Decorrelate,
    group_magnitudes,
    group_quantiles,
    rdpo,
    rdpo_whiten,
    subspace_whitening,
)
from mrtpo.advantages.registry import (
    ADVANTAGES,
    AdvantageMethod,
    NonNegative,
    Positive,
    Whiten,
    available,
    check_options,
    compute,
    get,
    register,
)
from mrtpo.advantages.registry import (
    _compute as _compute,
)

__all__ = [
    "ACTIVE_TOL",
    "ADVANTAGES",
    "BOUND_SLACK",
    "DEGENERATE_RTOL",
    "DVAO_TOL",
    "EPS",
    "RDPO_EIG_RTOL",
    "SAW_DELTA",
    "AdvantageMethod",
    "Batch",
    "Decorrelate",
    "GroupStats",
    "NonNegative",
    "Positive",
    "Whiten",
    "available",
    "check_options",
    "compute",
    "corr_grpo",
    "dara",
    "dara_scales",
    "dvao",
    "gd2po",
    "gd2po_keep",
    "gdpo",
    "get",
    "group_correlation_sum",
    "group_magnitudes",
    "group_quantiles",
    "group_stats",
    "group_zscore",
    "grpo",
    "make_batch",
    "rdpo",
    "rdpo_whiten",
    "register",
    "sa_mrpo",
    "sa_mrpo_weights",
    "saw",
    "saw_weights",
    "subspace_whitening",
    "whiten_columns",
]
