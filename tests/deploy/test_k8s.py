"""deploy/k8s as an operator applies it: every kustomization renders with
`kubectl kustomize` (offline), the objects validate against the Kubernetes
API types, the pieces refer to each other correctly, every container runs
unprivileged, two jobs on one node use disjoint host paths, and the
commands, flags, ports and probe paths are ones the binaries accept: the
rendered commands are run and probed."""
import copy
import os
import pathlib
import re
import subprocess
import sys
import unittest

import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import deploytest as dt  # noqa: E402
import k8s_schema  # noqa: E402

K8S = dt.DEPLOY / "k8s"
BINARIES = {"/opt/tutti/bin/tutti-packerd": dt.PACKERD, "/opt/tutti/bin/tutti-stagerd": dt.STAGERD}
STAGERD_SH = "/opt/tutti/k8s/stagerd.sh"


def kustomizations():
    """Every directory under deploy/k8s that kubectl kustomize can build."""
    out = []
    for k in sorted(K8S.rglob("kustomization.yaml")):
        doc = yaml.safe_load(k.read_text())
        if doc.get("kind", "Kustomization") == "Kustomization":
            out.append(k.parent)
    return out


_RENDERED = {}


def render(d: pathlib.Path):
    if d not in _RENDERED:
        r = dt.run(["kubectl", "kustomize", d])
        assert r.returncode == 0, f"kubectl kustomize {d.relative_to(dt.SOURCE_DIR)}:\n{r.stderr}"
        _RENDERED[d] = [o for o in yaml.safe_load_all(r.stdout) if o]
    return _RENDERED[d]


def pod_specs(objs):
    """(object, pod template metadata, pod spec) of every workload."""
    for o in objs:
        if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
            t = o["spec"]["template"]
            yield o, t.get("metadata", {}), t["spec"]
        elif o["kind"] == "Pod":
            yield o, o["metadata"], o["spec"]


def containers(spec):
    for c in spec.get("initContainers", []):
        yield c, True
    for c in spec["containers"]:
        yield c, False


def matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def quantity(q: str) -> float:
    m = re.match(r"^([0-9.]+)([a-zA-Z]*)$", str(q))
    units = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10,
             "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    return float(m.group(1)) * units[m.group(2)]


