"""LoRA roles on the distributed trainer (``--role-weights ROLE=lora[:RANK]``): one set of ranks holds **one** frozen
base and an adapter per LoRA role (:class:`LoraWorker`, the :class:`~baselines.weights.lora.SharedBase` of the
single-process trainer), and the roles share one vLLM engine that serves each adapter per request
(:meth:`baselines.ray_learner.engines.VLLMEngine.load_adapter`). The weight sync sends the adapter's tensors only.

The ranks keep the adapters replicated (a few MB each: nothing to shard); with several ranks each adapter's
gradients are averaged over them with one all-reduce (gloo or NCCL) before its optimiser step. Everything else, the
passes, packs and the PPO loss, is :class:`~baselines.ray_learner.distributed.RoleWorker`'s: each role's adapter is
presented to it through :class:`AdapterEngine`, the slice of DeepSpeed's engine interface those passes use.

The driver talks to one role's adapter through a :class:`RoleHandle`, which names the role in every call, so the
trainer calls a LoRA role's ranks as it calls a full role's.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

from baselines.config import TrainConfig
from baselines.ray_learner.distributed import RoleWorker, adamw, rank_device
from baselines.ray_learner.ds_setup import release_freed_memory
from baselines.ray_learner.engines import RESET_STEPS, pack_weights
from baselines.runs.console import redirect_actor_output
from baselines.weights.lora import SharedBase

# torch, transformers and peft are imported inside the functions that use them: importing this module (the CLI, the
# checks, a dry run) loads none of them (the actor imports them when it starts).


def adapter_state(peft_model: Any, role: str) -> dict[str, Any]:
    """``role``'s adapter tensors as peft saves them (keys without the adapter's name), copied to the CPU."""
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(peft_model, adapter_name=role)
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}


def adapter_payload(peft_model: Any, role: str, dtype: str | None = None) -> dict[str, Any]:
    """What :meth:`baselines.ray_learner.engines.VLLMEngine.load_adapter` takes: ``role``'s peft ``adapter_config.json``
    as a
    dict (sets as sorted lists, enums as their values) and its tensors packed for Ray (:func:`pack_weights`, in
    ``dtype``)."""
    conf = peft_model.peft_config[role].to_dict()
    config = {k: sorted(v) if isinstance(v, set) else getattr(v, "value", v) for k, v in conf.items()}
    return {"config": config, "tensors": pack_weights(adapter_state(peft_model, role), dtype)}


class AdapterEngine:
    """One role's adapter (or, without an optimiser, the reference: the base with adapters off) behind the calls
    :class:`~baselines.ray_learner.distributed.RoleWorker` makes on a DeepSpeed engine: forward, ``backward``, ``step``,
    ``global_steps``, ``get_lr``, ``optimizer``, ``module`` (the shared peft model: its config and dtype)."""

    def __init__(self, view: Any, optimizer: Any = None, world_size: int = 1, grad_clip: float = 1.0):
        self.view, self.optimizer = view, optimizer
        self.module = view.shared.peft
        self.world_size, self.grad_clip = world_size, grad_clip
        self.global_steps = 0
        self._norm = 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.view(*args, **kwargs)

    def train(self, mode: bool = True) -> None:
        self.view.train(mode)

    def eval(self) -> None:
        self.view.eval()

    def backward(self, loss: Any, scale_wrt_gas: bool = False) -> None:
        loss.backward()

    def step(self) -> None:
        """Average the adapter's gradients over the ranks, clip them, step, zero them."""
        import torch

        params = list(self.view.parameters())
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if self.world_size > 1:
            import torch.distributed as dist

            flat = torch.cat([p.grad.reshape(-1) for p in params])
            dist.all_reduce(flat)
            flat /= self.world_size
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
        self._norm = float(torch.nn.utils.clip_grad_norm_(params, self.grad_clip))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.global_steps += 1

    def get_global_grad_norm(self) -> float:
        return self._norm

    def get_lr(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]


