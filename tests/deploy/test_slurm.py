"""deploy/slurm/tutti.sbatch on a real single-node Slurm (Debian's slurm-wlm:
slurmctld and slurmd with a configuration, state directory and ports of the
test's own, AuthType=auth/none): the quick-start's job runs through sbatch
with 2 ranks on the node, exactly one stager runs there, the ranks read every
step, the daemons stop on SIGTERM, and no batch segment or run directory is left
behind; `scancel --signal=B:TERM` while training runs tears everything down at
once; the daemons' steps run without the cluster's MPI plugin. A job with the
job's locality on runs on two Slurm nodes sharing this host (two slurmd,
NodeAddr 127.0.0.1 and 127.0.0.2): the stagers fetch members from each other."""
import os
import pathlib
import random
import re
import shutil
import socket
import subprocess
import sys
import time
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import deploytest as dt  # noqa: E402

SBATCH = dt.DEPLOY / "slurm" / "tutti.sbatch"


class Slurm:
    """slurmctld + slurmd for this machine, in a directory of their own. With
    nodes > 1, that many slurmd on this host as nodes tutti0, tutti1, ... at
    NodeAddr 127.0.0.1, 127.0.0.2, ... (each with its own port and spool)."""

    def __init__(self, dir: pathlib.Path, nodes: int = 1):
        self.dir = dir
        host = socket.gethostname().split(".")[0]
        self.node = host
        self.nodes = [host] if nodes == 1 else [f"tutti{i}" for i in range(nodes)]
        self.conf = dir / "slurm.conf"
        for d in ("state", "spool", "log"):
            (dir / d).mkdir(parents=True, exist_ok=True)
        cpus = os.cpu_count() or 2
        if nodes == 1:
            node_lines = f"NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN"
            spool, pid, log = f"{dir}/spool", f"{dir}/slurmd.pid", f"{dir}/log/slurmd.log"
        else:
            node_lines = "\n".join(
                f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.{i + 1} "
                f"Port={dt.free_port()} CPUs={cpus} State=UNKNOWN"
                for i, n in enumerate(self.nodes))
            for n in self.nodes:
                (dir / "spool" / n).mkdir(exist_ok=True)
                (dir / "tmp" / n).mkdir(parents=True, exist_ok=True)
            spool, pid, log = (f"{dir}/spool/%n", f"{dir}/slurmd-%n.pid",
                               f"{dir}/log/slurmd-%n.log")
            # Each node's own TmpFS: the MPI plugin's (PMIx) client directories there are
            # named by job and step only, so two nodes on one host would collide in /tmp.
            node_lines = f"TmpFS={dir}/tmp/%n\n" + node_lines
        self.conf.write_text(f"""\
ClusterName=tuttitest
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={dt.free_port()}
SlurmdPort={dt.free_port()}
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={dir}/state
SlurmdSpoolDir={spool}
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={pid}
SlurmctldLogFile={dir}/log/slurmctld.log
SlurmdLogFile={log}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
KillWait=30
InactiveLimit=0
MailProg=/bin/true
PlugStackConfig={dir}/plugstack.conf
SlurmdParameters=config_overrides
{node_lines}
PartitionName=tutti Nodes={",".join(self.nodes)} Default=YES MaxTime=30 State=UP
""")
        (dir / "plugstack.conf").write_text("")
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.procs = []

    def start(self):
        daemons = [(["slurmctld", "-D", "-c", "-i", "-f", self.conf], "slurmctld.out")]
        for n in self.nodes:
            daemons.append((["slurmd", "-D", "-N", n, "-f", self.conf],
                            "slurmd.out" if len(self.nodes) == 1 else f"slurmd-{n}.out"))
        for argv, log in daemons:
            out = open(self.dir / "log" / log, "w")
            self.procs.append(subprocess.Popen([str(a) for a in argv], stdout=out,
                                               stderr=subprocess.STDOUT, env=self.env))
            time.sleep(0.5)

        def idle():
            for p in self.procs:
                if p.poll() is not None:
                    raise AssertionError(f"a Slurm daemon exited:\n{self.logs()}")
            r = dt.run(["sinfo", "-h", "-N", "-o", "%T"], env=self.env, timeout=20)
            return r.returncode == 0 and r.stdout.split() == ["idle"] * len(self.nodes)
        dt.wait_for("the Slurm nodes to be idle", idle, timeout=60, interval=0.5)

    def logs(self) -> str:
        out = []
        for f in sorted((self.dir / "log").iterdir()):
            out.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(out)

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class SbatchQuickstart(unittest.TestCase):
    def setUp(self):
        dt.need_tool(self, "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol")
        dt.need_binaries(self)
        if os.geteuid() != 0:
            self.skipTest("slurmd must run as root to launch job steps")

    def submit(self, name, train, nodes=1, config_extra="", samples=96, env_extra=None):
        """Submits tutti.sbatch for 2 ranks on each of `nodes` nodes with train(work dir) as
        the training command (the cluster's default MPI plugin is pmix, as on many clusters);
        returns (slurm, job id, work dir, job output path, logs dir, job_id of the config)."""
        work = dt.temp_dir(name)
        index = dt.make_dataset(work, samples)
        job_id = f"{name}-{os.getpid()}"
        config = work / "job.textproto"
        config.write_text(dt.job_config(index, job_id, world_size=2 * nodes, ranks_per_node=2)
                          + config_extra)
        home = work / "home"  # TUTTI_HOME: bin/ with the build's daemons
        (home / "bin").mkdir(parents=True)
        for b in (dt.PACKERD, dt.STAGERD):
            (home / "bin" / b.name).symlink_to(b)
        logs = work / "logs"
        slurm = Slurm(work / "slurm", nodes)
        slurm.start()
        self.addCleanup(slurm.stop)
        packer_metrics, stager_metrics = dt.free_port(), dt.free_port()
        env = dict(slurm.env, TUTTI_HOME=str(home), TUTTI_CACHE=str(work / "cache"),
                   TUTTI_CACHE_BYTES="1G", TUTTI_MEMORY_BUDGET="1G",
                   TUTTI_PACKER_PORT=str(dt.free_port()),
                   TUTTI_PACKER_METRICS=f"127.0.0.1:{packer_metrics}",
                   TUTTI_STAGER_METRICS=f"127.0.0.1:{stager_metrics}",
                   TUTTI_RUN_DIR=str(work / "run"), TUTTI_LOG_DIR=str(logs),
                   TUTTI_READY_TIMEOUT_S="120", TUTTI_STOP_TIMEOUT_S="20",
                   SLURM_MPI_TYPE="pmix", PMIX_MCA_gds="hash",
                   OMPI_MCA_btl_vader_single_copy_mechanism="none")
        env.update(env_extra or {})
        out = work / "job.out"
        r = dt.run(["sbatch", "--parsable", f"--nodes={nodes}", "--ntasks-per-node=2", "--time=10",
                    f"--output={out}", f"--chdir={work}", SBATCH, config, work / "dataset",
                    *train(work)], env=env)
        self.assertEqual(r.returncode, 0, r.stderr + slurm.logs())
        slurm_job = r.stdout.strip().split(";")[0]
        self.addCleanup(self.cancel, slurm, slurm_job)  # before Slurm stops: nothing left running
        return slurm, slurm_job, work, out, logs, job_id

    def cancel(self, slurm, slurm_job):
        dt.run(["scancel", slurm_job], env=slurm.env)
        try:
            self.wait_finished(slurm, slurm_job, 90)
        except AssertionError:
            pass

    def wait_finished(self, slurm, slurm_job, timeout):
        def finished():
            q = dt.run(["squeue", "-h", "-j", slurm_job, "-o", "%T"], env=slurm.env)
            return q.returncode == 0 and q.stdout.strip() == ""
        dt.wait_for(f"job {slurm_job} to finish", finished, timeout=timeout, interval=1)

    @staticmethod
    def detail(out, logs):
        text = out.read_text(errors="replace") if out.exists() else "(no job output)"
        return text, f"job output:\n{text[-4000:]}\n" + "\n".join(
            f"--- {f.name}\n{f.read_text(errors='replace')[-1500:]}" for f in sorted(logs.glob("*")))

    def test_two_ranks_one_stager_no_segments_left(self):
        slurm, slurm_job, work, out, logs, job_id = self.submit("slurm", lambda work: [
            dt.RANK_DEMO, "--steps", "3", "--connect_timeout_s", "60", "--batch_timeout_s",
            "120", "--join_timeout_s", "120"])
        self.wait_finished(slurm, slurm_job, 300)
        text, detail = self.detail(out, logs)
        state = dt.run(["scontrol", "show", "job", slurm_job], env=slurm.env).stdout
        self.assertIn("ExitCode=0:0", state, detail + state + slurm.logs())
        # The ranks pulled every step and ran the plan's exchanges.
        self.assertRegex(text, r"3 steps x 2 ranks: .*every byte verified", detail)
        # Exactly one stager ran on the node: one task of the stager step.
        stager_logs = sorted(logs.glob(f"tutti-stagerd-{slurm_job}-*.log"))
        self.assertEqual([p.name for p in stager_logs],
                         [f"tutti-stagerd-{slurm_job}-{slurm.node}-0.log"], detail)
        self.assertEqual(len(list(logs.glob(f"tutti-packerd-{slurm_job}.log"))), 1, detail)
        # The daemons were stopped with SIGTERM and exited cleanly.
        self.assertIn("stopping tutti-stagerd", text, detail)
        self.assertNotIn("did not stop within", text, detail)
        self.assertEqual(dt.shm_segments(job_id), [], detail)
        # The stagers' run directory (their sockets) went with them.
        self.assertFalse((work / "run").exists(), detail)
        # Without the job's locality the stagers neither serve nor ask each other.
        self.assertNotIn("locality on", text, detail)
        self.assertEqual(list(logs.glob("tutti-locality-*")), [], detail)
        self.assertNotIn("peers on", stager_logs[0].read_text(errors="replace"), detail)

    def test_locality_two_nodes_stagers_fetch_from_each_other(self):
        """locality { home_replication: 1 } on two nodes: each stager gets --node (its
        SLURM_NODEID), --peer_listen at its node's NodeAddr and --peers naming both, all with
        the job's token (TUTTI_TOKEN); the ranks read every step, each stager received members
        from the other's and none fell back to the source, and no call was refused for its
        token. %n keeps the two nodes' cache, socket and metrics apart on this one host."""
        # Two metrics ports PREFIX0 and PREFIX1 (TUTTI_STAGER_METRICS=127.0.0.1:PREFIX%n).
        while True:
            prefix = random.randrange(2000, 6000)
            try:
                for n in (0, 1):
                    with socket.socket() as sock:
                        sock.bind(("127.0.0.1", prefix * 10 + n))
                break
            except OSError:
                continue
        peer_port = dt.free_port()
        token = f"slurm-peers-{os.getpid()}"
        script = (
            '"$1" --steps 6 --connect_timeout_s 60 --batch_timeout_s 120 --join_timeout_s 120; '
            'rc=$?; if [ "$SLURM_LOCALID" = 0 ]; then '
            'curl -fsS "http://127.0.0.1:$3$SLURM_NODEID/metrics" > "$2/metrics-$SLURM_NODEID.txt"; '
            'fi; exit $rc')
        slurm, slurm_job, work, out, logs, job_id = self.submit(
            "slurm-peers", lambda work: ["/bin/bash", "-c", script, "train", dt.RANK_DEMO, work,
                                         prefix],
            nodes=2, samples=128,
            config_extra="\nlocality { home_replication: 1 }\nsample_deadline_ms: 30000\n",
            # Open MPI's shared-memory transport would take the two nodes' ranks for one
            # node's (the same host) and crash: TCP on loopback between every rank.
            env_extra=dict(TUTTI_TOKEN=token, TUTTI_PEER_PORT=str(peer_port),
                           OMPI_MCA_btl="self,tcp", OMPI_MCA_btl_tcp_if_include="lo",
                           TUTTI_STAGER_METRICS=f"127.0.0.1:{prefix}%n",
                           TUTTI_CACHE=str(pathlib.Path(dt.temp_dir("slurm-peers-cache")) / "c%n"),
                           TUTTI_RUN_DIR=f"/tmp/tutti-peers-{os.getpid()}-%n"))
        self.wait_finished(slurm, slurm_job, 300)
        text, detail = self.detail(out, logs)
        state = dt.run(["scontrol", "show", "job", slurm_job], env=slurm.env).stdout
        self.assertIn("ExitCode=0:0", state, detail + state + slurm.logs())
        self.assertRegex(text, r"6 steps x 4 ranks: .*every byte verified", detail)
        peers = f"0=127.0.0.1:{peer_port},1=127.0.0.2:{peer_port}"
        self.assertIn(f"locality on (home_replication 1): stagers serve each other at {peers}",
                      text, detail)
        # The packer kept a record of node changes (TUTTI_LOCALITY_RECORD's default) that
        # names this job: `tutti plan` replays it with the job's config, and refuses it with
        # a config whose fingerprint differs.
        record = logs / f"tutti-locality-{slurm_job}.record"
        self.assertIn(f"the packer records node changes in {record}", text, detail)
        packer_log = (logs / f"tutti-packerd-{slurm_job}.log").read_text(errors="replace")
        self.assertIn(f"locality record {record}: 0 node changes", packer_log, detail)
        self.assertTrue(record.exists(), detail)
        lines = record.read_text().splitlines()
        self.assertTrue(any(re.fullmatch(r"job [0-9a-f]+", l) for l in lines), lines)
        self.assertTrue(any(re.fullmatch(r"planned_through [1-9][0-9]*", l) for l in lines),
                        lines)
        replay = dt.run([dt.TUTTI, "plan", f"--config={work / 'job.textproto'}",
                         f"--locality-record={record}", "--steps=6", "--format=hash"])
        self.assertEqual(replay.returncode, 0, replay.stdout + replay.stderr)
        self.assertEqual(len(re.findall(r"(?m)^step \d+ [0-9a-f]+$", replay.stdout)), 6,
                         replay.stdout)
        other = dt.run([dt.TUTTI, "plan", f"--config={work / 'job.textproto'}",
                        f"--locality-record={record}", "--world-size=2", "--format=hash"])
        self.assertEqual(other.returncode, 1, other.stdout + other.stderr)
        self.assertIn("the config that record was made with", other.stderr)
        # One log per node (%N is the host's name here, %t the task = the node).
        stager_logs = sorted(logs.glob(f"tutti-stagerd-{slurm_job}-*.log"),
                             key=lambda p: p.name.rsplit("-", 1)[1])
        self.assertEqual([p.name.rsplit("-", 1)[1] for p in stager_logs], ["0.log", "1.log"],
                         detail)
        for n, log in enumerate(stager_logs):
            self.assertIn(f"node {n} listening on unix:///tmp/tutti-peers-{os.getpid()}-{n}/"
                          f"stager.sock, peers on 127.0.0.{n + 1}:{peer_port}",
                          log.read_text(errors="replace"), detail)
        received = []
        for n in (0, 1):
            metrics = (work / f"metrics-{n}.txt").read_text()
            got = dt.metric_value(
                metrics, 'tutti_stager_peer_members_total{outcome="received"}')
            fallback = dt.metric_value(
                metrics, 'tutti_stager_peer_members_total{outcome="fallback"}')
            refused = dt.metric_value(
                metrics, 'tutti_rpc_refused_total{reason="unauthenticated",'
                'service="tutti.v1.Stager"}')
            received.append(got)
            self.assertEqual(fallback, 0, f"node {n}\n{detail}")
            self.assertEqual(refused, 0, f"node {n}\n{detail}")
        self.assertTrue(all(r > 0 for r in received),
                        f"members received per node: {received}\n{detail}")
        self.assertNotIn("did not stop within", text, detail)
        self.assertEqual(dt.shm_segments(job_id), [], detail)
        for n in (0, 1):
            self.assertFalse(pathlib.Path(f"/tmp/tutti-peers-{os.getpid()}-{n}").exists(), detail)

    def test_sigterm_to_the_batch_shell_while_training_tears_down(self):
        """`scancel --batch --signal=TERM` (what --signal=B:TERM@120 sends before the time limit)
        while the training step runs: the script stops the training step and the daemons
        at once, removes the run directory, and no daemon or rank is left. The daemons'
        steps run without the cluster's MPI plugin (--mpi=none); the training keeps it."""
        marker = f"tutti-train-{os.getpid()}"
        slurm, slurm_job, work, out, logs, job_id = self.submit("slurm-term", lambda work: [
            "/bin/bash", "-c", 'env > "$1/train-$SLURM_PROCID.env"; echo "$2 running"; '
            'trap "echo $2 got TERM; exit 143" TERM; for i in $(seq 300); do sleep 1; done',
            "train", work, marker])
        envs = [work / f"train-{r}.env" for r in (0, 1)]
        dt.wait_for("both training ranks to run", lambda: all(e.exists() for e in envs),
                    timeout=180, interval=0.5)
        stagers = [p for p in dt.processes_with_arg(str(work / "cache"))
                   if (pathlib.Path("/proc") / str(p) / "cmdline").read_bytes().split(b"\0")[0]
                   .endswith(b"/tutti-stagerd")]
        self.assertEqual(len(stagers), 1, self.detail(out, logs)[1])
        stager_env = (pathlib.Path("/proc") / str(stagers[0]) / "environ").read_bytes()
        stager_env = dict(v.split("=", 1) for v in stager_env.decode(errors="replace").split("\0")
                          if "=" in v)
        train_env = dict(line.split("=", 1) for line in envs[0].read_text().splitlines()
                         if "=" in line)
        # The training step runs with the cluster's MPI plugin (PMIx sets up each task),
        # the daemons without.
        plugin = ("PMIX_RANK", "PMIX_NAMESPACE")
        self.assertEqual([k for k in plugin if k in train_env], list(plugin), sorted(train_env))
        self.assertEqual([k for k in plugin if k in stager_env], [],
                         f"tutti-stagerd's step runs with the MPI plugin: {sorted(stager_env)}")

        # The batch shell alone, as sbatch --signal=B:TERM@120 signals it.
        r = dt.run(["scancel", "--batch", "--signal=TERM", slurm_job], env=slurm.env)
        self.assertEqual(r.returncode, 0, r.stderr)
        # Before the daemons' stop timeouts could add up, not when the training step ends
        # on its own (in 5 minutes).
        self.wait_finished(slurm, slurm_job, 120)
        text, detail = self.detail(out, logs)
        self.assertIn("signalled; tearing down", text, detail)
        self.assertIn(f"{marker} got TERM", text, detail)
        self.assertIn("stopping tutti-stagerd", text, detail)
        self.assertNotIn("did not stop within", text, detail)
        state = dt.run(["scontrol", "show", "job", slurm_job], env=slurm.env).stdout
        self.assertIn("ExitCode=143:0", state, detail + state)
        dt.wait_for("the job's processes to end",
                    lambda: not dt.processes_with_arg(str(work / "cache"))
                    and not dt.processes_with_arg(marker), timeout=30)
        self.assertEqual(dt.shm_segments(job_id), [], detail)
        self.assertFalse((work / "run").exists(), detail)


if __name__ == "__main__":
    unittest.main()
