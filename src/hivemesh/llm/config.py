"""Where the LLM endpoint comes from: explicit settings, environment, config file.

Precedence is explicit keyword overrides (CLI flags), then environment
variables, then the ``[llm]`` table of a config file (a mapping). With
nothing configured, :meth:`LLMConfig.resolve` raises
:class:`~hivemesh.llm.errors.LLMNotConfigured` whose message is
:data:`HOW_TO_CONFIGURE`, ready to print.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hivemesh.errors import ConfigError
from hivemesh.llm.errors import LLMNotConfigured

__all__ = ["ENV", "HOW_TO_CONFIGURE", "LLMConfig"]

#: Environment variable for each setting.
ENV = {
    "base_url": "HIVEMESH_LLM_BASE_URL",
    "model": "HIVEMESH_LLM_MODEL",
    "api_key": "HIVEMESH_LLM_API_KEY",
    "timeout_s": "HIVEMESH_LLM_TIMEOUT_S",
    "max_attempts": "HIVEMESH_LLM_MAX_ATTEMPTS",
    "json_mode": "HIVEMESH_LLM_JSON_MODE",
    "gguf_path": "HIVEMESH_LLM_GGUF",
}

HOW_TO_CONFIGURE = """\
No LLM is configured, so the planner cannot run.

hivemesh talks to any OpenAI-compatible chat endpoint. Set, for example:

  # Ollama (ollama serve; ollama pull llama3.2)
  export HIVEMESH_LLM_BASE_URL=http://127.0.0.1:11434/v1
  export HIVEMESH_LLM_MODEL=llama3.2

  # vLLM / llama.cpp server:  HIVEMESH_LLM_BASE_URL=http://127.0.0.1:8000/v1
  # OpenAI:                   HIVEMESH_LLM_BASE_URL=https://api.openai.com/v1
  #                           HIVEMESH_LLM_API_KEY=sk-...  HIVEMESH_LLM_MODEL=gpt-4o-mini

or put the same keys (base_url, model, api_key) in the [llm] table of the
hivemesh config file. Optional: HIVEMESH_LLM_TIMEOUT_S (default 60),
HIVEMESH_LLM_MAX_ATTEMPTS (default 4), HIVEMESH_LLM_JSON_MODE=0 for servers
that reject response_format. A local GGUF model runs without a server with
the llama-cpp-python extra: HIVEMESH_LLM_GGUF=/path/to/model.gguf.
"""


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"not a boolean: {v!r}")


@dataclass(frozen=True, slots=True)
class LLMConfig:
    """Settings of one LLM endpoint (or a local GGUF file)."""

    base_url: str = ""
    model: str = ""
    api_key: str = ""
    timeout_s: float = 60.0
    max_attempts: int = 4
    json_mode: bool = True
    gguf_path: str = ""

    @classmethod
    def resolve(
        cls,
        file: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> LLMConfig:
        """Merge file < environment < overrides; raise if nothing usable."""
        env = os.environ if env is None else env
        merged: dict[str, Any] = {}
        for key in ENV:
            if file and file.get(key) not in (None, ""):
                merged[key] = file[key]
            if env.get(ENV[key], "") != "":
                merged[key] = env[ENV[key]]
            if overrides.get(key) not in (None, ""):
                merged[key] = overrides[key]
        if "base_url" not in merged and env.get("OPENAI_BASE_URL"):
            merged["base_url"] = env["OPENAI_BASE_URL"]
        if "api_key" not in merged and env.get("OPENAI_API_KEY"):
            merged["api_key"] = env["OPENAI_API_KEY"]
        unknown = sorted(set(overrides) - set(ENV))
        if unknown:
            raise ConfigError(f"unknown LLM settings: {', '.join(unknown)}")
        try:
            cfg = cls(
                base_url=str(merged.get("base_url", "")).rstrip("/"),
                model=str(merged.get("model", "")),
                api_key=str(merged.get("api_key", "")),
                timeout_s=float(merged.get("timeout_s", 60.0)),
                max_attempts=int(merged.get("max_attempts", 4)),
                json_mode=_bool(merged.get("json_mode", True)),
                gguf_path=str(merged.get("gguf_path", "")),
            )
        except ValueError as exc:
            raise ConfigError(f"bad LLM setting: {exc}") from None
        if cfg.gguf_path:
            return cfg
        if not cfg.base_url or not cfg.model:
            raise LLMNotConfigured(HOW_TO_CONFIGURE)
        if not cfg.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"LLM base URL must be http(s): {cfg.base_url!r}")
        if not (0 < cfg.timeout_s <= 3600 and 1 <= cfg.max_attempts <= 20):
            raise ConfigError("LLM timeout_s must be in (0, 3600] and max_attempts in 1..20")
        return cfg