class LoraWorker(RoleWorker):
    """One rank of the LoRA roles: the shared base, an adapter and an optimiser per role. Every method takes the
    role it acts for (``role=``; a :class:`RoleHandle` passes it)."""

    def __init__(
        self,
        ranks: dict[str, int | None],
        rank: int,
        world_size: int,
        master_port: int,
        model_path: str,
        cfg: TrainConfig,
    ):
        redirect_actor_output(os.environ.get("MAPPA_ACTOR_LOG_DIR"), f"trainer-lora-rank{rank}")
        import torch

        self.rank, self.world_size = rank, world_size
        backend, torch_device = rank_device(cfg.resolved_device())
        self.device = torch.device(torch_device)
        if world_size > 1:
            import torch.distributed as dist

            dist.init_process_group(
                backend, init_method=f"tcp://127.0.0.1:{master_port}", rank=rank, world_size=world_size
            )
        self._torch = torch
        self._build_lora(ranks, model_path, cfg)

    def _build_lora(
        self, ranks: dict[str, int | None], model_path: str, cfg: TrainConfig, *, seed: bool = True
    ) -> None:
        """The shared base from ``model_path``, a new adapter and optimiser per LoRA role."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch = self._torch
        self.role, self.cfg = "lora", cfg
        self._autocast = cfg.resolved_autocast()
        if seed:
            torch.manual_seed(cfg.seed)  # every rank draws the same initial adapters
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        base = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, cfg.resolved_dtype()))
        self.tied = bool(getattr(base.config, "tie_word_embeddings", False))
        self.shared = SharedBase(base.to(self.device), dict(ranks))
        self.adapters = {
            role: AdapterEngine(view, adamw(view.parameters(), cfg), self.world_size, cfg.grad_clip)
            for role, view in self.shared.views.items()
        }
        self.refs = {role: AdapterEngine(view.reference()) for role, view in self.shared.views.items()}
        self._use(next(iter(ranks)))

    def reset(  # type: ignore[override]
        self, ranks: dict[str, int | None], model_path: str, cfg: TrainConfig, steps=RESET_STEPS, log_dir=None
    ) -> None:
        """Make this rank as a fresh one (a pooled rank's next run: :mod:`baselines.training.pool`): the base read
        again and new adapters drawn from ``cfg.seed``, each with a new optimiser. The adapters are the weights and the
        optimiser's subject at once: leaving out ``weights`` or ``optimizer`` keeps both as they are."""
        redirect_actor_output(log_dir, f"trainer-lora-rank{self.rank}")
        if "weights" in steps and "optimizer" in steps:
            self.shared = self.adapters = self.refs = None  # type: ignore[assignment]
            gc.collect()
            self._build_lora(ranks, model_path, cfg, seed="rng" in steps)
        else:
            self.cfg = cfg
            if "rng" in steps:
                self._torch.manual_seed(cfg.seed)
        release_freed_memory()

    def _use(self, role: str) -> None:
        if role not in self.adapters:
            raise KeyError(f"no LoRA adapter for role {role!r} on this rank ({sorted(self.adapters)})")
        self.engine, self.ref, self.role = self.adapters[role], self.refs[role], role

    # A LoRA rank serves several roles: each call below names one (RoleHandle adds it), so these signatures add a
    # ``role`` the single-role RoleWorker's do not have.
    def ready(self, role: str | None = None) -> str:
        return super().ready()

    def logprobs(self, samples: list[Any], n_micro: int, *, policy: bool = True, ref: bool = True, role: str):  # type: ignore[override]
        self._use(role)
        return super().logprobs(samples, n_micro, policy=policy, ref=ref)

    def train_step(self, *args: Any, role: str, **kwargs: Any) -> dict[str, float]:  # type: ignore[override]
        self._use(role)
        return super().train_step(*args, **kwargs)

    def _step(self) -> float:
        self.engine.step()
        return self.engine.get_global_grad_norm()

    # --- weights and checkpoints
    def adapter_state(self, role: str) -> dict[str, Any]:
        """``role``'s adapter as peft saves it (keys without the adapter's name), on the CPU."""
        return adapter_state(self.shared.peft, role)

    def engine_weights(self, role: str) -> dict[str, Any] | None:  # type: ignore[override]
        """What the engine loads for ``role`` (:func:`adapter_payload`); None on ranks other than 0 (the ranks hold
        the same adapter)."""
        return adapter_payload(self.shared.peft, role, self.cfg.resolved_engine_dtype()) if self.rank == 0 else None

    def full_state(self, role: str) -> dict[str, Any] | None:  # type: ignore[override]
        """The base with ``role``'s adapter merged in, by Hugging Face name (rank 0; None elsewhere)."""
        if self.rank != 0:
            return None
        return {k: v.detach().clone() for k, v in self.shared.views[role].merged().state_dict().items()}

    def base_state(self, role: str | None = None) -> dict[str, Any]:
        """The shared base's own tensors (not the adapters'), by Hugging Face name: what training must not change."""
        base = self.shared.peft.get_base_model()
        return {
            k.replace(".base_layer", ""): v.detach().clone() for k, v in base.state_dict().items() if "lora_" not in k
        }

    def _checkpoint(self, path: str) -> Path:
        return Path(path) / f"lora-{'-'.join(sorted(self.adapters))}.pt"

    def save(self, path: str, role: str | None = None) -> None:
        """Every LoRA role's adapter, optimiser state and step count (rank 0: the ranks' replicas are equal)."""
        if self.rank != 0:
            return
        state = {
            role: {
                "adapter": self.shared.views[role].state_dict(),
                "optimizer": a.optimizer.state_dict(),
                "steps": a.global_steps,
            }
            for role, a in self.adapters.items()
        }
        Path(path).mkdir(parents=True, exist_ok=True)
        tmp = self._checkpoint(path).with_suffix(".tmp")
        self._torch.save(state, tmp)
        os.replace(tmp, self._checkpoint(path))

    def load(self, path: str, role: str | None = None) -> None:
        file = self._checkpoint(path)
        if not file.exists():
            raise FileNotFoundError(f"no LoRA checkpoint for roles {sorted(self.adapters)} under {path}")
        state = self._torch.load(file, map_location=self.device, weights_only=True)
        for role, a in self.adapters.items():
            self.shared.views[role].load_state_dict(state[role]["adapter"])
            a.optimizer.load_state_dict(state[role]["optimizer"])
            a.global_steps = state[role]["steps"]
        release_freed_memory()

    def export(self, path: str, role: str) -> None:  # type: ignore[override]
        """Rank 0 writes ``path``: the merged model (transformers folder with the tokenizer) and ``path/adapter/
        <role>``, the adapter alone in peft's layout."""
        if self.rank != 0:
            return
        self.shared.views[role].save_pretrained(path)
        self.tokenizer.save_pretrained(path)


class _Bound:
    def __init__(self, method: Any, role: str):
        self.method, self.role = method, role

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self.method.remote(*args, role=self.role, **kwargs)


class RoleHandle:
    """One LoRA role's view of a :class:`LoraWorker` actor: ``handle.train_step.remote(...)`` calls the actor's
    ``train_step`` with ``role=`` this role. ``actor``: the actor itself (what is killed, saved once)."""

    def __init__(self, actor: Any, role: str):
        self.actor, self.role = actor, role

    def __getattr__(self, name: str) -> _Bound:
        return _Bound(getattr(self.actor, name), self.role)


__all__ = ["AdapterEngine", "LoraWorker", "RoleHandle", "adapter_payload", "adapter_state"]
