"""deploy/kubernetes, rendered by kustomize (Debian's kubectl, `make kubectl`) and validated
offline against the Kubernetes 1.36 schemas (strict: an unknown field is an error), the first
version in which pod user namespaces (`hostUsers: false`) are stable. Then what the manifests
promise: the API's least privilege, the runner's user namespace and capabilities (the same
set the image test grants its container), the runners reachable only from the API, Secrets
for the credentials, probes, budgets."""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Iterator
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.conftest import ROOT
from tests.deploy.podman import ROOT_RUNNER_CAPS

KUBECTL = ROOT / ".venv" / "kubectl" / "usr" / "bin" / "kubectl"
SCHEMAS = "1.36.0"
Doc = dict[str, Any]


@pytest.fixture(scope="module")
def rendered() -> list[Doc]:
    assert KUBECTL.is_file(), "no kubectl: make kubectl"
    done = subprocess.run(
        [str(KUBECTL), "kustomize", str(ROOT / "deploy" / "kubernetes")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def find(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name)
    return found[0]


def containers(deployment: Doc) -> Iterator[Doc]:
    yield from deployment["spec"]["template"]["spec"]["containers"]


def env(container: Doc) -> dict[str, Doc]:
    return {e["name"]: e for e in container.get("env", [])}


def test_every_resource_validates_against_the_schemas(rendered: list[Doc]) -> None:
    kinds = sorted(d["kind"] for d in rendered)
    assert kinds == sorted(
        ["Namespace"] * 2
        + ["Deployment"] * 2
        + ["Service"] * 2
        + ["PodDisruptionBudget"] * 2
        + ["NetworkPolicy"]
    )
    for doc in rendered:
        kubernetes_validate.validate(doc, SCHEMAS, strict=True)


def test_the_validation_refuses_what_kubernetes_would(rendered: list[Doc]) -> None:
    """The validator is strict: a misspelt field or a wrong type fails."""
    runner = copy.deepcopy(find(rendered, "Deployment", "toolkiln-runner"))
    runner["spec"]["template"]["spec"]["hostUser"] = False
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(runner, SCHEMAS, strict=True)
    runner = copy.deepcopy(find(rendered, "Deployment", "toolkiln-runner"))
    runner["spec"]["template"]["spec"]["hostUsers"] = "false"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(runner, SCHEMAS, strict=True)


def test_the_image_is_set_in_one_place(rendered: list[Doc]) -> None:
    images = {c["image"] for d in rendered if d["kind"] == "Deployment" for c in containers(d)}
    assert images == {"registry.example.org/toolkiln:0.1.0"}


def test_the_api_runs_unprivileged_with_credentials_from_secrets(rendered: list[Doc]) -> None:
    api = find(rendered, "Deployment", "toolkiln-api")
    assert api["spec"]["replicas"] == 2
    pod = api["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001  # the image's user
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    assert "hostUsers" not in pod  # no capability to map: the node's default is enough
    (container,) = containers(api)
    sc = container["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert container["args"] == ["serve"]
    variables = env(container)
    for name in ("TOOLKILN_DATABASE_URL", "TOOLKILN_RUNNER_TOKEN"):
        assert "value" not in variables[name], name
        assert variables[name]["valueFrom"]["secretKeyRef"]["name"], name
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}


def test_the_runner_runs_in_a_user_namespace_with_the_jails_capabilities_only(
    rendered: list[Doc],
) -> None:
    runner = find(rendered, "Deployment", "toolkiln-runner")
    pod = runner["spec"]["template"]["spec"]
    assert pod["hostUsers"] is False
    assert pod["automountServiceAccountToken"] is False
    (container,) = containers(runner)
    assert container["args"][:2] == ["runner", "--listen"]
    sc = container["securityContext"]
    assert sc["capabilities"]["drop"] == ["ALL"]
    # The jail's capabilities as root of its namespace (the pod's, with hostUsers: false).
    assert sorted(sc["capabilities"]["add"]) == sorted(ROOT_RUNNER_CAPS)
    assert sc["readOnlyRootFilesystem"] is True
    # The image's data directory stays visible: the curated packages are there.
    mounted = {m["mountPath"] for m in container.get("volumeMounts", [])}
    assert not any(p == "/var/lib" or p.startswith("/var/lib/toolkiln") for p in mounted)
    assert {"seccompProfile", "appArmorProfile"} <= set(sc)  # chosen, with reasons in comments
    variables = env(container)
    assert "secretKeyRef" in variables["TOOLKILN_RUNNER_TOKEN"]["valueFrom"]
    for held_by_the_api_alone in ("TOOLKILN_DATABASE_URL", "TOOLKILN_LLM_API_KEY"):
        assert held_by_the_api_alone not in variables
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}


def test_the_api_finds_the_runners_through_their_headless_service(rendered: list[Doc]) -> None:
    runner = find(rendered, "Deployment", "toolkiln-runner")
    (container,) = containers(runner)
    host, port = container["args"][2].rsplit(":", 1)
    assert host == "0.0.0.0"
    service = find(rendered, "Service", "toolkiln-runner")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == runner["spec"]["selector"]["matchLabels"]
    (sport,) = service["spec"]["ports"]
    assert sport["port"] == int(port)
    (api,) = containers(find(rendered, "Deployment", "toolkiln-api"))
    meta = service["metadata"]
    wanted = f"{meta['name']}.{meta['namespace']}.svc.cluster.local:{port}"
    assert env(api)["TOOLKILN_RUNNERS"]["value"] == wanted


def test_runners_accept_only_the_api_and_reach_nothing(rendered: list[Doc]) -> None:
    runner = find(rendered, "Deployment", "toolkiln-runner")
    api = find(rendered, "Deployment", "toolkiln-api")
    policy = find(rendered, "NetworkPolicy", "toolkiln-runner")
    assert policy["metadata"]["namespace"] == runner["metadata"]["namespace"]
    spec = policy["spec"]
    assert spec["podSelector"] == {}  # every pod of the runners' namespace
    assert sorted(spec["policyTypes"]) == ["Egress", "Ingress"]
    assert spec["egress"] == []
    (rule,) = spec["ingress"]
    (peer,) = rule["from"]
    assert peer["podSelector"]["matchLabels"] == api["spec"]["selector"]["matchLabels"]
    assert peer["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": api["metadata"]["namespace"]
    }
    (container,) = containers(runner)
    assert rule["ports"] == [{"protocol": "TCP", "port": int(container["args"][2].split(":")[1])}]


def test_each_deployment_has_a_disruption_budget_and_the_api_a_service(
    rendered: list[Doc],
) -> None:
    for name in ("toolkiln-api", "toolkiln-runner"):
        deployment = find(rendered, "Deployment", name)
        budget = find(rendered, "PodDisruptionBudget", name)
        assert budget["metadata"]["namespace"] == deployment["metadata"]["namespace"]
        assert budget["spec"]["selector"] == deployment["spec"]["selector"]
    api = find(rendered, "Deployment", "toolkiln-api")
    service = find(rendered, "Service", "toolkiln")
    assert service["spec"]["selector"] == api["spec"]["selector"]["matchLabels"]


def test_pod_security_admission_is_restricted_where_the_api_runs(rendered: list[Doc]) -> None:
    api_ns = find(rendered, "Namespace", "toolkiln")["metadata"]["labels"]
    assert api_ns["pod-security.kubernetes.io/enforce"] == "restricted"
    runners_ns = find(rendered, "Namespace", "toolkiln-runners")["metadata"]["labels"]
    # Runners add capabilities, which only the privileged level admits; they live alone.
    assert runners_ns["pod-security.kubernetes.io/enforce"] == "privileged"
    spaces = {d["metadata"].get("namespace") for d in rendered if d["kind"] != "Namespace"}
    assert spaces == {"toolkiln", "toolkiln-runners"}
    in_runners = {
        (d["kind"], d["metadata"]["name"])
        for d in rendered
        if d["metadata"].get("namespace") == "toolkiln-runners"
    }
    assert in_runners == {
        ("Deployment", "toolkiln-runner"),
        ("Service", "toolkiln-runner"),
        ("NetworkPolicy", "toolkiln-runner"),
        ("PodDisruptionBudget", "toolkiln-runner"),
    }
