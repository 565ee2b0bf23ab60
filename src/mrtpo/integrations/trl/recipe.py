"""Training configs: YAML loading, command-line overrides, validation, and the ``train(config)`` entry.

A config has five sections (see ``recipes/*.yaml``), and optionally a list of plug-in modules::

    plugins: [my_ext]                            # imported first (mrtpo.plugins): what they register
                                                 # (advantage methods, credit schemes) validates
    model:  {path: <local folder or hub id>, dtype: auto}     or  {tiny: {hidden_size: 64, ...}}
    task:   {name: sql, options: {...}}          # a built-in task, or module:Class of your own;
                                                 # options.conditions: GDPO's conditioned reward
    data:   {source: <path or null>, split: train, limit: null, eval_split: null, eval_limit: null}
    method: {advantage_method: gdpo, advantage_options: {...}, credit: reward, credit_beta: 0.5, ...,
             opsd: {divergence: jsd, beta: 0.5}, cort: {ramp_steps: 50}}
    trl:    {output_dir: runs/x, learning_rate: 1e-6, num_generations: 8, ...}   # GRPOConfig fields
    peft:   {r: 16, lora_alpha: 32, target_modules: [q_proj, v_proj]}           # optional: LoRA

The ``method`` section is derived from :class:`~mrtpo.integrations.trl.MRTPOConfig`: every field it adds
to TRL's ``GRPOConfig`` under its own name, except the options of a baseline (``opsd_*``, ``cort_*``),
which sit in that baseline's subsection (``opsd_beta`` is ``method.opsd.beta``). ``trl`` takes any
``GRPOConfig`` / ``TrainingArguments`` field (TRL's own ``beta`` is the KL coefficient; the allocation
strength is ``method.credit_beta``). Values are checked and converted from the fields' type hints.
Overrides address a key by its dotted path: ``--method.credit_beta 0.3``, ``--trl.max_steps=10``;
values are parsed as YAML. Every unknown or ill-typed field is reported at once, in one line, naming
each field (with the nearest known name). One TRL default differs (:data:`TRAINER_DEFAULTS`):
``trl.save_total_limit`` is 2, so a run keeps its newest two checkpoints (null keeps every one).

``model.tiny`` builds a random tiny Qwen2 model (``mrtpo.models.tiny``) on a word-level tokenizer of
every word in the loaded examples (plus ``model.tiny.words``): a CPU smoke run, no download;
``model.dtype`` applies to it too (``auto``: float32).

``peft`` (optional) trains a PEFT LoRA adapter instead of the full model: its keys are
``peft.LoraConfig`` fields (``r``, ``lora_alpha``, ``lora_dropout``, ``target_modules``,
``modules_to_save``, ...), passed to TRL as ``peft_config``. TRL's reference model (``trl.beta > 0``)
is then the model with the adapter disabled.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import enum
import importlib
import importlib.util
import os
import re
import shutil
import sys
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

SECTIONS = ("model", "task", "data", "method", "trl", "peft")
PLUGINS_KEY = "plugins"  # the top-level list of plug-in modules (not a section)
MODEL_KEYS = ("path", "dtype", "tiny")
TINY_KEYS = (
    "hidden_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "intermediate_size",
    "tie_embeddings",
    "seed",
    "words",
)
TASK_KEYS = ("name", "options")
DATA_KEYS = ("source", "split", "limit", "eval_split", "eval_limit")
DTYPES = ("auto", "float32", "bfloat16", "float16")
# method keys of earlier versions -> their name now
RENAMED = {
    "beta": "credit_beta",
    "options": "advantage_options",
    "opsd_divergence": "opsd.divergence",
    "opsd_beta": "opsd.beta",
    "cort_ramp_steps": "cort.ramp_steps",
}
# trl.report_to names -> the package each needs (transformers' integrations)
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
# trl fields whose default differs from TRL's in a config: the newest 2 checkpoints are kept (TRL keeps
# every one: 201 checkpoints, 619 MB for 2,000 steps of the tiny recipe); `trl.save_total_limit: null`
# keeps all again
TRAINER_DEFAULTS = {"save_total_limit": 2}
# what `--overwrite` deletes in a run folder: the run files, checkpoints, TensorBoard logs, final model
RUN_FILES = (
    "run.json",
    "metrics.jsonl",
    "samples.jsonl",
    "runs",
    "checkpoint-*",
    "model*.safetensors*",
    "adapter_config.json",  # a peft run's final adapter
    "adapter_model*.safetensors*",
    "pytorch_model*.bin*",
    "config.json",
    "generation_config.json",
    "tokenizer*",
    "special_tokens_map.json",
    "chat_template.*",
    "vocab.*",
    "merges.txt",
    "training_args.bin",
    "README.md",
)


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
    """``["--method.credit_beta", "0.3", "--trl.max_steps=4", "--resume"]`` -> pairs and the resume target.

    ``--resume`` alone means the latest complete checkpoint in ``trl.output_dir`` (True); ``--resume
    PATH`` a checkpoint folder. Values are YAML scalars (``0.3`` a float, ``[1, 2]`` a list, ``null`` None).
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


