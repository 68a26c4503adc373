"""tutti: batches from the node's tutti-stagerd and the step plan's all-to-all.

`tutti.torch` is what a PyTorch trainer uses (a DataLoader-like loader of torch
tensors, model inputs in the Hugging Face convention, an autograd-aware
exchange). This package's top level is the lower-level binding: `Client`
(numpy views of a batch), `MpiTransport` / `NcclTransport` (exchanges of any
plan), `map_batch` and the error classes.
"""
from tutti._tutti import *  # noqa: F401,F403
from tutti._tutti import (  # noqa: F401
    Batch,
    Client,
    DataLossError,
    DeadlineExceededError,
    Error,
    FailedPreconditionError,
    HAVE_NCCL,
    InvalidArgumentError,
    MpiTransport,
    NotFoundError,
    OutOfRangeError,
    UnavailableError,
    map_batch,
    mpi_broadcast,
    mpi_world,
)

if HAVE_NCCL:
    from tutti._tutti import NcclTransport  # noqa: F401
