"""Test doubles of vLLM: the engine objects TRL's vLLM path and ``mrtpo eval --backend vllm`` call,
generating through a Hugging Face model on CPU. They are doubles, not vLLM: no paged attention, no CUDA
graphs, no kernels of vLLM's; what they keep is the contract those callers rely on.

- :class:`HFBackedEngine`: its own copy of the model (loaded from the path the caller names, as vLLM
  loads it), updated only through :meth:`HFBackedEngine.load_weights`; sampling with the caller's
  settings (``temperature``, ``top_p``, ``top_k``, ``min_p``, ``repetition_penalty``, ``max_tokens``)
  through ``transformers``' ``generate``; the log-probability of each sampled token after those settings
  (vLLM's ``processed_logprobs``, what TRL asks for), optionally shifted by a known amount
  (``logprob_shift(token_ids, i)`` for token i of a response) so that TRL's importance-sampling ratio is
  not 1; a record of every
  weight load (:class:`SyncRecord`: the step ``clock()`` said, a checksum of the loaded tensors) and
  every generation (:class:`GenerateRecord`: a checksum of the weights it sampled with).
- :class:`FakeLLM`: ``vllm.LLM`` for colocate mode and offline evaluation (``generate``, ``chat``,
  ``sleep`` / ``wake_up``, ``llm_engine...model.load_weights``). Sleep level 2 discards the weights and
  the KV cache as vLLM's does: generating before every weight is loaded again, or before the KV cache is
  woken, raises.
- :class:`FakeVLLMServer` and its ``client`` class: TRL's ``VLLMClient`` for server mode
  (``init_communicator``, ``get_server_info``, ``update_named_params``, ``reset_prefix_cache``,
  ``generate``), all talking to one engine (the "server").
- :func:`install_trl_double` / :func:`install_vllm_module`: patch them in where TRL imports them (and
  TRL's ``is_vllm_available`` there), or as the ``vllm`` module.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import sys
import types
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch


def weights_checksum(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 over (name, dtype, shape, bytes) of every tensor, in name order."""
    h = hashlib.sha256()
    for name, t in sorted(((n, t.detach()) for n, t in named), key=lambda x: x[0]):
        t = t.to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def model_checksum(model) -> str:
    """The checksum of a model's parameters under the names TRL pushes (``named_parameters``: tied
    weights once)."""
    return weights_checksum(model.named_parameters())


@dataclass
class SyncRecord:
    step: Any  # what the engine's clock() returned at the load (the trainer's global step in the tests)
    names: list[str]
    checksum: str  # of the loaded tensors


@dataclass
class GenerateRecord:
    step: Any
    prompts: int
    n: int
    checksum: str  # of the engine's own weights when it sampled
    params: dict[str, Any] = field(default_factory=dict)  # the SamplingParams' fields


_SAMPLING_FIELDS = {
    "n": 1,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "max_tokens": 16,
    "min_tokens": 0,
    "logprobs": None,
    "seed": None,
    "structured_outputs": None,
    "stop_token_ids": [],
    "ignore_eos": False,
    "skip_special_tokens": True,
}


LLM_KEYWORDS = frozenset(
    {
        # TRL's colocate engine (trl.generation.vllm_generation.VLLMGeneration._init_vllm, TRL 1.14-1.16)
        "tensor_parallel_size",
        "gpu_memory_utilization",
        "max_model_len",
        "max_num_seqs",
        "enable_sleep_mode",
        "model_impl",
        "distributed_executor_backend",
        "seed",
        "max_num_batched_tokens",
        "logprobs_mode",
        "quantization",
        "trust_remote_code",
        # mrtpo: the engine's dtype (eval's VLLMGenerator, and the CPU build's colocate engine), and what a
        # CPU run of the real engine sets
        "dtype",
        "enforce_eager",
        "kv_cache_memory_bytes",
        "enable_prefix_caching",
    }
)
"""The keyword arguments :class:`FakeLLM` takes besides ``model`` (others raise ``TypeError``): each is a
parameter of the real ``vllm.LLM`` or a field of ``vllm.EngineArgs`` (checked against the installed vLLM by
tests/integrations/trl/test_vllm_double.py)."""


