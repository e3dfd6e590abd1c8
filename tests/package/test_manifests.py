"""The Kubernetes manifests (packaging/kubernetes/) validate against the
schemas of Kubernetes 1.37 (kubernetes-validate carries them; pinned in
requirements.txt), strictly (an unknown field fails), and the cluster's
peers, probes and disruption budget fit together."""

import glob
import os
import re
import subprocess
import sys

from helpers import ROOT

MANIFESTS = sorted(glob.glob(os.path.join(ROOT, "packaging", "kubernetes", "*.yaml")))
VALIDATE = os.path.join(os.path.dirname(sys.executable), "kubernetes-validate")
KUBERNETES = "1.37.0"


def validate(*paths):
    p = subprocess.run([VALIDATE, "-k", KUBERNETES, "--strict", *paths], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def test_manifests_validate_against_the_kubernetes_schemas(tmp_path):
    assert len(MANIFESTS) >= 3, MANIFESTS
    rc, out = validate(*MANIFESTS)
    assert rc == 0, out
    assert out.count("passed") >= 6, out
    # The validator sees a mistake.
    bad = tmp_path / "bad.yaml"
    with open(os.path.join(ROOT, "packaging", "kubernetes", "cluster.yaml")) as f:
        bad.write_text(f.read().replace("minAvailable:", "minAvailabel:"))
    rc, out = validate(str(bad))
    assert rc != 0 and "minAvailabel" in out, out


def test_the_cluster_names_every_member_by_its_stable_dns_name():
    import yaml  # kubernetes-validate's dependency

    with open(os.path.join(ROOT, "packaging", "kubernetes", "cluster.yaml")) as f:
        docs = {d["kind"]: d for d in yaml.safe_load_all(f)}
    sts, svc, pdb = docs["StatefulSet"], docs["Service"], docs["PodDisruptionBudget"]
    replicas = sts["spec"]["replicas"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"]
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
    assert pdb["spec"]["minAvailable"] == replicas // 2 + 1
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    container = sts["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    name, service = sts["metadata"]["name"], svc["metadata"]["name"]
    wanted = [
        f"{name}-{i}@{name}-{i}.{service}.$(POD_NAMESPACE).svc:25672" for i in range(replicas)
    ]
    assert env["BERTH_CLUSTER_PEERS"].split(",") == wanted
    assert env["BERTH_CLUSTER_NODE_ID"] == "$(POD_NAME)"
    # A follower must stay ready (rolling restarts wait for readiness).
    assert container["readinessProbe"]["exec"]["command"] == ["/usr/bin/berth", "health", "--ready"]
    assert re.fullmatch(r"\d+", env["BERTH_LIMITS_MEMORY_HIGH_WATERMARK_BYTES"])
