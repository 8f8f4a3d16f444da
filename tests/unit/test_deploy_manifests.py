"""The Kubernetes manifests in deploy/k8s, read with PyYAML: what would break a deployment.

The image is the one deploy/Dockerfile builds (compose.yaml's name for it); replicas never
migrate and the Job does; the probes ask grpc.health.v1 on the health port; TLS and the
database URL come from Secrets; the PDB and the Service select the server's pods and only them;
pods run as the image's unprivileged user on a read-only root file system. And the image can
be built: a wheel built from exactly the files its build stage copies holds the whole package.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from effect_ledger.cli import build_parser
from effect_ledger.transport.server import LIVENESS_SERVICE_NAME

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
HEALTHCHECK_IN_IMAGE = "/opt/effect-ledger/healthcheck.py"


def _load(path: Path) -> list[dict[str, Any]]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document]


MANIFESTS = {path.name: _load(path) for path in sorted(K8S.glob("*.yaml"))}
OBJECTS = [document for name, documents in MANIFESTS.items() if name != "kustomization.yaml" for document in documents]


def one(kind: str) -> dict[str, Any]:
    (found,) = [o for o in OBJECTS if o["kind"] == kind]
    return found


DEPLOYMENT, JOB, SERVICE, PDB = one("Deployment"), one("Job"), one("Service"), one("PodDisruptionBudget")
(SERVER,) = DEPLOYMENT["spec"]["template"]["spec"]["containers"]
(MIGRATE,) = JOB["spec"]["template"]["spec"]["containers"]
COMPOSE = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
DOCKERFILE = (DEPLOY / "Dockerfile").read_text()


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container.get("env", [])}


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def port_of(listen: str) -> int:
    return int(listen.rsplit(":", 1)[1])


def test_every_manifest_is_a_resource_of_the_kustomization():
    (kustomization,) = MANIFESTS["kustomization.yaml"]
    assert sorted(kustomization["resources"]) == sorted(n for n in MANIFESTS if n != "kustomization.yaml")
    assert all({"apiVersion", "kind", "metadata"} <= o.keys() for o in OBJECTS)


def test_the_image_is_the_one_the_dockerfile_builds():
    service = COMPOSE["services"]["effect-ledger"]
    assert service["build"]["dockerfile"] == "deploy/Dockerfile"
    image = service["image"]
    assert f"-t {image} " in DOCKERFILE, "the Dockerfile's build command names another tag"
    assert SERVER["image"] == MIGRATE["image"] == image
    (kustomization,) = MANIFESTS["kustomization.yaml"]
    (entry,) = kustomization["images"]
    repository, tag = image.rsplit(":", 1)
    assert (entry["name"], f"{entry['newName']}:{entry['newTag']}") == (repository, image)


def test_replicas_do_not_migrate_and_serve_tls_only():
    arguments = SERVER["args"]
    assert arguments[0] == "serve" and "--no-migrate" in arguments
    assert "--insecure" not in arguments + SERVER.get("command", [])
    variables = env(SERVER)
    assert "EFFECT_LEDGER_INSECURE" not in variables and "EFFECT_LEDGER_NO_MIGRATE" not in variables
    mounts = {m["name"]: m["mountPath"] for m in SERVER["volumeMounts"]}
    volumes = {v["name"]: v for v in DEPLOYMENT["spec"]["template"]["spec"]["volumes"]}
    for name in ("EFFECT_LEDGER_TLS_CERT", "EFFECT_LEDGER_TLS_KEY", "EFFECT_LEDGER_TLS_CLIENT_CA"):
        (volume,) = [v for v, path in mounts.items() if variables[name].startswith(path + "/")]
        assert "secret" in volumes[volume], f"{name} is not read from a Secret"


def test_the_job_runs_migrate():
    assert MIGRATE["args"] == ["migrate"]
    assert JOB["spec"]["template"]["spec"]["restartPolicy"] in ("Never", "OnFailure")


def test_the_database_url_comes_from_one_secret():
    found = [env(c)["EFFECT_LEDGER_DATABASE_URL"] for c in (SERVER, MIGRATE)]
    assert all("secretKeyRef" in value for value in found)
    assert found[0] == found[1]


def test_every_setting_names_a_serve_flag():
    commands = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    serve = commands.choices["serve"]
    flags = {o for a in serve._actions for o in a.option_strings}
    variables = [name for name in env(SERVER) if name.startswith("EFFECT_LEDGER_")]
    assert variables
    for name in variables:
        assert "--" + name.removeprefix("EFFECT_LEDGER_").lower().replace("_", "-") in flags, name
    # The Service named effect-ledger would otherwise add EFFECT_LEDGER_* variables of its own.
    assert DEPLOYMENT["spec"]["template"]["spec"]["enableServiceLinks"] is False


def _healthcheck_port() -> int:
    tree = ast.parse((DEPLOY / "healthcheck.py").read_text())
    (target,) = [
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["TARGET"]
    ]
    return port_of(target)


def test_the_images_own_check_asks_its_serving_port():
    """Compose's health check (the image's HEALTHCHECK): grpc.health.v1 over the server's TLS."""
    assert f"COPY deploy/healthcheck.py {HEALTHCHECK_IN_IMAGE}" in DOCKERFILE
    listen = re.search(r'CMD \["serve", "--listen", "([^"]+)"\]', DOCKERFILE).group(1)
    assert port_of(listen) == _healthcheck_port()
    assert f'"{HEALTHCHECK_IN_IMAGE}"]' in DOCKERFILE.split("HEALTHCHECK ", 1)[1].split("\n\n", 1)[0]


