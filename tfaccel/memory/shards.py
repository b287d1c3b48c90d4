"""Which replica owns which variable under optimizer-state sharding (ZeRO-1), and each replica's share of bytes.

Pure Python (no TensorFlow): ``tfaccel.train.zero`` places the slots with it and ``tfaccel.memory.estimate``
predicts each replica's share with the same rule.
"""

from typing import List, Sequence

__all__ = ["partition_by_bytes", "shard_loads", "largest_share"]


def partition_by_bytes(sizes: Sequence[int], replicas: int) -> List[int]:
    """The owner (0..replicas-1) of each variable: largest first, each to the least-loaded replica (lowest index on
    a tie), so the same sizes always give the same owners.

    Example:
        >>> partition_by_bytes([400, 16, 400, 8], 2)
        [0, 0, 1, 1]
    """
    load = [0] * replicas
    owners = [0] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        owner = min(range(replicas), key=lambda r: (load[r], r))
        owners[index] = owner
        load[owner] += sizes[index]
    return owners


def shard_loads(sizes: Sequence[int], replicas: int) -> List[int]:
    """The bytes each replica owns when ``sizes`` are partitioned by :func:`partition_by_bytes`.

    Example:
        >>> shard_loads([400, 16, 400, 8], 2)
        [416, 408]
    """
    loads = [0] * replicas
    for size, owner in zip(sizes, partition_by_bytes(sizes, replicas)):
        loads[owner] += size
    return loads


def largest_share(sizes: Sequence[int], replicas: int) -> float:
    """The largest replica's bytes over the mean share (1.0: even) when ``sizes`` are partitioned by
    :func:`partition_by_bytes`; whole variables, so one variable above 1/replicas of the total makes it uneven.

    Example:
        >>> largest_share([600, 100, 100, 100], 2)
        1.3333333333333333
    """
    total = sum(sizes)
    return max(shard_loads(sizes, replicas)) * replicas / total if total else 1.0
