"""Which rank of a multi-process job this process is, as its launcher says (torchrun and
torch.distributed's launchers, Open MPI, MPICH and Slurm set these variables), so that each
rank of a job recorded with one ``-o`` writes a capture of its own: ``job.kreplay`` becomes
``job.rank0.kreplay``, ``job.rank1.kreplay``, ... beside it, each holding its rank, world size
and local rank in the capture's metadata properties."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# (rank, world size, local rank) variables, by launcher, first match wins
_LAUNCHERS = (
    ("RANK", "WORLD_SIZE", "LOCAL_RANK"),  # torchrun, torch.distributed.launch, accelerate, deepspeed
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),  # Open MPI
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),  # MPICH, Intel MPI
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),  # srun
)


@dataclass(frozen=True, slots=True)
class Rank:
    rank: int
    world_size: int
    local_rank: int

    def properties(self) -> tuple[tuple[str, str], ...]:
        """The capture metadata properties that record it."""
        return (("rank", str(self.rank)), ("world_size", str(self.world_size)), ("local_rank", str(self.local_rank)))


def this_rank(environ: Mapping[str, str] | None = None) -> Rank | None:
    """This process's rank in a job of several processes; None when it runs alone."""
    env = os.environ if environ is None else environ
    for rank, size, local in _LAUNCHERS:
        try:
            found = Rank(int(env[rank]), int(env[size]), int(env.get(local, env[rank])))
        except (KeyError, ValueError):
            continue
        if found.world_size > 1 and 0 <= found.rank < found.world_size:
            return found
    return None


def rank_output(path: Path, rank: Rank | None) -> Path:
    """Where this rank writes the capture the user named ``path``: ``path`` itself when alone."""
    if rank is None:
        return path
    return path.with_name(f"{path.stem}.rank{rank.rank}{path.suffix or '.kreplay'}")


def rank_properties(rank: Rank | None) -> tuple[tuple[str, str], ...]:
    """The capture metadata properties that record ``rank`` (none for a process that runs alone)."""
    return rank.properties() if rank is not None else ()
