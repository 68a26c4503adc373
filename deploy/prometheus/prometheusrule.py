#!/usr/bin/env python3
"""Writes alerts.yml's rule groups as a Prometheus Operator PrometheusRule.

  deploy/prometheus/prometheusrule.py          rewrite the PrometheusRule
  deploy/prometheus/prometheusrule.py --check  exit 1 when it differs from alerts.yml

The PrometheusRule lands in deploy/k8s/overlays/monitoring, where the
monitoring overlay picks it up; "release" is the label kube-prometheus-stack's
ruleSelector matches by default.
"""
import argparse
import pathlib
import sys

import yaml

HERE = pathlib.Path(__file__).resolve().parent
ALERTS = HERE / "alerts.yml"
OUT = HERE.parent / "k8s" / "overlays" / "monitoring" / "prometheusrule.yaml"
HEADER = ("# Generated from deploy/prometheus/alerts.yml by deploy/prometheus/prometheusrule.py;\n"
          "# edit alerts.yml and run the script again.\n")


def render() -> str:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "tutti", "labels": {"release": "kube-prometheus-stack"}},
        "spec": {"groups": groups},
    }
    return HEADER + yaml.safe_dump(rule, sort_keys=False, width=100)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="only compare; exit 1 when the PrometheusRule is out of date")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} differs from {ALERTS}; run {pathlib.Path(__file__).name}",
                  file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