# ---------------------------------------------------------------------------- fields and types


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _enum_in(hint: Any) -> type[enum.Enum] | None:
    for h in typing.get_args(hint) if _is_union(hint) else (hint,):
        if isinstance(h, type) and issubclass(h, enum.Enum):
            return h
    return None


def _coerce(value: Any, hint: Any) -> tuple[Any, str | None]:
    """Check ``value`` against a field's type hint, converting YAML scalars where unambiguous.

    Returns ``(value, None)`` or ``(value, error)``. YAML 1.1 reads ``1e-6`` as a string (converted to a
    number for numeric fields) and ``no``/``yes`` as booleans (converted back for text / enum fields,
    e.g. ``save_strategy: no``).
    """
    if hint is typing.Any or hint is None:
        return value, None
    kind = _enum_in(hint)
    if kind is not None:  # e.g. SaveStrategy | str: the enum's values are the choices
        if value is None and _is_union(hint) and type(None) in typing.get_args(hint):
            return None, None
        if isinstance(value, bool):
            value = "yes" if value else "no"
        choices = [e.value for e in kind]
        if isinstance(value, kind) or value in choices:
            return value, None
        return value, f"{value!r} is not one of {', '.join(map(str, choices))}"
    if _is_union(hint):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None, None
        errors = []
        for h in args:
            if h is type(None):
                continue
            v, err = _coerce(value, h)
            if err is None:
                return v, None
            errors.append(err)
        return value, errors[0] if errors else None
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        choices = typing.get_args(hint)
        return (
            (value, None)
            if value in choices
            else (value, f"{value!r} is not one of {', '.join(map(str, choices))}")
        )
    if hint is bool:
        return (value, None) if isinstance(value, bool) else (value, f"{value!r} is not true/false")
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
            if isinstance(value, str):
                try:
                    return int(value), None
                except ValueError:
                    pass
            return value, f"{value!r} is not an integer"
        return int(value), None
    if hint is float:
        if isinstance(value, str):
            try:
                return float(value), None
            except ValueError:
                return value, f"{value!r} is not a number"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return value, f"{value!r} is not a number"
        return float(value), None
    if hint is str:
        if isinstance(value, bool):
            return ("yes" if value else "no"), None
        if isinstance(value, (int, float)):
            return str(value), None
        return (value, None) if isinstance(value, str) else (value, f"{value!r} is not a string")
    if hint is list or origin is list:
        return (value, None) if isinstance(value, (list, tuple)) else (value, f"{value!r} is not a list")
    if hint is dict or origin is dict:
        return (value, None) if isinstance(value, dict) else (value, f"{value!r} is not a mapping")
    return value, None


def _config_class():
    from mrtpo.integrations.trl.config import MRTPOConfig

    return MRTPOConfig


@dataclasses.dataclass(frozen=True)
class Field:
    """A trainer field as the config addresses it: ``path`` under ``section`` maps to ``name``."""

    section: str  # "method" or "trl"
    path: str  # "credit_beta", "opsd.beta", "learning_rate"
    name: str  # the MRTPOConfig attribute
    hint: Any
    default: Any
    help: str

    @property
    def key(self) -> str:
        return f"{self.section}.{self.path}"


