"""tutti.torch against real daemons: the example trainer on 4 ranks as 2 nodes x 2
(torchrun and mpirun), gradient equivalence with post-balancing on and off, resumption
on fresh daemons, a launcher whose world size disagrees with the job. Needs
TUTTI_BUILD_DIR and PYTHONPATH=<build>/python."""
import json
import os
import re
import tempfile
import unittest

import torch

import cluster

EXAMPLE = os.path.join(cluster.EXAMPLES, "train_vlm.py")
DIGEST = os.path.join(cluster.HERE, "batch_digest.py")
# fp32, 10 SGD steps, sums reduced in different orders on different ranks: measured
# differences are ~1e-7 relative; a misplaced embedding row moves gradients by >1e-2.
RTOL, ATOL = 1e-4, 1e-6


def rows(out):
    """The example's step lines (JSON objects, decoded where each starts)."""
    decoder = json.JSONDecoder()
    return [decoder.raw_decode(out, m.start())[0] for m in re.finditer(r"\{\"step\"", out)]


def losses(out):
    return [r["loss"] for r in rows(out)]


def digests(out):
    # Ranks share the output stream: another process's text may follow a
    # digest on its line, so each is decoded where it starts and no further.
    decoder = json.JSONDecoder()
    rows = [decoder.raw_decode(out, m.end())[0] for m in re.finditer(r"DIGEST ", out)]
    return {(r["step"], r["rank"]): r for r in rows}


class ExampleTest(unittest.TestCase):
    def check_falls(self, out, rc, steps):
        self.assertEqual(rc, 0, out[-4000:])
        ls = losses(out)
        self.assertEqual(len(ls), steps, out[-4000:])
        first, last = sum(ls[:5]) / 5, sum(ls[-5:]) / 5
        print(f"loss: first 5 steps {first:.4f}, last 5 {last:.4f}")
        self.assertLess(last, first - 0.05, ls)
        # Per-source losses: every label token counted under its document's source
        # ("text", "vl" without a mixture), their weighted mean the step's loss.
        for r in rows(out):
            self.assertLessEqual(set(r["source_loss"]), {"text", "vl"}, r)
            total = sum(r["source_loss"][n] * r["source_tokens"][n] for n in r["source_loss"])
            self.assertEqual(sum(r["source_tokens"].values()), r["tokens"], r)
            self.assertAlmostEqual(total / r["tokens"], r["loss"], delta=1e-4 * r["loss"], msg=r)

    def test_torchrun_gloo_30_steps(self):
        with cluster.cluster(post=True) as c:
            rc, out = cluster.torchrun(c, EXAMPLE, ["--steps", "30"], timeout=900)
        self.check_falls(out, rc, 30)

    def test_mpirun_mpi_transport_30_steps(self):
        with cluster.cluster(post=True) as c:
            rc, out = cluster.mpirun(c, EXAMPLE, ["--steps", "30", "--transport", "mpi"], timeout=900)
        self.check_falls(out, rc, 30)


class GradientEquivalenceTest(unittest.TestCase):
    def run_job(self, post, extra=(), launcher=cluster.torchrun):
        with cluster.cluster(post=post) as c, tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "grads.pt")
            rc, out = launcher(c, EXAMPLE, ["--steps", "10", "--sgd", "--lr", "0.05",
                                            "--dump-grads", path, *extra], timeout=900)
            self.assertEqual(rc, 0, out[-4000:])
            return torch.load(path)

    @staticmethod
    def compare(a, b):
        """(worst loss difference, worst gradient excess over the tolerance) over the steps."""
        loss = max(abs(x["loss"] - y["loss"]) for x, y in zip(a, b))
        excess = max(float(((x["grad"] - y["grad"]).abs() - (ATOL + RTOL * y["grad"].abs())).max())
                     for x, y in zip(a, b))
        rel = max(float((x["grad"] - y["grad"]).abs().max() / y["grad"].abs().max())
                  for x, y in zip(a, b))
        return loss, excess, rel

    def test_post_balancing_leaves_loss_and_gradients_unchanged(self):
        off = self.run_job(False)
        on = self.run_job(True)
        self.assertEqual([x["step"] for x in on], list(range(10)))
        loss, excess, rel = self.compare(on, off)
        print(f"post-balancing on vs off, 10 steps: max |loss diff| {loss:.3g}, max grad diff / "
              f"max |grad| {rel:.3g}, tolerance rtol {RTOL} atol {ATOL}")
        self.assertLess(loss, 1e-5)
        self.assertLessEqual(excess, 0.0)
        # The negative control: two embedding rows swapped must fail the same check.
        swapped = self.run_job(True, ["--swap-rows"])
        loss_s, excess_s, rel_s = self.compare(swapped, off)
        print(f"two embedding rows swapped: max |loss diff| {loss_s:.3g}, max grad diff / max "
              f"|grad| {rel_s:.3g} -> the equivalence check fails, as it must")
        self.assertGreater(excess_s, 0.0)
        # The same exchange over tutti's MPI transport (mpirun): the same gradients as off.
        mpi = self.run_job(True, ["--transport", "mpi"], launcher=cluster.mpirun)
        self.assertEqual([x["step"] for x in mpi], list(range(10)))
        loss_m, excess_m, rel_m = self.compare(mpi, off)
        print(f"post-balancing on over the MPI transport vs off: max |loss diff| {loss_m:.3g}, "
              f"max grad diff / max |grad| {rel_m:.3g}")
        self.assertLess(loss_m, 1e-5)
        self.assertLessEqual(excess_m, 0.0)


