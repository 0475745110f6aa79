"""LoRA adapters per role on one shared frozen base (``--role-weights ROLE=lora[:RANK]``, single-process trainer).

Every ``lora`` role gets its own adapter (``peft``, rank ``RANK``, default 8, on every linear layer) in **one**
:class:`peft.PeftModel`, so the roles hold one copy of the base weights between them. Each role sees the shared
model through an :class:`AdapterView`: its forward passes, generation and parameters are those of its own adapter
(switched in under a lock before each call), and its reference policy is the same view with the adapters
disabled: the untouched base, so no reference copy is kept either. The base weights are never trained (their
``requires_grad`` is off; only the role's ``lora_A``/``lora_B`` tensors are in its optimiser).

Checkpoints hold each role's adapter tensors only; ``models/<role>/`` holds the merged model (base + that role's
adapter, loadable by transformers like any full model, so ``mappa eval --run`` plays it) and ``models/<role>/
adapter/<role>/`` the adapter alone, in peft's layout for a named adapter
(``peft.PeftModel.from_pretrained(base, "models/<role>/adapter/<role>")``).
"""

from __future__ import annotations

import copy
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# peft are imported inside the functions that use them: importing this module (the CLI, the checks, a dry run) loads
# none of them; it is the train extra's.

DEFAULT_RANK = 8


def lora_config(rank: int | None):
    from peft import LoraConfig

    r = rank or DEFAULT_RANK
    return LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")


class SharedBase:
    """One base model carrying one adapter per LoRA role."""

    def __init__(self, base: Any, ranks: dict[str, int | None]):
        try:
            from peft import get_peft_model
        except ImportError:
            raise RuntimeError("LoRA roles need peft (the 'models' extra: pip install peft)") from None
        roles = list(ranks)
        self.peft = get_peft_model(base, lora_config(ranks[roles[0]]), adapter_name=roles[0])
        for role in roles[1:]:
            self.peft.add_adapter(role, lora_config(ranks[role]))
        self.lock = threading.RLock()
        self.layers = [m for m in self.peft.modules() if hasattr(m, "_active_adapter") and hasattr(m, "lora_A")]
        for p in self.peft.parameters():
            p.requires_grad_(False)
        self.views = {role: AdapterView(self, role) for role in roles}
        for view in self.views.values():
            for p in view.parameters():
                p.requires_grad_(True)


class AdapterView:
    """One role's model: the shared base with this role's adapter (or, ``disabled``, with none: the reference)."""

    def __init__(self, shared: SharedBase, role: str, disabled: bool = False):
        self.shared, self.role, self.disabled = shared, role, disabled
        self.generation_config = shared.peft.generation_config
        self.name_or_path = getattr(shared.peft, "name_or_path", "")

    def reference(self) -> AdapterView:
        return AdapterView(self.shared, self.role, disabled=True)

    @contextmanager
    def _use(self):
        """This role's adapter switched in (or every adapter off, for the reference) on each LoRA layer directly:
        peft's ``set_adapter`` and ``disable_adapter`` would also flip ``requires_grad``, leaving only the last
        role's adapter trainable. The caller holds the lock."""
        layers = self.shared.layers
        for layer in layers:
            layer._active_adapter = [self.role]
            layer._disable_adapters = self.disabled
        try:
            yield
        finally:
            for layer in layers:
                layer._disable_adapters = False

    def __call__(self, *args: Any, **kwargs: Any):
        with self.shared.lock, self._use():
            return self.shared.peft(*args, **kwargs)

    def generate(self, *args: Any, **kwargs: Any):
        with self.shared.lock, self._use():
            return self.shared.peft.generate(*args, **kwargs)

    def named_parameters(self):
        """This role's adapter tensors (nothing for the reference)."""
        if self.disabled:
            return iter(())
        tag = f".{self.role}."
        return ((n, p) for n, p in self.shared.peft.named_parameters() if "lora_" in n and tag in n)

    def parameters(self):
        return (p for _, p in self.named_parameters())

    @property
    def training(self) -> bool:
        return self.shared.peft.training

    def train(self, mode: bool = True) -> AdapterView:
        self.shared.peft.train(mode)
        return self

    def eval(self) -> AdapterView:
        return self.train(False)

    def requires_grad_(self, flag: bool) -> AdapterView:
        for p in self.parameters():
            p.requires_grad_(flag)
        return self

    def state_dict(self) -> dict[str, Any]:
        """The adapter's tensors only (what a checkpoint stores)."""
        return {n: p.detach().clone() for n, p in self.named_parameters()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        own = dict(self.named_parameters())
        if set(own) != set(state):
            raise RuntimeError(f"{self.role}: adapter checkpoint keys differ ({sorted(set(own) ^ set(state))[:4]}...)")
        with self.shared.lock:
            for name, tensor in state.items():
                own[name].data.copy_(tensor)

    def merged(self):
        """A plain transformers model: the base with this role's adapter merged in (the shared model untouched)."""
        with self.shared.lock:
            clone = copy.deepcopy(self.shared.peft)
        clone.set_adapter(self.role)
        for other in [a for a in clone.peft_config if a != self.role]:
            clone.delete_adapter(other)
        return clone.merge_and_unload()

    def save_pretrained(self, path: str | Path) -> None:
        """``path``: the merged model; ``path/adapter/<role>``: this role's adapter alone (peft's format)."""
        path = Path(path)
        self.merged().save_pretrained(path)
        with self.shared.lock:
            self.shared.peft.save_pretrained(str(path / "adapter"), selected_adapters=[self.role])


__all__ = ["DEFAULT_RANK", "AdapterView", "SharedBase", "lora_config"]
