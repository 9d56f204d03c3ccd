"""The rank and size a launcher gave this process (Horovod's horovod.runner.common.util.env)."""
import os

# (rank, size) variables of the launchers chorus runs under: chorusrun (and
# horovodrun), Open MPI, MPICH/Intel MPI (PMI), Slurm.
_PAIRS = (("CHORUS_RANK", "CHORUS_SIZE"), ("HOROVOD_RANK", "HOROVOD_SIZE"),
          ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
          ("SLURM_PROCID", "SLURM_NTASKS"))


def get_env_rank_and_size():
    """(rank, size) from the first launcher's variables found, else None."""
    for rank_var, size_var in _PAIRS:
        rank, size = os.environ.get(rank_var), os.environ.get(size_var)
        if rank is not None and size is not None:
            return int(rank), int(size)
    return None
