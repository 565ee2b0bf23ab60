"""Training configs: YAML loading, command-line overrides, validation, and the ``train(config)`` entry.

A config has five sections (see ``recipes/*.yaml``)::

    model:  {path: <local folder or hub id>, dtype: auto}     or  {tiny: {hidden_size: 64, ...}}
    task:   {name: sql, options: {...}}                        # mrtpo.tasks.load_task(name, **options)
    data:   {source: <path or null>, split: train, limit: null, eval_split: null, eval_limit: null}
    method: {advantage_method: gdpo, options: {...}, credit: reward, beta: 0.5, ...}   # mrtpo's fields
    trl:    {output_dir: runs/x, learning_rate: 1e-6, num_generations: 8, ...}          # GRPOConfig fields

``method.beta`` is the allocation strength (``MRTPOConfig.credit_beta``) and ``method.options`` the
advantage method's options (``advantage_options``); every other method key has its ``MRTPOConfig``
name. ``trl`` takes any ``GRPOConfig`` / ``TrainingArguments`` field (TRL's own ``beta`` is the KL
coefficient). Overrides address a key by its dotted path: ``--method.beta 0.3``, ``--trl.max_steps=10``;
values are parsed as YAML. Every unknown or ill-typed field is reported at once, in one line, naming
each field (with the nearest known name).

``model.tiny`` builds a random tiny Qwen2 model (``mrtpo.models.tiny``) on a word-level tokenizer of
every word in the loaded examples (plus ``model.tiny.words``): a CPU smoke run, no download.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

SECTIONS = ("model", "task", "data", "method", "trl")
MODEL_KEYS = ("path", "dtype", "tiny")
TINY_KEYS = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "seed", "words")
TASK_KEYS = ("name", "options")
DATA_KEYS = ("source", "split", "limit", "eval_split", "eval_limit")
# method key -> MRTPOConfig field
METHOD_ALIASES = {"beta": "credit_beta", "options": "advantage_options"}
METHOD_FIELDS = (
    "advantage_method",
    "options",
    "credit",
    "beta",
    "loss",
    "cort_ramp_steps",
    "opsd_divergence",
    "opsd_beta",
    "replay_token_budget",
    "replay_chunk_size",
    "replay_prefix_sharing",
    "run_files",
    "log_samples",
    "log_localization",
)
DTYPES = ("auto", "float32", "bfloat16", "float16")


def _nearest(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _load_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"config file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"config file {str(path)!r} is not valid YAML: {' '.join(str(e).split())}") from None
    if not isinstance(data, dict):
        raise ValueError(f"config file {str(path)!r} must hold a mapping of sections {SECTIONS}")
    return data


def parse_overrides(argv: Sequence[str]) -> tuple[list[tuple[str, Any]], str | bool | None]:
    """``["--method.beta", "0.3", "--trl.max_steps=4", "--resume"]`` -> pairs and the resume target.

    ``--resume`` alone means the latest checkpoint in ``trl.output_dir`` (True); ``--resume PATH`` a
    checkpoint folder. Values are YAML scalars (``0.3`` a float, ``[1, 2]`` a list, ``null`` None).
    """
    pairs: list[tuple[str, Any]] = []
    resume: str | bool | None = None
    i = 0
    argv = list(argv)
    while i < len(argv):
        tok = argv[i]
        if not tok.startswith("--") or tok == "--":
            raise ValueError(f"override {tok!r} must look like --section.key VALUE or --section.key=VALUE")
        key, eq, value = tok[2:].partition("=")
        if key == "resume":
            if eq:
                resume = value
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                resume, i = argv[i + 1], i + 1
            else:
                resume = True
            i += 1
            continue
        if not eq:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise ValueError(f"override --{key} has no value")
            value, i = argv[i + 1], i + 1
        if "." not in key:
            raise ValueError(f"override --{key} must name a section and a key, e.g. --trl.{key}")
        try:
            parsed = yaml.safe_load(value) if value != "" else ""
        except yaml.YAMLError:
            parsed = value
        pairs.append((key, parsed))
        i += 1
    return pairs, resume


def apply_overrides(raw: dict[str, Any], pairs: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """A copy of ``raw`` with each dotted key set (intermediate mappings are created)."""
    out = copy.deepcopy(raw)
    for key, value in pairs:
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[parts[-1]] = value
    return out


def _coerce(value: Any, default: Any, hint: Any) -> tuple[Any, str | None]:
    """Coerce YAML scalars to a field's type where unambiguous; return (value, error or None)."""
    origin = typing.get_origin(hint)
    if default is None and isinstance(value, str):  # optional numbers: "1e-3" from YAML 1.1 / the CLI
        for kind in (int, float):
            if kind in typing.get_args(hint):
                try:
                    return kind(value), None
                except ValueError:
                    pass
        return value, None
    if origin is typing.Literal:
        choices = typing.get_args(hint)
        return (
            (value, None)
            if value in choices
            else (value, f"{value!r} is not one of {', '.join(map(str, choices))}")
        )
    if isinstance(default, bool):
        return (value, None) if isinstance(value, bool) else (value, f"{value!r} is not true/false")
    if isinstance(default, int) and not isinstance(default, bool):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
            if value is None and type(None) in typing.get_args(hint):
                return value, None
            return value, f"{value!r} is not an integer"
        return int(value), None
    if isinstance(default, float):
        if isinstance(value, str):
            try:
                return float(value), None  # YAML 1.1 reads 1e-6 as a string
            except ValueError:
                return value, f"{value!r} is not a number"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            if value is None and type(None) in typing.get_args(hint):
                return value, None
            return value, f"{value!r} is not a number"
        return float(value), None
    return value, None


