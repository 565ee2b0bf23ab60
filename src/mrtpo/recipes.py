"""The one reader of recipes that ``mrtpo plan`` (:mod:`mrtpo.plan`) and ``mrtpo launch``
(:mod:`mrtpo.launch`) share; neither imports the other:

- :func:`recipe_engine`: which engine a recipe is for (a ``mrtpo train`` config: TRL; a Hydra config of
  verl's trainer: verl) and its YAML as data;
- :func:`split_overrides` reads a TRL recipe's ``--section.key VALUE`` overrides (and the ``mrtpo train``
  flags among them), :func:`hydra_pairs` a verl recipe's ``key=value`` ones, :func:`plugin_args` the
  ``--plugin MODULE`` values among either; :func:`get` reads a dotted key of a Hydra config;
- :func:`server_split`: the GPUs of ``--vllm server`` and of training, a split whose training processes
  divide the recipe's generation batch (what ``mrtpo launch --vllm server`` starts and ``mrtpo plan``
  counts); :func:`batch_for`: the generation batch a number of processes splits.

Standard library and PyYAML only (the TRL override parser is imported when overrides are read).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

VERL_KEYS = ("defaults", "hydra", "actor_rollout_ref", "algorithm", "trainer", "ray_kwargs", "critic")
TRL_SECTIONS = ("model", "task", "data", "method", "trl", "peft", "plugins")
TRAIN_FLAGS = ("--resume", "--overwrite", "--print-config")  # `mrtpo train` flags, forwarded as they are


def recipe_engine(path: str | Path) -> tuple[str, dict[str, Any]]:
    """``("trl" | "verl", the YAML as data)``: a verl recipe is a Hydra config of verl's trainer, a TRL
    recipe a ``mrtpo train`` config."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"recipe {str(path)!r} does not exist")
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        first = str(e).strip().splitlines()[0]
        raise ValueError(f"recipe {str(path)!r} is not valid YAML: {first}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"recipe {str(path)!r} must be a mapping of sections")
    if any(k in raw for k in VERL_KEYS):
        return "verl", raw
    if any(k in raw for k in TRL_SECTIONS):
        return "trl", raw
    raise ValueError(
        f"recipe {str(path)!r} is neither a mrtpo train config (sections model, task, trl, ...) nor a verl "
        "config (actor_rollout_ref, algorithm, trainer, ...)"
    )


def split_overrides(tokens: list[str]) -> tuple[list[tuple[str, Any]], list[str]]:
    """``--section.key VALUE`` / ``--section.key=VALUE`` tokens -> (dotted pairs with YAML values, the
    ``mrtpo train`` flags among them); the tokens themselves are forwarded unchanged. The pairs are read
    by ``mrtpo train``'s own :func:`mrtpo.integrations.trl.reading.parse_overrides`."""
    from mrtpo.integrations.trl.reading import parse_overrides

    flags: list[str] = []
    rest: list[str] = []
    wants_value = False  # the last override was --section.key without =VALUE
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok in TRAIN_FLAGS or tok.startswith("--resume="):
            flags.append(tok)
            if tok == "--resume" and i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                i += 1
            i += 1
            continue
        if tok in ("--plugin", "--threads"):
            i += 2
            continue
        if tok.startswith("--") and "." in tok.split("=")[0]:
            rest.append(tok)
            wants_value = "=" not in tok
        elif wants_value and not tok.startswith("--"):
            rest.append(tok)  # the value of the override before it
            wants_value = False
        else:
            raise ValueError(
                f"override {tok!r} must look like --section.key VALUE (after --: "
                "mrtpo launch RECIPE --gpus 8 -- --trl.max_steps 5)"
            )
        i += 1
    pairs, _ = parse_overrides(rest)
    return pairs, flags


def hydra_pairs(tokens: list[str]) -> list[tuple[str, Any]]:
    """A verl recipe's Hydra overrides (``key=value``, ``+key=value``, ``~key``) -> (dotted key, YAML value)."""
    out = []
    for tok in tokens:
        key, eq, value = tok.partition("=")
        if not eq or key.startswith("--"):
            raise ValueError(
                f"override {tok!r} of a verl recipe must be Hydra's key=value (e.g. trainer.total_training_steps=10)"
            )
        try:
            out.append((key.lstrip("+~"), yaml.safe_load(value)))
        except yaml.YAMLError:
            out.append((key.lstrip("+~"), value))
    return out


def plugin_args(tokens: list[str]) -> list[str]:
    """The modules named by ``--plugin MODULE`` / ``--plugin=MODULE`` among ``tokens``."""
    out = []
    for i, tok in enumerate(tokens):
        if tok == "--plugin" and i + 1 < len(tokens):
            out.append(tokens[i + 1])
        elif tok.startswith("--plugin="):
            out.append(tok.partition("=")[2])
    return out


def get(raw: dict, dotted: str, default: Any = None) -> Any:
    """``raw["a"]["b"]["c"]`` for ``"a.b.c"``; ``default`` when a part is missing or not a mapping."""
    node: Any = raw
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


# ------------------------------------------------------------------------------- the vLLM server split


def server_split(
    gpus: int, trainer: dict[str, Any], vllm_gpus: list[int] | None = None, user_batch: bool = False
) -> tuple[list[int], list[int]]:
    """``(server GPUs, training GPUs)`` (positions ``0 .. gpus-1``) of ``--vllm server``.

    Named ``vllm_gpus`` are checked; by default the server takes the last 1, 2, 4, ... GPUs (tensor
    parallel sizes that divide the attention heads of the usual models), the fewest that leave a number
    of training processes dividing ``generation_batch_size`` (TRL splits the generation batch over them;
    with ``user_batch``, the per-device batch is the user's and ``per_device_train_batch_size x
    processes`` must divide it), while training keeps at least half of the GPUs. When no split does,
    one line names the generation batch that makes the 1-GPU server split work.
    """
    gbs = trainer.get("generation_batch_size")
    pdtbs = int(trainer.get("per_device_train_batch_size", 8))

    def divides(train: int) -> bool:
        return gbs is None or int(gbs) % (train * (pdtbs if user_batch else 1)) == 0

    if gpus < 2:
        raise ValueError(f"--vllm server needs at least 2 GPUs (one serves, the others train); --gpus {gpus}")
    if vllm_gpus is not None:
        bad = [g for g in vllm_gpus if not 0 <= g < gpus]
        if bad or len(set(vllm_gpus)) != len(vllm_gpus):
            raise ValueError(
                f"--vllm-gpus {','.join(map(str, vllm_gpus))} must be distinct GPUs in [0, {gpus})"
            )
        train = [g for g in range(gpus) if g not in vllm_gpus]
        if not train:
            raise ValueError(f"--vllm-gpus takes all {gpus} GPUs: leave at least one for training")
        if not divides(len(train)):
            best = _server_default(gpus, divides)
            hint = f"--vllm-gpus {','.join(map(str, best[0]))} divides it, or " if best else ""
            raise ValueError(
                f"generation_batch_size {gbs} cannot be split evenly over the {len(train)} training GPUs left "
                f"by --vllm-gpus {','.join(map(str, vllm_gpus))}: {hint}-- --trl.generation_batch_size "
                f"{batch_for(len(train), trainer, user_batch)} does"
            )
        return list(vllm_gpus), train
    best = _server_default(gpus, divides)
    if best is not None:
        return best
    raise ValueError(
        f"--vllm server on {gpus} GPUs: no split leaves training GPUs that divide generation_batch_size {gbs}; "
        f"-- --trl.generation_batch_size {batch_for(gpus - 1, trainer, user_batch)} trains on {gpus - 1} GPUs "
        "beside a 1-GPU server"
    )


def batch_for(processes: int, trainer: dict[str, Any], user_batch: bool = False) -> int:
    """The least generation batch at least the recipe's that ``processes`` training processes split evenly
    (whole prompt groups of ``num_generations``; with ``user_batch``, whole per-device batches too)."""
    step = processes * (int(trainer.get("per_device_train_batch_size", 8)) if user_batch else 1)
    group = int(trainer.get("num_generations", 8))
    step = step * group // math.gcd(step, group)
    return -(-int(trainer.get("generation_batch_size") or step) // step) * step


def _server_default(gpus: int, divides) -> tuple[list[int], list[int]] | None:
    serve = 1
    while serve <= gpus // 2:
        if divides(gpus - serve):
            return list(range(gpus - serve, gpus)), list(range(gpus - serve))
        serve *= 2
    return None
