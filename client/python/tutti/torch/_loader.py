"""tutti.torch.Loader: iterates a rank's batches like a DataLoader."""
import hashlib
import logging
import sys
import time
import warnings

import torch.distributed as dist

import tutti
from tutti import views
from tutti.torch import _exchange, _transports
from tutti.torch._batch import Batch, LabelOptions
from tutti.torch._env import launch_env

STATE_VERSION = 1
LOG = logging.getLogger("tutti.torch")
# The longest account of what a batch waits for that a progress line carries.
_MAX_WAITING_FOR = 400


def _say(message):
    """A progress line: to the `tutti.torch` logger (INFO) when the application has set up
    logging, else to stderr, so that it is seen either way."""
    if LOG.hasHandlers():
        LOG.info(message)
    else:
        print(f"tutti.torch: {message}", file=sys.stderr, flush=True)


class _WaitProgress:
    """What a rank waits for while connecting or waiting for a batch (tutti.Client's
    progress callback), and how long the wait took once it is over; silent for a wait
    shorter than the interval."""

    def __init__(self, rank):
        self.rank = rank
        self.reported = False

    def __call__(self, step, waited, waiting_for):
        self.reported = True
        if len(waiting_for) > _MAX_WAITING_FOR:
            waiting_for = waiting_for[:_MAX_WAITING_FOR] + " ..."
        waited = f"{waited:.0f}" if waited >= 10 else f"{waited:.1f}"
        if step < 0:
            _say(f"rank {self.rank}: connecting for {waited} s: {waiting_for}")
        else:
            _say(f"rank {self.rank}: waiting {waited} s for the batch of step {step}: "
                 f"{waiting_for}")

    def over(self, what, seconds):
        if self.reported:
            self.reported = False
            _say(f"rank {self.rank}: {what} after {seconds:.1f} s")


def _job_info(job):
    return job if isinstance(job, views.JobInfo) else views.JobInfo.from_dict(job)


def _sampling_identity(job):
    """What decides which samples make up each step's global batch: the same on
    every world size (ranks only split the global batch)."""
    job = _job_info(job)
    shards = hashlib.sha256("\n".join(job.shards).encode()).hexdigest()[:16]
    return {
        "seed": job.seed,
        "text_samples_per_step": job.text_samples_per_step,
        "vl_samples_per_step": job.vl_samples_per_step,
        "epochs": job.epochs,
        "dataset": {"samples": job.samples, "bytes": job.dataset_bytes, "shards": shards},
    }


def _mixture_fingerprint(job, next_step):
    """What drew the steps before next_step: the entry of JobInfo.mixture_history in force at
    step next_step - 1 (None for a job without a mixture, or before any step)."""
    found = None
    for start_step, fingerprint in _job_info(job).mixture_history:
        if next_step > 0 and start_step <= next_step - 1:
            found = fingerprint
    return found


def _check_mixture(job, state, mixture_change):
    """Refuses a checkpoint whose steps a different mixture drew, unless mixture_change says
    how to go on; returns a warning to give (or None)."""
    if mixture_change not in (None, "continue"):
        raise tutti.InvalidArgumentError(
            f"mixture_change={mixture_change!r}: use None (refuse a changed mixture) or 'continue'")
    step = int(state["next_step"])
    mine, theirs = _mixture_fingerprint(job, step), state.get("mixture")
    if mine == theirs:
        return None
    if mixture_change == "continue":
        return (f"resuming at step {step} with a mixture that differs from the checkpoint's for "
                "the steps before it (mixture_change='continue'): each source goes on from where "
                "this mixture puts it at that step")
    raise tutti.FailedPreconditionError(
        f"cannot resume at step {step}: the mixture that draws the steps before it is not the "
        f"checkpoint's (mixture fingerprint: checkpoint {theirs!r}, this job {mine!r}). To change "
        f"the mixture of a resumed job, keep its sources and stages as they were and add a stage "
        f"with start_step >= {step}: the steps before keep their draws and every source goes on "
        "in its epoch. To go on with the mixture as now configured anyway (each source goes on "
        "from where it puts it at that step, so samples of the sources' current epochs may come "
        "again or wait for their next epoch), pass load_state_dict(state, "
        "mixture_change='continue')")