def trainer_fields() -> dict[str, Field]:
    """Every MRTPOConfig field by config key (``method.credit_beta``, ``method.opsd.beta``, ``trl.seed``).

    Derived from the dataclass: fields MRTPOConfig adds to GRPOConfig form the ``method`` section, a
    field named ``<sub>_<rest>`` with ``<sub>`` in ``MRTPOConfig.METHOD_SUBSECTIONS`` sits at
    ``method.<sub>.<rest>``, and every other field is ``trl.<name>``.
    """
    from trl import GRPOConfig

    cls = _config_class()
    hints = typing.get_type_hints(cls)
    base = {f.name for f in dataclasses.fields(GRPOConfig)}
    out: dict[str, Field] = {}
    for f in dataclasses.fields(cls):
        if not f.init or f.name.startswith("_"):
            continue
        section, path = ("trl", f.name) if f.name in base else ("method", f.name)
        if section == "method":
            for sub in cls.METHOD_SUBSECTIONS:
                if f.name.startswith(sub + "_"):
                    path = f"{sub}.{f.name[len(sub) + 1 :]}"
        default = f.default if f.default is not dataclasses.MISSING else None
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        fld = Field(section, path, f.name, hints.get(f.name), default, str(f.metadata.get("help", "")))
        out[fld.key] = fld
    return out


def field_key(name: str) -> str:
    """The config key of the MRTPOConfig attribute ``name`` (``opsd_beta`` -> ``method.opsd.beta``)."""
    for key, f in trainer_fields().items():
        if f.name == name:
            return key
    return name


def _flatten(section: dict[str, Any], subsections: Sequence[str]) -> list[tuple[str, Any]]:
    """``{credit: reward, opsd: {beta: 0.3}}`` -> ``[("credit", "reward"), ("opsd.beta", 0.3)]``."""
    out = []
    for key, value in section.items():
        if key in subsections and isinstance(value, dict):
            out.extend((f"{key}.{k}", v) for k, v in value.items())
        else:
            out.append((str(key), value))
    return out