@pytest.mark.parametrize("probe", ["startupProbe", "readinessProbe", "livenessProbe"])
def test_probes_ask_grpc_health_on_the_health_port(probe):
    """The kubelet's own grpc probes, on the port --health-listen serves (plaintext: they speak
    nothing else), apart from the serving port, so a flood there never fails a probe."""
    listen = SERVER["args"][SERVER["args"].index("--listen") + 1]
    ports = {p["name"]: p["containerPort"] for p in SERVER["ports"]}
    assert ports["grpc"] == port_of(listen)
    assert ports["health"] == port_of(env(SERVER)["EFFECT_LEDGER_HEALTH_LISTEN"]) != ports["grpc"]
    assert "exec" not in SERVER[probe]
    assert SERVER[probe]["grpc"]["port"] == ports["health"]  # a grpc probe takes no port name
    # Ready means SERVING for the whole server (its database answers); started and alive mean
    # the process serves, which a database outage does not change.
    service = SERVER[probe]["grpc"].get("service", "")
    assert service == ("" if probe == "readinessProbe" else LIVENESS_SERVICE_NAME)
    assert SERVER[probe]["timeoutSeconds"] >= 1


def test_the_health_port_is_not_published():
    assert all(port["targetPort"] != "health" for port in SERVICE["spec"]["ports"])
    health = next(p["containerPort"] for p in SERVER["ports"] if p["name"] == "health")
    assert all(port["port"] != health for port in SERVICE["spec"]["ports"])


def test_the_pdb_and_the_service_select_the_servers_only():
    template_labels = DEPLOYMENT["spec"]["template"]["metadata"]["labels"]
    job_labels = JOB["spec"]["template"]["metadata"]["labels"]
    assert PDB["spec"]["selector"]["matchLabels"] == DEPLOYMENT["spec"]["selector"]["matchLabels"]
    for selector in (PDB["spec"]["selector"]["matchLabels"], SERVICE["spec"]["selector"]):
        assert matches(selector, template_labels)
        assert not matches(selector, job_labels)


def test_the_service_targets_the_named_grpc_port():
    (port,) = SERVICE["spec"]["ports"]
    names = {p["name"] for p in SERVER["ports"]}
    assert port["targetPort"] == "grpc" and "grpc" in names
    assert port["port"] == next(p["containerPort"] for p in SERVER["ports"] if p["name"] == "grpc")


