"""A tutti job on this machine for the torch tests: a small generated dataset,
its index, one tutti-packerd and one tutti-stagerd per "node" (own cache
each), on loopback ports the OS picks; and helpers that launch ranks under
torchrun or mpirun as two nodes of two ranks. Needs TUTTI_BUILD_DIR."""
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

BUILD = os.environ.get("TUTTI_BUILD_DIR", "")
HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
DATASET_OPTS = ["--samples", "192", "--samples-per-shard", "48", "--max-megapixels", "0.06",
                "--large-fraction", "0", "--text-fraction", "0.5", "--text-tokens-median", "40",
                "--max-text-tokens", "160", "--seed", "7"]

JOB = """job_id: "{job_id}"
seed: {seed}
world_size: {world}
ranks_per_node: {per_node}
index_path: "{index}"
epochs: {epochs}
batch {{
  text_samples_per_step: 8
  vl_samples_per_step: 8
  grad_accum: 2
  text_micro_batch: 1
  vl_micro_batch: 1
  text_vl_ratio: "1:1"
}}
vision {{ min_pixels: 3136 max_pixels: 50176 }}
curriculum {{ start_step: 0 max_pixels: 50176 seq_len: 2048 }}
packing {{ strategy: "tutti" }}
post_balancing {{ enabled: {post} hidden_size: {hidden} embedding_dtype: DTYPE_FLOAT32 }}
plan_window: 4
"""


def binary(*parts):
    path = os.path.join(BUILD, *parts)
    if not os.path.exists(path):
        raise RuntimeError(f"{path} is missing: build first (TUTTI_BUILD_DIR={BUILD!r})")
    return path


def dataset():
    """The generated dataset and its index, made once per build tree."""
    root = os.path.join(BUILD, "torch-tests")
    data, index, stamp = (os.path.join(root, n) for n in ("dataset", "index.tutti", "options"))
    want = " ".join(DATASET_OPTS)
    if os.path.exists(stamp) and open(stamp).read() == want and os.path.exists(index):
        return data, index
    os.makedirs(root, exist_ok=True)
    shutil.rmtree(data, ignore_errors=True)
    partial = tempfile.mkdtemp(dir=root, prefix="dataset.")
    subprocess.run([binary("tools", "tutti"), "gen-dataset", "--out", partial, "--quiet",
                    *DATASET_OPTS], check=True, stdout=subprocess.DEVNULL)
    os.rename(partial, data)
    tmp = index + ".tmp"
    subprocess.run([binary("tools", "tutti"), "index", "--source", data, "--out", tmp], check=True,
                   stdout=subprocess.DEVNULL)
    os.rename(tmp, index)
    with open(stamp, "w") as f:
        f.write(want)
    return data, index


def _ports(path, name, proc, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(path):
            with open(path) as f:
                kv = dict(line.strip().split("=", 1) for line in f if "=" in line)
            if "grpc" in kv and "metrics" in kv:
                return int(kv["grpc"])
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode} before it was ready")
        time.sleep(0.1)
    raise RuntimeError(f"{name} not ready after {timeout} s")


