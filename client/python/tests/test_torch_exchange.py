"""The torch.distributed exchange between real ranks (torchrun, gloo) and the MPI
transport (mpirun) on random plans, every value checked forward and backward; and
bad input, which fails every rank alike within a bounded time."""
import os
import re
import subprocess
import sys
import unittest

import cluster

RANKS = os.path.join(cluster.HERE, "torch_ranks.py")


def run(launcher, args, timeout=600):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.environ.get("PYTHONPATH", ""), cluster.HERE]),
               OMP_NUM_THREADS="1")
    with cluster.torchrun_logs() as logs:
        if launcher == "torchrun":
            maps = "0:1,1:1,2:1,3:1"
            argv = [cluster.PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", "4",
                    "--master_port", str(cluster._free_port()), "--redirects", maps, "--tee", maps,
                    "--log_dir", logs, RANKS, *args]
        else:
            argv = ["mpirun", "-np", "4", "--oversubscribe", "-x", "PYTHONPATH", "-x",
                    "OMP_NUM_THREADS", cluster.PYTHON, RANKS, *args, "--transport", "mpi"]
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout + p.stderr


class ExchangeTest(unittest.TestCase):
    # Both random tests count the messages: one per peer and direction (torch_ranks.py).
    def test_gloo_100_random_steps(self):
        rc, out = run("torchrun", ["random", "--steps", "100"])
        self.assertEqual(rc, 0, out[-3000:])
        self.assertEqual(len(re.findall(r"OK rank \d: 100 random steps", out)), 4, out[-3000:])

    def test_mpi_transport_100_random_steps(self):
        rc, out = run("mpirun", ["random", "--steps", "100"])
        self.assertEqual(rc, 0, out[-3000:])
        self.assertEqual(len(re.findall(r"OK rank \d: 100 random steps", out)), 4, out[-3000:])

    def test_images_skipped_on_their_encoding_rank_are_masked_where_they_land(self):
        for launcher in ("torchrun", "mpirun"):
            with self.subTest(launcher=launcher):
                rc, out = run(launcher, ["skipped", "--steps", "12"])
                self.assertEqual(rc, 0, out[-3000:])
                self.assertEqual(len(re.findall(r"OK rank \d: 12 steps with skipped images", out)),
                                 4, out[-3000:])
                masked = [int(n) for n in re.findall(r"skipped images, (\d+) documents", out)]
                self.assertGreater(sum(masked), 0, out[-3000:])  # the case occurred

    def results(self, launcher, case, timeout_s=10):
        rc, out = run(launcher, ["bad", "--case", case, "--timeout", str(timeout_s)], timeout=300)
        # Ranks share mpirun's (torchrun's) output stream: another rank's line (or torchrun's
        # "[defaultN]:" prefix of it) may follow one on its line.
        rows = re.findall(r"RESULT " + case + r" (\S+) ([\d.]+)s (.*?)(?=RESULT |\[default\d+\]:|\n|$)",
                          out)
        return rc, out, rows

    def test_bad_input_fails_every_rank_alike(self):
        want = {"shape": ("InvalidArgumentError", "x has shape"),
                "dtype": ("InvalidArgumentError", "x is torch.float64 but the job plans"),
                "device": ("InvalidArgumentError", "x is on meta but the process group's backend"),
                "released": ("FailedPreconditionError", "exchange of a released batch"),
                "corrupt": ("DataLossError", "rank 1: this rank cannot lay out the exchange"),
                "skip": ("FailedPreconditionError", "rank 0 is at step 1 but rank 1 at step 2"),
                "mismatch": ("FailedPreconditionError", "into other items than rank"),
                "old": ("FailedPreconditionError", "rank 1 refused the exchange: step 1, rank 1, "
                        "forward exchange: the plan is plan_version 3 but this client's exchange "
                        "needs plan_version 4 or later")}
        for case, (cls, text) in want.items():
            with self.subTest(case=case):
                rc, out, rows = self.results("torchrun", case)
                self.assertEqual(len(rows), 4, out[-3000:])
                self.assertEqual(len({(r[0], r[2]) for r in rows}), 1, rows)  # the same everywhere
                self.assertEqual(rows[0][0], cls)
                self.assertIn(text, rows[0][2])
                self.assertTrue(all(float(r[1]) < 5 for r in rows), rows)

    def test_a_rank_that_never_arrives_is_named(self):
        # With a 20 s join timeout the roll call gives ranks that are merely
        # slow (a loaded machine) 5 s to give up too: only the absent one is named.
        rc, out, rows = self.results("torchrun", "absent", timeout_s=20)
        self.assertEqual(len(rows), 3, out[-3000:])
        for cls, seconds, msg in rows:
            self.assertEqual(cls, "DeadlineExceededError")
            self.assertIn("rank(s) 1 did not join the exchange within 20 s", msg)
            self.assertLess(float(seconds), 40)

    def test_non_contiguous_encoder_output_is_exchanged(self):
        rc, out, _ = self.results("torchrun", "noncontiguous")
        self.assertEqual(out.count("RESULT noncontiguous none"), 4, out[-3000:])

    def test_mpi_transport_bad_input(self):
        # The MPI transport posts its receives before the agreement (the outputs are
        # scratch): bad input still fails every rank with the same error and message (the
        # lowest rank's verdict), soon, and leaves nothing behind (each case's run ends
        # cleanly).
        want = {"shape": ("InvalidArgumentError", r"x has shape \[23, 16\] but"),
                "skip": ("FailedPreconditionError",
                         r"rank \d is exchanging step \d's plan but rank \d step \d's"),
                "mismatch": ("FailedPreconditionError",
                             r"(splits the|expects the) \d+ bytes (it sends to|from) rank \d "
                             r"in(to)? other items than rank"),
                "old": ("FailedPreconditionError",
                        r"rank 1 refused the exchange: step 1, rank 1, forward exchange: the plan "
                        r"is plan_version 3 but this client's exchange needs plan_version 4"),
                "released": ("FailedPreconditionError", "exchange of a released batch"),
                "corrupt": ("DataLossError", "rank 1: this rank cannot lay out the exchange")}
        for case, (cls, pattern) in want.items():
            with self.subTest(case=case):
                rc, out, rows = self.results("mpirun", case)
                self.assertEqual(rc, 0, out[-3000:])
                self.assertEqual(len(rows), 4, out[-3000:])
                self.assertEqual(len({(r[0], r[2]) for r in rows}), 1, rows)  # the same everywhere
                for r in rows:
                    self.assertEqual(r[0], cls, rows)
                    self.assertRegex(r[2], pattern, rows)
                    self.assertLess(float(r[1]), 5, rows)
        rc, out, _ = self.results("mpirun", "noncontiguous")
        self.assertEqual(out.count("RESULT noncontiguous none"), 4, out[-3000:])


if __name__ == "__main__":
    unittest.main()