def downward_env(container, pod_meta, namespace, node="gpu-node"):
    """The container's environment as the kubelet would set it (the downward
    API's resource values from the container's own limits; spec.nodeName is
    `node`, a Secret's value names it)."""
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
            continue
        src = e["valueFrom"]
        if "fieldRef" in src:
            path = src["fieldRef"]["fieldPath"]
            assert path in ("metadata.namespace", "spec.nodeName"), src
            env[e["name"]] = namespace if path == "metadata.namespace" else node
        elif "secretKeyRef" in src:
            env[e["name"]] = f"secret:{src['secretKeyRef']['name']}/{src['secretKeyRef']['key']}"
        elif "resourceFieldRef" in src:
            ref = src["resourceFieldRef"]
            part, _, res = ref["resource"].partition(".")
            value = quantity(container["resources"][part][res])
            divisor = quantity(ref.get("divisor", "1"))
            env[e["name"]] = str(int(-(-value // divisor)))  # rounded up, as the kubelet does
    return env


def expand(s: str, env: dict) -> str:
    """Kubernetes' $(VAR) expansion in command, args and subPathExpr."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), s)


class Render(unittest.TestCase):
    def setUp(self):
        dt.need_tool(self, "kubectl")

    def test_every_kustomization_renders(self):
        dirs = kustomizations()
        names = {str(d.relative_to(K8S)) for d in dirs}
        for want in ("base", "cluster", "overlays/training-example", "overlays/monitoring",
                     "overlays/io-uring", "overlays/shared-node/job-a", "overlays/shared-node/job-b",
                     "overlays/locality"):
            self.assertIn(want, names)
        for d in dirs:
            with self.subTest(kustomization=str(d.relative_to(K8S))):
                self.assertTrue(render(d))

    def test_base_applies_alone(self):
        kinds = sorted(o["kind"] for o in render(K8S / "base"))
        self.assertEqual(kinds, ["ConfigMap", "ConfigMap", "DaemonSet", "Deployment", "Service"])
        self.assertEqual([o["kind"] for o in render(K8S / "cluster")], ["PriorityClass"])
        # The example pod and the Prometheus Operator's kinds come only with
        # their overlays.
        self.assertIn("Pod", [o["kind"] for o in render(K8S / "overlays/training-example")])
        self.assertNotIn("PodMonitor", [o["kind"] for o in render(K8S / "overlays/training-example")])

    def test_objects_validate_against_the_api_schemas(self):
        checked = set()
        for d in kustomizations():
            for o in render(d):
                where = f"{d.relative_to(K8S)}: {o['kind']}/{o['metadata']['name']}"
                if k8s_schema.kind_known(o):
                    self.assertEqual(k8s_schema.validate(o), [], where)
                    checked.add(o["kind"])
                else:
                    # Custom resources: their CRDs are not packaged in Debian;
                    # test_monitoring checks what they select and how.
                    self.assertEqual(o["apiVersion"], "monitoring.coreos.com/v1", where)
        self.assertTrue({"DaemonSet", "Deployment", "Service", "ConfigMap", "Pod",
                         "PriorityClass"} <= checked, checked)

    def test_a_job_lives_in_one_namespace(self):
        for d in kustomizations():
            if d == K8S / "cluster":
                continue
            namespaces = {o["metadata"].get("namespace") for o in render(d)
                          if o["kind"] != "PriorityClass"}
            self.assertEqual(len(namespaces), 1, f"{d.relative_to(K8S)}: {namespaces}")
            self.assertNotIn(None, namespaces, str(d.relative_to(K8S)))

    def test_the_validator_rejects_broken_objects(self):
        ds = copy.deepcopy(next(o for o in render(K8S / "base") if o["kind"] == "DaemonSet"))
        c = ds["spec"]["template"]["spec"]["containers"][0]
        c["resources"]["limits"]["cpu"] = "16 cores"
        c["ports"][0]["containerPort"] = "9471"
        c["livenessProbe"]["httpGet"]["pathh"] = "/healthz"
        del ds["spec"]["selector"]
        errors = "\n".join(k8s_schema.validate(ds))
        for want in ("limits.cpu: '16 cores' is not a quantity", "containerPort: expected an integer",
                     "pathh: unknown field", "spec.selector: required field missing"):
            self.assertIn(want, errors)

    def test_references_resolve(self):
        for d in kustomizations():
            objs = render(d)
            names = {(o["kind"], o["metadata"]["name"]) for o in objs + render(K8S / "cluster")}
            for o, meta, spec in pod_specs(objs):
                where = f"{d.relative_to(K8S)}: {o['kind']}/{o['metadata']['name']}"
                if o["kind"] != "Pod":
                    self.assertTrue(matches(o["spec"]["selector"]["matchLabels"], meta["labels"]), where)
                if "priorityClassName" in spec:
                    self.assertIn(("PriorityClass", spec["priorityClassName"]), names, where)
                volumes = {v["name"]: v for v in spec.get("volumes", [])}
                for v in volumes.values():
                    if "configMap" in v:
                        self.assertIn(("ConfigMap", v["configMap"]["name"]), names, where)
                for c, _ in containers(spec):
                    env_names = {e["name"] for e in c.get("env", [])}
                    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
                    for m in c.get("volumeMounts", []):
                        self.assertIn(m["name"], volumes, where)
                        for var in re.findall(r"\$\((\w+)\)", m.get("subPathExpr", "")):
                            self.assertIn(var, env_names, f"{where}: subPathExpr ${var}")
                    for e in c.get("env", []):
                        ref = e.get("valueFrom", {}).get("resourceFieldRef")
                        if ref:
                            self.assertEqual(ref["containerName"], c["name"], where)
                            part, _, res = ref["resource"].partition(".")
                            # Without a limit the downward API gives the node's capacity.
                            self.assertIn(res, c["resources"].get(part, {}), f"{where}: {e['name']}")
                    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                        if probe in c:
                            port = c[probe]["httpGet"]["port"]
                            self.assertIn(port, ports, f"{where}: {probe} port")
            for svc in (o for o in objs if o["kind"] == "Service"):
                pods = [(meta, spec) for _, meta, spec in pod_specs(objs)
                        if matches(svc["spec"]["selector"], meta.get("labels", {}))]
                self.assertTrue(pods, f"Service {svc['metadata']['name']} selects no pod")
                for p in svc["spec"]["ports"]:
                    self.assertTrue(any(p["targetPort"] in {cp["name"] for c in spec["containers"]
                                                            for cp in c.get("ports", [])}
                                        for _, spec in pods), p)

    def test_containers_run_unprivileged_with_requests_and_limits(self):
        for d in kustomizations():
            for o, _, spec in pod_specs(render(d)):
                pod_sc = spec.get("securityContext", {})
                self.assertIn("seccompProfile", pod_sc, o["metadata"]["name"])
                for c, init in containers(spec):
                    where = f"{d.relative_to(K8S)}: {o['metadata']['name']}/{c['name']}"
                    sc = c.get("securityContext", {})
                    self.assertIs(sc.get("allowPrivilegeEscalation"), False, where)
                    self.assertEqual(sc.get("capabilities", {}).get("drop"), ["ALL"], where)
                    res = c.get("resources", {})
                    self.assertIn("memory", res.get("requests", {}), where)
                    self.assertIn("cpu", res.get("requests", {}), where)
                    self.assertIn("memory", res.get("limits", {}), where)
                    if c["name"] == "host-dirs":
                        # The one root container: only chown/chmod of the job's
                        # host directories.
                        self.assertTrue(init, where)
                        self.assertEqual(sorted(sc["capabilities"]["add"]), ["CHOWN", "FOWNER"])
                        self.assertIs(sc.get("readOnlyRootFilesystem"), True, where)
                        continue
                    self.assertNotIn("add", sc.get("capabilities", {}), where)
                    non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
                    self.assertIs(non_root, True, where)
                    self.assertNotEqual(sc.get("runAsUser", pod_sc.get("runAsUser")), 0, where)
                    if c.get("image", "").startswith("tutti"):
                        self.assertIs(sc.get("readOnlyRootFilesystem"), True, where)

    def test_the_stager_fits_gpu_nodes(self):
        ds = next(o for o in render(K8S / "base") if o["kind"] == "DaemonSet")
        spec = ds["spec"]["template"]["spec"]
        self.assertIn({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                      spec["tolerations"])
        self.assertEqual(ds["spec"]["updateStrategy"]["type"], "RollingUpdate")
        self.assertEqual(ds["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"], 0)
        c = spec["containers"][0]
        self.assertEqual(c["resources"]["requests"], c["resources"]["limits"])  # Guaranteed QoS

    def test_locality_is_off_unless_its_overlay_is_used(self):
        """Only overlays/locality turns the job's locality on and gives the stager its node
        list, peer port and the job's token; every other kustomization is unchanged."""
        for d in kustomizations():
            objs = render(d)
            for cm in (o for o in objs if o["kind"] == "ConfigMap"
                       and "job.textproto" in o.get("data", {})):
                text = cm["data"]["job.textproto"]
                on = re.search(r"(?m)^\s*locality\s*\{[^}]*home_replication:\s*[1-9]", text)
                self.assertEqual(bool(on), d == K8S / "overlays/locality", d)
            for o, _, spec in pod_specs(objs):
                if o["metadata"]["name"] != "tutti-stagerd":
                    continue
                env = {e["name"] for c in spec["containers"] for e in c.get("env", [])}
                self.assertEqual("TUTTI_NODES_FILE" in env, d == K8S / "overlays/locality", d)

    def test_locality_overlay_gives_consistent_peer_flags(self):
        """overlays/locality: the stager's peer port is a hostPort equal to the containerPort
        and to TUTTI_PEER_PORT, the node list ConfigMap is mounted where TUTTI_NODES_FILE
        points, the stager and the packer take the job's token from the same Secret, and
        stagerd.sh (the rendered ConfigMap's) run on each listed node gives --node = its
        line, --peer_listen on the peer port and the same --peers naming every node's
        address; on a node not in the list it keeps --node=auto and names no peer."""
        objs = render(K8S / "overlays/locality")
        cms = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ConfigMap"}
        ds = next(o for o in objs if o["kind"] == "DaemonSet")
        packer = next(o for o in objs if o["kind"] == "Deployment")
        spec = ds["spec"]["template"]["spec"]
        c = next(c for c in spec["containers"] if c["name"] == "stagerd")
        env = {e["name"]: e for e in c["env"]}
        port = int(env["TUTTI_PEER_PORT"]["value"])
        peers = next(p for p in c["ports"] if p["name"] == "peers")
        self.assertEqual((peers["containerPort"], peers["hostPort"]), (port, port))
        self.assertEqual(env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName")
        token = env["TUTTI_TOKEN"]["valueFrom"]["secretKeyRef"]
        packer_env = {e["name"]: e for e in packer["spec"]["template"]["spec"]["containers"][0]["env"]}
        self.assertEqual(packer_env["TUTTI_TOKEN"]["valueFrom"]["secretKeyRef"], token)
        nodes_file = env["TUTTI_NODES_FILE"]["value"]
        mount = next(m for m in c["volumeMounts"] if m["mountPath"] == os.path.dirname(nodes_file))
        vol = next(v for v in spec["volumes"] if v["name"] == mount["name"])
        nodes_text = cms[vol["configMap"]["name"]]["data"][os.path.basename(nodes_file)]
        nodes = [line.split() for line in (l.split("#")[0] for l in nodes_text.splitlines())
                 if line.split()]
        self.assertGreaterEqual(len(nodes), 2, nodes_text)
        want_peers = ",".join(f"{i}={(n + n[:1])[1]}:{port}" for i, n in enumerate(nodes))
        script_cm = next(v["configMap"]["name"] for v in spec["volumes"] if v.get("configMap")
                         and any(m["name"] == v["name"] and m["mountPath"] == os.path.dirname(STAGERD_SH)
                                 for m in c["volumeMounts"]))
        known = dt.help_flags(dt.STAGERD) if os.access(dt.STAGERD, os.X_OK) else None
        tmp = dt.temp_dir("k8s-locality")
        (tmp / "nodes.txt").write_text(nodes_text)
        (tmp / "stagerd.sh").write_text(cms[script_cm]["data"]["stagerd.sh"])
        (tmp / "cache").mkdir()
        rec = tmp / "record.sh"
        rec.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > "$0.out"\n')
        rec.chmod(0o755)
        for i, name in [(i, n[0]) for i, n in enumerate(nodes)] + [(None, "not-a-job-node")]:
            with self.subTest(node=name):
                penv = downward_env(c, ds["spec"]["template"]["metadata"], "tutti", node=name)
                penv.update(PATH=os.environ["PATH"], TUTTI_STAGERD=str(rec),
                            TUTTI_CACHE_DIR=str(tmp / "cache"),
                            TUTTI_NODES_FILE=str(tmp / "nodes.txt"))
                r = dt.run(["/bin/sh", tmp / "stagerd.sh", *c["args"]], env=penv)
                self.assertEqual(r.returncode, 0, r.stderr)
                argv = (tmp / "record.sh.out").read_text().splitlines()
                flags = {}
                for a in argv:
                    k, _, v = a[2:].partition("=")
                    flags.setdefault(k, []).append(v)
                if i is None:
                    self.assertEqual(flags["node"], ["auto"])
                    self.assertNotIn("peers", flags)
                    self.assertNotIn("peer_listen", flags)
                    self.assertIn("not in", r.stderr)
                    continue
                self.assertEqual(flags["node"], [str(i)], argv)
                self.assertEqual(flags["peer_listen"], [f"0.0.0.0:{port}"], argv)
                self.assertEqual(flags["peers"], [want_peers], argv)
                # The stager's own entry is the address the others reach it at.
                self.assertIn(f"{i}={nodes[i][-1]}:{port}", flags["peers"][0].split(","))
                if known is not None:
                    for k in flags:
                        self.assertIn(k, known, f"tutti-stagerd has no flag --{k}")

    def test_locality_overlay_keeps_the_packer_record_on_a_volume_claim(self):
        """overlays/locality: the packer gets --locality_record in a directory mounted from a
        PersistentVolumeClaim rendered with it (an emptyDir would lose the record with the
        pod, and a rescheduled packer would plan served steps with other homes), writable by
        the packer's group; no other kustomization passes the flag."""
        for d in kustomizations():
            objs = render(d)
            for o, _, spec in pod_specs(objs):
                if o["metadata"]["name"] != "tutti-packerd":
                    continue
                c = next(c for c in spec["containers"] if c["name"] == "packerd")
                records = [a.partition("=")[2] for a in c.get("args", [])
                           if a.startswith("--locality_record=")]
                if d != K8S / "overlays/locality":
                    self.assertEqual(records, [], d)
                    continue
                self.assertEqual(len(records), 1, c.get("args"))
                record = records[0]
                mount = next(m for m in c["volumeMounts"]
                             if record.startswith(m["mountPath"].rstrip("/") + "/"))
                self.assertFalse(mount.get("readOnly", False), mount)
                vol = next(v for v in spec["volumes"] if v["name"] == mount["name"])
                self.assertNotIn("emptyDir", vol)
                claim = vol["persistentVolumeClaim"]["claimName"]
                pvcs = [p for p in objs if p["kind"] == "PersistentVolumeClaim"
                        and p["metadata"]["name"] == claim]
                self.assertEqual(len(pvcs), 1, claim)
                self.assertEqual(pvcs[0]["metadata"].get("namespace"), o["metadata"]["namespace"])
                self.assertIn("ReadWriteOnce", pvcs[0]["spec"]["accessModes"])
                self.assertEqual(spec["securityContext"]["fsGroup"],
                                 spec["securityContext"]["runAsGroup"])
                self.assertEqual(o["spec"]["replicas"], 1)
                self.assertEqual(o["spec"]["strategy"]["type"], "Recreate")
                if os.access(dt.PACKERD, os.X_OK):
                    self.assertIn("locality_record", dt.help_flags(dt.PACKERD))

    def test_two_jobs_on_one_node_share_no_host_path(self):
        seen = {}
        cache_percent = 0
        for job in ("job-a", "job-b"):
            objs = render(K8S / "overlays/shared-node" / job)
            ds = next(o for o in objs if o["kind"] == "DaemonSet")
            ns = ds["metadata"]["namespace"]
            spec = ds["spec"]["template"]["spec"]
            c = spec["containers"][0]
            env = downward_env(c, ds["spec"]["template"]["metadata"], ns)
            cache_percent += int(env["TUTTI_CACHE_PERCENT"])
            vols = {v["name"]: v for v in spec["volumes"]}
            for m in c["volumeMounts"]:
                host = vols[m["name"]].get("hostPath")
                if not host:
                    continue
                self.assertIn("subPathExpr", m, f"{job}: {m['name']} is the same for every job")
                path = os.path.join(host["path"], expand(m["subPathExpr"], env))
                self.assertNotIn(path, seen, f"{job} and {seen.get(path)} both use {path}")
                seen[path] = job
            cm = next(o for o in objs if o["kind"] == "ConfigMap" and "job.textproto" in o["data"])
            self.assertIn(f'job_id: "vlm-{job[-1]}"', cm["data"]["job.textproto"])
        self.assertLessEqual(cache_percent, 100)
        self.assertEqual(len(seen), 6)

    def test_io_uring_overlay_uses_the_shipped_profile(self):
        ds = next(o for o in render(K8S / "overlays/io-uring") if o["kind"] == "DaemonSet")
        profile = ds["spec"]["template"]["spec"]["securityContext"]["seccompProfile"]
        self.assertEqual(profile["type"], "Localhost")
        shipped = K8S / "seccomp" / pathlib.Path(profile["localhostProfile"]).name
        self.assertTrue(shipped.exists(), shipped)
        self.assertIn("--io_backend=uring", ds["spec"]["template"]["spec"]["containers"][0]["args"])


class Monitoring(unittest.TestCase):
    """What the Prometheus Operator would make of the monitors."""

    def setUp(self):
        dt.need_tool(self, "kubectl")

    def test_monitors_select_the_daemons_and_name_their_jobs(self):
        objs = render(K8S / "overlays/monitoring")
        alerts = (dt.DEPLOY / "prometheus" / "alerts.yml").read_text()
        jobs = {}
        for m in (o for o in objs if o["kind"] in ("ServiceMonitor", "PodMonitor")):
            self.assertEqual(m["metadata"]["labels"].get("release"), "kube-prometheus-stack")
            self.assertIn("jobLabel", m["spec"])
            sel = m["spec"]["selector"]["matchLabels"]
            if m["kind"] == "ServiceMonitor":
                targets = [o for o in objs if o["kind"] == "Service"
                           and matches(sel, o["metadata"]["labels"])]
                self.assertEqual(len(targets), 1, m["metadata"]["name"])
                labels = targets[0]["metadata"]["labels"]
                port_names = {p["name"] for p in targets[0]["spec"]["ports"]}
                endpoints = m["spec"]["endpoints"]
            else:
                targets = [(meta, spec) for _, meta, spec in pod_specs(objs)
                           if matches(sel, meta.get("labels", {}))]
                self.assertEqual(len(targets), 1, m["metadata"]["name"])
                labels = targets[0][0]["labels"]
                port_names = {p["name"] for c in targets[0][1]["containers"] for p in c.get("ports", [])}
                endpoints = m["spec"]["podMetricsEndpoints"]
            for e in endpoints:
                self.assertIn(e["port"], port_names)
                self.assertEqual(e.get("path", "/metrics"), "/metrics")
            # The operator's job label: the value of jobLabel on the target.
            job = labels[m["spec"]["jobLabel"]]
            jobs[m["kind"]] = job
            self.assertIn(job, alerts, f"alerts.yml never names job {job}")
        self.assertEqual(jobs, {"ServiceMonitor": "tutti-packerd", "PodMonitor": "tutti-stagerd"})

    def test_prometheusrule_carries_alerts_yml(self):
        r = dt.run([sys.executable, dt.DEPLOY / "prometheus" / "prometheusrule.py", "--check"])
        self.assertEqual(r.returncode, 0, r.stderr)
        rule = next(o for o in render(K8S / "overlays/monitoring") if o["kind"] == "PrometheusRule")
        alerts = yaml.safe_load((dt.DEPLOY / "prometheus" / "alerts.yml").read_text())
        self.assertEqual(rule["spec"]["groups"], alerts["groups"])
        self.assertEqual(rule["metadata"]["labels"].get("release"), "kube-prometheus-stack")
        self.assertEqual(rule["metadata"]["namespace"], "tutti")


class Commands(unittest.TestCase):
    """The rendered containers' commands, run with the build's binaries."""

    def setUp(self):
        dt.need_tool(self, "kubectl")
        dt.need_binaries(self)

    def _workloads(self):
        objs = render(K8S / "overlays/training-example")
        cms = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ConfigMap"}
        out = {}
        for o, meta, spec in pod_specs(objs):
            for c, init in containers(spec):
                if not init and c["image"].startswith("tutti:"):
                    out[o["metadata"]["name"]] = (o, meta, spec, c)
        return out, cms

    def _argv(self, o, meta, spec, c, cms, tmp, cache=None):
        """The binary and the flags the container would run it with (stagerd.sh's cache
        directory: `cache`, default tmp/cache)."""
        ns = o["metadata"]["namespace"]
        env = downward_env(c, meta, ns)
        cmd = [expand(a, env) for a in c["command"]]
        args = [expand(a, env) for a in c.get("args", [])]
        if cmd[-1] == STAGERD_SH:
            # Run the ConfigMap's script, with a recorder in place of the binary.
            vol = next(v for v in spec["volumes"] if v.get("configMap") and any(
                m["mountPath"] == os.path.dirname(STAGERD_SH) and m["name"] == v["name"]
                for m in c["volumeMounts"]))
            script = tmp / "stagerd.sh"
            script.write_text(cms[vol["configMap"]["name"]]["data"]["stagerd.sh"])
            rec = tmp / "record.sh"
            rec.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > "$0.out"\n')
            rec.chmod(0o755)
            cache = cache or tmp / "cache"
            cache.mkdir(exist_ok=True)
            r = dt.run(["/bin/sh", script, *args],
                       env=dict(env, PATH=os.environ["PATH"], TUTTI_STAGERD=str(rec),
                                TUTTI_CACHE_DIR=str(cache)))
            self.assertEqual(r.returncode, 0, r.stderr)
            return dt.STAGERD, (tmp / "record.sh.out").read_text().splitlines()
        self.assertIn(cmd[0], BINARIES, c["command"])
        return BINARIES[cmd[0]], cmd[1:] + args

    def test_stagerd_sh_derives_sizes_from_the_pod(self):
        work, cms = self._workloads()
        o, meta, spec, c = work["tutti-stagerd"]
        tmp = dt.temp_dir("stagerd-sh")
        binary, argv = self._argv(o, meta, spec, c, cms, tmp)
        flags = dict(a[2:].split("=", 1) for a in argv)
        limits = c["resources"]["limits"]
        self.assertEqual(flags["decode_threads"], str(int(quantity(limits["cpu"]))))
        self.assertEqual(flags["memory_budget"], f"{int(quantity(limits['memory']) / 2**20 * 75 // 100)}M")
        # The cache: a share of the space it may use (exactly: the next test), never more
        # than that share of the volume.
        st = os.statvfs(tmp / "cache")
        self.assertRegex(flags["cache_capacity"], r"^\d+M$")
        self.assertLessEqual(int(flags["cache_capacity"][:-1]),
                             st.f_blocks * st.f_frsize // 1024 // 1024 * 90 // 100)
        # Out-of-range shares are refused before the daemon starts.
        env = downward_env(c, meta, "tutti")
        r = dt.run(["/bin/sh", tmp / "stagerd.sh"],
                   env=dict(env, PATH=os.environ["PATH"], TUTTI_SHM_PERCENT="100",
                            TUTTI_STAGERD="/bin/false", TUTTI_CACHE_DIR=str(tmp)))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("TUTTI_SHM_PERCENT", r.stderr)

    def test_stagerd_sh_sizes_the_cache_from_free_space_and_what_it_holds(self):
        """On a 64 MiB volume where another job's cache holds 24 MiB and this one's 16 MiB,
        --cache_capacity is 90% of the 24 MiB free plus the 16 MiB held, not of 64 MiB."""
        work, cms = self._workloads()
        o, meta, spec, c = work["tutti-stagerd"]
        tmp = dt.temp_dir("stagerd-free")
        vol = tmp / "vol"
        vol.mkdir()
        r = dt.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", vol])
        if r.returncode != 0:
            self.skipTest(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        self.addCleanup(dt.run, ["umount", vol])
        cache, other = vol / "ns-a", vol / "ns-b"
        for d, mib in ((cache, 16), (other, 24)):
            d.mkdir()
            (d / "shard-000000.tar").write_bytes(b"\1" * (mib << 20))
        _, argv = self._argv(o, meta, spec, c, cms, tmp, cache=cache)
        flags = dict(a[2:].split("=", 1) for a in argv)
        st = os.statvfs(vol)
        free = st.f_bavail * st.f_frsize
        held = sum(p.stat().st_blocks * 512 for p in [cache, *cache.rglob("*")])
        self.assertEqual((free >> 20, held >> 20), (24, 16))
        self.assertEqual(flags["cache_capacity"], f"{(free + held) // 1024 // 1024 * 90 // 100}M")

    def test_every_flag_is_one_the_binary_accepts(self):
        work, cms = self._workloads()
        for name, (o, meta, spec, c) in work.items():
            binary, argv = self._argv(o, meta, spec, c, cms, dt.temp_dir("flags"))
            known = dt.help_flags(binary)
            self.assertTrue(known, f"{binary} --help lists no flags")
            for a in argv:
                m = re.match(r"^--([a-z0-9_]+)(=.*)?$", a)
                self.assertTrue(m, f"{name}: '{a}' is not a --flag=value argument")
                self.assertIn(m.group(1), known, f"{name}: {binary.name} has no flag --{m.group(1)}")

    def test_rendered_commands_serve_their_probes(self):
        """Runs the packer and the stager with the rendered flags (host paths
        and addresses moved into a temp dir and onto loopback ports) and asks
        each probe's path on the port the probe names."""
        work, cms = self._workloads()
        tmp = dt.temp_dir("k8s-run")
        index = dt.make_dataset(tmp)
        daemons = []
        try:
            packer_o, packer_meta, packer_spec, packer_c = work["tutti-packerd"]
            _, argv = self._argv(packer_o, packer_meta, packer_spec, packer_c, cms, tmp)
            job = tmp / "job.textproto"
            job.write_text(dt.job_config(index, "k8s-run"))
            packer_ports = {p["name"]: p["containerPort"] for p in packer_c["ports"]}
            grpc_port, metrics_port = dt.free_port(), dt.free_port()
            argv = self._rewrite(argv, {
                "config": str(job),
                "listen": self._port_moved(argv, "listen", packer_ports["grpc"], grpc_port),
                "metrics": self._port_moved(argv, "metrics", packer_ports["metrics"], metrics_port),
            })
            packer = dt.Daemon("tutti-packerd", [dt.PACKERD, *argv], tmp / "packer.log")
            daemons.append(packer)
            self._probe(packer, packer_c, {"metrics": metrics_port})

            stager_o, stager_meta, stager_spec, stager_c = work["tutti-stagerd"]
            _, argv = self._argv(stager_o, stager_meta, stager_spec, stager_c, cms, tmp)
            stager_ports = {p["name"]: p["containerPort"] for p in stager_c["ports"]}
            s_metrics = dt.free_port()
            (tmp / "cache").mkdir(exist_ok=True)
            argv = self._rewrite(argv, {
                "packer": f"127.0.0.1:{grpc_port}",
                "source": str(tmp / "dataset"),
                "cache": str(tmp / "cache"),
                "listen": f"unix://{tmp}/stager.sock",
                "metrics": self._port_moved(argv, "metrics", stager_ports["metrics"], s_metrics),
                "memory_budget": "1G",  # this machine's /dev/shm, not the pod's limit
                "socket_group": str(os.getgid()),
            })
            stager = dt.Daemon("tutti-stagerd", [dt.STAGERD, *argv], tmp / "stager.log")
            daemons.append(stager)
            self._probe(stager, stager_c, {"metrics": s_metrics})
            for d in (stager, packer):
                self.assertEqual(d.stop(), 0, f"{d.name} after SIGTERM:\n{d.tail()}")
        finally:
            for d in daemons:
                d.stop()

    @staticmethod
    def _rewrite(argv, values):
        out = []
        for a in argv:
            name = a[2:].split("=", 1)[0]
            out.append(f"--{name}={values[name]}" if name in values else a)
        return out

    def _port_moved(self, argv, flag, container_port, port):
        value = next(a.split("=", 1)[1] for a in argv if a.startswith(f"--{flag}="))
        host, _, p = value.rpartition(":")
        self.assertEqual(int(p), container_port,
                         f"--{flag}={value} is not the containerPort {container_port}")
        return f"127.0.0.1:{port}"

    def _probe(self, daemon, c, ports):
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            get = c[probe]["httpGet"]
            port = ports[get["port"]]
            status = dt.wait_for(
                f"{daemon.name} {probe} {get['path']} on :{port}",
                lambda: (daemon.alive() or self.fail(f"{daemon.name} exited:\n{daemon.tail()}"))
                and dt.http_get(port, get["path"])[0] == 200, timeout=90)
            self.assertTrue(status, f"{daemon.name} {probe}")


if __name__ == "__main__":
    unittest.main()