@dataclasses.dataclass
class RunConfig:
    """A validated training config (the sections of the module docstring)."""

    model: dict[str, Any]
    task: dict[str, Any]
    data: dict[str, Any]
    trainer: dict[str, Any]  # MRTPOConfig keyword arguments (method + trl, resolved)
    raw: dict[str, Any]  # the config as written, overrides applied
    peft: dict[str, Any] | None = None  # peft.LoraConfig keyword arguments, or None (full fine-tuning)
    plugins: list[str] = dataclasses.field(default_factory=list)  # plug-in modules, imported already

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> RunConfig:
        """Validate ``raw``; raise one ValueError listing every bad field.

        The ``plugins`` modules are imported first (a ValueError naming the one that fails), so the
        advantage methods, credit schemes and tasks they register are known when the rest is checked.
        """
        plugins = import_config_plugins(raw.get(PLUGINS_KEY))
        errors: list[str] = []
        for sec in raw:
            if sec not in SECTIONS and sec != PLUGINS_KEY:
                errors.append(
                    f"unknown section '{sec}'{_nearest(sec, (*SECTIONS, PLUGINS_KEY))}; sections: "
                    f"{', '.join(SECTIONS)} (and the list '{PLUGINS_KEY}')"
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
                    elif key == "tie_embeddings":
                        if not isinstance(v, bool):
                            errors.append(f"field 'model.tiny.tie_embeddings': {v!r} is not true or false")
                    elif key != "words" and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                        errors.append(f"field 'model.tiny.{key}': {v!r} is not a non-negative integer")
        # task
        check_keys("task", TASK_KEYS)
        task = dict(sections["task"])
        if not isinstance(task.get("name"), str) or not task.get("name"):
            errors.append(
                "field 'task.name' is required (e.g. sql, instruct, tools, toy, or mypkg.mod:MyTask)"
            )
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
        # method + trl -> MRTPOConfig fields, checked against their type hints
        fields = trainer_fields()
        subsections = _config_class().METHOD_SUBSECTIONS
        method_keys = [f.path for f in fields.values() if f.section == "method"]
        trl_keys = {f.path for f in fields.values() if f.section == "trl"}
        trainer: dict[str, Any] = {}
        for sec in ("method", "trl"):
            entries = _flatten(sections[sec], subsections if sec == "method" else ())
            known = method_keys if sec == "method" else sorted(trl_keys)
            for path, value in entries:
                f = fields.get(f"{sec}.{path}")
                if f is None:
                    if sec == "method" and path in RENAMED:
                        errors.append(f"field 'method.{path}' is now 'method.{RENAMED[path]}'")
                    elif sec == "method" and path in trl_keys:
                        errors.append(f"unknown field 'method.{path}' (a TRL field: put it under 'trl')")
                    elif sec == "trl" and (path in method_keys or path in RENAMED):
                        errors.append(f"field 'trl.{path}' belongs in the 'method' section")
                    elif sec == "method" and path in subsections:
                        errors.append(f"field 'method.{path}' must be a mapping of the {path} options")
                    else:
                        errors.append(f"unknown field '{sec}.{path}'{_nearest(path, known)}")
                    continue
                coerced, err = _coerce(value, f.hint)
                if err:
                    errors.append(f"field '{f.key}': {err}")
                trainer[f.name] = coerced
        if "output_dir" not in trainer:
            errors.append("field 'trl.output_dir' is required (the run folder)")
        for name, value in TRAINER_DEFAULTS.items():
            trainer.setdefault(name, value)
        peft_cfg = dict(sections["peft"]) or None
        if peft_cfg is not None:
            errors.extend(_peft_errors(peft_cfg))
        if errors:
            raise ValueError("invalid config: " + "; ".join(errors))
        return cls(
            model=model, task=task, data=data, trainer=trainer, raw=raw, peft=peft_cfg, plugins=plugins
        )

    def peft_config(self):
        """The ``peft.LoraConfig`` of the ``peft`` section (task type causal LM), or None."""
        if self.peft is None:
            return None
        from peft import LoraConfig

        return LoraConfig(**{"task_type": "CAUSAL_LM", **self.peft})

    def trainer_config(self):
        """The :class:`~mrtpo.integrations.trl.MRTPOConfig`; its own cross-field errors name the field."""
        cls = _config_class()
        try:
            return cls(**self.trainer)
        except (ValueError, TypeError) as e:
            msg = " ".join(str(e).split())
            m = re.match(r"(\w+)=(.*)", msg)
            if m and m.group(1) in {f.name for f in trainer_fields().values()}:
                msg = f"field '{field_key(m.group(1))}': {m.group(2)}"
            raise ValueError("invalid config: " + msg) from None

    def check_environment(self) -> None:
        """Raise one ValueError naming each field that asks for what is not installed here (a tracker,
        vLLM, Liger kernels) or not possible with this model (a KL reference model for ``model.tiny``).
        Run before training; a config can be validated on a machine that could not run it."""
        errors = _environment_errors(self.model, self.trainer, self.peft is not None)
        if errors:
            raise ValueError("invalid config: " + "; ".join(errors))

    def resolved(self) -> dict[str, Any]:
        """The config with every default filled in (what ``--print-config`` shows)."""
        args = self.trainer_config()
        values = args.to_dict()
        method: dict[str, Any] = {}
        trl: dict[str, Any] = {}
        for f in trainer_fields().values():
            value = getattr(args, f.name) if f.section == "method" else values.get(f.name)
            node = method if f.section == "method" else trl
            *subs, last = f.path.split(".")
            for sub in subs:
                node = node.setdefault(sub, {})
            node[last] = _plain(value)
        out = {"model": self.model, "task": self.task, "data": self.data, "method": method, "trl": trl}
        if self.plugins:
            out = {PLUGINS_KEY: list(self.plugins), **out}
        if self.peft is not None:
            out["peft"] = _plain(self.peft)
        return out


def _peft_errors(section: dict[str, Any]) -> list[str]:
    """The ``peft`` section's problems, one message per field (unknown keys, values LoraConfig refuses)."""
    try:
        from peft import LoraConfig
    except ImportError:
        return ["section 'peft' needs the peft package (pip install 'mrtpo[peft]')"]
    known = sorted(f.name for f in dataclasses.fields(LoraConfig) if f.init)
    errors = [f"unknown field 'peft.{k}'{_nearest(k, known)}" for k in section if k not in known]
    if not errors:
        try:
            LoraConfig(**{"task_type": "CAUSAL_LM", **section})
        except (ValueError, TypeError) as e:
            errors.append(f"section 'peft': {' '.join(str(e).split())}")
    return errors


def _plain(value: Any) -> Any:
    """A YAML-safe copy (enums by value, other objects by their text)."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def _environment_errors(model: dict[str, Any], trainer: dict[str, Any], peft: bool = False) -> list[str]:
    """Fields that ask for what is not installed or not possible with this model: one message each."""
    errors = []
    path = model.get("path")
    if isinstance(path, str):
        from mrtpo.models.loading import looks_like_path, missing_path_message

        if looks_like_path(path) and not Path(path).expanduser().exists():
            errors.append(f"field 'model.path': {missing_path_message(path)}")
    report_to = trainer.get("report_to")
    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    for name in names:
        if name in TRACKERS:
            module, package = TRACKERS[name]
            if importlib.util.find_spec(module) is None:
                errors.append(
                    f"field 'trl.report_to': {name!r} needs the {package} package (pip install {package}), "
                    f"or remove it from trl.report_to"
                )
    if trainer.get("use_vllm") is True and importlib.util.find_spec("vllm") is None:
        errors.append(
            "field 'trl.use_vllm': vllm is not installed (pip install vllm; it needs a GPU); "
            "set trl.use_vllm false to generate with transformers"
        )
    if trainer.get("use_liger_kernel") is True and importlib.util.find_spec("liger_kernel") is None:
        errors.append(
            "field 'trl.use_liger_kernel': liger-kernel is not installed (pip install liger-kernel; "
            "it needs a GPU); set trl.use_liger_kernel false"
        )
    beta = trainer.get("beta")
    if model.get("tiny") is not None and not peft and isinstance(beta, (int, float)) and beta > 0:
        errors.append(
            f"field 'trl.beta': {beta} (TRL's KL coefficient) loads a reference model from model.path; "
            "model.tiny runs with trl.beta 0 only, or with a peft section (the reference is the model "
            "with its adapter disabled; the allocation strength is method.credit_beta)"
        )
    return errors


def import_config_plugins(value: Any) -> list[str]:
    """Import the modules of a config's ``plugins`` list (:func:`mrtpo.plugins.import_plugins`, after
    ``$MRTPO_PLUGINS``); returns the list. A ValueError names the field and the module that fails."""
    from mrtpo.plugins import import_plugins

    if value is None:
        value = []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(m, str) and m.strip() for m in value):
        raise ValueError(
            f"invalid config: field '{PLUGINS_KEY}': {value!r} is not a list of module names (or .py paths)"
        )
    try:
        import_plugins(value)
    except ValueError as e:
        raise ValueError(f"invalid config: field '{PLUGINS_KEY}': {e}") from None
    return list(value)


def load_config(
    path: str | Path | None = None,
    overrides: Sequence[tuple[str, Any]] = (),
    raw: dict[str, Any] | None = None,
    plugins: Sequence[str] = (),
) -> RunConfig:
    """Read ``path`` (or take ``raw``), apply dotted ``overrides``, add ``plugins`` (``--plugin``) to the
    config's ``plugins`` list, validate."""
    base = _load_yaml(path) if path is not None else copy.deepcopy(raw or {})
    base = apply_overrides(base, overrides)
    if plugins:
        listed = base.get(PLUGINS_KEY) or []
        listed = [listed] if isinstance(listed, str) else list(listed)
        base[PLUGINS_KEY] = list(dict.fromkeys([*listed, *plugins]))
    return RunConfig.from_dict(base)


