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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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


def packed_logprobs(model: Any, pack: PrefixPack, temperature: float = 1.0) -> list[Any]:
    """Per row of the pack, the log-probabilities of its response tokens under ``model`` at the sampling
    ``temperature`` (logits / T; ``<= 0`` taken as 1), as :func:`baselines.samples.token_logprobs` gives them for a
    padded row. Logits are computed only at the parents of response tokens."""
    import torch

    module = getattr(model, "module", model)  # a DeepSpeed engine forwards to its module
    dtype = next(module.parameters()).dtype
    out = model(
        input_ids=pack.input_ids,
        position_ids=pack.position_ids,
        attention_mask=attention_mask_for(module, pack, dtype),
        logits_to_keep=pack.logit_index,
    )
    logits = out.logits[0].float()  # [M, V]
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits[pack.target_row, pack.target_ids] - lse[pack.target_row]  # [R]
    return [picked[idx] for idx in pack.sample_tokens]
