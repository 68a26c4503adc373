"""deploy/k8s/seccomp/tutti-stagerd.json, the profile overlays/io-uring runs
the stager under, installed by libseccomp as a container runtime would: the
stager stages, decodes and serves batches under it with io_uring; and with
io_uring refused, as containerd 2 and Docker 25's default profiles refuse it,
--io_backend=auto (the base manifest's setting) falls back to pread, says so
once, and serves the same."""
import pathlib
import sys
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import deploytest as dt  # noqa: E402

PROFILE = dt.DEPLOY / "k8s" / "seccomp" / "tutti-stagerd.json"
WRAPPER = pathlib.Path(__file__).resolve().parent / "seccomp_exec.py"
IO_URING = "io_uring_setup,io_uring_enter,io_uring_register"


class Seccomp(unittest.TestCase):
    def setUp(self):
        dt.need_binaries(self)
        try:
            import seccomp  # noqa: F401
        except ImportError:
            self.fail("python3-seccomp is not installed (tools/setup.sh installs it)")

    def _serve(self, name, deny, flags):
        prefix = ["/usr/bin/python3", WRAPPER, PROFILE, *(["--deny", deny] if deny else []), "--"]
        job = dt.Job(name, stager_prefix=prefix, stager_flags=flags)
        try:
            r = job.run_ranks(steps=3)
            self.assertEqual(r.returncode, 0, f"{r.stdout[-2000:]}\n{r.stderr[-2000:]}\n"
                             f"stager log:\n{job.stager.tail()}")
            m = job.metrics("stager")
            self.assertGreater(dt.metric_value(m, "tutti_stager_staged_files_total"), 0)
            self.assertGreaterEqual(dt.metric_value(m, "tutti_stager_batches_built_total"), 6)
        finally:
            status = job.stop()
        self.assertEqual(status["stager"], 0, job.stager.tail())
        self.assertEqual(dt.shm_segments(job.job_id), [])
        return job.stager.log.read_text(errors="replace")

    def test_the_profile_allows_what_the_stager_does_with_io_uring(self):
        self._serve("seccomp-uring", None, ["--io_backend=uring"])

    def test_io_uring_refused_falls_back_to_pread(self):
        log = self._serve("seccomp-auto", IO_URING, ["--io_backend=auto"])
        lines = [l for l in log.splitlines() if "io_uring" in l and "pread" in l]
        self.assertEqual(len(lines), 1, log[-3000:])

    def test_uring_required_but_refused_fails_with_a_reason(self):
        prefix = ["/usr/bin/python3", WRAPPER, PROFILE, "--deny", IO_URING, "--"]
        # The job's daemons name its own directory in their arguments.
        before = dt.processes_with_arg("tutti-deploy-seccomp-refused-")
        with self.assertRaises(AssertionError) as e:
            dt.Job("seccomp-refused", stager_prefix=prefix, stager_flags=["--io_backend=uring"])
        self.assertIn("io_uring", str(e.exception))
        # Its packer is stopped with it, not left running.
        self.assertEqual(dt.processes_with_arg("tutti-deploy-seccomp-refused-") - before, set())


if __name__ == "__main__":
    unittest.main()
