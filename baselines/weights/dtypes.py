"""Which dtype a device computes natively, and the engines' dtype setting made concrete from it."""

from __future__ import annotations


def native_bf16(device: str) -> bool:
    """Whether ``device`` ('cpu' or 'cuda') computes bfloat16 natively: a GPU, or a CPU whose flags in
    ``/proc/cpuinfo`` include ``avx512_bf16`` or ``amx_bf16`` (oneDNN's bf16 matmuls; without them bf16 is
    emulated and slower than float32)."""
    if device != "cpu":
        return True
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False


def resolve_engine_dtype(requested: str, device: str = "cpu", trainer_dtype: str = "float32") -> str:
    """An engine dtype setting (``TrainConfig.engine_dtype``) made concrete: 'auto' is bfloat16 where ``device``
    computes it natively (:func:`native_bf16`), else ``trainer_dtype``."""
    if requested != "auto":
        return requested
    return "bfloat16" if native_bf16(device) else trainer_dtype


__all__ = ["native_bf16", "resolve_engine_dtype"]