def _config_fields() -> dict[str, dataclasses.Field]:
    from mrtpo.integrations.trl import MRTPOConfig

    return {f.name: f for f in dataclasses.fields(MRTPOConfig) if f.init and not f.name.startswith("_")}


@dataclasses.dataclass
class RunConfig:
    """A validated training config (the sections of the module docstring)."""

    model: dict[str, Any]
    task: dict[str, Any]
    data: dict[str, Any]
    trainer: dict[str, Any]  # MRTPOConfig keyword arguments (method + trl, resolved)
    raw: dict[str, Any]  # the config as written, overrides applied

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> RunConfig:
        """Validate ``raw``; raise one ValueError listing every bad field."""
        errors: list[str] = []
        for sec in raw:
            if sec not in SECTIONS:
                errors.append(
                    f"unknown section '{sec}'{_nearest(sec, SECTIONS)}; sections: {', '.join(SECTIONS)}"
                )
        sections: dict[str, dict] = {}
        for sec in SECTIONS:
            value = raw.get(sec) or {}
            if not isinstance(value, dict):
                errors.append(f"section '{sec}' must be a mapping, got {type(value).__name__}")
                value = {}
            sections[sec] = value

        def check_keys(sec: str, known: Sequence[str]) -> None:
            for key in sections[sec]:
                if key not in known:
                    errors.append(f"unknown field '{sec}.{key}'{_nearest(key, known)}")

        # model
        check_keys("model", MODEL_KEYS)
        model = dict(sections["model"])
        if ("path" in model and model["path"] is not None) == ("tiny" in model and model["tiny"] is not None):
            errors.append("field 'model.path' or 'model.tiny' (exactly one) must be set")
        if model.get("path") is not None and not isinstance(model["path"], str):
            errors.append(f"field 'model.path' must be a string, got {model['path']!r}")
        model.setdefault("dtype", "auto")
        if model["dtype"] not in DTYPES:
            errors.append(f"field 'model.dtype': {model['dtype']!r} is not one of {', '.join(DTYPES)}")
        tiny = model.get("tiny")
        if tiny is not None:
            if not isinstance(tiny, dict):
                errors.append("field 'model.tiny' must be a mapping (e.g. {hidden_size: 64, num_layers: 2})")
            else:
                for key, v in tiny.items():
                    if key not in TINY_KEYS:
                        errors.append(f"unknown field 'model.tiny.{key}'{_nearest(key, TINY_KEYS)}")
                    elif key != "words" and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                        errors.append(f"field 'model.tiny.{key}': {v!r} is not a non-negative integer")
        # task
        check_keys("task", TASK_KEYS)
        task = dict(sections["task"])
        if not isinstance(task.get("name"), str) or not task.get("name"):
            errors.append("field 'task.name' is required (e.g. sql, instruct, tools, toy)")
        task.setdefault("options", {})
        if not isinstance(task["options"], dict):
            errors.append("field 'task.options' must be a mapping of the task's constructor arguments")
        # data
        check_keys("data", DATA_KEYS)
        data = {"source": None, "split": "train", "limit": None, "eval_split": None, "eval_limit": None}
        data.update(sections["data"])
        for key in ("limit", "eval_limit"):
            v = data[key]
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                errors.append(f"field 'data.{key}': {v!r} is not a positive integer")
        if data["source"] is not None:
            data["source"] = str(data["source"])
        # method + trl -> MRTPOConfig fields
        fields = _config_fields()
        hints = typing.get_type_hints(_mrtpo_config_class())
        method_fields = {METHOD_ALIASES.get(k, k) for k in METHOD_FIELDS}
        trainer: dict[str, Any] = {}
        for key, value in sections["method"].items():
            name = METHOD_ALIASES.get(key, key)
            if key not in METHOD_FIELDS:
                where = (
                    " (a TRL field: put it under 'trl')" if key in fields and key not in method_fields else ""
                )
                errors.append(f"unknown field 'method.{key}'{where or _nearest(key, METHOD_FIELDS)}")
                continue
            trainer[name] = value
        trl_known = [n for n in fields if n not in method_fields]
        for key, value in sections["trl"].items():
            if key not in fields or key in method_fields:
                if key in method_fields or key in METHOD_ALIASES:
                    errors.append(f"field 'trl.{key}' belongs in the 'method' section")
                else:
                    errors.append(f"unknown field 'trl.{key}'{_nearest(key, trl_known)}")
                continue
            trainer[key] = value
        for name, value in list(trainer.items()):
            f = fields[name]
            default = f.default if f.default is not dataclasses.MISSING else None
            coerced, err = _coerce(value, default, hints.get(name))
            if err:
                sec = "method" if name in method_fields else "trl"
                key = {v: k for k, v in METHOD_ALIASES.items()}.get(name, name) if sec == "method" else name
                errors.append(f"field '{sec}.{key}': {err}")
            trainer[name] = coerced
        if "output_dir" not in trainer:
            errors.append("field 'trl.output_dir' is required (the run folder)")
        if errors:
            raise ValueError("invalid config: " + "; ".join(errors))
        return cls(model=model, task=task, data=data, trainer=trainer, raw=raw)

    def trainer_config(self):
        """The :class:`~mrtpo.integrations.trl.MRTPOConfig`; its own cross-field errors name the field."""
        from mrtpo.integrations.trl import MRTPOConfig

        try:
            return MRTPOConfig(**self.trainer)
        except (ValueError, TypeError) as e:
            raise ValueError("invalid config: " + " ".join(str(e).split())) from None


