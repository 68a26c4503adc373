"""Shared pieces of the deploy tests: the build's binaries, a small dataset,
daemons as real processes on loopback, and HTTP on their metrics port.

The tests run from CTest (label "deploy") with TUTTI_BUILD_DIR and
TUTTI_SOURCE_DIR set; run one by hand with
  TUTTI_BUILD_DIR=build TUTTI_SOURCE_DIR=. /usr/bin/python3 -m unittest -v tests/deploy/test_k8s.py
"""
import atexit
import http.client
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest

SOURCE_DIR = pathlib.Path(os.environ.get("TUTTI_SOURCE_DIR",
                                         pathlib.Path(__file__).resolve().parents[2]))
BUILD_DIR = pathlib.Path(os.environ.get("TUTTI_BUILD_DIR", SOURCE_DIR / "build")).resolve()
DEPLOY = SOURCE_DIR / "deploy"
TUTTI = BUILD_DIR / "tools" / "tutti"
PACKERD = BUILD_DIR / "services" / "packer" / "tutti-packerd"
STAGERD = BUILD_DIR / "services" / "stager" / "tutti-stagerd"
RANK_DEMO = BUILD_DIR / "client" / "tutti-rank-demo"


def need_tool(case: unittest.TestCase, *names: str) -> None:
    """Skips `case` (saying why) when one of the programs is not installed."""
    for name in names:
        if shutil.which(name) is None:
            case.skipTest(f"{name} is not installed on this machine")


def need_binaries(case: unittest.TestCase) -> None:
    for b in (TUTTI, PACKERD, STAGERD, RANK_DEMO):
        if not os.access(b, os.X_OK):
            case.fail(f"{b} is missing: build first (cmake --build {BUILD_DIR})")


_TEMP_DIRS = []


def _remove_temp_dirs():
    if os.environ.get("TUTTI_KEEP_TEST_DIRS") != "1":
        for d in _TEMP_DIRS:
            shutil.rmtree(d, ignore_errors=True)


atexit.register(_remove_temp_dirs)


def temp_dir(prefix: str) -> pathlib.Path:
    """A fresh directory, removed when the test process exits (kept with
    TUTTI_KEEP_TEST_DIRS=1)."""
    d = pathlib.Path(tempfile.mkdtemp(prefix=f"tutti-deploy-{prefix}-"))
    _TEMP_DIRS.append(d)
    return d


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("timeout", 120)
    return subprocess.run([str(c) for c in cmd], **kw)


def http_get(port: int, path: str, timeout: float = 5.0, host: str = "127.0.0.1"):
    """(status, body) of GET http://host:port/path."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        conn.close()


def wait_for(what: str, check, timeout: float = 60.0, interval: float = 0.2):
    """Calls check() until it returns something true; fails after `timeout`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        # ValueError: a body that is not JSON yet (Prometheus answers its query API
        # with an empty body while it starts).
        except (OSError, http.client.HTTPException, ValueError) as e:
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def help_flags(binary) -> dict:
    """The flags `binary --help` lists, name -> the rest of its help text."""
    out = run([binary, "--help"])
    text = out.stdout + out.stderr
    flags = {}
    name = None
    for line in text.splitlines():
        m = re.match(r"^\s+--([a-z][a-z0-9_]*)\b(.*)$", line)
        if m:
            name = m.group(1)
            flags[name] = m.group(2)
        elif name and line.startswith("      "):
            flags[name] += " " + line.strip()
        else:
            name = None
    return flags


def make_dataset(dir: pathlib.Path, samples: int = 96) -> pathlib.Path:
    """A small synthetic WebDataset and its index in `dir`; returns the index."""
    ds = dir / "dataset"
    r = run([TUTTI, "gen-dataset", "--out", ds, "--samples", samples, "--samples-per-shard", 32,
             "--max-megapixels", "0.3", "--large-fraction", 0, "--text-tokens-median", 200,
             "--seed", 7, "--quiet"], timeout=300)
    assert r.returncode == 0, f"gen-dataset: {r.stdout}{r.stderr}"
    index = dir / "index.tutti"
    r = run([TUTTI, "index", "--source", ds, "--out", index], timeout=300)
    assert r.returncode == 0, f"index: {r.stdout}{r.stderr}"
    return index


def job_config(index: pathlib.Path, job_id: str, world_size: int = 4, ranks_per_node: int = 2) -> str:
    """A small job for `index`, shaped like deploy/examples/job.textproto."""
    example = (DEPLOY / "examples" / "job.textproto").read_text()
    text = re.sub(r'(?m)^index_path:.*$', f'index_path: "{index}"', example)
    text = re.sub(r'(?m)^job_id:.*$', f'job_id: "{job_id}"', text)
    text = re.sub(r'(?m)^world_size:.*$', f'world_size: {world_size}', text)
    text = re.sub(r'(?m)^ranks_per_node:.*$', f'ranks_per_node: {ranks_per_node}', text)
    return text


