"""Which launcher started this process, and torch.distributed from it."""
import dataclasses
import datetime
import os
import socket
import subprocess

import torch
import torch.distributed as dist


@dataclasses.dataclass(frozen=True)
class LaunchEnv:
    """This process's place in the job, as its launcher says."""

    launcher: str  # "tutti", "torchrun", "mpirun", "slurm" or "single"
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


def _int(environ, name):
    value = environ.get(name, "")
    if value == "":
        return None
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None
    if number < 0:
        raise ValueError(f"environment variable {name}={value!r} is negative")
    return number


def _slurm_tasks_per_node(value):
    # SLURM_TASKS_PER_NODE / SLURM_NTASKS_PER_NODE: "4", "2(x3)" or "2(x2),1".
    first = value.split(",")[0]
    return int(first.split("(")[0]) if first else None


def launch_env(environ=None):
    """Rank, world size, local rank and local world size from the environment:
    TUTTI_RANK/TUTTI_WORLD_SIZE, torchrun (RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE), Open MPI's mpirun (OMPI_COMM_WORLD_*), MPICH/PMI
    (PMI_RANK, PMI_SIZE) or Slurm's srun (SLURM_PROCID, SLURM_NTASKS,
    SLURM_LOCALID), in that order; a single process otherwise."""
    env = os.environ if environ is None else environ
    candidates = [
        ("tutti", "TUTTI_RANK", "TUTTI_WORLD_SIZE", "TUTTI_LOCAL_RANK", "TUTTI_LOCAL_WORLD_SIZE"),
        ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
        ("mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
         "OMPI_COMM_WORLD_LOCAL_SIZE"),
        ("mpirun", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
        ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None),
    ]
    for launcher, rank_var, world_var, local_var, local_world_var in candidates:
        rank = _int(env, rank_var)
        if rank is None:
            continue
        world = _int(env, world_var)
        if world is None:
            raise ValueError(f"{rank_var} is set but {world_var} is not: the launcher's environment "
                             "is incomplete")
        if world == 0 or rank >= world:
            raise ValueError(f"{rank_var}={rank} is outside {world_var}={world}")
        local = _int(env, local_var)
        if local_world_var is not None:
            local_world = _int(env, local_world_var)
        else:
            per_node = env.get("SLURM_NTASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ""
            local_world = _slurm_tasks_per_node(per_node) if per_node else None
        if local_world is None:
            local_world = world
        if local is None:
            local = rank % local_world
        return LaunchEnv(launcher, rank, world, local, local_world)
    return LaunchEnv("single", 0, 1, 0, 1)


def _free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _slurm_master(env):
    nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    if not nodes:
        return None
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True,
                             text=True, timeout=30, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        out = [nodes.split(",")[0]] if "[" not in nodes else []
    return out[0] if out else None


def init_process_group(backend=None, timeout=datetime.timedelta(minutes=30)):
    """Initialises torch.distributed from whatever launched this process:
    torchrun (env://), mpirun (rank 0's address sent to every rank over MPI)
    or Slurm (the first node of the step, a port from the job id), unless
    MASTER_ADDR and MASTER_PORT say where. backend: "nccl" when CUDA is
    available, else "gloo". Sets the CUDA device to the local rank. Returns
    the LaunchEnv. Does nothing but return it when already initialised."""
    env = launch_env()
    if torch.cuda.is_available():
        torch.cuda.set_device(env.local_rank % torch.cuda.device_count())
    if dist.is_initialized():
        return env
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    environ = os.environ
    if environ.get("MASTER_ADDR") and environ.get("MASTER_PORT"):
        init = f"tcp://{environ['MASTER_ADDR']}:{environ['MASTER_PORT']}"
    elif env.launcher == "mpirun":
        from tutti import mpi_broadcast  # MPI is this launcher's rendezvous

        mine = f"{socket.gethostname()}:{_free_port()}".encode() if env.rank == 0 else b""
        init = "tcp://" + mpi_broadcast(mine, 0).decode()
    elif env.launcher == "slurm":
        master = _slurm_master(environ)
        if master is None:
            raise RuntimeError("Slurm launched this process but neither MASTER_ADDR nor "
                               "SLURM_JOB_NODELIST says where rank 0 runs; export MASTER_ADDR")
        port = 20000 + int(environ.get("SLURM_JOB_ID", "0")) % 20000
        init = f"tcp://{master}:{port}"
    elif env.world_size == 1:
        init = f"tcp://127.0.0.1:{_free_port()}"
    else:
        raise RuntimeError(f"{env.launcher} started rank {env.rank} of {env.world_size} but gives "
                           "no rendezvous address: set MASTER_ADDR and MASTER_PORT")
    dist.init_process_group(backend, init_method=init, rank=env.rank, world_size=env.world_size,
                            timeout=timeout)
    return env