def _mrtpo_config_class():
    from mrtpo.integrations.trl import MRTPOConfig

    return MRTPOConfig


def load_config(
    path: str | Path | None = None,
    overrides: Sequence[tuple[str, Any]] = (),
    raw: dict[str, Any] | None = None,
) -> RunConfig:
    """Read ``path`` (or take ``raw``), apply dotted ``overrides``, validate."""
    base = _load_yaml(path) if path is not None else copy.deepcopy(raw or {})
    return RunConfig.from_dict(apply_overrides(base, overrides))


def _tiny_model_and_tokenizer(spec: dict[str, Any], examples) -> tuple[Any, Any]:
    import torch

    from mrtpo.models.tiny import build_model, build_tokenizer

    words: list[str] = []
    seen: set[str] = set()
    for ex in examples:
        for seg in ex.segments:
            for w in seg.text.split():
                if w not in seen:
                    seen.add(w)
                    words.append(w)
    for w in spec.get("words") or []:
        if str(w) not in seen:
            seen.add(str(w))
            words.append(str(w))
    tok = build_tokenizer(words)
    kw = {
        k: spec[k]
        for k in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "seed")
        if k in spec
    }
    model = build_model(len(tok), dtype=torch.float32, **kw)
    return model, tok


def _hf_model_and_tokenizer(path: str, dtype: str):
    from mrtpo.models.loading import load_model_and_tokenizer

    try:
        return load_model_and_tokenizer(path, dtype=dtype, device=None, eval_mode=False)
    except OSError as e:  # not a local folder, and not reachable or unknown on the hub
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FileNotFoundError(f"field 'model.path': cannot load {path!r}: {first}") from None


