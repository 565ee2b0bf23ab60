"""The evaluations' LLM judges: :mod:`mrtpo.clients.judge`, importable here as well."""

from mrtpo.clients.judge import (
    DEFAULT_KEY_ENVS,
    RETRY_STATUS,
    CachedJudge,
    Judge,
    JudgeError,
    LocalJudge,
    OpenAIChatJudge,
    cache_key,
    default_cache_dir,
    make_judge,
    post_json,
)

__all__ = [
    "DEFAULT_KEY_ENVS",
    "RETRY_STATUS",
    "CachedJudge",
    "Judge",
    "JudgeError",
    "LocalJudge",
    "OpenAIChatJudge",
    "cache_key",
    "default_cache_dir",
    "make_judge",
    "post_json",
]
