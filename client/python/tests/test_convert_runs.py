"""tutti convert as runs: byte-identical shards whatever the worker count and task size,
shard limits, resumption after a SIGKILL (and a damaged last shard) giving the bytes of
an uninterrupted run, another conversion's output refused, the summary, the progress
line on a terminal, and the command through the C++ `tutti` tool, from the build tree and
installed. Needs PYTHONPATH=<build>/python and TUTTI_BUILD_DIR."""
import json
import os
import pty
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import convert_fixtures as fx
from tutti.convert import ConvertError, ConvertOptions, run
from tutti.convert.cli import parser

BUILD = os.environ.get("TUTTI_BUILD_DIR", "")
TOOL = os.path.join(BUILD, "tools", "tutti")


def dataset(root, n, seed=0):
    """n LLaVA records over a few images (0-2 each, at different turns), a FineVision
    JSON array, a WebDataset caption shard, and a few bad records."""
    rng = random.Random(seed)
    os.makedirs(os.path.join(root, "img"), exist_ok=True)
    names = []
    for i in range(6):
        name = f"img/{i}.{'jpg' if i % 2 else 'png'}"
        fx.make_image(os.path.join(root, name), 20 + 8 * i, 60 - 5 * i, "JPEG" if i % 2 else "PNG", seed=i)
        names.append(name)
    records = []
    for i in range(n):
        k = rng.choice((0, 1, 2))
        images = [rng.choice(names) for _ in range(k)]
        turns = [fx.sentence(rng, rng.randint(3, 12)) for _ in range(2 * rng.randint(1, 3))]
        at = sorted(rng.sample(range(0, len(turns), 2), min(k, len(turns) // 2)))
        if len(at) < k:
            images = images[:len(at)]
        for j in at:
            turns[j] = "<image>\n" + turns[j]
        conv = [{"from": "human" if j % 2 == 0 else "gpt", "value": t} for j, t in enumerate(turns)]
        records.append({"id": f"r{i}", "images": images, "conversations": conv})
    records[n // 3] = {"image": "img/nowhere.jpg", "conversations": [
        {"from": "human", "value": "<image>\nwhat"}, {"from": "gpt", "value": "a cat"}]}
    records[n // 2] = "{broken"
    fx.write_jsonl(os.path.join(root, "a.jsonl"), records)
    with open(os.path.join(root, "b.json"), "w") as f:
        json.dump([{"images": [names[i % 6]], "texts": [{"user": fx.sentence(rng, 5),
                                                         "assistant": fx.sentence(rng, 7)}]}
                   for i in range(max(4, n // 20))], f)
    with open(os.path.join(root, names[1]), "rb") as f:
        jpg = f.read()
    fx.write_wds(os.path.join(root, "c.tar"), [(f"k{i}", {"jpg": jpg, "txt": fx.sentence(rng, 6).encode()})
                                               for i in range(max(4, n // 20))])
    return [os.path.join(root, p) for p in ("a.jsonl", "b.json", "c.tar")]


class RunsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tutti-convert-runs-")
        cls.sp = fx.train_sentencepiece(os.path.join(cls.dir, "sp"))
        cls.inputs = dataset(os.path.join(cls.dir, "data"), 240)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    def options(self, out, **kw):
        return ConvertOptions(inputs=self.inputs, out=os.path.join(self.dir, out), tokenizer=self.sp,
                              progress="never", **kw)

    def test_same_bytes_whatever_the_workers_and_task_size(self):
        runs = {}
        for workers, task in ((1, 64), (2, 7), (3, 1)):
            report = run(self.options(f"det{workers}", workers=workers, task_records=task,
                                      shard_size=24 << 10))
            runs[workers] = fx.shard_bytes(report.out)
            self.assertGreater(len(report.shards), 3)
            self.assertGreater(report.total.samples, 200)
            self.assertEqual(set(report.total.skipped) & {"missing_image", "bad_record"},
                             {"missing_image", "bad_record"})
        self.assertEqual(runs[1], runs[2])
        self.assertEqual(runs[1], runs[3])
        again = run(self.options("det1", workers=2, shard_size=24 << 10))  # a finished run: no change
        self.assertEqual(fx.shard_bytes(again.out), runs[1])
        self.assertEqual(again.kept_shards, len(again.shards))

    def test_shard_limits(self):
        report = run(self.options("limits", samples_per_shard=25, workers=2))
        manifest, samples = fx.read_shards(report.out)
        self.assertEqual(manifest["samples"], report.total.samples)
        self.assertEqual(len(manifest["shards"]), -(-report.total.samples // 25))
        report = run(self.options("bytes", shard_size=10 << 10, workers=2))
        for name in report.shards:
            size = os.path.getsize(os.path.join(report.out, name))
            self.assertLessEqual(size, 10 << 10, name)

    def test_another_conversion_in_out_is_refused_unless_overwritten(self):
        run(self.options("other"))
        with self.assertRaisesRegex(ConvertError, "other inputs or options.*--overwrite"):
            run(self.options("other", samples_per_shard=3))
        report = run(self.options("other", samples_per_shard=3, overwrite=True))
        self.assertEqual(len(report.shards), -(-report.total.samples // 3))


def command():
    """The converter's command line: the C++ tool when built, else the module."""
    if os.path.exists(TOOL):
        return [TOOL, "convert"]
    return [sys.executable, "-m", "tutti.convert"]


class CommandTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tutti-convert-cmd-")
        cls.sp = fx.train_sentencepiece(os.path.join(cls.dir, "sp"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    def convert(self, inputs, out, *args, **kw):
        return subprocess.run(command() + ["--tokenizer", self.sp, "--out", out, *args, *inputs],
                              capture_output=True, text=True, timeout=600, **kw)

    @unittest.skipUnless(os.path.exists(TOOL), "needs TUTTI_BUILD_DIR with tools/tutti built")
    def test_help_through_the_tool_explains_every_option(self):
        r = subprocess.run([TOOL, "convert", "--help"], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        for action in parser()._actions:
            for flag in action.option_strings:
                self.assertIn(flag, r.stdout)
            self.assertTrue(action.help, action.dest)
        self.assertIn("image_count_mismatch", r.stdout)
        r = subprocess.run([TOOL, "--help"], capture_output=True, text=True, timeout=60)
        self.assertIn("convert", r.stdout)
        r = subprocess.run([TOOL, "convert", "--out", self.dir], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn("needs --tokenizer, INPUT", r.stderr)

    def test_resume_after_sigkill_gives_the_uninterrupted_bytes(self):
        inputs = dataset(os.path.join(self.dir, "big"), 4000, seed=1)
        args = ("--shard-size", "16K", "--workers", "2", "--no-progress")
        whole = os.path.join(self.dir, "whole")
        r = self.convert(inputs, whole, *args)
        self.assertEqual(r.returncode, 0, r.stderr)
        expected = fx.shard_bytes(whole)
        self.assertGreater(len(expected), 20)

        out = os.path.join(self.dir, "killed")
        p = subprocess.Popen(command() + ["--tokenizer", self.sp, "--out", out, *args, *inputs],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 300
        while not os.path.exists(os.path.join(out, "shard-000004.tar")):
            self.assertIsNone(p.poll(), "the run ended before it could be killed")
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.005)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        self.assertFalse(os.path.exists(os.path.join(out, "tutti_dataset.json")), "killed too late")
        done = sorted(n for n in os.listdir(out) if n.endswith(".tar"))
        self.assertLess(len(done), len(expected) - 1)
        # The last finished shard loses a byte: the rerun must redo it too.
        with open(os.path.join(out, done[-1]), "r+b") as f:
            f.truncate(os.path.getsize(f.name) - 1)
        r = self.convert(inputs, out, *args, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        summary = json.loads(r.stdout)
        self.assertGreater(summary["kept_shards"], 0)
        self.assertLess(summary["kept_shards"], len(done))
        self.assertEqual(fx.shard_bytes(out), expected)
        self.assertEqual([n for n in os.listdir(out) if n.endswith(".partial")], [])
        # The whole run's counts, kept shards included.
        whole_summary = json.loads(self.convert(inputs, whole, *args, "--json").stdout)
        self.assertEqual(summary["total"], whole_summary["total"])

    def test_summary_json_file_and_exit_status(self):
        data = os.path.join(self.dir, "small")
        inputs = dataset(data, 30, seed=2)
        path = os.path.join(self.dir, "summary.json")
        r = self.convert(inputs, os.path.join(self.dir, "s1"), "--json", "--summary-file", path)
        self.assertEqual(r.returncode, 0, r.stderr)
        summary = json.loads(r.stdout)
        with open(path) as f:
            self.assertEqual(json.load(f), summary)
        self.assertEqual(summary["records"], 30 + 4 + 4)
        self.assertEqual(summary["skipped"], sum(summary["total"]["skipped"].values()))
        self.assertEqual(summary["total"]["samples"] + summary["skipped"], summary["records"])
        r = self.convert(inputs, os.path.join(self.dir, "s2"), "--strict")
        self.assertEqual(r.returncode, 1)
        self.assertIn("--strict", r.stderr)
        self.assertRegex(r.stderr, r"a\.jsonl:\d+: .*\[(missing_image|image_count_mismatch|bad_record)\]")
        r = self.convert([os.path.join(data, "nothing.jsonl")], os.path.join(self.dir, "s3"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("nothing.jsonl: no such file", r.stderr)

    @unittest.skipUnless(os.path.exists(TOOL), "needs TUTTI_BUILD_DIR with tools/tutti built")
    def test_tutti_index_reads_every_sample(self):
        out = os.path.join(self.dir, "indexed")
        r = self.convert(dataset(os.path.join(self.dir, "index-data"), 60, seed=4), out,
                         "--samples-per-shard", "16", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        written = json.loads(r.stdout)["total"]
        with open(os.path.join(out, "tutti_dataset.json")) as f:
            vocab = json.load(f)["tokenizer"]["vocab_size"]
        r = subprocess.run([TOOL, "index", "--source", out, "--out", os.path.join(self.dir, "i.tutti"),
                            "--vocab-size", str(vocab)], capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        text = r.stdout + r.stderr
        self.assertRegex(text, rf"\b{written['samples']} samples\b")
        self.assertRegex(text, rf"\b{written['images']} images\b")
        self.assertNotIn("skipped", text)
        self.assertNotIn("ignored", text)

    def test_converts_where_the_compiled_extension_does_not_load(self):
        import tutti
        package = os.path.join(self.dir, "pure")
        shutil.copytree(os.path.dirname(tutti.__file__), os.path.join(package, "tutti"),
                        ignore=shutil.ignore_patterns("_tutti*", "__pycache__"))
        env = {**os.environ, "PYTHONPATH": package}
        inputs = dataset(os.path.join(self.dir, "pure-data"), 10, seed=5)
        r = subprocess.run([sys.executable, "-m", "tutti.convert", "--tokenizer", self.sp, "--out",
                            os.path.join(self.dir, "pure-out"), "--json", *inputs],
                           capture_output=True, text=True, env=env, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertGreater(json.loads(r.stdout)["total"]["samples"], 10)
        r = subprocess.run([sys.executable, "-c", "import tutti; tutti.Client"], capture_output=True,
                           text=True, env=env, timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("tutti.Client needs tutti's compiled extension, which did not load", r.stderr)

    def test_benchmark_runs(self):
        bench = ([TOOL, "bench", "convert"] if os.path.exists(TOOL)
                 else [sys.executable, "-m", "tutti.convert.bench"])
        r = subprocess.run(bench + ["--samples", "40", "--repeats", "1", "--workers", "2", "--json"],
                           capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr)
        result = json.loads(r.stdout)
        self.assertEqual(result["samples"], 40)
        self.assertEqual(sorted(result["convert"]), ["1", "2"])
        for key in ("overhead", "overhead_cpu", "tokenizer_samples_per_s"):
            self.assertGreater(result[key] + 1, 0, key)

    def test_progress_line_is_redrawn_on_a_terminal(self):
        inputs = dataset(os.path.join(self.dir, "tty"), 30, seed=3)
        master, slave = pty.openpty()
        p = subprocess.Popen(command() + ["--tokenizer", self.sp, "--out", os.path.join(self.dir, "tty-out"),
                                          *inputs], stdout=subprocess.DEVNULL, stderr=slave)
        # The slave stays open here, so what the run wrote stays readable after it exits.
        text, deadline = b"", time.monotonic() + 300
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.1)[0]:
                text += os.read(master, 65536)
            elif p.poll() is not None:
                break
        os.close(slave)
        os.close(master)
        self.assertEqual(p.wait(timeout=10), 0)
        self.assertRegex(text.decode(), r"\rconvert: 38/38 records \(100%\)")


@unittest.skipUnless(os.path.exists(TOOL), "needs TUTTI_BUILD_DIR with tools/tutti built")
class InstalledTest(unittest.TestCase):
    def test_installed_tool_converts_without_the_build_tree(self):
        with tempfile.TemporaryDirectory(prefix="tutti-convert-install-") as d:
            prefix = os.path.join(d, "prefix")
            subprocess.run(["cmake", "--install", BUILD, "--prefix", prefix], check=True,
                           stdout=subprocess.DEVNULL, timeout=600)
            sp = fx.train_sentencepiece(os.path.join(d, "sp"))
            inputs = dataset(os.path.join(d, "data"), 12)
            # No PYTHONPATH: the package can only come from the prefix (lib/python).
            env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TUTTI_PYTHON")}
            tool = os.path.join(prefix, "bin", "tutti")
            r = subprocess.run([tool, "convert", "--tokenizer", sp, "--out", os.path.join(d, "out"),
                                "--json", *inputs], capture_output=True, text=True, env=env, timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertGreater(json.loads(r.stdout)["total"]["samples"], 10)


if __name__ == "__main__":
    unittest.main()