def _tiny_model_and_tokenizer(spec: dict[str, Any], examples, dtype: str = "auto") -> tuple[Any, Any]:
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
    kw = {k: spec[k] for k in TINY_KEYS if k != "words" and k in spec}  # words: the tokenizer's, above
    model = build_model(len(tok), dtype=getattr(torch, "float32" if dtype == "auto" else dtype), **kw)
    return model, tok


def _hf_model_and_tokenizer(path: str, dtype: str):
    from mrtpo.models.loading import load_model_and_tokenizer

    try:
        return load_model_and_tokenizer(path, dtype=dtype, device=None, eval_mode=False)
    except OSError as e:  # not a local folder, and not reachable or unknown on the hub
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FileNotFoundError(f"field 'model.path': cannot load {path!r}: {first}") from None


def load_task_spec(name: str, options: dict[str, Any] | None = None):
    """Build the task named by ``task.name``: a built-in name (``toy``) or ``module:Class``, an importable
    :class:`~mrtpo.tasks.base.Task` subclass of your own (``mypkg.tasks:MyTask``), with ``options``."""
    from mrtpo.tasks import TASKS, load_task, user_task_class
    from mrtpo.tasks.conditions import with_conditions

    options = dict(options or {})
    conditions = options.pop("conditions", None)
    if conditions:  # GDPO's conditioned reward: the task option of every task (mrtpo.tasks.conditions)
        task = load_task_spec(name, options)
        try:
            return with_conditions(task, conditions)
        except ValueError as e:  # "task.options.conditions.<reward>: why" -> "field '...': why"
            where, _, why = str(e).partition(": ")
            raise ValueError(
                f"invalid config: field '{where}': {why}" if why else f"invalid config: {e}"
            ) from None
    if ":" in name:
        try:
            cls = user_task_class(name)
        except ValueError as e:
            raise ValueError(f"field 'task.name': {e}") from None
    else:
        if name not in TASKS:
            _import_builtin_tasks()
        if name not in TASKS:
            hint = "; a task of your own is given as module:Class (e.g. mypkg.tasks:MyTask)"
            raise ValueError(
                f"field 'task.name': unknown task {name!r}{_nearest(name, TASKS.names())}; "
                f"known: {', '.join(TASKS.names())}{hint}"
            )
        return _construct(lambda: load_task(name, **options))
    return _construct(lambda: cls(**options))