def build_trainer(
    config: RunConfig,
    *,
    model=None,
    tokenizer=None,
    task=None,
    train_examples=None,
    eval_examples=None,
    callbacks=None,
):
    """Load the task, data, model and tokenizer of ``config`` and build the :class:`MRTPOTrainer`.

    Any of ``model``/``tokenizer``/``task``/``train_examples`` given here replaces what the config
    would load (programmatic use: the demo passes its own warm-started model).
    """
    from mrtpo.integrations.trl import MRTPOTrainer
    from mrtpo.tasks import load_task

    args = config.trainer_config()
    if task is None:
        try:
            task = load_task(config.task["name"], **config.task["options"])
        except TypeError as e:
            raise ValueError(f"invalid config: field 'task.options': {e}") from None
    d = config.data
    if train_examples is None:
        train_examples = task.load(d["source"], split=d["split"], limit=d["limit"])
    if eval_examples is None and d["eval_split"]:
        eval_examples = task.load(d["source"], split=d["eval_split"], limit=d["eval_limit"])
    if not train_examples:
        raise ValueError(f"task {config.task['name']!r} loaded no training examples from {d['source']!r}")
    if model is None or tokenizer is None:
        if config.model.get("tiny") is not None:
            m, t = _tiny_model_and_tokenizer(
                config.model["tiny"], list(train_examples) + list(eval_examples or [])
            )
        else:
            m, t = _hf_model_and_tokenizer(config.model["path"], config.model["dtype"])
        model, tokenizer = model or m, tokenizer or t
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    run_info = {"model": config.model.get("path") or "tiny", "config": config.raw}
    return MRTPOTrainer(
        model,
        args=args,
        task=task,
        train_dataset=list(train_examples),
        eval_dataset=list(eval_examples) if eval_examples else None,
        processing_class=tokenizer,
        run_info=run_info,
        callbacks=callbacks,
    )


def train(
    config: RunConfig | dict | str | Path,
    overrides: Sequence[tuple[str, Any]] = (),
    *,
    resume: str | bool | None = None,
    **build_kwargs,
):
    """Train from a config (a :class:`RunConfig`, a raw dict or a YAML path); returns the trainer.

    Args:
        overrides: dotted ``(key, value)`` pairs applied on top of the config.
        resume: True for the latest checkpoint in ``trl.output_dir``, a checkpoint folder, or None.
        build_kwargs: see :func:`build_trainer` (model, tokenizer, task, train_examples, ...).
    """
    if isinstance(config, RunConfig):
        cfg = load_config(raw=config.raw, overrides=overrides)
    elif isinstance(config, dict):
        cfg = load_config(raw=config, overrides=overrides)
    else:
        cfg = load_config(config, overrides)
    if isinstance(resume, str):
        if not Path(resume).is_dir():
            raise FileNotFoundError(f"checkpoint folder {resume!r} does not exist")
    elif resume:
        from transformers.trainer_utils import get_last_checkpoint

        out = cfg.trainer["output_dir"]
        if not Path(out).is_dir() or get_last_checkpoint(out) is None:
            raise FileNotFoundError(f"--resume: no checkpoint-* folder in {out!r}")
    trainer = build_trainer(cfg, **build_kwargs)
    trainer.train(resume_from_checkpoint=resume or None)
    return trainer
