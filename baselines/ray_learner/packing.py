"""Prefix-shared packing: a micro-batch of samples as one token tree, every shared prefix computed once.

A role's samples share long prefixes: every prompt starts with the role's system prompt, an agent's second turn
holds its first turn (prompt, response, tool feedback) whole, and GRPO's samples of one prompt share all of it.
Padded micro-batches compute each of those tokens once per sample, forward and backward; on the demo's rollouts
(SmolLM2-135M, MathChat) that is a third of the trainer's tokens (the code executor's: two fifths).

A :class:`PrefixPack` is a trie of its samples' token rows laid out as one sequence: each distinct (prefix, token)
is one position, its position id is its depth, and it attends to its ancestors only (a 4-D mask). A token's
hidden state depends only on its ancestors, so each sample's log-probs are exactly those of its own padded row
(up to float rounding), and the gradient is the same sum over samples: a prefix shared by ``k`` samples gets the
``k`` samples' gradients through its one copy. Where two samples share a response token (GRPO's samples of a
prompt that start alike) the token has one log-prob, used by each sample's loss with its own advantage.

:func:`pack_samples` groups rows into packs of at most ``budget`` distinct tokens (rows sorted by their tokens,
so samples with a common prefix are neighbours); :func:`packed_logprobs` gives each sample's response log-probs.
The same idea is "shared-prefix" / "tree attention" packing of GRPO groups in recent RL trainers (e.g. Prefix
Grouper, arXiv:2506.05433); this is a small, exact, model-agnostic version for Hugging Face causal LMs that accept a
custom 4-D attention mask.

**The prefix every row shares** (:func:`plan_packs`): a rank's rows of one role all start with the role's system
prompt and worked example, a third to a half of a MathChat row (measured on the demo's rollouts: 119 / 171 / 233
tokens of the solver's / code executor's / verifier's 225 / 400 / 587). Packs of a few rows each would still compute
it once per pack; instead it is run once per step (:func:`prefix_states`) and every pack attends to its keys and
values as a cache (:func:`packed_logprobs` with ``prefix``). In a training step the pack passes take the cached keys
and values as leaf tensors, so their gradients add up there, and one backward through the prefix
(:class:`SharedPrefix`) passes the sum on to the parameters: the same gradient as computing the prefix with every
pack, the prefix's forward and backward done once. Under gradient checkpointing the packs' layers are checkpointed
and read the prefix through a cache that stores nothing (so a layer's recomputation reads what its forward read);
the prefix's own pass is not checkpointed, since its keys and values must be kept for the step.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

# torch and transformers are imported inside the functions that use them: importing this module (the CLI, the checks, a
# dry run) loads none of them.

if TYPE_CHECKING:
    from baselines.config import TrainConfig

Row = tuple[list[int], int]
"""A sample's tokens (prompt + response) and the index of its first response token."""


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def pack_samples(rows: Sequence[Row], budget: int) -> list[list[int]]:
    """Row indices in packs of at most ``budget`` distinct tokens each, of which at most ``budget // 2`` response
    tokens (their logits are the pack's other large activation: the memory check counts that many); a row over
    either bound is a pack alone.

    Rows are taken in the order of their tokens: a row's longest common prefix with the rows before it in that
    order is the one with its predecessor, so a pack's distinct tokens are its rows' lengths less those prefixes.
    The result depends on the rows only (ties by index)."""
    if budget < 1:
        raise ValueError(f"budget must be >= 1, not {budget}")
    order = sorted(range(len(rows)), key=lambda i: (rows[i][0], i))
    packs: list[list[int]] = []
    used = responses = 0
    prev: list[int] | None = None
    for i in order:
        ids, start = rows[i]
        new = len(ids) - (_lcp(prev, ids) if prev is not None else 0)
        resp = len(ids) - max(start, _lcp(prev, ids) if prev is not None else 0)  # response tokens not shared
        if packs and used + new <= budget and responses + resp <= budget // 2:
            packs[-1].append(i)
            used += new
            responses += resp
        else:
            packs.append([i])
            used, responses = len(ids), len(ids) - start
        prev = ids
    return packs