class Cluster:
    """One packer and `nodes` stagers for a job of nodes x per_node ranks."""

    def __init__(self, work, post=True, nodes=2, per_node=2, hidden=64, seed=11, epochs=0,
                 job_id=None, data=None, job=JOB):
        """data: (dataset directory, index) to serve instead of the generated dataset; job: the
        job's text with the fields JOB has as {placeholders}."""
        self.work, self.nodes, self.per_node = work, nodes, per_node
        self.world = nodes * per_node
        self.job_args = dict(post=post, hidden=hidden, seed=seed, epochs=epochs)
        self.job_id = job_id or f"torchtest-{os.getpid()}-{os.path.basename(work)}"
        self.procs, self.logs = [], []
        self.data, self.index = data or dataset()
        self.config = os.path.join(work, "job.textproto")
        with open(self.config, "w") as f:
            f.write(job.format(job_id=self.job_id, world=self.world, per_node=per_node,
                               index=self.index, post="true" if post else "false", hidden=hidden,
                               seed=seed, epochs=epochs))
        self.packer = self.stagers = None

    def start(self):
        logs = os.path.join(self.work, "logs")
        os.makedirs(logs, exist_ok=True)
        pf = os.path.join(self.work, "packer.ports")
        p = self._spawn("packer", [binary("services", "packer", "tutti-packerd"), "--config",
                                   self.config, "--listen", "127.0.0.1:0", "--metrics",
                                   "127.0.0.1:0", "--port_file", pf], logs)
        self.packer = f"127.0.0.1:{_ports(pf, 'tutti-packerd', p)}"
        self.stagers = []
        files = []
        for n in range(self.nodes):
            sf = os.path.join(self.work, f"stager{n}.ports")
            files.append((sf, self._spawn(f"stager{n}", [
                binary("services", "stager", "tutti-stagerd"), "--packer", self.packer, "--node",
                str(n), "--source", self.data, "--cache", os.path.join(self.work, f"cache{n}"),
                "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0", "--port_file", sf,
                "--memory_budget", "256M", "--packer_wait_s", "30", "--queue_depth", "4",
                "--block_size", "256K"], logs)))
        for n, (sf, proc) in enumerate(files):
            self.stagers.append(f"127.0.0.1:{_ports(sf, f'tutti-stagerd {n}', proc)}")
        return self

    def _spawn(self, name, argv, logs):
        log = open(os.path.join(logs, name + ".log"), "w")
        self.logs.append(log)
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []
        for log in self.logs:
            log.close()
        self.logs = []

    def env(self, node):
        e = dict(os.environ)
        e.update(TUTTI_PACKER=self.packer, TUTTI_STAGER=self.stagers[node],
                 PYTHONPATH=os.path.join(BUILD, "python"), OMP_NUM_THREADS="1",
                 OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                 OMPI_MCA_rmaps_base_oversubscribe="1")
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                  "MASTER_PORT", "TUTTI_RANK", "TUTTI_WORLD_SIZE"):
            e.pop(k, None)
        return e


@contextlib.contextmanager
def cluster(**kw):
    work = tempfile.mkdtemp(prefix="tutti-torch-")
    c = Cluster(work, **kw)
    try:
        yield c.start()
    finally:
        c.stop()
        shutil.rmtree(work, ignore_errors=True)


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(c, script, args, timeout=600, launcher_args=()):
    """Runs `script` on every rank as c.nodes torchrun invocations (one per node, each
    with its node's stager), rendezvous on loopback; `launcher_args` go to torchrun.
    Returns (returncode, outputs)."""
    port = _free_port()
    procs = []
    n = c.per_node
    maps = ",".join(f"{i}:1" for i in range(n))  # Debian's torchrun needs per-rank maps
    with torchrun_logs() as logs:
        for node in range(c.nodes):
            argv = [PYTHON, "-m", "torch.distributed.run", f"--nnodes={c.nodes}",
                    f"--nproc_per_node={n}", f"--node_rank={node}", "--master_addr=127.0.0.1",
                    f"--master_port={port}", "--redirects", maps, "--tee", maps,
                    "--log_dir", os.path.join(logs, f"node{node}"), *launcher_args, script, *args]
            procs.append(subprocess.Popen(argv, env=c.env(node), stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        return _collect(procs, timeout)


@contextlib.contextmanager
def torchrun_logs():
    """A directory for torchrun's per-rank logs (--log_dir), removed afterwards: by default
    torchrun leaves one under the system's temporary directory per run."""
    logs = tempfile.mkdtemp(prefix="tutti-torchrun-")
    try:
        yield logs
    finally:
        shutil.rmtree(logs, ignore_errors=True)


def mpirun(c, script, args, timeout=600):
    """Runs `script` on every rank under one mpirun, an app context per node (each with
    its node's stager). Returns (returncode, outputs)."""
    argv = ["mpirun", "--oversubscribe", "--bind-to", "none"]
    for node in range(c.nodes):
        if node:
            argv.append(":")
        argv += ["-np", str(c.per_node), "env", f"TUTTI_STAGER={c.stagers[node]}", PYTHON,
                 script, *args]
    proc = subprocess.Popen(argv, env=c.env(0), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    return _collect([proc], timeout)


def _collect(procs, timeout):
    deadline = time.time() + timeout
    outs, rc = [], 0
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
            out += f"\n[timed out after {timeout} s]"
            rc = rc or 124
        outs.append(out)
        rc = rc or p.returncode
    return rc, "\n".join(outs)
