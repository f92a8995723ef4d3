"""The accelerators tx plans for: memory, peak bf16 FLOP/s and memory bandwidth per chip.

Figures are the vendors' data sheets: Google Cloud's TPU system architecture pages
(cloud.google.com/tpu/docs/v4, /v5e, /v5p, /v6e) and NVIDIA's data sheets (dense Tensor Core
bf16, without sparsity; SXM parts). `kinds` are the device_kind strings jax reports; v5p
reports itself as "TPU v5" and v5e as "TPU v5 lite", which is why the match is exact.
"""

from __future__ import annotations

import dataclasses

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    kinds: tuple[str, ...]  # jax's device_kind for it
    hbm_bytes: int
    bf16_tflops: float  # dense peak
    hbm_tbytes_per_sec: float
    source: str


CHIPS = (
    Chip("v4", ("TPU v4",), 32 * GIB, 275.0, 1.2, "cloud.google.com/tpu/docs/v4"),
    Chip(
        "v5e", ("TPU v5 lite", "TPU v5e"), 16 * GIB, 197.0, 0.819, "cloud.google.com/tpu/docs/v5e"
    ),
    Chip("v5p", ("TPU v5", "TPU v5p"), 95 * GIB, 459.0, 2.765, "cloud.google.com/tpu/docs/v5p"),
    Chip("v6e", ("TPU v6 lite", "TPU v6e"), 32 * GIB, 918.0, 1.64, "cloud.google.com/tpu/docs/v6e"),
    Chip(
        "v3",
        ("TPU v3",),
        32 * GIB,
        123.0,
        0.9,
        "cloud.google.com/tpu/docs/system-architecture-tpu-vm",
    ),
    Chip(
        "H200", ("NVIDIA H200",), 141 * 10**9, 989.0, 4.8, "NVIDIA H200 Tensor Core GPU data sheet"
    ),
    Chip(
        "H100",
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100"),
        80 * 10**9,
        989.0,
        3.35,
        "NVIDIA H100 data sheet (SXM)",
    ),
    Chip(
        "A100",
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100"),
        80 * 10**9,
        312.0,
        2.039,
        "NVIDIA A100 data sheet (SXM, 80 GB)",
    ),
    Chip(
        "V100",
        ("Tesla V100-SXM2-32GB", "Tesla V100"),
        32 * 10**9,
        125.0,
        0.9,
        "NVIDIA V100 data sheet (SXM2)",
    ),
)


def chip(device_kind: str) -> Chip | None:
    """The chip jax calls `device_kind`: an exact match first, then the longest prefix."""
    for c in CHIPS:
        if device_kind in c.kinds:
            return c
    prefixes = [(len(k), c) for c in CHIPS for k in c.kinds if device_kind.startswith(k)]
    return max(prefixes, key=lambda p: p[0])[1] if prefixes else None


def by_name(name: str) -> Chip:
    for c in CHIPS:
        if c.name.lower() == name.lower():
            return c
    raise KeyError(f"unknown chip {name!r}; known: {', '.join(c.name for c in CHIPS)}")
