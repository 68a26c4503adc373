"""deploy/prometheus with promtool: the rules and the scrape config check,
the unit tests pass, every alert has a test that sees it fire and one that
sees it quiet, and each of those tests fails when the rule is broken (never
firing, or firing on anything). TuttiDaemonDown fires for the job labels the
Prometheus Operator derives from deploy/k8s's monitors."""
import copy
import pathlib
import subprocess
import sys
import unittest

import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import deploytest as dt  # noqa: E402

PROM = dt.DEPLOY / "prometheus"
ALERTS = PROM / "alerts.yml"
TESTS = PROM / "tests" / "alerts_test.yml"


def promtool(*args, cwd=None):
    return dt.run(["promtool", *args], cwd=cwd)


class Rules(unittest.TestCase):
    def setUp(self):
        dt.need_tool(self, "promtool")

    def test_rules_and_config_check(self):
        r = promtool("check", "rules", ALERTS)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        r = promtool("check", "config", PROM / "prometheus.yml")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_prometheusrule_groups_check(self):
        rule = yaml.safe_load((dt.DEPLOY / "k8s/overlays/monitoring/prometheusrule.yaml").read_text())
        tmp = dt.temp_dir("promrule")
        (tmp / "rules.yml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
        r = promtool("check", "rules", tmp / "rules.yml")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_unit_tests_pass(self):
        r = promtool("test", "rules", TESTS)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def _alerts(self):
        groups = yaml.safe_load(ALERTS.read_text())["groups"]
        return [r["alert"] for g in groups for r in g["rules"] if "alert" in r]

    def _split(self, alert, firing):
        """The unit tests that expect `alert` to fire (or to stay quiet) only."""
        doc = yaml.safe_load(TESTS.read_text())
        kept = []
        for t in doc["tests"]:
            cases = [c for c in t.get("alert_rule_test", []) if c["alertname"] == alert
                     and bool(c["exp_alerts"]) == firing]
            if cases:
                kept.append(dict(t, alert_rule_test=cases))
        return dict(doc, tests=kept)

    def _mutated_run(self, alert, tests, mutate):
        tmp = dt.temp_dir("mutant")
        rules = yaml.safe_load(ALERTS.read_text())
        for g in rules["groups"]:
            for r in g["rules"]:
                if r.get("alert") == alert:
                    mutate(r)
        (tmp / "alerts.yml").write_text(yaml.safe_dump(rules))
        tests = dict(tests, rule_files=["alerts.yml"])
        (tmp / "t.yml").write_text(yaml.safe_dump(tests))
        return promtool("test", "rules", "t.yml", cwd=tmp)

    def test_every_alert_is_seen_firing_and_quiet(self):
        alerts = self._alerts()
        self.assertGreaterEqual(len(alerts), 13)
        for alert in alerts:
            with self.subTest(alert=alert):
                firing, quiet = self._split(alert, True), self._split(alert, False)
                self.assertTrue(firing["tests"], f"no test sees {alert} fire")
                self.assertTrue(quiet["tests"], f"no test sees {alert} quiet")
                # Unchanged, both halves pass.
                for t in (firing, quiet):
                    r = self._mutated_run(alert, t, lambda rule: None)
                    self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                # A rule that never fires fails the firing half ...
                r = self._mutated_run(alert, firing,
                                      lambda rule: rule.update(expr="vector(1) < 0"))
                self.assertNotEqual(r.returncode, 0, f"{alert}: firing tests pass without the rule")
                # ... and one that always fires fails the quiet half.
                def always(rule):
                    rule["expr"] = "vector(1)"
                    rule.pop("for", None)
                r = self._mutated_run(alert, quiet, always)
                self.assertNotEqual(r.returncode, 0, f"{alert}: quiet tests pass when it always fires")


class OperatorJobLabels(unittest.TestCase):
    """The job label the Prometheus Operator gives the daemons' targets is the
    one TuttiDaemonDown and the absent() rules select on."""

    def setUp(self):
        dt.need_tool(self, "promtool", "kubectl")

    def test_daemon_down_fires_for_the_monitors_job_labels(self):
        r = dt.run(["kubectl", "kustomize", dt.DEPLOY / "k8s/overlays/monitoring"])
        self.assertEqual(r.returncode, 0, r.stderr)
        objs = [o for o in yaml.safe_load_all(r.stdout) if o]
        series, expected = [], []
        for m in (o for o in objs if o["kind"] in ("ServiceMonitor", "PodMonitor")):
            sel = m["spec"]["selector"]["matchLabels"]
            if m["kind"] == "ServiceMonitor":
                labels = next(o["metadata"]["labels"] for o in objs if o["kind"] == "Service" and
                              all(o["metadata"]["labels"].get(k) == v for k, v in sel.items()))
            else:
                labels = next(o["spec"]["template"]["metadata"]["labels"] for o in objs
                              if o["kind"] == "DaemonSet" and all(
                                  o["spec"]["template"]["metadata"]["labels"].get(k) == v
                                  for k, v in sel.items()))
            # What the operator writes: the jobLabel's value, or without one
            # "<namespace>/<monitor>".
            job = labels[m["spec"]["jobLabel"]] if m["spec"].get("jobLabel") else \
                f"{m['metadata']['namespace']}/{m['metadata']['name']}"
            series.append({"series": f'up{{job="{job}", instance="10.0.0.1:9000"}}',
                           "values": "0x10"})
            expected.append({"exp_labels": {"severity": "critical", "job": job,
                                            "instance": "10.0.0.1:9000"}})
        rules = yaml.safe_load(ALERTS.read_text())
        rule = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "TuttiDaemonDown")
        tmp = dt.temp_dir("joblabel")
        # Annotations are another test's business: compare labels only.
        rule.pop("annotations", None)
        (tmp / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [rule]}]}))
        (tmp / "t.yml").write_text(yaml.safe_dump({
            "rule_files": ["rules.yml"], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": [
                {"eval_time": "5m", "alertname": "TuttiDaemonDown", "exp_alerts": expected}]}]}))
        r = promtool("test", "rules", "t.yml", cwd=tmp)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)


if __name__ == "__main__":
    unittest.main()
