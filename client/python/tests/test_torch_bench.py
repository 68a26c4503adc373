"""`tutti bench torch` end to end on a tiny plan: every exchange case runs at each world
size --runs times in fresh processes and reports each run with all its columns, tutti's
messages per pair among them (not a timing test: only that the benchmark runs and says what
it measured)."""
import json
import os
import subprocess
import unittest


class BenchTest(unittest.TestCase):
    def test_every_run_of_every_exchange_case_is_reported(self):
        tool = os.path.join(os.environ["TUTTI_BUILD_DIR"], "tools", "tutti")
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        p = subprocess.run([tool, "bench", "torch", "--cases", "exchange_gloo,exchange_mpi",
                            "--ranks", "2,3", "--images", "3", "--hidden", "32", "--repeats", "1",
                            "--runs", "2", "--json"],
                           capture_output=True, text=True, timeout=240, env=env)
        self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr[-2000:])
        got = json.loads(p.stdout.strip().splitlines()[-1])
        self.assertEqual([(c["case"], c.get("ranks"), c.get("run")) for c in got["cases"]],
                         [(case, ranks, run) for case in ("exchange_gloo", "exchange_mpi")
                          for ranks in (2, 3) for run in (1, 2)], got)
        for c in got["cases"]:
            for key in ("tutti_ms", "bare_ms", "tutti_vs_bare_throughput"):
                self.assertGreater(c[key], 0, (key, c))
            self.assertEqual(c["messages_per_pair"], 1.0, c)  # one message per pair, counted
            self.assertEqual(len(c["load_average"]), 3)


if __name__ == "__main__":
    unittest.main()