class SamplingParams:
    """``vllm.SamplingParams`` double: the fields vLLM has (unknown keywords raise ``TypeError``, as
    vLLM's do); ``top_k`` 0 or -1 and ``min_p`` 0 switch those filters off."""

    def __init__(self, **kw: Any) -> None:
        unknown = sorted(set(kw) - set(_SAMPLING_FIELDS))
        if unknown:
            raise TypeError(f"SamplingParams double: unexpected keyword(s) {unknown}")
        for k, v in {**_SAMPLING_FIELDS, **kw}.items():
            setattr(self, k, list(v) if isinstance(v, list) else v)  # a fresh list per instance


@dataclass
class StructuredOutputsParams:
    regex: str | None = None


@dataclass
class Logprob:
    logprob: float
    rank: int = 1
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    prompt: str | None = None


@dataclass
class Sampled:
    token_ids: list[int]
    logprobs: list[float]  # the shifted processed log-probabilities returned to the caller
    true_logprobs: list[float]  # before the shift


class HFBackedEngine:
    """The engine behind the doubles: a Hugging Face model of its own, weights loaded by name."""

    def __init__(
        self,
        model_path: str,
        *,
        seed: int = 0,
        logprob_shift: Callable[[list[int], int], float] | None = None,
        clock: Callable[[], Any] | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM

        from mrtpo.models.loading import load_tokenizer

        if not model_path:
            raise ValueError(
                "HFBackedEngine double: the model path is empty (vLLM loads the model from a path)"
            )
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        self.tokenizer = load_tokenizer(model_path)  # as mrtpo loads it (the tiny word-level tokenizers too)
        self.seed = seed
        self.logprob_shift = logprob_shift
        self.clock = clock or (lambda: None)
        self.syncs: list[SyncRecord] = []
        self.generations: list[GenerateRecord] = []
        self.returned: list[Sampled] = []  # every sequence handed out, in order
        self.loaded_since_sleep: set[str] | None = None  # None: weights resident
        self.calls = 0
        self._pending: list[tuple[str, torch.Tensor]] = []

    # -- weights
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy each ``(name, tensor)`` into the engine's model (a name the model lacks raises, as in
        vLLM); consecutive loads up to :meth:`finish_sync` make one :class:`SyncRecord`."""
        params = dict(self.model.named_parameters())
        done = set()
        for name, t in weights:
            if name not in params:
                raise KeyError(f"HFBackedEngine double: no parameter {name!r} to load")
            if tuple(t.shape) != tuple(params[name].shape):
                raise ValueError(f"HFBackedEngine double: {name!r} has shape {tuple(t.shape)}")
            with torch.no_grad():
                params[name].copy_(t.detach().to(params[name].dtype))
            self._pending.append((name, t.detach().to("cpu", copy=True)))
            done.add(name)
            if self.loaded_since_sleep is not None:
                self.loaded_since_sleep.add(name)
        return done

    def finish_sync(self) -> None:
        """Close the current weight load (TRL resets the prefix cache after pushing every tensor)."""
        if self._pending:
            self.syncs.append(
                SyncRecord(self.clock(), [n for n, _ in self._pending], weights_checksum(self._pending))
            )
            self._pending = []

    def discard_weights(self) -> None:
        """vLLM's sleep level 2: the weights are gone until every one is loaded again."""
        with torch.no_grad():
            for p in self.model.parameters():
                p.fill_(float("nan"))
        self.loaded_since_sleep = set()

    def _check_resident(self) -> None:
        if self.loaded_since_sleep is not None:
            missing = {n for n, _ in self.model.named_parameters()} - self.loaded_since_sleep
            if missing:
                raise RuntimeError(
                    f"HFBackedEngine double: generate after sleep level 2 with {len(missing)} weight(s) not "
                    f"loaded again (e.g. {sorted(missing)[0]!r})"
                )
            self.loaded_since_sleep = None

    # -- sampling
    def sample(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Sampled]]:
        """``params.n`` samples of each prompt: token ids (ending with EOS when the model stopped) and the
        processed log-probability of each sampled token (shifted by ``logprob_shift``)."""
        from transformers import GenerationConfig

        self._check_resident()
        self.finish_sync()
        self.generations.append(
            GenerateRecord(
                self.clock(), len(prompts), int(params.n), model_checksum(self.model), dict(vars(params))
            )
        )
        gc = self.model.generation_config
        eos = gc.eos_token_id if gc.eos_token_id is not None else self.tokenizer.eos_token_id
        greedy = float(params.temperature) == 0.0
        cfg = GenerationConfig(
            do_sample=not greedy,
            temperature=None if greedy else float(params.temperature),
            # explicit "off" values: transformers otherwise fills in its own defaults (top_k=50)
            top_p=None if greedy else 1.0 if params.top_p is None else float(params.top_p),
            top_k=None if greedy else 0 if params.top_k in (None, 0, -1) else int(params.top_k),
            min_p=None if greedy or not params.min_p else float(params.min_p),
            repetition_penalty=None
            if params.repetition_penalty in (None, 1.0)
            else float(params.repetition_penalty),
            max_new_tokens=int(params.max_tokens),
            min_new_tokens=int(params.min_tokens or 0) or None,
            num_return_sequences=int(params.n),
            eos_token_id=None if params.ignore_eos else eos,
            pad_token_id=self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos,
            output_scores=True,
            return_dict_in_generate=True,
        )
        seed = self.seed * 1_000_003 + self.calls if params.seed is None else int(params.seed)
        self.calls += 1
        out: list[list[Sampled]] = []
        stops = set([eos] if isinstance(eos, int) else (eos or []))
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            for ids in prompts:
                res = self.model.generate(input_ids=torch.tensor([list(ids)]), generation_config=cfg)
                seqs = res.sequences[:, len(ids) :]  # [n, T]
                logps = torch.stack(res.scores, dim=1).float().log_softmax(-1)  # [n, T, V] processed
                group = []
                for r in range(seqs.shape[0]):
                    toks = seqs[r].tolist()
                    cut = next((i + 1 for i, t in enumerate(toks) if t in stops), len(toks))
                    toks = toks[:cut]
                    true = [float(logps[r, i, t]) for i, t in enumerate(toks)]
                    shifted = [
                        lp + (float(self.logprob_shift(toks, i)) if self.logprob_shift else 0.0)
                        for i, lp in enumerate(true)
                    ]
                    s = Sampled(toks, shifted, true)
                    self.returned.append(s)
                    group.append(s)
                out.append(group)
        return out


