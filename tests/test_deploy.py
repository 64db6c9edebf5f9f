"""Deployment files: the docker-compose observability services, and the Kubernetes manifests
(rendered by ``kubectl kustomize``, validated against the Kubernetes JSON schemas with
``kubernetes-validate``, KEDA's and the Prometheus Operator's CRD types from the ``cloudcoil``
model packages, and the Kafka trigger's metadata against a schema written from KEDA's docs)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from spinf_stream.config import RunSettings
from spinf_stream.telemetry import dashboard

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "deploy" / "k8s"
OVERLAYS = ("cpu", "gpu", "keda", "routes")
#: the oldest Kubernetes minor release the manifests must be valid for
K8S_VERSION = "1.29.0"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def host_path(spec: str) -> tuple[Path, str]:
    src, dst = spec.split(":")[:2]
    return (REPO / src).resolve(), dst


# -- docker-compose: Prometheus and Grafana ----------------------------------------------------------


def test_compose_prometheus_scrapes_the_scorers_metrics_port(compose):
    prom = compose["services"]["prometheus"]
    config_src = next(host_path(v) for v in prom["volumes"] if v.endswith("prometheus.yml:ro"))
    config = yaml.safe_load(config_src[0].read_text())
    (job,) = config["scrape_configs"]
    (sd,) = job["dns_sd_configs"]
    port = int(compose["services"]["scorer"]["environment"]["SPINF_METRICS_PORT"])
    assert sd["names"] == ["scorer", "scorer-cpu", "scorer-routes"] and sd["port"] == port and job["metrics_path"] == "/metrics"


def test_compose_grafana_provisions_the_prometheus_datasource_and_the_generated_dashboard(compose):
    graf = compose["services"]["grafana"]
    mounts = dict(host_path(v) for v in graf["volumes"] if v.startswith("./"))
    provisioning = next(src for src, dst in mounts.items() if dst == "/etc/grafana/provisioning")
    (ds,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert ds["uid"] == dashboard.DATASOURCE_UID and ds["url"] == "http://prometheus:9090"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "spinf-stream.yml").read_text())["providers"]
    dashboards_dir = next(src for src, dst in mounts.items() if dst == provider["options"]["path"])
    assert (dashboards_dir / dashboard.DASHBOARD_FILE.name).resolve() == dashboard.DASHBOARD_FILE.resolve()
    json.loads(dashboard.DASHBOARD_FILE.read_text())


def test_compose_scorer_healthcheck_asks_healthz_on_the_metrics_port(compose):
    scorer = compose["services"]["scorer"]
    port = scorer["environment"]["SPINF_METRICS_PORT"]
    assert f"127.0.0.1:{port}/healthz" in " ".join(scorer["healthcheck"]["test"])
    assert "SPINF_HEALTH_FILE" not in scorer["environment"]


# -- Kubernetes -----------------------------------------------------------------------------------


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        msg = "kubectl (with its built-in kustomize) is not installed: `apt-get install kubectl`"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return path


@cache
def _render(directory: str) -> tuple[dict[str, Any], ...]:
    out = subprocess.run([kubectl(), "kustomize", directory], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def render(overlay: str) -> list[dict[str, Any]]:
    return [json.loads(json.dumps(d)) for d in _render(str(K8S / "overlays" / overlay))]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    return doc


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (c,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return c


def config(docs: list[dict[str, Any]]) -> dict[str, str]:
    return next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "spinf-stream-config")["data"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_core_resource_is_valid_against_the_kubernetes_schemas(overlay):
    docs = render(overlay)
    core = [d for d in docs if "." not in d["apiVersion"].split("/")[0]]  # v1, apps/v1: not a CRD group
    assert {d["kind"] for d in core} == {"ConfigMap", "Secret", "Deployment", "Service"}
    for d in core:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)  # raises ValidationError


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_config_map_holds_valid_scorer_settings(overlay, monkeypatch):
    env = config(render(overlay))
    fields = {"SPINF_" + n.upper() for n in RunSettings.model_fields}
    assert set(env) <= fields, set(env) - fields
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SPINF_SASL_USERNAME", "u")
    monkeypatch.setenv("SPINF_SASL_PASSWORD", "p")
    s = RunSettings()
    assert s.metrics_port == int(container(render(overlay))["ports"][0]["containerPort"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_ask_healthz_and_readyz_on_the_metrics_port(overlay):
    c = container(render(overlay))
    assert c["ports"] == [{"name": "metrics", "containerPort": 9464, "protocol": "TCP"},
                          {"name": "api", "containerPort": 8000, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_sasl_credentials_come_from_the_secret(overlay):
    docs = render(overlay)
    secret = one(docs, "Secret", "spinf-stream-kafka")
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container(docs)["env"] if "valueFrom" in e}
    for name in ("SPINF_SASL_USERNAME", "SPINF_SASL_PASSWORD"):
        assert refs[name]["name"] == secret["metadata"]["name"] and refs[name]["key"] in secret["stringData"]
    assert "SPINF_SASL_PASSWORD" not in config(docs)


def test_the_metrics_service_selects_the_scorer_pods():
    docs = render("gpu")
    svc, dep = one(docs, "Service", "spinf-stream-metrics"), one(docs, "Deployment")
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_http_api_asks_for_a_key_of_its_secret_and_its_service_reaches_the_port_it_listens_on(overlay, monkeypatch):
    docs = render(overlay)
    secret, svc, dep = one(docs, "Secret", "spinf-stream-api"), one(docs, "Service", "spinf-stream-api"), one(docs, "Deployment")
    ref = next(e["valueFrom"]["secretKeyRef"] for e in container(docs)["env"] if e["name"] == "SPINF_API_KEYS")
    assert ref == {"name": "spinf-stream-api", "key": "SPINF_API_KEYS"}
    for k, v in {**config(docs), "SPINF_API_KEYS": secret["stringData"]["SPINF_API_KEYS"],
                 "SPINF_SASL_USERNAME": "u", "SPINF_SASL_PASSWORD": "p"}.items():
        monkeypatch.setenv(k, v)
    s = RunSettings()
    assert s.api_key and s.listen_host() == "0.0.0.0"  # with a key: reachable from the Service
    port = next(p for p in container(docs)["ports"] if p["name"] == "api")
    assert port["containerPort"] == s.api_port and svc["spec"]["ports"][0]["targetPort"] == "api"
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]


def test_the_packs_config_map_carries_the_shipped_pack_the_scorer_runs():
    docs = render("gpu")
    packs = next(d for d in docs if d["metadata"]["name"] == "spinf-stream-packs")
    mount = next(m for m in container(docs)["volumeMounts"] if m["name"] == "packs")
    volume = next(v for v in one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"] if v["name"] == "packs")
    lands = {i["path"]: packs["data"][i["key"]] for i in volume["configMap"]["items"]}
    assert config(docs)["SPINF_PACK"] == f"{mount['mountPath']}/spam.yaml"
    # the pack and every shipped calibration, where --calibration auto and --calibration recall95 look
    folder = REPO / "packs" / "spam" / "calibrations"
    want = {"spam.yaml": REPO / "packs" / "spam.yaml"} | {
        f"spam/calibrations/{p.relative_to(folder).as_posix()}": p for p in folder.rglob("*.json")}
    assert len(want) == 7 and "spam/calibrations/recall95/qwen2.5-coder-0.5b.json" in want
    assert lands == {k: p.read_text() for k, p in want.items()}, "run deploy/k8s/packs_configmap.py"
    assert set(packs["data"]) == {i["key"] for i in volume["configMap"]["items"]}


def test_the_gpu_overlay_asks_for_one_gpu_and_the_cpu_overlay_for_none():
    gpu = container(render("gpu"))["resources"]
    assert gpu["limits"]["nvidia.com/gpu"] == "1"
    cpu = container(render("cpu"))["resources"]
    assert "nvidia.com/gpu" not in {**cpu["limits"], **cpu["requests"]}


# -- KEDA ------------------------------------------------------------------------------------------


def keda_trigger() -> dict[str, Any]:
    (trigger,) = one(render("keda"), "ScaledObject")["spec"]["triggers"]
    return trigger


def test_the_scaled_object_and_trigger_authentication_are_valid_keda_resources():
    from cloudcoil.models.keda.v1alpha1 import ScaledObject, TriggerAuthentication

    docs = render("keda")
    for model, doc in ((ScaledObject, one(docs, "ScaledObject")), (TriggerAuthentication, one(docs, "TriggerAuthentication"))):
        parsed = model.model_validate(doc)  # KEDA's CRD types (raises on wrong types or missing fields)
        # the models ignore unknown keys: a round trip that loses one is a misspelt field
        assert parsed.model_dump(by_alias=True, exclude_none=True, mode="json") == doc


def test_the_kafka_trigger_metadata_is_valid_for_kedas_kafka_scaler():
    schema = json.loads((REPO / "tests" / "schemas" / "keda_kafka_trigger.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    trigger = keda_trigger()
    assert trigger["type"] == "kafka"
    jsonschema.validate(trigger["metadata"], schema)


def test_the_kafka_trigger_schema_refuses_what_keda_refuses():
    schema = json.loads((REPO / "tests" / "schemas" / "keda_kafka_trigger.schema.json").read_text())
    good = keda_trigger()["metadata"]
    for bad in ({**good, "lagTreshold": "5"}, {**good, "offsetResetPolicy": "smallest"},
                {**good, "allowIdleConsumers": "true"}, {k: v for k, v in good.items() if k != "topic"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_the_trigger_watches_the_scorers_group_topic_and_offset_reset_policy():
    docs = render("keda")
    env, meta = config(docs), keda_trigger()["metadata"]
    assert meta["bootstrapServers"] == env["SPINF_BOOTSTRAP_SERVERS"]
    assert meta["consumerGroup"] == env["SPINF_GROUP_ID"]
    assert meta["topic"] == env["SPINF_INPUT_TOPIC"]
    assert meta["offsetResetPolicy"] == env["SPINF_AUTO_OFFSET_RESET"]
    assert meta["limitToPartitionsWithLag"] == "true"
    auth = one(docs, "TriggerAuthentication")
    secret = one(docs, "Secret", "spinf-stream-kafka")
    assert keda_trigger()["authenticationRef"]["name"] == auth["metadata"]["name"]
    assert all(r["name"] == secret["metadata"]["name"] and r["key"] in secret["stringData"]
               for r in auth["spec"]["secretTargetRef"])


def test_replicas_are_capped_at_the_partition_count(compose):
    so = one(render("keda"), "ScaledObject")
    partitions = int(compose["services"]["topics"]["environment"]["PARTITIONS"])
    assert so["spec"]["maxReplicaCount"] == partitions
    assert so["spec"]["scaleTargetRef"]["name"] == one(render("keda"), "Deployment")["metadata"]["name"]
    assert keda_trigger()["metadata"].get("allowIdleConsumers", "false") == "false"


# -- the optional ServiceMonitor -------------------------------------------------------------------


def test_the_service_monitor_component_selects_the_metrics_service(tmp_path):
    from cloudcoil.models.prometheus_operator.v1 import ServiceMonitor

    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(K8S / "overlays" / "gpu", tmp_path)],
        "components": [os.path.relpath(K8S / "components" / "servicemonitor", tmp_path)],
    }))
    docs = [json.loads(json.dumps(d)) for d in _render(str(tmp_path))]
    sm, svc = one(docs, "ServiceMonitor"), one(docs, "Service", "spinf-stream-metrics")
    assert ServiceMonitor.model_validate(sm).model_dump(by_alias=True, exclude_none=True, mode="json") == sm
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"]


def test_the_compose_routes_scorer_runs_the_sample_routes_file_whose_topics_the_stack_creates(compose):
    from spinf_stream.config import RunSettings
    from spinf_stream.routes import check_routes, load_routes
    from spinf_stream.stream.app import ROUTE_FLAGS
    from spinf_stream.stream.routing import router_for

    svc = compose["services"]["scorer-routes"]
    env = {k: str(v) for k, v in svc["environment"].items()}
    host_file = REPO / "deploy" / "routes.yaml"
    assert f"./deploy/routes.yaml:{env['SPINF_ROUTES']}:ro" in svc["volumes"]
    settings = RunSettings.model_validate({k.removeprefix("SPINF_").lower(): v for k, v in env.items()})
    assert not set(ROUTE_FLAGS) & settings.model_fields_set  # nothing a routes file replaces
    routes = load_routes(host_file)
    packs = check_routes(routes, host_file, models=False)
    assert {p.name for p in packs.values()} == {"spam", "moderation", "sentiment"}
    router = router_for(routes, {k: (p.name, p.version) for k, p in packs.items()})
    created = set(compose["services"]["topics"]["environment"]["TOPICS"].split())
    assert {*routes.input_topics, *router.output_topics, routes.dead_letter_topic} <= created
    assert {p.model for p in routes.lanes().values()} == {"qwen2.5-coder-0.5b", "smollm2-135m"}


def test_the_k8s_routes_overlay_runs_the_sample_routes_file_from_the_base(monkeypatch):
    from spinf_stream.routes import check_routes, load_routes
    from spinf_stream.stream.app import ROUTE_FLAGS

    docs = render("routes")
    env = config(docs)
    routes_map = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "spinf-stream-routes")
    assert routes_map["data"] == {"routes.yaml": (REPO / "deploy" / "routes.yaml").read_text()}, "run deploy/k8s/packs_configmap.py"
    volume = next(v for v in one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"] if v["name"] == "routes")
    mount = next(m for m in container(docs)["volumeMounts"] if m["name"] == "routes")
    assert volume["configMap"]["name"] == "spinf-stream-routes"
    assert env["SPINF_ROUTES"] == f"{mount['mountPath']}/routes.yaml"
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    settings = RunSettings(sasl_username="u", sasl_password="p")
    assert not set(ROUTE_FLAGS) & settings.model_fields_set  # nothing the routes file replaces
    assert env["SPINF_GROUP_ID"] != config(render("gpu"))["SPINF_GROUP_ID"]  # its own consumer group
    routes = load_routes(REPO / "deploy" / "routes.yaml")
    packs = check_routes(routes, REPO / "deploy" / "routes.yaml", models=False)  # the image's packs folder has them
    assert {p.name for p in packs.values()} == {"spam", "moderation", "sentiment"}