class ResumeTest(unittest.TestCase):
    def test_resume_on_fresh_daemons_and_another_world_size(self):
        with tempfile.TemporaryDirectory() as d:
            state = os.path.join(d, "loader.pt")
            with cluster.cluster(post=True, job_id="resume") as c:
                rc, out = cluster.torchrun(c, DIGEST, ["--steps", "8"], timeout=600)
                self.assertEqual(rc, 0, out[-3000:])
                full = digests(out)
            self.assertEqual(len(full), 32)
            with cluster.cluster(post=True, job_id="resume") as c:
                rc, out = cluster.torchrun(c, DIGEST, ["--steps", "4", "--save-state", state])
                self.assertEqual(rc, 0, out[-3000:])
            with cluster.cluster(post=True, job_id="resume") as c:  # fresh daemons, empty caches
                rc, out = cluster.torchrun(c, DIGEST, ["--steps", "4", "--resume", state])
                self.assertEqual(rc, 0, out[-3000:])
                resumed = digests(out)
            self.assertEqual(sorted(resumed), [(s, r) for s in range(4, 8) for r in range(4)])
            for key, row in resumed.items():
                self.assertEqual(row["digest"], full[key]["digest"], key)
            # Two ranks (one node of two) resume the same global batches.
            with cluster.cluster(post=True, nodes=1, per_node=2, job_id="resume") as c:
                rc, out = cluster.torchrun(c, DIGEST, ["--steps", "4", "--resume", state])
                self.assertEqual(rc, 0, out[-3000:])
                small = digests(out)
            for s in range(4, 8):
                self.assertEqual(sorted(sum((small[s, r]["docs"] for r in range(2)), [])),
                                 sorted(sum((full[s, r]["docs"] for r in range(4)), [])), s)
            # Another seed draws other samples: refused, saying why.
            with cluster.cluster(post=True, seed=12, job_id="resume") as c:
                rc, out = cluster.torchrun(c, DIGEST, ["--steps", "1", "--resume", state])
            self.assertNotEqual(rc, 0)
            self.assertIn("cannot resume: the checkpoint's steps drew their samples differently "
                          "(seed: checkpoint 11, this job 12)", out)


class LauncherTest(unittest.TestCase):
    def test_torchrun_world_size_disagreeing_with_the_job(self):
        with cluster.cluster(post=True) as c:
            c.nodes, c.per_node = 1, 3  # torchrun starts 3 ranks for a 4-rank job
            # torchrun stops the other ranks once it sees one fail; polled every 20 s, it
            # lets every rank (each failing at once, at its own pace on a loaded machine)
            # say why first.
            rc, out = cluster.torchrun(c, DIGEST, ["--steps", "1"], timeout=300,
                                       launcher_args=["--monitor_interval", "20"])
        self.assertNotEqual(rc, 0)
        self.assertEqual(out.count("world size mismatch: this client runs with 3 ranks but job"), 3,
                         out[-3000:])


if __name__ == "__main__":
    unittest.main()
