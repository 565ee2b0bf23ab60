"""Training configs: YAML reading, command-line overrides and validation, before torch is imported.

A config holds these sections (see ``recipes/*.yaml``), and optionally a list of plug-in modules::

    plugins: [my_ext]                            # imported first (mrtpo.plugins): what they register
                                                 # (advantage methods, credit schemes, tasks) validates
    model:  {path: <local folder or hub id>, dtype: auto}     or  {tiny: {hidden_size: 64, ...}}
    task:   {name: sql, options: {...}}          # a built-in task, or module:Class of your own;
                                                 # options.conditions: GDPO's conditioned reward
    data:   {source: <path or null>, split: train, limit: null, eval_split: null, eval_limit: null}
    method: {method: gdpo, options: {eps: 1.0e-6}, weights: null, credit: reward, credit_beta: 0.5,
             credit_options: {}, ramp_steps: 50, seed: null}     # the block verl reads as algorithm.mrtpo
    loss:   {name: policy}                       # or {name: opsd, divergence: jsd, beta: 0.5}
    replay: {token_budget: 16384, chunk_size: 256, sharding: auto, ...}   # as verl's algorithm.mrtpo.replay
    log:    {samples: 2, localization: true, run_files: true}
    trl:    {output_dir: runs/x, learning_rate: 1e-6, num_generations: 8, ...}   # GRPOConfig fields
    peft:   {r: 16, lora_alpha: 32, target_modules: [q_proj, v_proj]}           # optional: LoRA

Every section is a pydantic model: ``task``, ``model`` and ``data`` are declared here (:class:`TaskSection`
is the one place that declares the task section's keys), ``method`` is derived from
:class:`mrtpo.method.MethodConfig`'s fields, ``loss``/``replay``/``log`` from
:class:`mrtpo.integrations.trl.fields.MRTPOFields` (their metadata ``key``) and ``trl`` from the
description of TRL's ``GRPOConfig`` (:mod:`mrtpo.integrations.trl.trl_fields`), so that nothing here
imports torch, transformers or TRL: a bad field fails in a fraction of a second. What needs them is
checked next, by :meth:`RunConfig.check` (method and credit names against the registries, the task's
options, what this machine lacks) and :meth:`RunConfig.trainer_config` (TRL's own cross-field rules).

Overrides address a key by its dotted path: ``--method.credit_beta 0.3``, ``--trl.max_steps=10``;
values are parsed as YAML. Every unknown or ill-typed field is reported at once, in one line, naming
each field (with the nearest known name) and where its value came from (the config file or the
command line). The flat method fields of earlier versions (``method.advantage_method``,
``method.cort.ramp_steps``, ``method.opsd.beta``, ``method.replay_token_budget``, ...) are read with a
FutureWarning naming their spelling now. One TRL default differs (:data:`TRAINER_DEFAULTS`):
``trl.save_total_limit`` is 2, so a run keeps its newest two checkpoints (null keeps every one).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    model_validator,
)

from mrtpo.integrations.trl import trl_bounds, trl_fields
from mrtpo.integrations.trl.fields import CONFIG_KEYS, MRTPOFields, deprecated_fields, option_fields
from mrtpo.integrations.trl.reading import (
    Origins,
    apply_overrides,
    load_yaml,
    nearest,
    parse_overrides,
    read,
    renamed_path,
)
from mrtpo.method import METHOD_FIELDS, MethodConfig

__all__ = [
    "OPTION_SECTIONS",
    "TRAINER_DEFAULTS",
    "Origins",
    "RunConfig",
    "TaskSection",
    "apply_overrides",
    "import_config_plugins",
    "load_config",
    "load_yaml",
    "parse_overrides",
    "recipe_model",
]

PLUGINS_KEY = "plugins"  # the top-level list of plug-in modules (not a section)
DTYPES = ("auto", "float32", "bfloat16", "float16")
ON_VERIFIER_ERROR = ("raise", "min")
"""``task.on_verifier_error``'s values (:data:`mrtpo.tasks.faults.ON_ERROR`, which imports torch)."""
TRAINER_DEFAULTS = {"save_total_limit": 2}
"""trl fields whose default differs from TRL's in a config: the newest 2 checkpoints are kept (TRL keeps
every one: 201 checkpoints, 619 MB for 2,000 steps of the tiny recipe); ``trl.save_total_limit: null``
keeps all again."""
REMOVED = {"method.beta": "method.credit_beta"}
"""Spellings of earlier versions that are errors naming the spelling now (``method.beta`` reads as TRL's
KL coefficient ``trl.beta``)."""