def shm_segments(job_id: str):
    """Batch segments in /dev/shm whose names carry `job_id`."""
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", job_id)
    return sorted(p.name for p in pathlib.Path("/dev/shm").glob(f"tutti-{safe}-*"))


class Daemon:
    """A daemon process with its output in a log file; stop() sends SIGTERM."""

    def __init__(self, name: str, argv, log: pathlib.Path, env=None, preexec_fn=None):
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log = log
        self._out = open(log, "w")
        self.proc = subprocess.Popen(self.argv, stdout=self._out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, preexec_fn=preexec_fn)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, then the exit status (SIGKILL and -9 past `timeout`)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()
        return self.proc.returncode


def read_ports(path: pathlib.Path) -> dict:
    ports = {}
    if path.exists():
        for line in path.read_text().splitlines():
            k, _, v = line.partition("=")
            ports[k] = v
    return ports


def wait_port_file(daemon: Daemon, path: pathlib.Path, timeout: float = 60.0) -> dict:
    def ready():
        if not daemon.alive():
            raise AssertionError(f"{daemon.name} exited ({daemon.proc.returncode}):\n{daemon.tail()}")
        p = read_ports(path)
        return p if "grpc" in p and "metrics" in p else None
    return wait_for(f"{daemon.name}'s port file", ready, timeout)


def mpirun_ranks(ranks: int, stagers: str, packer: str, steps: int, timeout: float = 240.0,
                 extra=()) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    return run(["mpirun", "-np", ranks, "--oversubscribe", RANK_DEMO, "--stager", stagers,
                "--packer", packer, "--steps", steps, "--connect_timeout_s", 60,
                "--batch_timeout_s", 120, "--join_timeout_s", 120, *extra],
               timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def processes_with_arg(text: str) -> set:
    """PIDs of running (not zombie) processes with an argument containing `text`."""
    pids = set()
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(text.encode() in a for a in args):
            pids.add(int(entry.name))
    return pids


class Job:
    """A one-node job on loopback: the dataset, a packer, one stager (its argv
    optionally behind `stager_prefix`, e.g. a seccomp wrapper) and ranks."""

    def __init__(self, name: str, ranks: int = 2, stager_prefix=(), stager_flags=(),
                 samples: int = 96):
        self.name = name
        self.ranks = ranks
        self.dir = temp_dir(name)
        self.job_id = f"{name}-{os.getpid()}"
        self.index = make_dataset(self.dir, samples)
        self.config = self.dir / "job.textproto"
        self.config.write_text(job_config(self.index, self.job_id, ranks, ranks))
        self.packer = Daemon("tutti-packerd", [
            PACKERD, f"--config={self.config}", "--listen=127.0.0.1:0", "--metrics=127.0.0.1:0",
            f"--port_file={self.dir}/packer.ports"], self.dir / "packer.log")
        self.stager = None
        try:
            self.packer_ports = wait_port_file(self.packer, self.dir / "packer.ports")
            self.packer_address = f"127.0.0.1:{self.packer_ports['grpc']}"
            self.socket = f"unix://{self.dir}/stager.sock"
            self.stager = Daemon("tutti-stagerd", [
                *stager_prefix, STAGERD, f"--packer={self.packer_address}", "--node=0",
                f"--source={self.dir}/dataset", f"--cache={self.dir}/cache",
                f"--listen={self.socket}", "--metrics=127.0.0.1:0",
                f"--port_file={self.dir}/stager.ports", "--memory_budget=1G", "--queue_depth=8",
                "--block_size=256K", *stager_flags], self.dir / "stager.log")
            self.stager_ports = wait_port_file(self.stager, self.dir / "stager.ports")
        except BaseException:
            # A daemon that did not come up: nothing of the job is left running.
            if self.stager is not None:
                self.stager.stop()
            self.packer.stop()
            raise

    def run_ranks(self, steps: int = 3) -> subprocess.CompletedProcess:
        return mpirun_ranks(self.ranks, self.socket, self.packer_address, steps)

    def metrics(self, which: str) -> str:
        port = (self.stager_ports if which == "stager" else self.packer_ports)["metrics"]
        status, body = http_get(int(port), "/metrics")
        assert status == 200, status
        return body

    def stop(self) -> dict:
        """Exit statuses after SIGTERM, stager first."""
        return {"stager": self.stager.stop(), "packer": self.packer.stop()}


def metric_value(text: str, name: str) -> float:
    """Sum of every sample of metric `name` in a /metrics body."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total
