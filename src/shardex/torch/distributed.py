"""Who this process is in a distributed job, and how many samples each rank gets."""

from __future__ import annotations

from typing import Any

from shardex.errors import ConfigError


def resolve_ranks(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: those given, else torch.distributed's, else ``(0, 1)``."""
    if rank is None or world_size is None:
        import torch.distributed as dist

        running = dist.is_available() and dist.is_initialized()
        if world_size is None:
            world_size = dist.get_world_size() if running else 1
        if rank is None:
            rank = dist.get_rank() if running else 0
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(
            f"rank {rank} is not in range(world_size={world_size}); each rank must be "
            "0 <= rank < world_size"
        )
    return rank, world_size


def rank_share(num_samples: int, world_size: int, *, drop_last: bool) -> int:
    """Samples every rank gets per epoch: padded up without ``drop_last``, else cut down."""
    if drop_last:
        return num_samples // world_size
    return -(-num_samples // world_size)


def check_state(state: dict[str, Any], kind: str, expected: dict[str, Any]) -> None:
    """Raise ConfigError for a state dict of another kind, or naming the first field
    whose saved value differs from ``expected``."""
    if not isinstance(state, dict) or state.get("kind") != kind:
        found = state.get("kind") if isinstance(state, dict) else type(state).__name__
        raise ConfigError(f"not a {kind} state dict (its kind is {found!r})")
    for name, value in expected.items():
        if state.get(name) != value:
            raise ConfigError(
                f"cannot resume: the state was saved with {name}={state.get(name)!r} but this "
                f"{kind} has {name}={value!r}; create it with the same settings"
            )