class Loader:
    """A rank's batches, one per step, as tutti.torch.Batch (torch tensors over the stager's
    shared memory). Iterate it like a DataLoader:

        loader = tutti.torch.Loader()
        for batch in loader:
            ...

    Addresses come from TUTTI_PACKER and TUTTI_STAGER (else the node's default stager socket
    /var/run/tutti/stager.sock); rank and world size from torch.distributed when it is
    initialised, else the launcher (torchrun, mpirun, srun). transport: how exchange() moves
    rows: "auto" (the torch.distributed group when initialised, else tutti's MPI transport
    under mpirun, else none for a world of one), "torch", "mpi", "nccl" (tutti's, under
    mpirun), "local" (one rank) or None (no exchanges: reading batches only). group: the torch.distributed group (default: the world).

    While it connects or waits for a batch, a rank says every progress_interval seconds (10 by
    default; the first line one interval in, so a quick batch prints nothing) what it waits
    for: a daemon that does not answer yet, no plan from the packer yet, shards still being
    staged into the node's cache, decoding. progress: None (default) on rank 0 only, True on
    every rank, False never. The lines go to the "tutti.torch" logger at INFO when logging is
    set up, else to stderr.

    The iteration ends after the job's last step (epochs x steps per epoch; never with
    epochs: 0) or after max_steps batches. Taking the next batch releases the previous one.
    state_dict() / load_state_dict() resume at the step after the last batch taken."""

    def __init__(self, *, stager=None, packer=None, transport="auto", group=None,
                 labels=None, pin_memory=False, device=None, max_steps=None,
                 connect_timeout=60.0, batch_timeout=600.0, join_timeout=600.0,
                 progress=None, progress_interval=10.0):
        env = launch_env()
        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(group), dist.get_world_size(group)
            if env.launcher != "single" and (env.rank, env.world_size) != (rank, world):
                raise tutti.FailedPreconditionError(
                    f"torch.distributed says rank {rank} of {world} but {env.launcher}'s "
                    f"environment says rank {env.rank} of {env.world_size}")
        else:
            rank, world = env.rank, env.world_size
        self.rank, self.world_size, self.local_rank = rank, world, env.local_rank
        if progress is None:
            progress = rank == 0
        self._progress = _WaitProgress(rank) if progress and progress_interval else None
        self._args = dict(stager=stager, packer=packer, rank=rank, world_size=world,
                          connect_timeout=connect_timeout, batch_timeout=batch_timeout,
                          join_timeout=join_timeout, progress=self._progress,
                          progress_interval=float(progress_interval or 0))
        self._client = self._connect(0)
        self.job = self._client.job
        self.job_info = views.JobInfo.from_dict(self.job)  # the same, typed
        self._labels = labels or LabelOptions()
        self._pin = pin_memory
        self._device = device
        self.max_steps = max_steps
        self._taken = 0
        self._current = None
        self.next_step = self._client.next_step
        self.transport = self._make_transport(transport, group, join_timeout, env)

    def _connect(self, start_step):
        start = time.monotonic()
        client = tutti.Client(start_step=start_step, **self._args)
        if self._progress:
            self._progress.over("connected", time.monotonic() - start)
        return client

    def _make_transport(self, kind, group, timeout, env):
        if kind is None:
            return None  # batches only: exchange() refuses
        initialised = dist.is_available() and dist.is_initialized()
        if kind == "auto":
            if initialised:
                kind = "torch"
            elif env.launcher == "mpirun":
                kind = "mpi"
            elif self.world_size == 1:
                kind = "local"
            else:
                raise tutti.FailedPreconditionError(
                    f"rank {self.rank} of {self.world_size} has no way to exchange: initialise "
                    "torch.distributed first (tutti.torch.init_process_group()), or run under "
                    "mpirun, or pass transport=")
        if kind == "torch":
            if not initialised:
                raise tutti.FailedPreconditionError(
                    "transport='torch' needs torch.distributed initialised first")
            return _transports.TorchTransport(group, timeout)
        if kind == "mpi":
            t = _transports.MpiTransport(timeout)
        elif kind == "nccl":
            t = _transports.NcclTransport(timeout, device=env.local_rank)
        elif kind == "local":
            if self.world_size != 1:
                raise tutti.FailedPreconditionError(
                    f"transport='local' is for a world of one rank, not {self.world_size}")
            return _transports.LocalTransport()
        else:
            raise tutti.InvalidArgumentError(
                f"transport={kind!r}: use 'auto', 'torch', 'mpi', 'nccl' or 'local'")
        if (t.rank, t.world) != (self.rank, self.world_size):
            raise tutti.FailedPreconditionError(
                f"the {kind} transport sees rank {t.rank} of {t.world} but this loader is rank "
                f"{self.rank} of {self.world_size}: launch the ranks with mpirun for it")
        return t

    # ---- iteration ----
    def __iter__(self):
        return self

    def __next__(self):
        if self._current is not None:
            pending = self._current._pending_backward()
            self._current.release()
            self._current = None
            if pending:
                raise tutti.FailedPreconditionError(pending)
        if self.max_steps is not None and self._taken >= self.max_steps:
            raise StopIteration
        try:
            raw = self._client.next()
        except tutti.OutOfRangeError:
            raise StopIteration from None
        if self._progress:
            self._progress.over(f"the batch of step {raw.step} came", raw.wait_seconds)
        batch = Batch(raw, self.job_info, labels=self._labels)
        batch._transport = self.transport
        try:
            _exchange.share_skipped_images(batch)  # collective, before any label is built
        except BaseException:
            batch.release()
            raise
        if self._pin:
            batch = batch.pin_memory()
        if self._device is not None:
            batch = batch.to(self._device, non_blocking=True)
        self._current = batch
        self._taken += 1
        self.next_step = self._client.next_step
        return batch

    def __len__(self):
        total = self.job_info.total_steps
        if total == 0:
            if self.max_steps is None:
                raise TypeError("this job has no end (epochs: 0): pass max_steps to have a length")
            return self.max_steps - self._taken
        left = max(0, total - self.next_step)
        return left if self.max_steps is None else min(left, self.max_steps - self._taken)

    @property
    def steps_per_epoch(self):
        return self.job_info.steps_per_epoch

    @property
    def epoch(self):
        """The epoch of the next batch (step // steps_per_epoch)."""
        spe = self.steps_per_epoch
        return self.next_step // spe if spe else 0

    def report_timing(self, step, phases):
        """Phase timings for the packer's cost model: {'vit': s, 'llm': s, ...}."""
        self._client.report_timing(step, phases)

    # ---- resumption ----
    def state_dict(self):
        """Where this loader stands: save it with the model checkpoint after the optimizer
        step of the last batch taken. The same on every rank."""
        return {"version": STATE_VERSION, "next_step": int(self.next_step),
                "world_size": self.world_size, "job_id": self.job_info.job_id,
                "config_fingerprint": self.job_info.config_fingerprint,
                "sampling": _sampling_identity(self.job_info),
                "mixture": _mixture_fingerprint(self.job_info, int(self.next_step))}

    def load_state_dict(self, state, *, mixture_change=None):
        """Continues at state["next_step"]: the batches of an uninterrupted run, on fresh
        daemons too. A different world size is fine (the global batch of a step does not
        depend on it); a different seed, batch composition or dataset is refused. So is a
        mixture that drew the steps before next_step differently from the checkpoint's (a
        stage added from next_step on is not a difference), unless mixture_change='continue':
        then the job goes on with its mixture as now configured."""
        if self._taken:
            raise tutti.FailedPreconditionError(
                "load_state_dict() after batches were taken: restore before iterating")
        version = state.get("version")
        if version != STATE_VERSION:
            raise tutti.InvalidArgumentError(
                f"loader state version {version!r}; this tutti reads version {STATE_VERSION}")
        mine, theirs = _sampling_identity(self.job_info), state.get("sampling") or {}
        diffs = [f"{k}: checkpoint {theirs.get(k)!r}, this job {mine[k]!r}"
                 for k in mine if theirs.get(k) != mine[k]]
        if diffs:
            raise tutti.FailedPreconditionError(
                "cannot resume: the checkpoint's steps drew their samples differently ("
                + "; ".join(diffs) + "); resume with the job config and dataset it was "
                "saved with (world_size and ranks_per_node may change)")
        warning = _check_mixture(self.job_info, state, mixture_change)
        if warning:
            warnings.warn(warning)
        step = int(state["next_step"])
        self._client = self._connect(step)
        self.next_step = self._client.next_step

    def close(self):
        if self._current is not None:
            self._current.release()
            self._current = None
