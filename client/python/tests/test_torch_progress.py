"""tutti.torch.Loader says what it waits for while a batch is slow to come: rank 0,
resumed at a step whose plan its stager does not have while the packer is stopped
(SIGSTOP), says every interval that the batch waits for that plan, and once more when the
batch comes; rank 1 says nothing; a batch that comes quickly prints nothing. Needs
TUTTI_BUILD_DIR and PYTHONPATH=<build>/python."""
import contextlib
import io
import logging
import os
import re
import signal
import subprocess
import time
import unittest

import cluster

RANK = """
import os, sys, time
import tutti.torch
interval, go, step = float(sys.argv[1]), sys.argv[2], int(sys.argv[3])
loader = tutti.torch.Loader(transport=None, progress_interval=interval, connect_timeout=120,
                            batch_timeout=240)
if step:
    state = loader.state_dict()
    state["next_step"] = step
    loader.load_state_dict(state)
print("CONNECTED", flush=True)
while go and not os.path.exists(go):
    time.sleep(0.05)
batch = next(loader)
print("STEP", batch.step, flush=True)
loader.close()
"""

PROGRESS = re.compile(r"^tutti\.torch: rank (\d+): waiting ([\d.]+) s for the batch of step (\d+): "
                      r"(.*)$")


def start_rank(c, rank, interval, go="", step=0):
    env = c.env(0)
    env.update(TUTTI_RANK=str(rank), TUTTI_WORLD_SIZE=str(c.world))
    return subprocess.Popen([cluster.PYTHON, "-c", RANK, str(interval), go, str(step)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(test, proc, step=0, timeout=300):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    test.assertEqual(proc.returncode, 0, out + err)
    test.assertIn(f"STEP {step}", out, out + err)
    return err


class SlowBatchTest(unittest.TestCase):
    def test_rank_0_says_what_the_batch_waits_for_and_rank_1_is_quiet(self):
        step, interval, stopped = 40, 0.5, 3.0
        with cluster.cluster(post=False, nodes=1, per_node=2) as c:
            go = os.path.join(c.work, "go")
            ranks = [start_rank(c, r, interval, go, step) for r in (0, 1)]
            for r in ranks:  # both connected, resumed at the step, and waiting for `go`
                line = r.stdout.readline()
                if line.strip() != "CONNECTED":
                    r.kill()
                    self.fail(line + r.communicate()[1])
            packer = c.procs[0]
            packer.send_signal(signal.SIGSTOP)
            try:
                open(go, "w").close()
                time.sleep(stopped)
            finally:
                packer.send_signal(signal.SIGCONT)
            err0, err1 = (finish(self, r, step) for r in ranks)
        lines = [m for m in map(PROGRESS.match, err0.splitlines()) if m]
        self.assertGreaterEqual(len(lines), 2, err0)
        for m in lines:
            self.assertEqual((m.group(1), m.group(3)), ("0", str(step)), err0)
        waited = [float(m.group(2)) for m in lines]
        self.assertEqual(waited, sorted(waited), err0)
        self.assertGreaterEqual(waited[0], interval, err0)  # nothing before one interval
        # What it waits for, as the stager says it: the plan of that step.
        self.assertIn(f"the stager says: no plan for step {step} from the packer yet", err0)
        self.assertRegex(err0, rf"tutti\.torch: rank 0: the batch of step {step} came after "
                               r"\d+\.\d s")
        # Only rank 0 speaks (progress=None).
        self.assertNotIn("tutti.torch:", err1)


class QuickFirstBatchTest(unittest.TestCase):
    def test_a_batch_within_the_interval_prints_nothing(self):
        with cluster.cluster(post=False, nodes=1, per_node=1) as c:
            err = finish(self, start_rank(c, 0, 120))
        self.assertNotIn("tutti.torch:", err)


class ReporterTest(unittest.TestCase):
    """Where the lines go: the tutti.torch logger once the application set up logging,
    else stderr."""

    def setUp(self):
        from tutti.torch import _loader
        self.loader = _loader

    def test_stderr_without_logging_then_the_logger(self):
        report = self.loader._WaitProgress(0)
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            report(-1, 10.2, "tutti-packerd at p:1 is not available yet: refused")
            report(3, 20.0, "the stager says: x" * 300)
            report.over("the batch of step 3 came", 21.25)
            report.over("the batch of step 4 came", 0.01)  # nothing reported since
        self.assertEqual(stderr.getvalue().splitlines()[0],
                         "tutti.torch: rank 0: connecting for 10 s: tutti-packerd at p:1 is not "
                         "available yet: refused")
        self.assertTrue(stderr.getvalue().splitlines()[1].endswith(" ..."))
        self.assertLess(len(stderr.getvalue().splitlines()[1]), 500)
        self.assertEqual(stderr.getvalue().splitlines()[2:],
                         ["tutti.torch: rank 0: the batch of step 3 came after 21.2 s"])

        log = logging.getLogger("tutti.torch")
        records = []
        handler = logging.Handler()
        handler.emit = records.append
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                report(0, 10.0, "the stager says: no plan for step 0 from the packer yet")
        finally:
            log.removeHandler(handler)
            log.setLevel(logging.NOTSET)
        self.assertEqual(stderr.getvalue(), "")
        self.assertEqual([r.getMessage() for r in records],
                         ["rank 0: waiting 10 s for the batch of step 0: the stager says: no plan "
                          "for step 0 from the packer yet"])
        self.assertEqual(records[0].levelno, logging.INFO)


if __name__ == "__main__":
    unittest.main()