class _Model:
    def __init__(self, engine: HFBackedEngine) -> None:
        self._engine = engine

    def load_weights(self, weights):
        return self._engine.load_weights(weights)


def _ns(**kw: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(**kw)


class FakeLLM:
    """``vllm.LLM`` double (colocate mode and offline evaluation) over an :class:`HFBackedEngine`.

    ``FakeLLM.instances`` lists every one built (the test reaches the one TRL built through it or through
    ``trainer.vllm_generation.llm``); ``FakeLLM.defaults`` are keyword arguments for the engine
    (``logprob_shift``) set by the test before TRL builds it."""

    instances: ClassVar[list[FakeLLM]] = []
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, model: str, **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - LLM_KEYWORDS)
        if unknown:
            raise TypeError(f"FakeLLM double: keyword(s) {unknown} not in vllm_double.LLM_KEYWORDS")
        self.kwargs = {"model": model, **kwargs}
        self.engine = HFBackedEngine(model, seed=int(kwargs.get("seed") or 0), **type(self).defaults)
        self.sleep_calls: list[int] = []
        self.wake_calls: list[list[str] | None] = []
        self.kv_cache_awake = True
        self.prefix_cache_resets = 0
        max_len = kwargs.get("max_model_len") or self.engine.model.config.max_position_embeddings
        self.llm_engine = _ns(
            model_executor=_ns(driver_worker=_ns(model_runner=_ns(model=_Model(self.engine)))),
            model_config=_ns(max_model_len=max_len),
        )
        type(self).instances.append(self)

    @property
    def clock(self):
        return self.engine.clock

    @clock.setter
    def clock(self, fn) -> None:
        self.engine.clock = fn

    def sleep(self, level: int = 1) -> None:
        self.sleep_calls.append(level)
        self.kv_cache_awake = False
        if level == 2:
            self.engine.discard_weights()

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.wake_calls.append(tags)
        if tags is None or "kv_cache" in tags:
            self.kv_cache_awake = True

    def reset_prefix_cache(self) -> bool:
        self.prefix_cache_resets += 1
        self.engine.finish_sync()
        return True

    def get_tokenizer(self):
        return self.engine.tokenizer

    def _outputs(self, prompts: list[list[int]], params: SamplingParams) -> list[RequestOutput]:
        if not self.kv_cache_awake:
            raise RuntimeError(
                "FakeLLM double: generate while the KV cache sleeps (wake_up(['kv_cache']) first)"
            )
        tok = self.engine.tokenizer
        res = []
        for ids, group in zip(prompts, self.engine.sample(prompts, params)):
            outs = [
                CompletionOutput(
                    index=i,
                    text=tok.decode(s.token_ids, skip_special_tokens=bool(params.skip_special_tokens)),
                    token_ids=s.token_ids,
                    logprobs=None
                    if params.logprobs is None
                    else [{t: Logprob(lp, 1)} for t, lp in zip(s.token_ids, s.logprobs)],
                    finish_reason="stop" if len(s.token_ids) < params.max_tokens else "length",
                )
                for i, s in enumerate(group)
            ]
            res.append(RequestOutput(list(ids), outs))
        return res

    def generate(self, prompts, sampling_params: SamplingParams | None = None, use_tqdm: bool = True):
        params = sampling_params or SamplingParams()
        ids = []
        for p in prompts if isinstance(prompts, list) else [prompts]:
            if isinstance(p, dict):
                if "multi_modal_data" in p:
                    raise NotImplementedError("FakeLLM double: no multimodal inputs")
                ids.append(list(p["prompt_token_ids"]))
            elif isinstance(p, str):
                ids.append(self.engine.tokenizer(p, add_special_tokens=False)["input_ids"])
            else:
                raise TypeError(f"FakeLLM double: prompt of type {type(p).__name__}")
        return self._outputs(ids, params)

    def chat(self, messages, sampling_params: SamplingParams | None = None, use_tqdm: bool = True, **kw):
        """Each conversation through the tokenizer's chat template (generation prompt added), as vLLM's
        ``LLM.chat``."""
        convs = messages if messages and isinstance(messages[0], list) else [messages]
        tok = self.engine.tokenizer
        ids = [
            tok.apply_chat_template(list(c), tokenize=True, add_generation_prompt=True, return_dict=False)
            for c in convs
        ]
        ids = [list(x["input_ids"]) if isinstance(x, dict) else list(x) for x in ids]
        return self._outputs(ids, sampling_params or SamplingParams())


