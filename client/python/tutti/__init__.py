"""tutti: batches from the node's tutti-stagerd and the step plan's all-to-all.

`tutti.torch` is what a PyTorch trainer uses (a DataLoader-like loader of torch
tensors, model inputs in the Hugging Face convention, an autograd-aware
exchange). This package's top level is the lower-level binding: `Client`
(numpy views of a batch), `MpiTransport` / `NcclTransport` (exchanges of any
plan), `map_batch` and the error classes.

`tutti.convert` (the data converter) is pure Python: where the extension cannot be
loaded (a data-preparation machine without MPI or CUDA libraries), the package still
imports, and using the binding raises the extension's ImportError.
"""
try:
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
except ImportError as _error:
    _extension_error = _error  # the except clause's name is gone after it

    def __getattr__(name):
        raise ImportError(f"tutti.{name} needs tutti's compiled extension, which did not load: "
                          f"{_extension_error}") from _extension_error

else:
    if HAVE_NCCL:
        from tutti._tutti import NcclTransport  # noqa: F401
