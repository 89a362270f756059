"""Language-model providers behind one protocol.

* :class:`OpenAICompatProvider` -- any OpenAI-compatible chat endpoint
  (Ollama, vLLM, llama.cpp server, OpenAI), configured by :class:`LLMConfig`
  from flags, environment (``HIVEMESH_LLM_BASE_URL``, ``HIVEMESH_LLM_MODEL``,
  ``HIVEMESH_LLM_API_KEY``) or a config file;
* :class:`LlamaCppProvider` -- a local GGUF file (``llama-cpp-python`` extra);
* :class:`ScriptedLLM`, :class:`FixedLatencyLLM` -- in-process stubs.

:func:`provider_from_config` picks one from an :class:`LLMConfig`.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from hivemesh._lazy import lazy_exports
from hivemesh.llm.base import LLMProvider as LLMProvider
from hivemesh.llm.base import LLMResult as LLMResult
from hivemesh.llm.base import Message as Message
from hivemesh.llm.base import RetryPolicy as RetryPolicy
from hivemesh.llm.base import UsageHook as UsageHook
from hivemesh.llm.base import extract_json as extract_json
from hivemesh.llm.config import HOW_TO_CONFIGURE as HOW_TO_CONFIGURE
from hivemesh.llm.config import LLMConfig as LLMConfig
from hivemesh.llm.gguf import LlamaCppProvider as LlamaCppProvider
from hivemesh.llm.stub import FixedLatencyLLM as FixedLatencyLLM
from hivemesh.llm.stub import ScriptedLLM as ScriptedLLM

if TYPE_CHECKING:  # loads httpx: imported on first use (see hivemesh._lazy)
    from hivemesh.llm.openai import OpenAICompatProvider as OpenAICompatProvider

__all__ = [
    "HOW_TO_CONFIGURE",
    "FixedLatencyLLM",
    "LLMConfig",
    "LLMProvider",
    "LLMResult",
    "LlamaCppProvider",
    "Message",
    "OpenAICompatProvider",
    "RetryPolicy",
    "ScriptedLLM",
    "UsageHook",
    "extract_json",
    "provider_from_config",
]


def provider_from_config(
    config: LLMConfig,
    *,
    on_usage: UsageHook | None = None,
    rng: random.Random | None = None,
) -> LLMProvider:
    """The provider ``config`` describes (GGUF if ``gguf_path`` is set)."""
    if config.gguf_path:
        return LlamaCppProvider(config, on_usage=on_usage, rng=rng)
    from hivemesh.llm.openai import OpenAICompatProvider

    return OpenAICompatProvider(config, on_usage=on_usage, rng=rng)


__getattr__ = lazy_exports(__name__, {"OpenAICompatProvider": "hivemesh.llm.openai"})
