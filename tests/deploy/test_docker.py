"""deploy/docker/Dockerfile and .dockerignore, checked without a Docker
engine (there is none on the build machines): a multi-stage build on a pinned
Debian 12 base that builds through tools/setup.sh, runtime stages as a
non-root user with OCI labels and health checks on the daemons' /healthz,
every shared library the installed binaries load provided by the runtime
stage's packages, and a build context without build trees."""
import os
import pathlib
import re
import subprocess
import sys
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import deploytest as dt  # noqa: E402

DOCKERFILE = dt.DEPLOY / "docker" / "Dockerfile"
DOCKERIGNORE = dt.SOURCE_DIR / ".dockerignore"


def instructions():
    """(instruction, argument) pairs, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            yield word.upper(), rest.strip()


def stages():
    """stage name -> {"from": base, "body": [(instruction, argument), ...]}."""
    out, current, args = {}, None, {}
    for ins, arg in instructions():
        if ins == "ARG" and current is None:
            k, _, v = arg.partition("=")
            args[k] = v
        elif ins == "FROM":
            m = re.match(r"^(\S+)(?:\s+AS\s+(\S+))?$", arg, re.I)
            current = m.group(2) or f"stage{len(out)}"
            base = re.sub(r"\$\{?(\w+)\}?", lambda v: args.get(v.group(1), v.group(0)), m.group(1))
            out[current] = {"from": base, "body": []}
        elif current:
            out[current]["body"].append((ins, arg))
    return out


def effective(st, name, ins):
    """The last `ins` of stage `name`, following FROM <stage> chains."""
    while name in st:
        found = [a for i, a in st[name]["body"] if i == ins]
        if found:
            return found[-1]
        name = st[name]["from"]
    return None


def docker_ignored(path: str, patterns) -> bool:
    """Docker's .dockerignore semantics: patterns match from the context root,
    ** spans directories, a matched directory excludes what is below it, and
    the last matching pattern (a "!" one re-includes) decides."""
    def rx(p):
        out = ""
        i = 0
        while i < len(p):
            if p.startswith("**/", i):
                out += "(?:.*/)?"
                i += 3
            elif p.startswith("**", i):
                out += ".*"
                i += 2
            elif p[i] == "*":
                out += "[^/]*"
                i += 1
            elif p[i] == "?":
                out += "[^/]"
                i += 1
            else:
                out += re.escape(p[i])
                i += 1
        return re.compile(f"^{out}$")
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    ignored = False
    for p in patterns:
        neg = p.startswith("!")
        r = rx(p.lstrip("!").strip("/"))
        if any(r.match(x) for x in prefixes):
            ignored = not neg
    return ignored


class Static(unittest.TestCase):
    def test_multi_stage_on_a_pinned_debian_12(self):
        st = stages()
        self.assertTrue({"build", "runtime", "packerd", "stagerd", "tutti"} <= set(st), list(st))
        for name, s in st.items():
            if s["from"] in st:
                continue
            self.assertRegex(s["from"], r"^debian:12\.\d+(-slim)?(@sha256:[0-9a-f]{64})?$", name)
        # The last stage is the default target: every binary.
        self.assertEqual(list(st)[-1], "tutti")

    def test_build_stage_is_the_setup_script(self):
        body = " ".join(a for i, a in stages()["build"]["body"] if i == "RUN")
        self.assertIn("tools/setup.sh --no-quickstart", body)
        self.assertIn("cmake --install build --prefix /opt/tutti", body)
        # CUDA builds get the NCCL transport, and the build proves it.
        self.assertIn("libnccl-dev", body)
        self.assertIn("grep -q libnccl", body)

    def test_runtime_runs_unprivileged_with_labels_and_health_checks(self):
        st = stages()
        k8s_uid = re.search(r"runAsUser: (\d+)", (dt.DEPLOY / "k8s/base/stager.yaml").read_text())
        for target in ("packerd", "stagerd", "tutti"):
            user = effective(st, target, "USER")
            self.assertIsNotNone(user, target)
            self.assertNotIn(user.split(":")[0], ("0", "root"), target)
            self.assertEqual(user.split(":")[0], k8s_uid.group(1), "the manifests' runAsUser")
        runtime = " ".join(a for i, a in st["runtime"]["body"])
        self.assertIn("useradd --uid 10001", runtime)
        labels = " ".join(a for i, a in st["runtime"]["body"] if i == "LABEL")
        for key in ("title", "description", "version", "revision", "base.name"):
            self.assertIn(f"org.opencontainers.image.{key}=", labels)
        for target, port in (("packerd", 9470), ("stagerd", 9471)):
            body = dict(st[target]["body"])
            self.assertIn(f"http://127.0.0.1:{port}/healthz", body["HEALTHCHECK"], target)
            self.assertIn(f"--metrics=0.0.0.0:{port}", body["ENTRYPOINT"], target)
            self.assertEqual(body.get("STOPSIGNAL"), "SIGTERM")

    def test_runtime_packages_provide_every_shared_library(self):
        for tool in ("dpkg", "apt-cache", "ldd", "readelf"):
            dt.need_tool(self, tool)
        prefix = dt.temp_dir("install")
        r = dt.run(["cmake", "--install", dt.BUILD_DIR, "--prefix", prefix], timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        runtime = " ".join(a for i, a in stages()["runtime"]["body"] if i == "RUN")
        listed = re.search(r"apt-get install -y -qq --no-install-recommends (.*?)&&", runtime).group(1).split()
        r = dt.run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
                    "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances", *listed])
        self.assertEqual(r.returncode, 0, r.stderr)
        closure = set(listed) | {l.strip().split(":")[-1].strip().strip("<>") for l in r.stdout.splitlines()}
        elves = [p for p in prefix.rglob("*") if p.is_file() and p.read_bytes()[:4] == b"\x7fELF"]
        self.assertGreaterEqual(len(elves), 5)
        needed = {}  # real path of a library -> the ELF files that load it
        for elf in elves:
            for lib in re.findall(r"=> (/\S+)", dt.run(["ldd", elf]).stdout):
                real = os.path.realpath(lib)
                if not real.startswith(str(prefix)):
                    needed.setdefault(real, set()).add(elf.name)
        owners = {}
        aliases = [p.replace("/usr/lib/", "/lib/", 1) for p in needed]  # merged /usr
        for line in dt.run(["dpkg", "-S", *needed, *aliases]).stdout.splitlines():
            pkg, _, path = line.partition(": ")
            owners[path.strip()] = pkg.split(":")[0]
        missing = {}
        for real, users in needed.items():
            pkg = owners.get(real) or owners.get(real.replace("/usr/lib/", "/lib/", 1))
            if pkg is None and real.startswith("/usr/local/cuda"):
                # A CUDA toolkit outside Debian (this build found NCCL): the
                # image's WITH_CUDA=1 runtime installs NVIDIA's packages.
                name = "libnccl2" if "libnccl" in real else "cuda-cudart-"
                self.assertIn(name, runtime, real)
                continue
            self.assertIsNotNone(pkg, f"no Debian package owns {real}")
            if pkg not in closure:
                missing.setdefault(pkg, set()).update(f"{u}: {real}" for u in users)
        self.assertEqual(missing, {}, "libraries no runtime package brings")

    def test_dockerignore_keeps_build_trees_out(self):
        patterns = [l.strip() for l in DOCKERIGNORE.read_text().splitlines()
                    if l.strip() and not l.startswith("#")]
        for path in ("build/CMakeCache.txt", "build-gpu/build.ninja", ".git/HEAD",
                     "client/python/__pycache__/x.cpython-311.pyc", "tools/build/x"):
            self.assertTrue(docker_ignored(path, patterns), path)
        tracked = dt.run(["git", "-C", dt.SOURCE_DIR, "ls-files"]).stdout.split()
        if not tracked:
            self.skipTest("not a git checkout: no list of the repository's files")
        lost = [p for p in tracked if docker_ignored(p, patterns) and not p.startswith(".ci/")]
        self.assertEqual(lost, [], "repository files the build context would miss")
        for needed in ("CMakeLists.txt", "tools/setup.sh", "proto/tutti/v1/job.proto"):
            self.assertIn(needed, tracked)


class EntrypointFlags(unittest.TestCase):
    def test_entrypoint_flags_are_ones_the_daemons_accept(self):
        dt.need_binaries(self)
        st = stages()
        for target, binary in (("packerd", dt.PACKERD), ("stagerd", dt.STAGERD)):
            known = dt.help_flags(binary)
            body = dict(st[target]["body"])
            for field in ("ENTRYPOINT", "CMD"):
                for a in re.findall(r'"(--[a-z_0-9]+)', body.get(field, "")):
                    self.assertIn(a[2:], known, f"{target} {field}: {a}")


if __name__ == "__main__":
    unittest.main()