def _construct(make):
    try:
        return make()
    except TypeError as e:
        raise ValueError(f"invalid config: field 'task.options': {e}") from None


def _import_builtin_tasks() -> None:
    """Import every task package under ``mrtpo.tasks`` so the registry lists them (they register on
    import; a task whose extra is not installed is left out)."""
    import pkgutil

    import mrtpo.tasks as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        if info.ispkg:
            with contextlib.suppress(ImportError):
                importlib.import_module(f"mrtpo.tasks.{info.name}")


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
    from mrtpo.integrations.deepspeed_cpu import use_gloo_allreduce_on_cpu
    from mrtpo.integrations.trl.trainer import MRTPOTrainer

    use_gloo_allreduce_on_cpu()  # DS_ACCELERATOR=cpu: no 200 s compile of a kernel, no lock left behind
    args = config.trainer_config()
    config.check_environment()
    if task is None:
        task = load_task_spec(config.task["name"], config.task["options"])
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
                config.model["tiny"], list(train_examples) + list(eval_examples or []), config.model["dtype"]
            )
        else:
            m, t = _hf_model_and_tokenizer(config.model["path"], config.model["dtype"])
        model, tokenizer = model or m, tokenizer or t
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    run_info = {"model": config.model.get("path") or "tiny", "config": config.raw, "peft": config.peft}
    return MRTPOTrainer(
        model,
        args=args,
        task=task,
        train_dataset=list(train_examples),
        eval_dataset=list(eval_examples) if eval_examples else None,
        processing_class=tokenizer,
        run_info=run_info,
        callbacks=callbacks,
        peft_config=config.peft_config(),
    )


class RunFolderNotEmpty(ValueError):
    """``trl.output_dir`` holds an earlier run and neither resume nor overwrite was asked for."""


class TrainingInterrupted(Exception):
    """Training stopped on Ctrl-C (SIGINT) after saving a checkpoint.

    Attributes: ``step`` (the last optimizer step), ``checkpoint`` (its folder), ``trainer``.
    """

    def __init__(self, step: int, checkpoint: Path | None, trainer) -> None:
        super().__init__(f"interrupted at step {step}")
        self.step, self.checkpoint, self.trainer = step, checkpoint, trainer


def _prepare_run_folder(out: Path, overwrite: bool) -> None:
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not overwrite:
        first = ("run.json", "metrics.jsonl", "samples.jsonl", "model.safetensors")
        held = sorted((p.name for p in out.iterdir()), key=lambda n: (n not in first, n))
        n_ckpt = sum(1 for h in held if h.startswith("checkpoint-"))
        shown = [h for h in held if not h.startswith("checkpoint-")][:4]
        if n_ckpt:
            shown.append(f"{n_ckpt} checkpoint(s)")
        raise RunFolderNotEmpty(
            f"run folder {str(out)!r} is not empty ({', '.join(shown)}): add --resume to continue that run, "
            "--overwrite to delete its run files and checkpoints and start again, or choose another "
            "--trl.output_dir"
        )
    if int(os.environ.get("RANK", "0")) != 0:  # several processes (accelerate launch): the first deletes
        return
    for pattern in RUN_FILES:
        for p in out.glob(pattern):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()


