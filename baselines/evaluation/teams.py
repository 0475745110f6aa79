"""Teams for evaluation: who plays each role (a local model, a run's exported models, an OpenAI-compatible endpoint)
and the policies that play them (an in-process vLLM engine per distinct model, transformers, or the endpoint)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from baselines.evaluation.evaluate import EvalConfig
from baselines.ray_learner.engines import VLLMEngine, VLLMPolicy
from baselines.weights.dtypes import resolve_engine_dtype
from baselines.weights.models import resolve_model
from baselines.weights.policies import GenerationConfig, TransformersPolicy

# torch and transformers are imported inside the functions that use them: importing this module (the CLI, the checks, a
# dry run) loads none of them; openai is optional (the coach extra).


class OpenAIPolicy:
    """A role played by a model behind an OpenAI-compatible chat endpoint; a batch is sent concurrently."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str = "OPENAI_API_KEY",
        max_tokens: int = 512,
        temperature: float = 0.6,
        top_p: float = 1.0,
        seed: int = 0,
        concurrency: int = 8,
        timeout_s: float = 600.0,
    ):
        from openai import OpenAI

        self.client = OpenAI(base_url=base_url, api_key=os.environ.get(api_key_env, "EMPTY"), timeout=timeout_s)
        self.model, self.max_tokens, self.temperature, self.top_p, self.seed = (
            model,
            max_tokens,
            temperature,
            top_p,
            seed,
        )
        self.concurrency = concurrency
        self.generated_tokens = 0
        self.calls = 0

    def _one(self, conversation) -> str:
        reply = self.client.chat.completions.create(
            model=self.model,
            messages=list(conversation),
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed + self.calls,
        )
        if reply.usage is not None:
            self.generated_tokens += reply.usage.completion_tokens or 0
        return reply.choices[0].message.content or ""

    def generate(self, batch) -> list[str]:
        self.calls += 1
        with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(batch)))) as pool:
            return list(pool.map(self._one, batch))


def team_from_args(
    roles: Sequence[str],
    *,
    model: str | None = None,
    role_models: Mapping[str, str] | None = None,
    run_dir: str | None = None,
    role_endpoints: Mapping[str, str] | None = None,
    endpoint_model: str | None = None,
) -> dict[str, dict[str, str]]:
    """Who plays each role: ``{"kind": "local", "model": ...}`` or ``{"kind": "endpoint", "url", "model"}``.

    Precedence per role: an endpoint, a ``--role-model``, the ``models/<role>`` folder of ``run_dir`` (exported
    by ``mappa train``), then ``model`` (default: the bundled SmolLM2-135M).
    """
    role_models, role_endpoints = dict(role_models or {}), dict(role_endpoints or {})
    unknown = (set(role_models) | set(role_endpoints)) - set(roles)
    if unknown:
        raise ValueError(f"unknown roles {sorted(unknown)}; roles: {list(roles)}")
    team = {}
    for role in roles:
        if role in role_endpoints:
            url = role_endpoints[role]
            name = endpoint_model
            if "@" in url:  # MODEL@URL
                name, url = url.split("@", 1)
            if not name:
                raise ValueError(f"endpoint of {role!r}: give the served model as MODEL@URL or --endpoint-model")
            team[role] = {"kind": "endpoint", "url": url, "model": name}
        elif role in role_models:
            team[role] = {"kind": "local", "model": role_models[role]}
        elif run_dir is not None:
            path = Path(run_dir) / "models" / role
            if not (path / "config.json").exists():
                raise FileNotFoundError(
                    f"{path} holds no exported model: `mappa train` writes models/<role>/ when a run finishes"
                )
            team[role] = {"kind": "local", "model": str(path)}
        else:
            team[role] = {"kind": "local", "model": model or "smollm2-135m"}
    return team


def build_policies(
    team: Mapping[str, Mapping[str, str]], cfg: EvalConfig, engines: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Policies for ``team`` (see :func:`team_from_args`); roles with the same local model share one engine.
    ``engines``: a cache of the local models' policies by path, shared across teams
    (:mod:`baselines.evaluation.swap`)."""
    shared: dict[str, Any] = engines if engines is not None else {}
    policies = {}
    for role, who in team.items():
        if who["kind"] == "endpoint":
            policies[role] = OpenAIPolicy(
                who["url"],
                who["model"],
                max_tokens=cfg.max_new_tokens,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                seed=cfg.seed,
            )
            continue
        path = resolve_model(who["model"])
        if path not in shared:
            if cfg.engine == "vllm":
                from transformers import AutoTokenizer

                engine = VLLMEngine(
                    path,
                    dtype=resolve_engine_dtype(cfg.engine_dtype, _device()),
                    seed=cfg.seed,
                    max_model_len=cfg.max_prompt_tokens + cfg.max_new_tokens + 8,
                )
                shared[path] = VLLMPolicy(
                    engine,
                    AutoTokenizer.from_pretrained(path),
                    max_prompt_tokens=cfg.max_prompt_tokens,
                    max_new_tokens=cfg.max_new_tokens,
                    temperature=cfg.temperature,
                    top_p=cfg.top_p,
                )
            elif cfg.engine == "transformers":
                gen = GenerationConfig(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p)
                shared[path] = TransformersPolicy(path, gen, seed=cfg.seed)
            else:
                raise ValueError(f"engine must be 'vllm' or 'transformers', not {cfg.engine!r}")
        policies[role] = shared[path]
    return policies


__all__ = ["OpenAIPolicy", "build_policies", "team_from_args"]


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
