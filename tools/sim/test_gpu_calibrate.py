"""tools/gpu_calibrate.py on the CPU with its tiny shape: the code path the
GPU run takes, pairs in the format `tutti simulate --calibration` reads, and
the refusals of bad arguments."""
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "gpu_calibrate.py")
TUTTI = os.environ.get("TUTTI_CLI", "")
PAIR = re.compile(r"^(vit sdpa|vit eager|llm flash) (\d+) ([0-9.e+-]+)$")


class GpuCalibrateTest(unittest.TestCase):
    def run_script(self, *args):
        return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                              timeout=240)

    def test_tiny_shape_on_the_cpu_writes_pairs_the_simulator_reads(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "pairs.txt")
            r = self.run_script("--tiny", "--device", "cpu", "--repeats", "2", "--out", out)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(out) as f:
                lines = f.read().splitlines()
            self.assertTrue(lines[0].startswith("# tutti gpu_calibrate 20"), lines[0])
            self.assertIn("# device cpu", lines[1])
            kinds = {}
            for line in lines:
                if line.startswith("#"):
                    continue
                m = PAIR.match(line)
                self.assertIsNotNone(m, line)
                self.assertGreater(float(m.group(3)), 0, line)
                kinds.setdefault(m.group(1), []).append(int(m.group(2)))
            for kind in ("vit sdpa", "vit eager", "llm flash"):
                self.assertEqual(kinds.get(kind), [32, 64, 128, 256, 512], kind)
            if not TUTTI:
                self.skipTest("TUTTI_CLI not set: the simulator's reading is not checked")
            # The simulator reads every line; CPU timings of a tiny shape may
            # be too noisy for its fit, which then refuses naming the phase
            # (never a line it cannot read).
            s = subprocess.run([TUTTI, "simulate", "--ladder", "--world-sizes=8", "--steps=1",
                                "--rungs=tutti", "--sync=allreduce", "--stages=1003520",
                                "--samples=20000", "--calibration=" + out],
                               capture_output=True, text=True, timeout=120)
            if s.returncode != 0:
                self.assertIn("calibration: the", s.stderr)
                self.assertNotIn(" line ", s.stderr)
            else:
                self.assertIn("tutti ", s.stdout)

    def test_a_time_budget_skips_what_is_left_and_says_so(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "pairs.txt")
            r = self.run_script("--tiny", "--device", "cpu", "--repeats", "1", "--budget-s",
                                "0.000001", "--out", out)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(out) as f:
                text = f.read()
            self.assertIn("# llm flash 512: skipped, past the time budget", text)

    def test_bad_arguments_are_refused(self):
        r = self.run_script("--tiny", "--device", "cpu", "--blocks", "0")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--blocks", r.stderr)
        r = self.run_script("--model", "gpt-5")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("gpt-5", r.stderr)


if __name__ == "__main__":
    unittest.main()
