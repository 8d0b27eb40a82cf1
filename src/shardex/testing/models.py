"""A tiny embedding model for examples and tests (stands in for a real image encoder)."""

from __future__ import annotations

from typing import Any


def tiny_embedder(dim: int = 8) -> Any:
    """``(B, 3, H, W)`` -> ``(B, dim)``: channel means through a fixed linear map."""
    import torch

    generator = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(3, dim)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(dim, 3, generator=generator))
        linear.bias.zero_()
    return torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), linear)
