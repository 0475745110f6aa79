"""The DeepSpeed side of the distributed trainer, run inside Ray actors: ZeRO ranks per role (:class:`RoleWorker`);
the per-rank batch plan is in :mod:`baselines.ray_learner.packing`, the vLLM side (engines, the driver's policy, the
weight transfer) in :mod:`baselines.ray_learner.engines`.

Nothing here imports Ray, vLLM or DeepSpeed at module level: the classes are plain Python classes that
:mod:`baselines.training.ray_trainer` turns into actors with ``ray.remote``, and which a test can also build in-process.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Sequence
from typing import Any

from baselines.algorithm.losses import ppo_clip_loss
from baselines.algorithm.samples import Sample, TokenBatch, autocast, sample_rows, token_logprobs, tokenize_samples
from baselines.config import TrainConfig
from baselines.ray_learner.ds_setup import (
    adamw,
    check_extension_locks,
    deepspeed_config,
    rank_device,
    release_freed_memory,
)
from baselines.ray_learner.engines import RESET_STEPS, pack_weights
from baselines.ray_learner.packing import (
    SharedPrefix,
    balance,
    build_pack,
    micro_batches,
    packed_logprobs,
    plan_packs,
    plan_shards,
    prefix_states,
    sharing_prefix,
    strip_prefix,
)
from baselines.runs.console import redirect_actor_output

__all__ = ["RoleWorker", "adamw", "balance", "deepspeed_config", "micro_batches", "plan_shards", "rank_device"]


def _logp_gap(lps: list[Any], behaviour: list[Any]) -> tuple[float, int]:
    """The summed absolute gap between this pass's log-probs and the engine's (where given), and its token count."""
    gap, n = 0.0, 0
    for lp, b in zip(lps, behaviour, strict=False):  # as many as the pass has samples
        if b is not None:
            d = (lp.detach() - b.to(lp)).abs()
            gap, n = gap + float(d.sum()), n + d.numel()
    return gap, n


class RoleWorker:
    """One DeepSpeed ZeRO-3 rank of one role: the trained model, the frozen reference (also ZeRO-3 sharded) and
    the optimiser state shard. Every method is collective: the driver calls it on all ranks of the role."""

    def __init__(self, role: str, rank: int, world_size: int, master_port: int, model_path: str, cfg: TrainConfig):
        redirect_actor_output(os.environ.get("MAPPA_ACTOR_LOG_DIR"), f"trainer-{role}-rank{rank}")
        import torch

        self.rank, self.world_size = rank, world_size
        os.environ.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(master_port),
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK="0",  # Ray gives each actor its own visible device
            LOCAL_WORLD_SIZE="1",
        )
        import deepspeed

        backend, torch_device = rank_device(cfg.resolved_device())
        check_extension_locks()  # init_distributed builds DeepSpeed's CPU op on first use, behind a lock file
        deepspeed.init_distributed(dist_backend=backend, verbose=False)
        self.device = torch.device(torch_device)
        self._torch = torch
        self._build(role, model_path, cfg, reference=True)

    def _build(
        self, role: str, model_path: str, cfg: TrainConfig, *, reference: bool, state=None, seed: bool = True
    ) -> None:
        """The trained model (from ``model_path``, or ``state`` over it) and its optimiser in a new DeepSpeed engine;
        with ``reference`` the frozen reference too (also ZeRO-3 sharded)."""
        import deepspeed
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch = self._torch
        self.role, self.cfg = role, cfg
        self._autocast = cfg.resolved_autocast()  # forward passes in bfloat16, weights and gradients in dtype
        dtype = getattr(torch, cfg.resolved_dtype())
        if seed:
            torch.manual_seed(cfg.seed)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
        if state is not None:
            model.load_state_dict(state, strict=False)
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.config.use_cache = False
        self.tied = bool(getattr(model.config, "tie_word_embeddings", False))
        ref = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).eval() if reference else None
        optimizer = adamw(model.parameters(), cfg)
        self.engine, *_ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=deepspeed_config(cfg, self.world_size, train=True)
        )
        if self.world_size == 1 and cfg.zero_stage == 0:
            # one rank has nothing to reduce, but DeepSpeed's stage 0 still runs every gradient through an all-reduce
            # at each step (ZeRO stages partition the gradients in that path: they keep it)
            self.engine.enable_backward_allreduce = False
        if ref is not None:
            for p in ref.parameters():
                p.requires_grad_(False)
            self.ref, *_ = deepspeed.initialize(model=ref, config=deepspeed_config(cfg, self.world_size, train=False))

    def reset(
        self, role: str, model_path: str, cfg: TrainConfig, steps: Sequence[str] = RESET_STEPS, log_dir=None
    ) -> None:
        """Make this rank as a fresh one of ``role`` under ``cfg`` (a pooled rank's next run:
        :mod:`baselines.training.pool`). ``optimizer``: a new DeepSpeed engine and optimiser (step count 0) on
        ``weights``: the starting model read again from ``model_path`` (the frozen reference, the same model, is
        kept); ``rng``: torch seeded from ``cfg.seed``. Collective: every rank of the role at once. ``steps`` leaves
        steps out only to show that each is needed (the pool's test)."""
        redirect_actor_output(log_dir, f"trainer-{role}-rank{self.rank}")
        if "optimizer" in steps:
            state = None if "weights" in steps else self.full_state(everywhere=True)
            self.engine.destroy()
            self.engine = None
            gc.collect()
            self._build(role, model_path, cfg, reference=False, state=state, seed="rng" in steps)
        else:
            self.role, self.cfg = role, cfg
            if "weights" in steps:
                self._load_in_place(model_path)
            if "rng" in steps:
                self._torch.manual_seed(cfg.seed)
        release_freed_memory()

    def _load_in_place(self, model_path: str) -> None:
        """The starting model's weights copied into the live parameters (the optimiser's state kept)."""
        import deepspeed
        from transformers import AutoModelForCausalLM

        start = AutoModelForCausalLM.from_pretrained(model_path, dtype=self.engine.module.dtype).state_dict()
        for name, p in self.engine.module.named_parameters():
            with deepspeed.zero.GatheredParameters([p], modifier_rank=0, enabled=self.cfg.zero_stage == 3):
                p.data.copy_(start[name])

    def ready(self) -> str:
        """The id of the node this actor runs on, once it is up."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def pid(self) -> int:
        """This actor's process id (the pool's memory figure)."""
        return os.getpid()

    # --- batches
    def _batch(self, samples: Sequence[Sample]):
        if not samples:  # a dummy pass of one token pair: keeps the ranks' collective calls in step
            eos = self.tokenizer.eos_token_id
            torch = self._torch

            return TokenBatch(torch.tensor([[eos, eos]]), torch.ones(1, 2, dtype=torch.long), torch.zeros(1, 1), 0, 0)
        return tokenize_samples(samples, self.tokenizer, self.cfg.max_prompt_tokens, self.cfg.max_new_tokens + 1)

    def _to_device(self, b):
        b.input_ids = b.input_ids.to(self.device)
        b.attention_mask = b.attention_mask.to(self.device)
        b.response_mask = b.response_mask.to(self.device)
        return b

    def _rows(self, samples: Sequence[Sample]) -> list[tuple[list[int], int]]:
        return sample_rows(samples, self.tokenizer, self.cfg.max_prompt_tokens, self.cfg.max_new_tokens + 1)

    def _length_order(self, rows: Sequence[tuple[list[int], int]]) -> list[int]:
        """Sample indices longest first: consecutive micro-batches then hold samples of similar lengths, so right
        padding wastes little (the loss is a sum over samples: their order changes nothing else)."""
        return sorted(range(len(rows)), key=lambda i: (-len(rows[i][0]), i))

    def _passes(self, model: Any, samples: Sequence[Sample], n_micro: int, prefixes: list | None = None):
        """Yield, per forward pass, the indices of its samples and their response tokens' log-probs (one tensor
        each, in the graph of ``model``); exactly ``n_micro`` passes: those past the samples are dummy passes of
        one token pair (indices ``[]``, one zero-size-free tensor to backpropagate a zero through).

        With a shared prefix (:func:`sharing_prefix`) one more pass runs first, over the prefix, and its
        :class:`~baselines.ray_learner.packing.SharedPrefix` is appended to ``prefixes``: after the passes' backwards,
        the caller sends its gradient on (:meth:`~baselines.ray_learner.packing.SharedPrefix.backward_loss`). Under
        ZeRO-3 every rank runs
        it (a rank without a shared prefix on one token: parameters are gathered collectively)."""
        rows = self._rows(samples) if samples else []
        T = self.cfg.temperature
        if self.cfg.pack_tokens:
            share = sharing_prefix(self.cfg)
            cut, packs = plan_packs(rows, self.cfg.pack_tokens, share)
            prefix: SharedPrefix | None = None
            if share and (cut or self.cfg.zero_stage == 3):
                ids = rows[0][0][:cut] if cut else [self.tokenizer.eos_token_id]
                with autocast(self._autocast, self.device):
                    run = prefix_states(model, ids, self.device)
                if prefixes is not None:
                    prefixes.append(run)
                prefix = run if cut else None
            rows = strip_prefix(rows, cut)
            if len(packs) > n_micro:
                raise RuntimeError(f"{len(packs)} packs on rank {self.rank} but {n_micro} passes planned")
            for k in range(n_micro):
                if k >= len(packs):
                    with autocast(self._autocast, self.device):
                        dummy = token_logprobs(model, self._to_device(self._batch([])), T).sum()
                    yield [], [dummy]
                    continue
                idx = packs[k]
                pack = build_pack([rows[i] for i in idx]).to(self.device)
                with autocast(self._autocast, self.device):
                    lps = packed_logprobs(model, pack, T, prefix=prefix)
                yield idx, lps
            return
        order = self._length_order(rows)
        for sl in micro_batches(len(samples), self.cfg.micro_batch, n_micro):
            idx = order[sl]
            b = self._to_device(self._batch([samples[i] for i in idx]))
            with autocast(self._autocast, self.device):
                logp = token_logprobs(model, b, T)
            if not idx:
                yield [], [logp.sum()]
                continue
            mask = b.response_mask.bool()
            yield idx, [logp[k][mask[k]] for k in range(len(idx))]

    def logprobs(
        self, samples: list[Sample], n_micro: int, *, policy: bool = True, ref: bool = True
    ) -> list[tuple[Any, Any]]:
        """Per sample, in order: (log-probs of its response tokens under the current policy, under the frozen
        reference); a pass not asked for (``policy``/``ref`` False) gives None in its place. Before the first
        update the policy *is* the reference: both come from one pass."""
        torch = self._torch
        out: list[tuple[Any, Any]] = [(None, None)] * len(samples)
        self.engine.eval()
        same = self.engine.global_steps == 0
        with torch.no_grad():
            if policy or (ref and same):
                for idx, lps in self._passes(self.engine, samples, n_micro):
                    for k, i in enumerate(idx):
                        lp = lps[k].float().cpu()
                        out[i] = (lp if policy else None, lp if ref and same else None)
            if ref and not same:
                for idx, lps in self._passes(self.ref, samples, n_micro):
                    for k, i in enumerate(idx):
                        out[i] = (out[i][0], lps[k].float().cpu())
        release_freed_memory()
        return out

    def train_step(
        self,
        samples: list[Sample],
        advantages: list[Any],
        old_logp: list[Any] | None,
        total_tokens: int,
        n_micro: int,
        lr: float,
        behaviour_logp: list[Any] | None = None,
    ) -> dict[str, float]:
        """One optimiser step over this rank's samples at learning rate ``lr``; the loss is the PPO clipped surrogate
        summed over tokens and divided by the role's token count over all ranks (times the world size: ZeRO averages
        gradients).

        ``old_logp`` None: this step is the only one on these samples and the policy is still the one that sampled
        them, so the old log-probs are this forward pass's own, detached (the ratio is exactly 1, as TRL's GRPO
        with one iteration per generation); no separate pass computed them. ``behaviour_logp`` (the engine's
        log-probs of the sampled tokens) is only compared with this pass's: their mean absolute gap is returned
        as ``rollout_logp_gap`` (engine vs trainer numerics)."""
        t0 = time.perf_counter()
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr
        self.engine.train()
        stats = {"loss": 0.0, "clip_frac": 0.0}
        gap, gap_n = 0.0, 0
        scale = self.world_size / max(total_tokens, 1)
        tokens = 0
        prefixes: list[SharedPrefix] = []
        for idx, lps in self._passes(self.engine, samples, n_micro, prefixes):
            if not idx:
                self.engine.backward(lps[0] * 0.0, scale_wrt_gas=False)
                continue
            if behaviour_logp is not None:
                g, c = _logp_gap(lps, [behaviour_logp[j] for j in idx])
                gap, gap_n = gap + g, gap_n + c
            behaviour = [behaviour_logp[j] for j in idx] if behaviour_logp is not None else None
            loss, n, clip_frac, is_weight = self._pass_loss(lps, idx, advantages, old_logp, behaviour)
            stats["is_weight_mean"] = stats.get("is_weight_mean", 0.0) + is_weight * n / max(total_tokens, 1)
            self.engine.backward(loss * n * scale, scale_wrt_gas=False)
            stats["loss"] += float(loss.detach()) * n / max(total_tokens, 1)
            stats["clip_frac"] += clip_frac * n / max(total_tokens, 1)
            tokens += n
        for prefix in prefixes:  # the packs' gradients at the shared prefix, through its forward once
            self.engine.backward(prefix.backward_loss(), scale_wrt_gas=False)
        t_backward = time.perf_counter()
        norm = self._step()
        end = time.perf_counter()
        stats.update(
            lr=float(self.engine.get_lr()[0]),
            grad_norm=float(norm) if norm is not None else float("nan"),
            rank_tokens=tokens,
            rank_samples=len(samples),
            seconds=end - t0,
            forward_backward_s=t_backward - t0,
            optimizer_s=end - t_backward,
        )
        if gap_n:
            stats["rollout_logp_gap"] = gap / gap_n
        release_freed_memory()
        return stats

    def _pass_loss(
        self, lps: list[Any], idx: list[int], advantages: list[Any], old_logp: list[Any] | None, behaviour=None
    ) -> tuple[Any, int, float, float]:
        """One pass's PPO clipped surrogate (its tokens' mean), its token count, clip fraction and mean importance
        weight; old log-probs None: this pass's own, detached (ratio 1). With ``rollout_is_cap`` and the engine's
        log-probs (``behaviour``): each token's loss weighted by ``min(pi_trainer / pi_engine, cap)``."""
        torch = self._torch
        logp = torch.cat(lps)[None]
        adv = torch.cat([advantages[j].to(logp) for j in idx])[None]
        old = logp.detach().clone() if old_logp is None else torch.cat([old_logp[j].to(logp) for j in idx])[None]
        weights = None
        if self.cfg.rollout_is_cap > 0 and behaviour is not None and all(b is not None for b in behaviour):
            engine = torch.cat([b.to(logp) for b in behaviour])[None]
            weights = torch.exp(logp.detach() - engine).clamp(max=self.cfg.rollout_is_cap)
        loss, info = ppo_clip_loss(logp, old, adv, torch.ones_like(logp), self.cfg.clip_eps, weights=weights)
        return loss, int(logp.shape[1]), info["clip_frac"], float(weights.mean()) if weights is not None else 1.0

    def _step(self) -> float | None:
        """The optimiser step; returns the gradient norm before it (DeepSpeed reports it for ZeRO-3 or fp16/bf16
        optimisers only: else computed here, NaN with several ranks, whose gradients are reduced in the step)."""
        norm = None
        if self.cfg.zero_stage < 3:
            grads = [p.grad.detach().float().norm() for p in self.engine.module.parameters() if p.grad is not None]
            norm = float(self._torch.stack(grads).norm()) if grads else 0.0
            if self.world_size > 1:
                norm = float("nan")  # a local norm would mislead
        self.engine.step()
        return self.engine.get_global_grad_norm() if norm is None else norm

    # --- weights and checkpoints
    def full_state(self, everywhere: bool = False) -> dict[str, Any] | None:
        """The whole model (gathered from the ZeRO-3 shards) on rank 0 (``everywhere``: on every rank), by Hugging
        Face name; None elsewhere."""
        import deepspeed

        keep = everywhere or self.rank == 0
        out: dict[str, Any] = {}
        for name, p in self.engine.module.named_parameters():
            with deepspeed.zero.GatheredParameters([p], enabled=self.cfg.zero_stage == 3):
                if keep:
                    out[name] = p.data.detach().to("cpu", copy=True)
        if not keep:
            return None
        if self.tied and "lm_head.weight" not in out:  # vLLM reloads the head by name, tied or not
            out["lm_head.weight"] = out["model.embed_tokens.weight"]
        return out

    def engine_weights(self) -> dict[str, tuple[Any, str]] | None:
        """:meth:`full_state` packed for the role's engine (:func:`pack_weights`); None on ranks other than 0.
        Without ZeRO-3 the arrays are views of the live parameters, not copies: Ray serialises the return value
        into its object store before this actor runs anything else."""
        if self.cfg.zero_stage == 3:
            state = self.full_state()
            return None if state is None else pack_weights(state, self.cfg.resolved_engine_dtype())
        if self.rank != 0:
            return None
        state = {name: p.data for name, p in self.engine.module.named_parameters()}
        if self.tied and "lm_head.weight" not in state:
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        return pack_weights(state, self.cfg.resolved_engine_dtype())

    def save(self, path: str) -> None:
        self.engine.save_checkpoint(path, tag=self.role, save_latest=False)

    def export(self, path: str) -> None:
        """Collective: rank 0 writes the gathered model as a transformers folder (config, weights, tokenizer)."""
        state = self.full_state()
        if self.rank != 0 or state is None:
            return
        from transformers import AutoModelForCausalLM

        config = self.engine.module.config
        model = AutoModelForCausalLM.from_config(config, dtype=next(iter(state.values())).dtype)
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected or [k for k in missing if not (self.tied and k == "lm_head.weight")]:
            raise RuntimeError(f"exporting {self.role}: missing {missing}, unexpected {unexpected}")
        model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)

    def load(self, path: str) -> None:
        loaded, _ = self.engine.load_checkpoint(path, tag=self.role)
        if loaded is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint for role {self.role!r} under {path}")