def shared_prefix(rows: Sequence[Row], cap: int) -> int:
    """The number of leading tokens every row holds, at most ``cap`` and short of every row's first response token
    by one (a response token's log-prob comes from its parent's logits: the parent stays in the row's pack)."""
    if not rows:
        return 0
    n = min(cap, min(start for _, start in rows) - 1)
    first = rows[0][0]
    for ids, _ in rows[1:]:
        n = min(n, _lcp(first, ids))
    return max(n, 0)


def strip_prefix(rows: Sequence[Row], n: int) -> list[Row]:
    """The rows without their first ``n`` tokens (a prefix :func:`shared_prefix` found): what the packs hold."""
    return [(ids[n:], start - n) for ids, start in rows]


def plan_packs(rows: Sequence[Row], budget: int, share: bool) -> tuple[int, list[list[int]]]:
    """A rank's packs of ``rows``: the length of the prefix run once for all of them (0 when ``share`` is off; at most
    half the budget, which the memory check counts), and the row indices per pack of the rows without it."""
    n = shared_prefix(rows, budget // 2) if share else 0
    return n, (pack_samples(strip_prefix(rows, n), budget) if rows else [])


def distinct_tokens(rows: Sequence[Row]) -> int:
    """Positions a pack of these rows has (its trie's nodes)."""
    ordered = sorted(r[0] for r in rows)
    return sum(len(ids) - (_lcp(ordered[k - 1], ids) if k else 0) for k, ids in enumerate(ordered))


@dataclass
class PrefixPack:
    input_ids: Any  # [1, N] long: the trie's tokens, parents before children
    position_ids: Any  # [1, N] long: each token's depth (its position in every row that holds it)
    ancestors: Any  # [N, N] bool: row i is True at i and at every ancestor of i
    logit_index: Any  # [M] long: the positions whose logits are needed (parents of response tokens)
    target_row: Any  # [R] long: per response token, its parent's row in the M logits
    target_ids: Any  # [R] long: per response token, the token
    sample_tokens: list[Any]  # per row in the pack, [len(response)] long: its response tokens among the R
    dense_tokens: int  # what padded rows would hold (sum of the rows' lengths)

    @property
    def tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def to(self, device: Any) -> PrefixPack:
        return PrefixPack(
            self.input_ids.to(device),
            self.position_ids.to(device),
            self.ancestors.to(device),
            self.logit_index.to(device),
            self.target_row.to(device),
            self.target_ids.to(device),
            [t.to(device) for t in self.sample_tokens],
            self.dense_tokens,
        )


def build_pack(rows: Sequence[Row]) -> PrefixPack:
    """The trie of ``rows`` (each ``(ids, start)``: tokens and first response index, ``1 <= start < len(ids)``) as one
    sequence: :class:`PrefixPack`."""
    import torch

    children: list[dict[int, int]] = [{}]  # node 0 is a virtual root, not a position
    token: list[int] = [-1]
    parent: list[int] = [-1]
    depth: list[int] = [-1]
    paths: list[list[int]] = []
    for ids, start in rows:
        if not 1 <= start < len(ids):
            raise ValueError(f"a row needs a prompt and a response: start {start}, length {len(ids)}")
        node, path = 0, []
        for t in ids:
            nxt = children[node].get(t)
            if nxt is None:
                nxt = len(token)
                children[node][t] = nxt
                children.append({})
                token.append(t)
                parent.append(node)
                depth.append(depth[node] + 1)
            path.append(nxt)
            node = nxt
        paths.append(path)
    n = len(token) - 1  # positions: node k at k - 1
    anc = torch.zeros((n + 1, n + 1), dtype=torch.bool)
    for k in range(1, n + 1):  # a node's parent was created before it: its row is complete
        anc[k] = anc[parent[k]]
        anc[k, k] = True
    resp: dict[int, int] = {}  # response node -> its index among the R
    logit_rows: dict[int, int] = {}  # parent node -> its row among the M
    sample_tokens = []
    for (_ids, start), path in zip(rows, paths, strict=True):
        idx = []
        for node in path[start:]:
            if node not in resp:
                resp[node] = len(resp)
                logit_rows.setdefault(parent[node], len(logit_rows))
            idx.append(resp[node])
        sample_tokens.append(torch.tensor(idx, dtype=torch.long))
    resp_nodes = list(resp)
    return PrefixPack(
        input_ids=torch.tensor([token[1:]], dtype=torch.long),
        position_ids=torch.tensor([depth[1:]], dtype=torch.long),
        ancestors=anc[1:, 1:].contiguous(),
        logit_index=torch.tensor([p - 1 for p in logit_rows], dtype=torch.long),
        target_row=torch.tensor([logit_rows[parent[v]] for v in resp_nodes], dtype=torch.long),
        target_ids=torch.tensor([token[v] for v in resp_nodes], dtype=torch.long),
        sample_tokens=sample_tokens,
        dense_tokens=sum(len(ids) for ids, _ in rows),
    )


def attention_mask_for(model: Any, pack: PrefixPack, dtype: Any) -> Any:
    """The pack's 4-D mask ``[1, 1, N, N]`` in the form the model's attention takes: boolean (True attends) for
    SDPA, additive (0 / most negative) for eager attention.

    Cost: SDPA's CPU flash kernel computes every block of a masked ``N x N`` product (with no mask, a causal row
    skips half): at 1152 tokens attention is ~30% of a SmolLM2-135M forward+backward (measured), so packs larger
    than about one full row gain less than their token count says."""
    import torch

    impl = getattr(getattr(model, "config", None), "_attn_implementation", "sdpa")
    mask = pack.ancestors[None, None]
    if impl == "sdpa":
        return mask
    if impl == "eager":
        out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
        return out.masked_fill(~mask, torch.finfo(dtype).min)
    raise ValueError(f"prefix packing needs sdpa or eager attention, not {impl!r}")


def packed_logprobs(
    model: Any, pack: PrefixPack, temperature: float = 1.0, prefix: SharedPrefix | None = None
) -> list[Any]:
    """Per row of the pack, the log-probabilities of its response tokens under ``model`` at the sampling
    ``temperature`` (logits / T; ``<= 0`` taken as 1), as :func:`baselines.algorithm.samples.token_logprobs` gives them
    for a padded row. Logits are computed only at the parents of response tokens. ``prefix``: the pack's rows are the
    rows without this prefix (:func:`strip_prefix`); every position attends to it."""
    import torch

    module = getattr(model, "module", model)  # a DeepSpeed engine forwards to its module
    dtype = next(module.parameters()).dtype
    mask = attention_mask_for(module, pack, dtype)
    kwargs: dict[str, Any] = {}
    position_ids = pack.position_ids
    if prefix is not None:
        n = pack.tokens
        seen = torch.ones((1, 1, n, prefix.length), dtype=mask.dtype, device=mask.device)
        if mask.dtype != torch.bool:
            seen = torch.zeros_like(seen)  # additive: 0 attends
        mask = torch.cat([seen, mask], dim=-1)
        position_ids = position_ids + prefix.length
        kwargs["past_key_values"] = _read_only_cache(prefix.cache)
    with _checkpointed_layers_read(module, prefix is not None):
        out = model(
            input_ids=pack.input_ids,
            position_ids=position_ids,
            attention_mask=mask,
            logits_to_keep=pack.logit_index,
            **kwargs,
        )
    logits = out.logits[0].float()  # [M, V]
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits[pack.target_row, pack.target_ids] - lse[pack.target_row]  # [R]
    return [picked[idx] for idx in pack.sample_tokens]


class SharedPrefix:
    """The keys and values of a prefix every pack of a step shares (:func:`prefix_states`).

    Under autograd the pack passes see them as leaf tensors (:attr:`cache`): each pass's backward adds its gradient
    to them, and :meth:`backward_loss` is a scalar whose gradient, taken once after every pass, sends the summed
    gradient through the prefix's own forward to the parameters (a DeepSpeed engine takes it as one more loss)."""

    def __init__(self, length: int, states: list[tuple[Any, Any]]):
        self.length = length
        self._states = states
        grad = any(k.requires_grad for k, _ in states)
        self.cache = [(k.detach().requires_grad_(), v.detach().requires_grad_()) for k, v in states] if grad else states

    def backward_loss(self) -> Any:
        """``sum(state * its leaf's gradient)``: its gradient with respect to the parameters is the one the packs sent
        back through the prefix. Zero (still in the graph) where no pass used the prefix."""
        total = None
        for (k, v), (lk, lv) in zip(self._states, self.cache, strict=True):
            for state, leaf in ((k, lk), (v, lv)):
                term = (state * leaf.grad).sum() if leaf.grad is not None else state.sum() * 0.0
                total = term if total is None else total + term
        return total


@cache
def _read_only_cache_class() -> type:
    import torch
    from transformers import DynamicCache

    class ReadOnlyCache(DynamicCache):
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            layer = self.layers[layer_idx]
            return torch.cat([layer.keys, key_states], dim=-2), torch.cat([layer.values, value_states], dim=-2)

    return ReadOnlyCache


def _read_only_cache(states: list[tuple[Any, Any]]) -> Any:
    """A cache that hands every layer the prefix's keys and values followed by the pass's own, and stores nothing:
    a checkpointed layer's recomputation in the backward pass reads what its forward read."""
    return _read_only_cache_class()(ddp_cache_data=states)


def _checkpoint_layers(module: Any) -> list[Any]:
    """The model's layers that checkpoint themselves (transformers' ``GradientCheckpointingLayer``), if any."""
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:  # pragma: no cover - transformers before the class: nothing to toggle
        return []
    return [m for m in module.modules() if isinstance(m, GradientCheckpointingLayer)]


_UNSET = object()


@contextmanager
def _set_on(layers: list[Any], name: str, value: Any):
    """Set attribute ``name`` to ``value`` on each of ``layers`` for a pass, then restore it as it was found (an
    instance value, or none: the class's)."""
    before = [m.__dict__.get(name, _UNSET) for m in layers]
    for m in layers:
        setattr(m, name, value)
    try:
        yield
    finally:
        for m, was in zip(layers, before, strict=True):
            if was is _UNSET:
                m.__dict__.pop(name, None)
            else:
                setattr(m, name, was)


def _checkpointing_off(module: Any):
    """Gradient checkpointing off for one pass: the shared prefix's layers keep their activations (and its keys and
    values, which a checkpointed layer would drop), to be backpropagated once after every pack."""
    layers = [m for m in _checkpoint_layers(module) if m.gradient_checkpointing]
    return _set_on(layers, "gradient_checkpointing", False)


def _checkpointed_layers_read(module: Any, on: bool):
    """Let checkpointed layers take the pass's cache (transformers drops it otherwise): it is a read-only
    :func:`_read_only_cache`, so the backward replay sees the same keys and values as the forward."""
    layers = [m for m in _checkpoint_layers(module) if m.gradient_checkpointing] if on else []
    if layers and not hasattr(type(layers[0]), "_can_checkpoint_with_cache"):
        raise RuntimeError(
            "this transformers version's checkpointed layers drop a cache: share_prefix needs transformers>=5 "
            "with gradient checkpointing (or --no-share-prefix)"
        )
    return _set_on(layers, "_can_checkpoint_with_cache", True)


def prefix_states(model: Any, ids: Sequence[int], device: Any = None) -> SharedPrefix:
    """Run the prefix ``ids`` through ``model`` once and keep its per-layer keys and values (in the autograd graph when
    gradients are on). Only the last position's logits are computed (nothing reads them). Under gradient
    checkpointing the prefix's pass is not checkpointed: it is one pass a step, and its keys and values are kept for
    every pack (a checkpointed layer would store them again in its recomputation)."""
    import torch
    from transformers import DynamicCache

    kv = DynamicCache()  # passed, not asked for with use_cache (which checkpointing models turn off)
    with _checkpointing_off(getattr(model, "module", model)):
        model(
            input_ids=torch.tensor([list(ids)], dtype=torch.long, device=device),
            past_key_values=kv,
            logits_to_keep=1,
        )
    states = [(layer.keys, layer.values) for layer in kv.layers]
    return SharedPrefix(len(ids), states)


# ----------------------------------------------------------------------------------------------- rank plans


def balance(costs: Sequence[int], ranks: int) -> list[list[int]]:
    """Split sample indices over ``ranks`` so their total costs (tokens) are as even as possible, dropping none.

    Longest-processing-time-first: samples by decreasing cost, each to the rank with the least total so far (ties
    to the lower rank). The result is a function of ``costs`` only; each rank's indices are in increasing order.
    """
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, not {ranks}")
    loads = [0] * ranks
    shards: list[list[int]] = [[] for _ in range(ranks)]
    for i in sorted(range(len(costs)), key=lambda j: (-costs[j], j)):
        r = min(range(ranks), key=lambda k: (loads[k], k))
        shards[r].append(i)
        loads[r] += costs[i]
    return [sorted(s) for s in shards]


def micro_batches(n: int, size: int, count: int) -> list[slice]:
    """``count`` slices over ``n`` items in chunks of ``size``; the ones past the end are empty. Every ZeRO-3 rank
    must run the same number of forward passes (parameters are gathered collectively), so ranks with fewer
    samples run empty micro-batches as dummy passes."""
    return [slice(min(i * size, n), min((i + 1) * size, n)) for i in range(count)]


def plan_shards(rows: Sequence[tuple[list[int], int]], ranks: int, cfg: TrainConfig) -> tuple[list[list[int]], int]:
    """A role's sample rows (:func:`baselines.algorithm.samples.sample_rows`) over ``ranks``: each rank's indices, and
    how many forward passes every rank runs (the most any rank needs; ZeRO-3 ranks run them in step).

    Padded micro-batches (``cfg.pack_tokens`` 0): samples balanced by tokens, ``cfg.micro_batch`` per pass. Prefix
    packs: the packs are formed over all the rows and balanced over the ranks by their distinct tokens (a pack's
    shared prefixes stay on one rank); each rank re-forms its packs from its rows, as the workers do."""
    if not cfg.pack_tokens:
        shards = balance([len(ids) for ids, _ in rows], ranks)
        return shards, max(1, max(-(-len(sh) // cfg.micro_batch) for sh in shards))
    share = sharing_prefix(cfg)
    cut, packs = plan_packs(rows, cfg.pack_tokens, share)
    stripped = strip_prefix(rows, cut)
    owners = balance([distinct_tokens([stripped[i] for i in p]) for p in packs], ranks)
    shards = [sorted(i for k in own for i in packs[k]) for own in owners]
    n = max(len(plan_packs([rows[i] for i in sh], cfg.pack_tokens, share)[1]) for sh in shards)
    return shards, max(1, n)


def sharing_prefix(cfg: TrainConfig) -> bool:
    """Whether packs attend to a prefix run once per batch (:func:`baselines.ray_learner.packing.plan_packs`): with
    packs and ``share_prefix``. Under gradient checkpointing the packs are checkpointed and the prefix's one pass is
    not."""
    return bool(cfg.pack_tokens and cfg.share_prefix)


def mini_batches(n: int, size: int | None, seed: int) -> list[list[int]]:
    """Sample indices in optimiser-step mini-batches of ``size`` (shuffled with ``seed``; the last may be smaller);
    ``None`` or ``size >= n``: one step over everything."""
    import torch

    if not size or size >= n:
        return [list(range(n))]
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    return [sorted(order[i : i + size]) for i in range(0, n, size)]