def test_metrics_are_served_and_scraped_on_the_named_port():
    ports = {p["name"]: p["containerPort"] for p in SERVER["ports"]}
    annotations = DEPLOYMENT["spec"]["template"]["metadata"]["annotations"]
    assert port_of(env(SERVER)["EFFECT_LEDGER_METRICS_LISTEN"]) == ports["metrics"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == ports["metrics"]


@pytest.mark.parametrize("workload", [DEPLOYMENT, JOB], ids=["Deployment", "Job"])
def test_pods_run_unprivileged_on_a_read_only_root(workload):
    uid = int(re.search(r"--uid (\d+)", DOCKERFILE).group(1))
    pod = workload["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == uid
    assert pod["automountServiceAccountToken"] is False
    for container in pod["containers"]:
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        assert {"requests", "limits"} <= container["resources"].keys()
        assert "memory" in container["resources"]["limits"]


def test_shutdown_fits_in_the_grace_period():
    sleep = shlex.join(SERVER["lifecycle"]["preStop"]["exec"]["command"])
    seconds = int(sleep.rsplit(" ", 1)[1])
    serve = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction").choices["serve"]
    drain = next(a.default for a in serve._actions if "--grace-seconds" in a.option_strings)
    assert DEPLOYMENT["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > seconds + drain


# --- the image's build stage -----------------------------------------------------------------

WHEEL_BUILD_TIMEOUT_SECONDS = 120


def _dockerignore_pattern(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regular expression over a path relative to the context
    (Go's filepath.Match with ``**``: ``*`` and ``?`` stay within one path segment)."""
    pieces, index = [], 0
    while index < len(pattern):
        if pattern.startswith("**/", index):
            pieces.append("(?:.*/)?")
            index += 3
        elif pattern.startswith("**", index):
            pieces.append(".*")
            index += 2
        elif pattern[index] == "*":
            pieces.append("[^/]*")
            index += 1
        elif pattern[index] == "?":
            pieces.append("[^/]")
            index += 1
        elif pattern[index] == "[":
            end = pattern.index("]", index)
            pieces.append(pattern[index : end + 1])
            index = end + 1
        else:
            pieces.append(re.escape(pattern[index]))
            index += 1
    return re.compile("".join(pieces))


def _in_build_context(relative: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether the file ``relative`` is sent to the builder: the last rule that matches it, or
    one of its parent folders, decides (a ``!`` rule lets it in)."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[: count + 1]) for count in range(len(parts))]
    included = True
    for negated, pattern in rules:
        if any(pattern.fullmatch(prefix) for prefix in prefixes):
            included = negated
    return included


def _build_stage_copies() -> list[tuple[list[str], str]]:
    """The (sources, destination) of each COPY from the build context in the build stage."""
    stage = DOCKERFILE.split("\nFROM ")[1]  # from the first FROM to the next
    copies = []
    for line in stage.splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(word.startswith("--from") for word in words):
            copies.append((words[1:-1], words[-1]))
    return copies


def _copy_the_build_context(target: Path) -> None:
    """Into ``target``, what the build stage's COPY lines put in its working directory."""
    lines = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    written = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    rules = [(line.startswith("!"), _dockerignore_pattern(line.removeprefix("!").strip("/"))) for line in written]
    exceptions = [line.removeprefix("!") for line in written if line.startswith("!")]
    context = set()
    for folder, folders, names in os.walk(REPO):
        at = Path(folder).relative_to(REPO).as_posix().removeprefix(".")
        # Not into a folder that is left out and that no exception reaches into (.venv, .git).
        folders[:] = [
            name
            for name in folders
            if _in_build_context(f"{at}/{name}".lstrip("/"), rules)
            or any(e.startswith(f"{at}/{name}/".lstrip("/")) for e in exceptions)
        ]
        context.update(f"{at}/{name}".lstrip("/") for name in names)
    context = {relative for relative in context if _in_build_context(relative, rules)}
    for sources, destination in _build_stage_copies():
        for source in sources:
            pattern = _dockerignore_pattern(source.strip("/"))
            for relative in sorted(context):
                head = relative.split("/", 1)
                if pattern.fullmatch(relative):  # a file: into the destination folder
                    copied = target / destination / Path(relative).name
                elif pattern.fullmatch(head[0]) and len(head) == 2:  # a folder: its contents
                    copied = target / destination / head[1]
                else:
                    continue
                copied.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(REPO / relative, copied)


def test_the_build_stage_copies_what_the_package_is_built_from(tmp_path):
    source = tmp_path / "src"
    _copy_the_build_context(source)
    assert (source / "setup.py").is_file(), "setup.py discovers the packages: the image must copy it"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), "."],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=WHEEL_BUILD_TIMEOUT_SECONDS,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("effect_ledger-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"effect_ledger/cli.py", "effect_ledger/__main__.py", "effect_ledger/storage/migrations/env.py"} <= names
    policies = {p.relative_to(REPO / "policy").as_posix() for p in (REPO / "policy").rglob("*.rego")}
    assert policies
    assert {f"effect_ledger/_policy/{name}" for name in policies} <= names
