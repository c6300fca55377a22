#!/usr/bin/env python3
"""Checks Keel's dashboards and alert rules against a live Prometheus.

usage: check.py PROMETHEUS_URL DEPLOY_DIR RUN_ID
- Every dashboard JSON parses; every panel and target uses the provisioned
  datasource (uid keel-prometheus, type prometheus), as do the annotations.
- Every PromQL expression of the dashboards (with $sweep -> .*, $run -> RUN_ID)
  is evaluated through /api/v1/query and must return data.
- Every alert rule's expression must evaluate (status success), and every
  metric it names must return data on its own (an alert expression returns data
  only while it fires).
Exits 0 when all checks pass; prints one line per check.
"""
import json
import re
import sys
import urllib.parse
import urllib.request

url, deploy, run = sys.argv[1], sys.argv[2], sys.argv[3]
failures = 0


def query(expr):
    with urllib.request.urlopen(url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})) as r:
        return json.loads(r.read().decode())


def check(ok, what):
    global failures
    print(("ok    " if ok else "FAIL  ") + what)
    failures += 0 if ok else 1


DS = {"type": "prometheus", "uid": "keel-prometheus"}
provisioned = open(deploy + "/grafana/provisioning/datasources/keel.yml").read()
check("uid: keel-prometheus" in provisioned and "type: prometheus" in provisioned, "provisioned datasource keel-prometheus")
exprs = []
for name in ("sweep-overview", "run-stability", "fleet", "outliers"):
    d = json.load(open("%s/grafana/dashboards/%s.json" % (deploy, name)))
    for p in d["panels"]:
        check(p.get("datasource") == DS, "%s: panel '%s' datasource" % (name, p["title"]))
        for t in p["targets"]:
            check(t.get("datasource") == DS, "%s: panel '%s' target %s datasource" % (name, p["title"], t["refId"]))
            exprs.append((name + ": " + p["title"], t["expr"]))
    for a in d.get("annotations", {}).get("list", []):
        check(a.get("datasource") == DS, "%s: annotation '%s' datasource" % (name, a["name"]))
        exprs.append((name + ": annotation " + a["name"], a["expr"]))
    for v in d.get("templating", {}).get("list", []):
        check(v.get("datasource") == DS, "%s: variable %s datasource" % (name, v["name"]))

for where, expr in exprs:
    e = expr.replace("$sweep", ".*").replace("$run", run)
    if "changes(" in e and "> 0" in e:
        e = e.replace("[1m]) > 0", "[1h]) >= 0")  # annotation: any change marker within the test's window
    r = query(e)
    check(r["status"] == "success" and len(r["data"]["result"]) > 0, "%s returns data: %s" % (where, e))

# The Fleet panel "comm overlapped %" (its own query): a share, for the two-rank run.
fleet = json.load(open("%s/grafana/dashboards/fleet.json" % deploy))
overlap = [t["expr"] for p in fleet["panels"] if "comm overlapped" in p["title"] for t in p["targets"]]
check(len(overlap) == 1, "fleet: one 'comm overlapped' query")
r = query(overlap[0]) if overlap else {"status": "none"}
shares = [float(s["value"][1]) for s in r["data"]["result"]] if r["status"] == "success" else []
check(len(shares) > 0 and all(0 <= v <= 1 for v in shares), "comm overlapped share in [0, 1]: %s" % shares)

rules = open(deploy + "/prometheus/alerts.yml").read()
for name, expr in re.findall(r"- alert: (\w+)\n(?:\s+#.*\n)*\s+expr: (.+)\n", rules):
    r = query(expr)
    check(r["status"] == "success", "alert %s evaluates (%d series firing now)" % (name, len(r["data"]["result"])))
    for metric in sorted(set(re.findall(r"\b(keel_[a-z_]+|up)\b", expr))):
        sel = metric + ('{job="keel-worker"}' if metric == "up" else "")
        m = query(sel)
        check(m["status"] == "success" and len(m["data"]["result"]) > 0, "alert %s: %s has data" % (name, sel))

print("%d failures" % failures)
sys.exit(1 if failures else 0)