@dataclass
class FakeVLLMServer:
    """A "vLLM server" for TRL's server mode: one engine, and :attr:`client` (TRL's ``VLLMClient``
    double) bound to it. ``clients`` lists every client TRL built."""

    model_path: str
    logprob_shift: Callable[[list[int], int], float] | None = None
    seed: int = 0
    clients: list[Any] = field(default_factory=list)
    engine: HFBackedEngine | None = None

    def __post_init__(self) -> None:
        self.engine = HFBackedEngine(self.model_path, seed=self.seed, logprob_shift=self.logprob_shift)
        server = self

        class VLLMClientDouble:
            """TRL's ``VLLMClient`` double: every call goes to :class:`FakeVLLMServer`'s engine."""

            def __init__(self, base_url=None, host="0.0.0.0", server_port=8000, group_port=51216,
                         connection_timeout=0.0):  # fmt: skip
                self.base_url = base_url or f"http://{host}:{server_port}"
                self.group_port = group_port
                self.communicator_device = None
                self.prefix_cache_resets = 0
                server.clients.append(self)

            def init_communicator(self, device=0):
                self.communicator_device = device

            def close_communicator(self):
                self.communicator_device = None

            def get_server_info(self) -> dict:
                return {
                    "model_config": {"logprobs_mode": "processed_logprobs"},
                    "weight_transfer_config": {"backend": "nccl"},
                }

            def update_named_params(self, metadata, named_params):
                if self.communicator_device is None:
                    raise RuntimeError("VLLMClient double: update_named_params before init_communicator")
                pairs = list(named_params)
                names = [n for n, _, _ in metadata]
                if names != [n for n, _ in pairs]:
                    raise ValueError(
                        "VLLMClient double: the streamed tensors differ from the announced metadata"
                    )
                for (n, dtype, shape), (_, t) in zip(metadata, pairs):
                    if str(t.dtype).removeprefix("torch.") != dtype or list(t.shape) != list(shape):
                        raise ValueError(f"VLLMClient double: {n!r} is not the announced {dtype} {shape}")
                server.engine.load_weights(pairs)
                server.engine.finish_sync()

            def update_named_param(self, name, weights):
                server.engine.load_weights([(name, weights)])

            def reset_prefix_cache(self):
                self.prefix_cache_resets += 1
                server.engine.finish_sync()

            def generate(self, prompts, features=None, n=1, repetition_penalty=1.0, temperature=1.0, top_p=1.0,
                         top_k=-1, min_p=0.0, max_tokens=16, logprobs=0, structured_outputs_regex=None,
                         generation_kwargs=None):  # fmt: skip
                if features is not None:
                    raise NotImplementedError("VLLMClient double: no multimodal features")
                params = SamplingParams(
                    n=n,
                    repetition_penalty=repetition_penalty,
                    temperature=temperature,
                    top_p=top_p,
                    top_k=top_k,
                    min_p=min_p,
                    max_tokens=max_tokens,
                    logprobs=logprobs,
                    **(generation_kwargs or {}),
                )
                groups = server.engine.sample([list(p) for p in prompts], params)
                seqs = [s for g in groups for s in g]  # prompt-major, as the server returns them
                return {
                    "prompt_ids": [list(p) for p in prompts],
                    "completion_ids": [s.token_ids for s in seqs],
                    "logprobs": [[[lp] for lp in s.logprobs] for s in seqs],
                    "logprob_token_ids": [[[t] for t in s.token_ids] for s in seqs],
                }

        self.client = VLLMClientDouble


