"""A real Prometheus (Debian's) scrapes a quick-start run (tools/quickstart.sh
--keep-running: one packer, two stagers, 4 ranks) with deploy/prometheus's
job names and rules, while more ranks pull steps; then every Grafana panel's
query (the dashboard's variables set to All) returns a series with a value,
every metric an alert rule selects exists in the scrape (alerts.yml's unit
tests prove the rules fire), and every rule evaluates without error."""
import json
import math
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
import unittest
import urllib.parse

import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import deploytest as dt  # noqa: E402

DASHBOARD = dt.DEPLOY / "grafana" / "tutti-dashboard.json"
ALERTS = dt.DEPLOY / "prometheus" / "alerts.yml"
# The dashboard's variables as Grafana expands them with "All" selected.
VARIABLES = {"$job": "tutti-packerd|tutti-stagerd", "$instance": ".+", "$__rate_interval": "2m"}


def dashboard_queries():
    d = json.loads(DASHBOARD.read_text())
    for p in d["panels"]:
        for t in p.get("targets", []):
            yield p["title"], t["expr"]


def expand(expr: str) -> str:
    for k, v in sorted(VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(k, v)
    return expr


def selectors(expr: str):
    """The metric selectors (name and matchers) in a PromQL expression."""
    for m in re.finditer(r"\b((?:tutti|process)_[a-z0-9_]+|up)\b(\{[^}]*\})?", expr):
        yield m.group(1) + (m.group(2) or "")


class Scrape(unittest.TestCase):
    def setUp(self):
        dt.need_tool(self, "prometheus", "mpirun")
        dt.need_binaries(self)

    def _query(self, port, promql):
        url = "/api/v1/query?query=" + urllib.parse.quote(promql)
        status, body = dt.http_get(port, url, timeout=10)
        data = json.loads(body)
        self.assertEqual(data.get("status"), "success", f"{promql}: {body[:300]}")
        return data["data"]["result"]

    def test_every_panel_and_alert_query_returns_data(self):
        work = dt.temp_dir("scrape")
        qs = subprocess.Popen(
            [dt.SOURCE_DIR / "tools" / "quickstart.sh", "--build-dir", dt.BUILD_DIR, "--work-dir",
             work, "--samples", "96", "--max-megapixels", "0.3", "--steps", "4", "--keep-running"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
            start_new_session=True)
        self.addCleanup(lambda: qs.poll() is None and os.killpg(qs.pid, signal.SIGKILL))
        out = []
        ports = {}
        deadline = time.monotonic() + 300
        for line in qs.stdout:
            out.append(line)
            m = re.search(r"tutti-packerd on 127\.0\.0\.1:(\d+) \(metrics :(\d+)", line)
            if m:
                ports["packer"], ports["packer_metrics"] = m.groups()
            m = re.search(r"tutti-stagerd node (\d) on 127\.0\.0\.1:(\d+) \(metrics :(\d+)", line)
            if m:
                ports[f"stager{m.group(1)}"], ports[f"stager{m.group(1)}_metrics"] = m.group(2, 3)
            if line.startswith("Logs:") or time.monotonic() > deadline:
                break
        self.assertIn("stager1_metrics", ports, "".join(out))

        prom_port = dt.free_port()
        config = work / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(ALERTS)],
            "scrape_configs": [
                {"job_name": "tutti-packerd",
                 "static_configs": [{"targets": [f"127.0.0.1:{ports['packer_metrics']}"]}]},
                {"job_name": "tutti-stagerd",
                 "static_configs": [{"targets": [f"127.0.0.1:{ports['stager0_metrics']}",
                                                 f"127.0.0.1:{ports['stager1_metrics']}"]}]},
            ]}))
        prom = dt.Daemon("prometheus", [
            "prometheus", f"--config.file={config}", f"--storage.tsdb.path={work}/tsdb",
            f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"], work / "prom.log")
        self.addCleanup(prom.stop)
        dt.wait_for("three targets up", lambda: len(
            [r for r in self._query(prom_port, "up == 1")]) == 3, timeout=60)
        # More steps while Prometheus scrapes, so that rates and quantiles move.
        # They start past everything the quick-start's steps made the daemons
        # plan and stage ahead (the stagers' --stage_ahead 16 and the packer's
        # plan_window 8 beyond that), so that the packer plans them now; the
        # curriculum's first phase (steps 0-49) still holds.
        stagers = f"127.0.0.1:{ports['stager0']},127.0.0.1:{ports['stager1']}"
        r = dt.mpirun_ranks(4, stagers, f"127.0.0.1:{ports['packer']}", 6, extra=["--start_step", "40"])
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        time.sleep(4)  # a few scrapes after the last step

        missing = []
        for title, expr in dashboard_queries():
            result = self._query(prom_port, expand(expr))
            values = [float(s["value"][1]) for s in result]
            if not any(math.isfinite(v) for v in values):
                missing.append(f"panel '{title}': {expr} -> {values or 'no series'}")
        rules = yaml.safe_load(ALERTS.read_text())
        for g in rules["groups"]:
            for rule in g["rules"]:
                for sel in selectors(rule["expr"]):
                    if not self._query(prom_port, sel):
                        missing.append(f"alert {rule['alert']}: {sel} -> no series")
        self.assertEqual(missing, [], "\n".join(missing))
        status, body = dt.http_get(prom_port, "/api/v1/rules", timeout=10)
        for g in json.loads(body)["data"]["groups"]:
            for rule in g["rules"]:
                self.assertEqual(rule["health"], "ok", f"{rule['name']}: {rule.get('lastError')}")

        os.killpg(qs.pid, signal.SIGTERM)
        rest, _ = qs.communicate(timeout=60)
        self.assertEqual(qs.returncode, 0, "".join(out) + rest)
        self.assertIn("stopped the packer and both stagers cleanly", rest)


if __name__ == "__main__":
    unittest.main()