def _resume_target(out: Path, resume: str | bool, log) -> str:
    from mrtpo.integrations.trl.checkpoints import checkpoint_problems, pick_checkpoint

    if isinstance(resume, str):
        if not Path(resume).is_dir():
            raise FileNotFoundError(f"checkpoint folder {resume!r} does not exist")
        problems = checkpoint_problems(resume)
        if problems:
            raise ValueError(
                f"checkpoint {resume!r} cannot be resumed exactly: {', '.join(problems)}; "
                "give a complete checkpoint-N folder (or --resume alone: the newest complete one)"
            )
        return resume
    folder, skipped = pick_checkpoint(out)
    if folder is None:
        if not skipped:
            raise FileNotFoundError(f"--resume: no checkpoint-* folder in {str(out)!r}")
        raise ValueError(
            f"--resume: no complete checkpoint in {str(out)!r} ("
            + "; ".join(f"{p.name}: {', '.join(pr)}" for p, pr in skipped)
            + ")"
        )
    for p, problems in skipped:
        log(f"{p.name} is incomplete ({', '.join(problems)}): resuming from {folder.name} instead")
    return str(folder)


def _interrupt_callback():
    from transformers import TrainerCallback

    class StopOnInterrupt(TrainerCallback):
        """After the first SIGINT: finish the current optimizer step, save a checkpoint, stop."""

        requested = False

        def on_step_end(self, args, state, control, **kwargs):
            if self.requested:
                control.should_save = True
                control.should_training_stop = True

    return StopOnInterrupt()


def train(
    config: RunConfig | dict | str | Path,
    overrides: Sequence[tuple[str, Any]] = (),
    *,
    resume: str | bool | None = None,
    overwrite: bool = False,
    save_final: bool = True,
    log=None,
    **build_kwargs,
):
    """Train from a config (a :class:`RunConfig`, a raw dict or a YAML path); returns the trainer.

    The run folder (``trl.output_dir``) must be empty or absent, unless ``resume`` (continue it) or
    ``overwrite`` (delete its run files, checkpoints, logs and model first). At the end the model and
    tokenizer are saved into it (``trainer.save_model()``; loadable with ``from_pretrained``).

    Ctrl-C (SIGINT, in the main thread) stops after the current optimizer step, saves a checkpoint and
    raises :class:`TrainingInterrupted`; a second Ctrl-C stops at once (KeyboardInterrupt).

    Args:
        overrides: dotted ``(key, value)`` pairs applied on top of the config.
        resume: True for the newest complete checkpoint in ``trl.output_dir`` (incomplete newer ones are
            skipped and named through ``log``), a checkpoint folder (refused when incomplete), or None.
        overwrite: start again in a non-empty run folder.
        save_final: save the final model and tokenizer into ``trl.output_dir``.
        log: a ``str -> None`` for notices (default: print to stderr).
        build_kwargs: see :func:`build_trainer` (model, tokenizer, task, train_examples, ...).
    """
    import signal
    import threading

    log = log or (lambda msg: print(f"mrtpo train: {msg}", file=sys.stderr, flush=True))
    if isinstance(config, RunConfig):
        cfg = load_config(raw=config.raw, overrides=overrides)
    elif isinstance(config, dict):
        cfg = load_config(raw=config, overrides=overrides)
    else:
        cfg = load_config(config, overrides)
    out = Path(cfg.trainer["output_dir"])
    if resume:
        resume = _resume_target(out, resume, log)
    else:
        cfg.trainer_config()  # a bad field fails before anything is deleted
        cfg.check_environment()
        _prepare_run_folder(out, overwrite)
    trainer = build_trainer(cfg, **build_kwargs)
    if trainer.accelerator.is_main_process:
        from mrtpo.integrations.trl.run_logging import estimate_run_bytes

        log(estimate_run_bytes(trainer)["text"])
    stopper = _interrupt_callback()
    trainer.add_callback(stopper)

    def on_sigint(signum, frame):
        if stopper.requested:
            raise KeyboardInterrupt
        stopper.requested = True
        log("Ctrl-C: stopping after this step and saving a checkpoint (Ctrl-C again to stop at once)")

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, on_sigint) if main_thread else None
    try:
        trainer.train(resume_from_checkpoint=resume or None)
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, previous)
    if stopper.requested:
        step = trainer.state.global_step
        folder = out / f"checkpoint-{step}"
        raise TrainingInterrupted(step, folder if folder.is_dir() else None, trainer)
    if save_final:
        trainer.save_model()
    return trainer