# ---------------------------------------------------------------------------------------- value types


def _reject_bool(what: str):
    def check(value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError(f"{value!r} is not {what}")
        return value

    return BeforeValidator(check)


def _text(yes_no: bool):
    """A text field: YAML 1.1 reads ``no``/``yes`` as booleans (``save_strategy: no``): taken back as
    text unless the field also takes a boolean; numbers become their text."""

    def check(value: Any) -> Any:
        if isinstance(value, bool) and yes_no:
            return "yes" if value else "no"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        return value

    return BeforeValidator(check)


def _choices(values: Sequence[Any]):
    yes_no = not any(isinstance(v, bool) for v in values)

    def check(value: Any) -> Any:
        if isinstance(value, bool) and yes_no:
            value = "yes" if value else "no"
        if value not in values:
            raise ValueError(f"{value!r} is not one of {', '.join(map(str, values))}")
        return value

    return BeforeValidator(check)


def _non_negative(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a non-negative integer")
    return value


def _positive(value: Any) -> Any:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{value!r} is not a positive integer")
    return value


def _rate(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"{value!r} is not a number in [0, 1]")
    return float(value)


def annotation(desc: Any, *, in_union_with_bool: bool = False) -> Any:
    """The pydantic type of a type description of :mod:`mrtpo.integrations.trl.trl_fields`."""
    if desc == "bool":
        return Annotated[bool, Field(strict=True)]
    if desc == "int":
        return Annotated[int, _reject_bool("an integer")]
    if desc == "float":
        return Annotated[float, _reject_bool("a number")]
    if desc == "str":
        return Annotated[str, _text(yes_no=not in_union_with_bool)]
    if desc == "dict":
        return dict[str, Any]
    if desc == "null":
        return None
    if desc == "any":
        return Any
    if "list" in desc:
        return list[annotation(desc["list"])]
    if "choices" in desc:
        return Annotated[Any, _choices(desc["choices"])]
    members = desc["union"]
    if "any" in members:
        return Any
    with_bool = "bool" in members
    types = tuple(annotation(m, in_union_with_bool=with_bool) for m in members)
    if len([m for m in members if m != "null"]) < 2:  # X | None: pydantic's nullable X
        return Union[types]  # noqa: UP007 (a runtime tuple)
    return Annotated[Union[types], Field(union_mode="left_to_right")]  # noqa: UP007


def _model(name: str, fields: dict[str, tuple[Any, Any]], doc: str = "") -> type[BaseModel]:
    return create_model(name, __config__=ConfigDict(extra="forbid"), __doc__=doc, **fields)


# ---------------------------------------------------------------------------------------- sections


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TinySection(_Section):
    """``model.tiny``: a random tiny Qwen2 model (:mod:`mrtpo.models.tiny`) on a word-level tokenizer."""

    hidden_size: Annotated[int, BeforeValidator(_positive)] | None = None
    num_layers: Annotated[int, BeforeValidator(_non_negative)] | None = None
    num_heads: Annotated[int, BeforeValidator(_positive)] | None = None
    num_kv_heads: Annotated[int, BeforeValidator(_positive)] | None = None
    intermediate_size: Annotated[int, BeforeValidator(_non_negative)] | None = None
    tie_embeddings: Annotated[bool, Field(strict=True)] | None = None
    seed: Annotated[int, BeforeValidator(_non_negative)] | None = None
    words: list[Annotated[str, _text(yes_no=True)]] | None = None

    @model_validator(mode="after")
    def _shape(self) -> TinySection:
        """The attention's shape (the keys not given take build_model's defaults): each head as wide as
        hidden_size / num_heads, an even width (rotary embeddings), whole groups of query heads per
        key-value head; else the model fails in its first forward pass, in a traceback."""
        from mrtpo.models.tiny import attention_shape  # plain Python at import (no torch)

        hidden, heads, kv = attention_shape(self.model_dump())
        if hidden % (2 * heads):
            raise ValueError(
                f"field 'model.tiny.hidden_size' ({hidden}) with 'model.tiny.num_heads' ({heads}): "
                "hidden_size must be a multiple of 2 x num_heads (each attention head is hidden_size / "
                "num_heads wide, an even width for the rotary embeddings)"
            )
        if heads % kv:
            raise ValueError(
                f"field 'model.tiny.num_kv_heads' ({kv}) with 'model.tiny.num_heads' ({heads}): num_heads "
                "must be a multiple of num_kv_heads (each key-value head serves a whole group of query heads)"
            )
        return self


class ModelSection(_Section):
    path: Annotated[str, Field(strict=True)] | None = Field(None, description="a local folder or a hub id")
    dtype: Annotated[str, _choices(DTYPES)] = "auto"
    tiny: TinySection | None = None

    @model_validator(mode="after")
    def _one_source(self) -> ModelSection:
        if (self.path is None) == (self.tiny is None):
            raise ValueError("field 'model.path' or 'model.tiny' (exactly one) must be set")
        return self


class TaskSection(_Section):
    """The task section: every key a config may give a task is declared here."""

    name: Annotated[str, Field(strict=True, min_length=1)] = Field(
        description="a built-in task (mrtpo train --help lists them) or module:Class of your own"
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments of the task's constructor"
    )
    on_verifier_error: Annotated[str, _choices(ON_VERIFIER_ERROR)] = Field(
        "raise",
        description="a failed verdict (docs/verifiers.md): 'raise' stops the run after a checkpoint of "
        "the last completed step; 'min' scores the reward's minimum and counts it",
    )
    max_verifier_error_rate: Annotated[float, BeforeValidator(_rate)] = Field(
        0.1, description="under 'min', the largest share of one batch's verdicts that may fail"
    )


class DataSection(_Section):
    source: Annotated[str, _text(yes_no=True)] | None = None
    split: Annotated[str, _text(yes_no=True)] = "train"
    limit: Annotated[int, BeforeValidator(_positive)] | None = None
    eval_split: Annotated[str, _text(yes_no=True)] | None = None
    eval_limit: Annotated[int, BeforeValidator(_positive)] | None = None


def _dataclass_fields(cls: type, names: Sequence[str]) -> dict[str, tuple[Any, Any]]:
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        if f.name in names:
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            out[f.name] = (annotation(trl_fields.describe(hints[f.name])), default)
    return out


MethodSection = _model(
    "MethodSection",
    {
        **_dataclass_fields(MethodConfig, METHOD_FIELDS),
        "method": (annotation("str"), MethodConfig.method),  # a TRL run names its method
        "seed": (annotation({"union": ["int", "null"]}), None),  # null: the run's trl.seed
    },
    "The method block (mrtpo.method.MethodConfig's fields; names and options are checked against the "
    "registries by RunConfig.check).",
)


def _option_sections() -> dict[str, type[BaseModel]]:
    """``loss``, ``replay`` and ``log`` from MRTPOFields (metadata ``key``: section.name)."""
    hints = typing.get_type_hints(MRTPOFields)
    by_section: dict[str, dict[str, tuple[Any, Any]]] = {}
    for f in option_fields():
        section, name = CONFIG_KEYS[f.name].split(".")
        by_section.setdefault(section, {})[name] = (annotation(trl_fields.describe(hints[f.name])), f.default)
    return {s: _model(f"{s.title()}Section", fs) for s, fs in by_section.items()}


OPTION_SECTIONS = _option_sections()
OPTION_FIELD = {CONFIG_KEYS[f.name]: f.name for f in option_fields()}
"""``"loss.beta"`` -> ``"opsd_beta"``: where a config writes each of MRTPOFields' own options."""


@functools.cache
def trl_section() -> type[BaseModel]:
    """The ``trl`` section: every field of the installed TRL's GRPOConfig (:mod:`~.trl_fields`)."""
    described = trl_fields.load()["fields"]
    fields = {name: (annotation(d["type"]), d["default"]) for name, d in described.items()}
    return _model("TRLSection", fields, "TRL's GRPOConfig fields (TrainingArguments' included).")


def _section_default(value: Any) -> Any:
    return {} if value is None else value


def _plugins(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


@functools.cache
def recipe_model() -> type[BaseModel]:
    """The whole config (plugins, then every section)."""
    section = lambda cls: (Annotated[cls, BeforeValidator(_section_default)], Field(default_factory=cls))  # noqa: E731
    return _model(
        "Recipe",
        {
            PLUGINS_KEY: (Annotated[list[str], BeforeValidator(_plugins)], Field(default_factory=list)),
            "model": (ModelSection, ...),
            "task": (TaskSection, ...),
            "data": section(DataSection),
            "method": section(MethodSection),
            **{name: section(cls) for name, cls in OPTION_SECTIONS.items()},
            "trl": section(trl_section()),
            "peft": (dict[str, Any] | None, None),
        },
    )


def sections() -> tuple[str, ...]:
    return tuple(k for k in recipe_model().model_fields if k != PLUGINS_KEY)


def _walk(loc: Sequence[Any]) -> tuple[list[str], type[BaseModel] | None, list[Any]]:
    """The field path of a pydantic error location, the model holding its last field (for known
    names) and what follows the path (union members, list indices, an unknown key)."""
    cls: type[BaseModel] | None = recipe_model()
    path: list[str] = []
    holder = cls
    for i, item in enumerate(loc):
        if cls is None or not isinstance(item, str) or item not in cls.model_fields:
            return path, holder, list(loc[i:])
        path.append(item)
        holder = cls
        cls = _model_in(cls.model_fields[item].annotation)
    return path, holder, []


def _model_in(hint: Any) -> type[BaseModel] | None:
    if isinstance(hint, type) and issubclass(hint, BaseModel):
        return hint
    for arg in typing.get_args(hint):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


_TEXT = {
    "float_parsing": "is not a number",
    "float_type": "is not a number",
    "int_parsing": "is not an integer",
    "int_type": "is not an integer",
    "int_from_float": "is not an integer",
    "bool_type": "is not true or false",
    "bool_parsing": "is not true or false",
    "string_type": "is not a string",
    "list_type": "is not a list",
    "dict_type": "is not a mapping",
    "none_required": "must be null",
}


def _message(err: dict[str, Any], origins: Origins) -> tuple[str, str]:
    """``(field path, one message)`` of a pydantic error."""
    path, holder, rest = _walk(err["loc"])
    key = ".".join(path)
    kind, value = err["type"], err.get("input")
    where = origins.note(key)
    if kind == "extra_forbidden" and rest:
        name = str(rest[0])
        full = f"{key}.{name}" if key else name
        where = origins.note(full)
        if not key:
            known = [*sections(), PLUGINS_KEY]
            return full, (
                f"unknown section '{name}'{nearest(name, known)}{where}; sections: {', '.join(sections())} "
                f"(and the list '{PLUGINS_KEY}')"
            )
        return full, _unknown_field(key, name, list(holder_fields(key))) + where
    if kind == "missing":
        field = holder.model_fields[path[-1]] if holder is not None and path else None
        hint = f" ({field.description})" if field is not None and field.description else ""
        return key, f"field '{key}' is required{hint}"
    if kind in ("model_type", "model_attributes_type", "dict_type") and len(path) == 1 and not rest:
        return key, f"section '{key}' must be a mapping, got {type(value).__name__}{where}"
    if kind in ("model_type", "model_attributes_type"):
        return key, f"field '{key}' must be a mapping, got {value!r}{where}"
    if kind == "value_error":
        text = str(err.get("ctx", {}).get("error") or err["msg"]).removeprefix("Value error, ")
        if text.startswith("field '"):
            return key, text + where
    elif kind in _TEXT:
        text = f"{value!r} {_TEXT[kind]}"
    else:
        text = f"{value!r}: {err['msg'][:1].lower()}{err['msg'][1:]}"
    index = [x for x in rest if isinstance(x, int)]
    if index:
        text = f"item {index[0]}: {text}"
    return key, f"field '{key}': {text}{where}"


def holder_fields(key: str) -> list[str]:
    """The field names of the section or subsection at dotted ``key``."""
    cls: type[BaseModel] | None = recipe_model()
    for part in key.split("."):
        cls = _model_in(cls.model_fields[part].annotation) if cls and part in cls.model_fields else None
    return list(cls.model_fields) if cls is not None else []


def _unknown_field(section: str, name: str, known: list[str]) -> str:
    full = f"{section}.{name}"
    if full in REMOVED:
        return f"field '{full}' is now '{REMOVED[full]}'"
    trl_known = set(trl_section().model_fields)
    method_like = {*METHOD_FIELDS, *deprecated_fields(), *OPTION_FIELD.values()}  # MRTPOConfig's own names
    if section == "method" and name in trl_known:
        return f"unknown field '{full}' (a TRL field: put it under 'trl')"
    if section == "trl" and name in method_like:
        return (
            f"field '{full}' belongs in the 'method' section (method.{name})"
            if name in METHOD_FIELDS
            else (f"field '{full}' is MRTPO's, not TRL's: write {renamed_path('method.' + name)}")
        )
    return f"unknown field '{full}'{nearest(name, known)}"


def validation_errors(exc: ValidationError, origins: Origins) -> list[str]:
    """One message per field (the first of a field's errors: a union reports one per member)."""
    seen: dict[str, str] = {}
    for err in exc.errors(include_url=False):
        key, text = _message(err, origins)
        seen.setdefault(key, text)
    return list(seen.values())


# ---------------------------------------------------------------------------------------- the validated config


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


_GROUPS = re.compile(r"generation_batch_size \((\d+)\) must be divisible by num_generations \((\d+)\)")
_FIELD_MESSAGE = re.compile(r"^(method\.[\w.]+?)(?:=|: | has )(.*)$")


@dataclasses.dataclass
class RunConfig:
    """A validated training config (the sections of the module docstring).

    Built by :func:`load_config` without importing torch, transformers or TRL; :meth:`check` then
    checks what needs them (one line naming every such field), :meth:`trainer_config` builds the
    :class:`~mrtpo.integrations.trl.MRTPOConfig`.
    """

    model: dict[str, Any]
    task: dict[str, Any]
    data: dict[str, Any]
    trainer: dict[str, Any]  # MRTPOConfig keyword arguments: method (the block as given), options, trl fields
    raw: dict[str, Any]  # the config as written (spellings of today), overrides applied
    peft: dict[str, Any] | None = None  # peft.LoraConfig keyword arguments, or None (full fine-tuning)
    plugins: list[str] = dataclasses.field(default_factory=list)  # plug-in modules, imported already
    origins: Origins = dataclasses.field(default_factory=Origins)  # where each value came from

    @classmethod
    def from_dict(cls, raw: dict[str, Any], origins: Origins | None = None) -> RunConfig:
        """Validate ``raw`` (spellings of today); raise one ValueError listing every bad field.

        The ``plugins`` modules are imported first (a ValueError naming the one that fails), so the
        advantage methods, credit schemes and tasks they register are known when the rest is checked.
        """
        origins = origins or Origins()
        plugins = import_config_plugins(raw.get(PLUGINS_KEY))
        errors: list[str] = []
        try:
            valid = recipe_model().model_validate(raw)
        except ValidationError as e:
            errors.extend(validation_errors(e, origins))
            valid = None
        trl_raw = raw.get("trl")
        if not isinstance(trl_raw, dict) or "output_dir" not in trl_raw:
            errors.append("field 'trl.output_dir' is required (the run folder)")
        if valid is not None:  # the numbers torch / TRL would refuse only once training started
            errors.extend(trl_bounds.bound_errors(valid.trl.model_dump(exclude_unset=True), origins.note))
        if errors:
            raise ValueError("invalid config: " + "; ".join(errors))
        trainer: dict[str, Any] = {"method": valid.method.model_dump(exclude_unset=True)}
        for section in OPTION_SECTIONS:
            for name, value in getattr(valid, section).model_dump(exclude_unset=True).items():
                trainer[OPTION_FIELD[f"{section}.{name}"]] = value
        trainer.update(valid.trl.model_dump(exclude_unset=True))
        for name, value in TRAINER_DEFAULTS.items():
            trainer.setdefault(name, value)
        model = {"dtype": "auto", **valid.model.model_dump(exclude_unset=True)}
        return cls(
            model=model,
            task=valid.task.model_dump(),
            data=valid.data.model_dump(),
            trainer=trainer,
            raw=raw,
            peft=dict(valid.peft) if valid.peft else None,
            plugins=plugins,
            origins=origins,
        )

    def method_config(self) -> MethodConfig:
        """The validated method block (against the registries: imports torch); ``seed`` null is
        ``trl.seed``, ``weights`` null TRL's ``reward_weights``."""
        block = dict(self.trainer.get("method") or {})
        if block.get("weights") is None and self.trainer.get("reward_weights") is not None:
            block["weights"] = self.trainer["reward_weights"]
        seed = self.trainer.get("seed", trl_section().model_fields["seed"].default)
        return MethodConfig.from_dict(block, prefix="method.", run_seed=seed)

    def check(self) -> None:
        """What :func:`load_config` cannot check without torch, at once: the task and its options, the
        method and credit names and options against the registries (plug-ins included), the ``peft``
        section, and what this machine lacks (:func:`~mrtpo.integrations.trl.checks.environment_errors`).
        One ValueError naming every such field and where its value came from."""
        from mrtpo.integrations.trl import checks

        errors = []
        try:
            checks.load_task_spec(self.task["name"], self.task["options"], self.origins.note)
        except ValueError as e:
            errors.append(str(e).removeprefix("invalid config: "))
        try:
            self.method_config()
        except ValueError as e:
            errors.append(self._field_message(str(e)))
        errors.extend(self._peft_errors())
        errors.extend(
            checks.environment_errors(
                self.model, self.data, self.trainer, self.peft is not None, self.origins.note
            )
        )
        if errors:
            raise ValueError("invalid config: " + "; ".join(errors))

    def check_environment(self) -> None:
        """Raise one ValueError naming each field that asks for what this machine lacks (a GPU, vLLM, a
        tracker, a model or data folder, a hub model offline) or this model cannot do (a KL reference
        model for ``model.tiny``). A config can be validated on a machine that could not run it."""
        from mrtpo.integrations.trl.checks import environment_errors

        errors = environment_errors(
            self.model, self.data, self.trainer, self.peft is not None, self.origins.note
        )
        if errors:
            raise ValueError("invalid config: " + "; ".join(errors))

    def _field_message(self, message: str) -> str:
        """``"method.credit='x' is unknown..."`` -> ``"field 'method.credit': 'x' is unknown... (from ...)"``."""
        m = _FIELD_MESSAGE.match(" ".join(message.split()))
        if m is None:
            return message
        key, rest = m.group(1), m.group(2)
        key = key.split(".credit_options.")[0] if ".credit_options." in key else key
        head = key.rsplit(".", 1)[0] if key.count(".") > 1 else key
        rest = f"has {rest}" if message.startswith(f"{m.group(1)} has ") else rest
        return f"field '{head}': {rest}{self.origins.note(head)}"

    def _peft_errors(self) -> list[str]:
        """The ``peft`` section's problems, one message per field (unknown keys, values LoraConfig refuses)."""
        if self.peft is None:
            return []
        try:
            from peft import LoraConfig
        except ImportError:
            return ["section 'peft' needs the peft package (pip install 'mrtpo[peft]')"]
        known = sorted([*PEFT_OPTIONS, *(f.name for f in dataclasses.fields(LoraConfig) if f.init)])
        errors = [
            f"unknown field 'peft.{k}'{nearest(k, known)}{self.origins.note('peft.' + k)}"
            for k in self.peft
            if k not in known
        ]
        errors += [
            f"field 'peft.{k}' must be true or false, got {self.peft[k]!r}{self.origins.note('peft.' + k)}"
            for k in PEFT_OPTIONS
            if k in self.peft and not isinstance(self.peft[k], bool)
        ]
        if not errors:
            try:
                LoraConfig(**{"task_type": "CAUSAL_LM", **self.lora_fields()})
            except (ValueError, TypeError) as e:
                errors.append(f"section 'peft': {' '.join(str(e).split())}{self.origins.note('peft')}")
        return errors

    def peft_config(self):
        """The ``peft.LoraConfig`` of the ``peft`` section (task type causal LM), or None."""
        if self.peft is None:
            return None
        from peft import LoraConfig

        return LoraConfig(**{"task_type": "CAUSAL_LM", **self.lora_fields()})

    def lora_fields(self) -> dict[str, Any]:
        """The ``peft`` section less mrtpo's own options (:data:`PEFT_OPTIONS`): ``LoraConfig``'s arguments."""
        return {k: v for k, v in (self.peft or {}).items() if k not in PEFT_OPTIONS}

    @property
    def peft_save_merged(self) -> bool:
        """``peft.save_merged``: the run folder gets the merged model (the adapter goes to ``adapter/``)."""
        return bool((self.peft or {}).get("save_merged", False))

    def trainer_config(self):
        """The :class:`~mrtpo.integrations.trl.MRTPOConfig`; its own cross-field errors name the field."""
        from mrtpo.integrations.trl.config import MRTPOConfig

        try:
            return MRTPOConfig(**self.trainer)
        except (ValueError, TypeError) as e:
            msg = " ".join(str(e).split())
            m = re.match(r"(\w+)=(.*)", msg)
            keys = {**{name: f"trl.{name}" for name in trl_section().model_fields}, **_option_keys()}
            if "doesn't support bf16/gpu" in msg:  # TRL's words for bf16 without a GPU or use_cpu
                msg = (
                    f"field 'trl.bf16': true{self.origins.note('trl.bf16')} needs a GPU, or trl.use_cpu: true "
                    "to train on this machine's CPU (no GPU here); a GPU recipe is planned and started with "
                    "mrtpo plan / mrtpo launch"
                )
            elif group := _GROUPS.match(msg):  # TRL's words: the generation batch holds no whole groups
                key = "trl.num_generations"
                msg = (
                    f"field '{key}': {group.group(2)} does not divide the {group.group(1)} responses a "
                    "generation holds (trl.per_device_train_batch_size x processes x "
                    "trl.steps_per_generation, or trl.generation_batch_size): every prompt's "
                    f"num_generations responses must be in one generation{self.origins.note(key)}"
                )
            elif m and m.group(1) in keys:
                key = keys[m.group(1)]
                msg = f"field '{key}': {m.group(2)}{self.origins.note(key)}"
            elif _FIELD_MESSAGE.match(msg):
                msg = self._field_message(msg)
            raise ValueError("invalid config: " + msg) from None

    def resolved(self) -> dict[str, Any]:
        """The config with every default filled in (what ``--print-config`` shows)."""
        args = self.trainer_config()
        values = args.to_dict()
        out: dict[str, Any] = {
            "model": self.model,
            "task": self.task,
            "data": self.data,
            "method": args.method.to_dict(),
        }
        for key, name in OPTION_FIELD.items():
            section, field_name = key.split(".")
            out.setdefault(section, {})[field_name] = trl_fields.plain(getattr(args, name))
        out["trl"] = {name: trl_fields.plain(values.get(name)) for name in trl_section().model_fields}
        if self.plugins:
            out = {PLUGINS_KEY: list(self.plugins), **out}
        if self.peft is not None:
            out["peft"] = trl_fields.plain(self.peft)
        return out


# keys of the ``peft`` section that are mrtpo's, not LoraConfig's (docs/training.md, "LoRA run folders")
PEFT_OPTIONS = ("save_merged",)


def _option_keys() -> dict[str, str]:
    return {name: key for key, name in OPTION_FIELD.items()}


def load_config(
    path: str | Path | None = None,
    overrides: Sequence[tuple[str, Any]] = (),
    raw: dict[str, Any] | None = None,
    plugins: Sequence[str] = (),
) -> RunConfig:
    """Read ``path`` (or take ``raw``), apply dotted ``overrides``, add ``plugins`` (``--plugin``) to the
    config's ``plugins`` list, validate (without importing torch, transformers or TRL unless a plug-in
    does): a :class:`RunConfig`. Deprecated spellings are read with a FutureWarning each."""
    base, origins = read(path, overrides, raw)
    if plugins:
        listed = base.get(PLUGINS_KEY) or []
        listed = [listed] if isinstance(listed, str) else list(listed)
        base[PLUGINS_KEY] = list(dict.fromkeys([*listed, *plugins]))
    return RunConfig.from_dict(base, origins)
