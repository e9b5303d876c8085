#!/usr/bin/env python3
"""Prometheus's configuration for the local cluster, made from the chart as rendered for it: each
PodMonitor becomes the scrape job the prometheus-operator would generate for it (pods of the
monitor's namespace matching its selector, the container port it names, its relabelings, the
`namespace`/`pod`/`container`/`endpoint`/`job` target labels the operator adds), the apiserver is
scraped as kube-prometheus-stack does, and the PrometheusRules' groups become the rule file.

  config.py CHART_YAML KUBECONFIG OUT_DIR   writes OUT_DIR/prometheus.yml and OUT_DIR/rules.yml
"""
import base64
import pathlib
import re
import sys

import yaml


def sanitize(name):
    """A Kubernetes label name as Prometheus's service discovery spells it in meta labels."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def relabeling(r):
    """A prometheus-operator RelabelConfig (camelCase) as Prometheus's relabel_config."""
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label", "regex": "regex",
            "replacement": "replacement", "action": "action", "separator": "separator",
            "modulus": "modulus"}
    out = {keys[k]: v for k, v in r.items() if k in keys}
    if "action" in out:
        out["action"] = out["action"].lower()
    return out


def pod_monitor_jobs(monitor, kubeconfig):
    meta, spec = monitor["metadata"], monitor["spec"]
    ns = meta["namespace"]
    namespaces = spec.get("namespaceSelector", {}).get("matchNames") or [ns]
    jobs = []
    for i, endpoint in enumerate(spec["podMetricsEndpoints"]):
        relabel = [{"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"],
                    "regex": "(Failed|Succeeded)"}]
        for key, value in sorted(spec["selector"].get("matchLabels", {}).items()):
            label = sanitize(key)
            relabel.append({"action": "keep",
                            "source_labels": [f"__meta_kubernetes_pod_label_{label}",
                                              f"__meta_kubernetes_pod_labelpresent_{label}"],
                            "regex": f"({re.escape(value)});true"})
        relabel.append({"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                        "regex": endpoint["port"]})
        relabel += [
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"target_label": "job", "replacement": f"{ns}/{meta['name']}"},
            {"target_label": "endpoint", "replacement": endpoint["port"]},
        ]
        relabel += [relabeling(r) for r in endpoint.get("relabelings", [])]
        job = {
            "job_name": f"podMonitor/{ns}/{meta['name']}/{i}",
            "honor_labels": bool(endpoint.get("honorLabels", False)),
            "kubernetes_sd_configs": [{"role": "pod", "kubeconfig_file": kubeconfig,
                                       "namespaces": {"names": namespaces}}],
            "metrics_path": endpoint.get("path", "/metrics"),
            "scheme": endpoint.get("scheme", "http"),
            "relabel_configs": relabel,
        }
        if "interval" in endpoint:
            job["scrape_interval"] = endpoint["interval"]
        jobs.append(job)
    return jobs


def apiserver_job(kubeconfig, out_dir):
    """The apiserver, with the admin kubeconfig's credentials written out as files."""
    config = yaml.safe_load(open(kubeconfig))
    cluster = config["clusters"][0]["cluster"]
    user = config["users"][0]["user"]
    tls = {}
    for field, key, name in (("certificate-authority-data", "ca_file", "ca.crt"),
                             ("client-certificate-data", "cert_file", "client.crt"),
                             ("client-key-data", "key_file", "client.key")):
        source = cluster if field.startswith("certificate-authority") else user
        if field in source:
            path = out_dir / name
            path.write_bytes(base64.b64decode(source[field]))
            path.chmod(0o600)
            tls[key] = str(path)
    job = {"job_name": "apiserver", "scheme": "https", "tls_config": tls,
           "static_configs": [{"targets": [re.sub(r"^https://", "", cluster["server"])],
                               "labels": {"job": "apiserver"}}]}
    if "token" in user:
        job["authorization"] = {"credentials": user["token"]}
    return job


def main():
    chart, kubeconfig, out_dir = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
    out_dir.mkdir(parents=True, exist_ok=True)
    docs = [d for d in yaml.safe_load_all(open(chart)) if d]
    monitors = [d for d in docs if d["kind"] == "PodMonitor"]
    rules = [d for d in docs if d["kind"] == "PrometheusRule"]
    if not monitors or not rules:
        sys.exit("config.py: the chart rendered no PodMonitor or PrometheusRule (prometheusRule.enabled?)")
    jobs = [job for m in monitors for job in pod_monitor_jobs(m, kubeconfig)]
    jobs.append(apiserver_job(kubeconfig, out_dir))
    config = {
        "global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
        "rule_files": [str(out_dir / "rules.yml")],
        "scrape_configs": jobs,
    }
    yaml.safe_dump(config, open(out_dir / "prometheus.yml", "w"), sort_keys=False)
    groups = [g for r in rules for g in r["spec"]["groups"]]
    yaml.safe_dump({"groups": groups}, open(out_dir / "rules.yml", "w"), sort_keys=False)


if __name__ == "__main__":
    main()