def install_trl_double(monkeypatch, server: FakeVLLMServer | None = None) -> None:
    """Patch the doubles in where TRL imports them (``trl.generation.vllm_generation``: ``LLM``,
    ``SamplingParams``, ``StructuredOutputsParams``, ``VLLMClient`` and ``is_vllm_available``), and keep
    the process's rendezvous variables that TRL's colocate mode sets from leaking out of the test."""
    import trl.generation.vllm_generation as vg

    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    FakeLLM.instances = []
    monkeypatch.setattr(FakeLLM, "defaults", {})
    monkeypatch.setattr(vg, "is_vllm_available", lambda *a, **k: True)
    monkeypatch.setattr(vg, "LLM", FakeLLM, raising=False)
    monkeypatch.setattr(vg, "SamplingParams", SamplingParams, raising=False)
    monkeypatch.setattr(vg, "StructuredOutputsParams", StructuredOutputsParams, raising=False)
    if server is not None:
        monkeypatch.setattr(vg, "VLLMClient", server.client)


def install_vllm_module(monkeypatch) -> types.ModuleType:
    """A ``vllm`` module of the doubles (``LLM``, ``SamplingParams``) in ``sys.modules``, found by
    ``importlib.util.find_spec`` too."""
    mod = types.ModuleType("vllm")
    mod.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    mod.LLM, mod.SamplingParams, mod.RequestOutput = FakeLLM, SamplingParams, RequestOutput
    FakeLLM.instances = []
    monkeypatch.setattr(FakeLLM, "defaults", {})
    monkeypatch.setitem(sys.modules, "vllm", mod)
    return mod
