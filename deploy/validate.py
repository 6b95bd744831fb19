#!/usr/bin/env python3
"""Offline checks of longhaul's deployment files (deploy/README.md, "Checking").

    python3 deploy/validate.py             # check everything, say what was checked
    python3 deploy/validate.py --commands  # print the units' and manifests' command lines as JSON

Checks, with no network use:

- kubernetes/: every manifest against the Kubernetes API schemas that the
  `kubernetes-validate` package bundles, in strict mode (unknown fields are
  errors), for each of KUBERNETES_VERSIONS; the references between the
  manifests (selectors, Services, ConfigMaps, ServiceAccounts, claims,
  roles, the kustomization's list); the TOML in the ConfigMaps; the image.
- systemd/: `systemd-analyze verify` on every unit, as written, in a scratch
  root that holds the host's system units, the units, and stand-in
  executables at the units' Exec*= paths (verify refuses a unit whose
  program is missing, and the real binaries need not be built or
  installed). Any line it prints about the units is a failure: verify
  exits 0 on unknown or misplaced directives, which it only warns about.
  The example TOML and environment files the units name must exist and parse.
- Dockerfile: the packages it builds and the binaries it copies exist in
  the workspace, and its image tag is the workspace version the manifests use.

Each check first makes sure that it can fail: a copy of the input with a
known mistake must be refused, or the check itself is reported broken.

Exit status: 0 when everything passed; 1 on any failure; 77 (skipped) when
kubernetes-validate or systemd-analyze is missing and everything else
passed, unless LONGHAUL_REQUIRE_DEPLOY=1 is set, which makes a missing
tool a failure.

`--commands` prints every command line of the units and manifests that runs
`coordinator`, `longhaul` or `site-agent`, as a JSON list of {"source",
"program", "argv"}: the units' specifiers and environment variables
expanded with the example environment files, shell scripts in manifests
reduced to their `exec` lines with the containers' variables given sample
values. tests/deploy.rs parses each with the binaries' own argument parsers.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEPLOY = Path(__file__).resolve().parent
ROOT = DEPLOY.parent
KUBERNETES_DIR = DEPLOY / "kubernetes"
SYSTEMD_DIR = DEPLOY / "systemd"
DOCKERFILE = DEPLOY / "Dockerfile"

# The oldest Kubernetes release the manifests are meant for, and the newest
# that the pinned kubernetes-validate (deploy/requirements.txt) bundles.
KUBERNETES_VERSIONS = ("1.33", "1.37")
REQUIRE = "LONGHAUL_REQUIRE_DEPLOY"
SKIPPED = 77
PROGRAMS = ("coordinator", "longhaul", "site-agent")
# Where systemd's own units are; copied into the scratch root for verify.
HOST_UNIT_DIRS = (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system"))
EXEC_KEYS = ("ExecStart", "ExecStartPre", "ExecStartPost", "ExecReload", "ExecStop", "ExecStopPost")
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "PersistentVolume",
    "StorageClass",
    "PriorityClass",
}
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}


class CheckFailed(Exception):
    """An input is wrong; the message says which and why."""


@dataclass
class Report:
    failures: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def ok(self, message: str) -> None:
        print(f"ok      {message}")

    def fail(self, message: str) -> None:
        self.failures.append(message)
        print(f"FAIL    {message}")

    def note(self, message: str) -> None:
        print(f"        {message}")

    def lacking(self, tool: str, hint: str) -> None:
        self.missing.append(f"{tool} ({hint})")
        print(f"MISSING {tool}: {hint}")


def rel(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------- Kubernetes


def load_manifests(yaml: Any) -> list[tuple[Path, dict[str, Any]]]:
    """Every object of every YAML file in kubernetes/, with its file."""
    files = sorted([*KUBERNETES_DIR.glob("*.yaml"), *KUBERNETES_DIR.glob("*.yml")])
    if not files:
        raise CheckFailed(f"{rel(KUBERNETES_DIR)}: no manifests")
    objects = []
    for path in files:
        try:
            documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        except yaml.YAMLError as error:
            raise CheckFailed(f"{rel(path)}: not YAML: {error}") from None
        if not documents:
            raise CheckFailed(f"{rel(path)}: no objects")
        for document in documents:
            if not isinstance(document, dict):
                raise CheckFailed(f"{rel(path)}: a document is not a mapping")
            for key in ("apiVersion", "kind"):
                if not isinstance(document.get(key), str):
                    raise CheckFailed(f"{rel(path)}: an object has no {key}")
            if document["kind"] != "Kustomization":
                name = (document.get("metadata") or {}).get("name")
                if not isinstance(name, str):
                    raise CheckFailed(f"{rel(path)}: a {document['kind']} has no metadata.name")
            objects.append((path, document))
    return objects


def describe(obj: dict[str, Any]) -> str:
    return f"{obj['kind']}/{(obj.get('metadata') or {}).get('name', '?')}"


def schema_errors(kv: Any, obj: dict[str, Any]) -> list[str]:
    """What the bundled schemas of each version find wrong with `obj`."""
    errors = []
    for version in KUBERNETES_VERSIONS:
        try:
            kv.validate(obj, version, strict=True)
        except kv.ValidationError as error:
            path = ".".join(str(p) for p in error.path) or "(top level)"
            errors.append(f"Kubernetes {version}: {path}: {error.message}")
        except (kv.SchemaNotFoundError, kv.InvalidSchemaError, kv.VersionNotSupportedError) as error:
            errors.append(f"Kubernetes {version}: {getattr(error, 'message', error)}")
    return errors


def pod_spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    if obj["kind"] not in WORKLOADS:
        return None
    return ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}


def pod_labels(obj: dict[str, Any]) -> dict[str, str]:
    return (((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels") or {}


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


def workspace_version() -> str:
    manifest = tomllib.loads((ROOT / "Cargo.toml").read_text())
    return manifest["workspace"]["package"]["version"]


def reference_errors(objects: list[tuple[Path, dict[str, Any]]]) -> list[str]:
    """Dangling or inconsistent references between the manifests."""
    errors: list[str] = []
    by_kind: dict[tuple[str, str, str], dict[str, Any]] = {}
    namespaces = {o["metadata"]["name"] for _, o in objects if o["kind"] == "Namespace"}
    image = f"longhaul:{workspace_version()}"
    for path, obj in objects:
        if obj["kind"] == "Kustomization":
            continue
        namespace = obj["metadata"].get("namespace", "")
        if obj["kind"] in CLUSTER_SCOPED:
            if namespace:
                errors.append(f"{rel(path)}: {describe(obj)} is cluster-scoped but names namespace {namespace}")
        elif not namespace:
            errors.append(f"{rel(path)}: {describe(obj)} names no namespace")
        elif namespaces and namespace not in namespaces:
            errors.append(f"{rel(path)}: {describe(obj)} is in namespace {namespace}, which no manifest creates")
        key = (obj["kind"], namespace, obj["metadata"]["name"])
        if key in by_kind:
            errors.append(f"{rel(path)}: {describe(obj)} is defined twice")
        by_kind[key] = obj

    def exists(kind: str, namespace: str, name: str) -> bool:
        return (kind, namespace, name) in by_kind

    workloads = [(p, o) for p, o in objects if o["kind"] in WORKLOADS]
    for path, obj in workloads:
        where = f"{rel(path)}: {describe(obj)}"
        namespace = obj["metadata"].get("namespace", "")
        spec = pod_spec(obj) or {}
        selector = ((obj.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        if not matches(selector, pod_labels(obj)):
            errors.append(f"{where}: spec.selector.matchLabels {selector} does not match the pod template's labels")
        account = spec.get("serviceAccountName")
        if account and account != "default" and not exists("ServiceAccount", namespace, account):
            errors.append(f"{where}: serviceAccountName {account} is not defined")
        claims = {c["metadata"]["name"] for c in (obj.get("spec") or {}).get("volumeClaimTemplates") or []}
        volumes = {v["name"] for v in spec.get("volumes") or []} | claims
        for volume in spec.get("volumes") or []:
            if "configMap" in volume and not exists("ConfigMap", namespace, volume["configMap"]["name"]):
                errors.append(f"{where}: volume {volume['name']}: ConfigMap {volume['configMap']['name']} is not defined")
            claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if claim and not exists("PersistentVolumeClaim", namespace, claim):
                errors.append(f"{where}: volume {volume['name']}: PersistentVolumeClaim {claim} is not defined")
        for container in containers(spec):
            if container.get("image") != image:
                errors.append(f"{where}: container {container['name']} runs {container.get('image')}, not {image} (deploy/Dockerfile)")
            for mount in container.get("volumeMounts") or []:
                if mount["name"] not in volumes:
                    errors.append(f"{where}: container {container['name']} mounts {mount['name']}, which is no volume")
        if obj["kind"] == "StatefulSet":
            service = obj["spec"].get("serviceName")
            headless = by_kind.get(("Service", namespace, service or ""))
            if headless is None or (headless.get("spec") or {}).get("clusterIP") != "None":
                errors.append(f"{where}: serviceName {service} is not a headless Service here")

    for path, obj in objects:
        namespace = obj.get("metadata", {}).get("namespace", "")
        where = f"{rel(path)}: {describe(obj)}"
        if obj["kind"] == "Service":
            selector = (obj.get("spec") or {}).get("selector") or {}
            selected = [o for _, o in workloads if o["metadata"].get("namespace") == namespace and matches(selector, pod_labels(o))]
            if not selected:
                errors.append(f"{where}: its selector {selector} matches no workload's pods")
            for port in (obj.get("spec") or {}).get("ports") or []:
                target = port.get("targetPort")
                if isinstance(target, str):
                    named = [
                        p
                        for o in selected
                        for c in containers(pod_spec(o) or {})
                        for p in c.get("ports") or []
                        if p.get("name") == target
                    ]
                    if not named:
                        errors.append(f"{where}: targetPort {target} is no container port of the pods it selects")
                    elif any(p.get("protocol", "TCP") != port.get("protocol", "TCP") for p in named):
                        errors.append(f"{where}: port {port.get('name')} is {port.get('protocol', 'TCP')}, its target {target} is not")
        elif obj["kind"] == "PodDisruptionBudget":
            selector = ((obj.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
            if not any(o["metadata"].get("namespace") == namespace and matches(selector, pod_labels(o)) for _, o in workloads):
                errors.append(f"{where}: its selector {selector} matches no workload's pods")
        elif obj["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            role = obj.get("roleRef") or {}
            role_namespace = "" if role.get("kind") == "ClusterRole" else namespace
            if not exists(role.get("kind", ""), role_namespace, role.get("name", "")):
                errors.append(f"{where}: roleRef {role.get('kind')}/{role.get('name')} is not defined")
            for subject in obj.get("subjects") or []:
                if subject.get("kind") == "ServiceAccount" and not exists(
                    "ServiceAccount", subject.get("namespace", namespace), subject.get("name", "")
                ):
                    errors.append(f"{where}: subject ServiceAccount {subject.get('namespace')}/{subject.get('name')} is not defined")
        elif obj["kind"] == "ConfigMap":
            for key, text in (obj.get("data") or {}).items():
                if key.endswith(".toml"):
                    try:
                        tomllib.loads(text)
                    except tomllib.TOMLDecodeError as error:
                        errors.append(f"{where}: {key} is not TOML: {error}")
    return errors


def kustomization_errors(objects: list[tuple[Path, dict[str, Any]]]) -> list[str]:
    kustomizations = [(p, o) for p, o in objects if o["kind"] == "Kustomization"]
    if len(kustomizations) != 1:
        return [f"{rel(KUBERNETES_DIR)}: expected one kustomization.yaml, found {len(kustomizations)}"]
    path, kustomization = kustomizations[0]
    listed = kustomization.get("resources") or []
    files = {p.name for p, o in objects if o["kind"] != "Kustomization"}
    errors = []
    for name in listed:
        if not (KUBERNETES_DIR / name).is_file():
            errors.append(f"{rel(path)}: resource {name} does not exist")
    if len(set(listed)) != len(listed):
        errors.append(f"{rel(path)}: a resource is listed twice")
    for name in sorted(files - set(listed)):
        errors.append(f"{rel(path)}: {name} is not listed in resources")
    return errors


def check_kubernetes(report: Report) -> None:
    print("== kubernetes/: the manifests against the Kubernetes schemas, and each other")
    try:
        import kubernetes_validate as kv  # noqa: PLC0415 (optional dependency)
        import yaml  # noqa: PLC0415 (a dependency of kubernetes-validate)
    except ImportError as error:
        report.lacking(
            "kubernetes-validate",
            f"cannot import {error.name}: python3 -m pip install -r deploy/requirements.txt",
        )
        return
    report.note(f"with kubernetes-validate {kv.__version__}, strict, Kubernetes {', '.join(KUBERNETES_VERSIONS)}")
    # The check must be able to fail: a misspelled field is refused.
    canary = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "dta": {}}
    if not schema_errors(kv, canary):
        report.fail("kubernetes-validate accepts a ConfigMap with a misspelled field (dta): the schema check is broken")
        return
    try:
        objects = load_manifests(yaml)
    except CheckFailed as error:
        report.fail(str(error))
        return
    for path, obj in objects:
        if obj["kind"] == "Kustomization":
            continue
        errors = schema_errors(kv, obj)
        for error in errors:
            report.fail(f"{rel(path)}: {describe(obj)}: {error}")
        if not errors:
            report.ok(f"{rel(path)}: {describe(obj)} matches the schema")
    errors = kustomization_errors(objects) + reference_errors(objects)
    for error in errors:
        report.fail(error)
    if not errors:
        report.ok(f"{rel(KUBERNETES_DIR)}: the kustomization lists every manifest; references, ConfigMap TOML and images agree")


# ------------------------------------------------------------------- systemd


def unit_entries(text: str) -> list[tuple[str, str, str]]:
    """(section, key, value) of a unit file, continuation lines joined."""
    entries = []
    section = ""
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if pending:
            line = pending + " " + line
            pending = ""
        elif not line or line.startswith(("#", ";")):
            continue
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
        elif "=" in line:
            key, value = line.split("=", 1)
            entries.append((section, key.strip(), value.strip()))
    return entries


def exec_program(value: str) -> str:
    """The program of an Exec*= value, without systemd's prefixes."""
    program = value.lstrip("-@:+!|")
    return shlex.split(program)[0] if program.strip() else ""


def example_file(unit_path: Path, key: str) -> Path | None:
    """The example beside the unit of a file that the unit reads from /etc/longhaul."""
    for section, name, value in unit_entries(unit_path.read_text()):
        if section == "Service" and name == key:
            target = value.lstrip("-")
            if target.startswith("/etc/longhaul/"):
                return SYSTEMD_DIR / Path(target).name
    return None


def verify_units(systemd_analyze: str, units: list[Path], host_units: Path) -> tuple[int, list[str]]:
    """Runs `systemd-analyze verify` on `units` in a scratch root; its exit status and output lines."""
    with tempfile.TemporaryDirectory(prefix="longhaul-verify-") as scratch:
        root = Path(scratch)
        shutil.copytree(host_units, root / "usr/lib/systemd/system", symlinks=True)
        unit_dir = root / "etc/systemd/system"
        unit_dir.mkdir(parents=True)
        for unit in units:
            shutil.copyfile(unit, unit_dir / unit.name)
            for section, key, value in unit_entries(unit.read_text()):
                program = exec_program(value) if section == "Service" and key in EXEC_KEYS else ""
                if program.startswith("/"):
                    stand_in = root / program.lstrip("/")
                    stand_in.parent.mkdir(parents=True, exist_ok=True)
                    stand_in.write_text("#!/bin/sh\nexit 0\n")
                    stand_in.chmod(0o755)
        result = subprocess.run(
            [systemd_analyze, "verify", f"--root={root}", "--man=no", "--generators=no", *(u.name for u in units)],
            capture_output=True,
            text=True,
            env={**os.environ, "SYSTEMD_LOG_COLOR": "0", "SYSTEMD_PAGER": "", "LC_ALL": "C"},
            check=False,
            timeout=120,
        )
        lines = [
            line.replace(str(unit_dir) + "/", "").replace(str(root), "<root>")
            for line in (result.stdout + result.stderr).splitlines()
            if line.strip()
        ]
        return result.returncode, lines


def about(line: str, units: list[Path]) -> bool:
    return any(unit.name in line for unit in units)


def check_systemd(report: Report) -> None:
    print("== systemd/: the units, their example files, systemd-analyze verify")
    units = sorted(SYSTEMD_DIR.glob("*.service"))
    if not units:
        report.fail(f"{rel(SYSTEMD_DIR)}: no units")
        return
    # The example files the units read must exist and parse, tool or not.
    for unit in units:
        for key in ("EnvironmentFile",):
            example = example_file(unit, key)
            if example is not None and not example.is_file():
                report.fail(f"{rel(unit)}: {key}= names /etc/longhaul/{example.name}, but {rel(example)} does not exist")
        for section, key, value in unit_entries(unit.read_text()):
            if section == "Service" and key == "ExecStart":
                for config in re.findall(r"--config\s+(/etc/longhaul/\S+\.toml)", value):
                    example = SYSTEMD_DIR / Path(config).name
                    try:
                        tomllib.loads(example.read_text())
                        report.ok(f"{rel(unit)}: its --config {config} has the example {rel(example)}, which is TOML")
                    except (OSError, tomllib.TOMLDecodeError) as error:
                        report.fail(f"{rel(unit)}: its --config {config}: {rel(example)}: {error}")
    systemd_analyze = shutil.which("systemd-analyze")
    if systemd_analyze is None:
        report.lacking("systemd-analyze", "apt-get install systemd")
        return
    host_units = next((d for d in HOST_UNIT_DIRS if (d / "sysinit.target").exists()), None)
    if host_units is None:
        report.lacking("systemd's unit directory", f"none of {', '.join(map(str, HOST_UNIT_DIRS))} has sysinit.target")
        return
    version = subprocess.run([systemd_analyze, "--version"], capture_output=True, text=True, check=False)
    report.note(f"with {version.stdout.splitlines()[0] if version.stdout else systemd_analyze}")
    # The check must be able to fail: a misspelled directive is reported.
    with tempfile.TemporaryDirectory(prefix="longhaul-canary-") as scratch:
        canary = Path(scratch) / units[0].name
        canary.write_text(units[0].read_text().replace("[Service]\n", "[Service]\nRestartSecc=5s\n", 1))
        status, lines = verify_units(systemd_analyze, [canary], host_units)
        if status == 0 and not any(about(line, [canary]) for line in lines):
            report.fail("systemd-analyze verify says nothing about a misspelled directive (RestartSecc=): the unit check is broken")
            return
    status, lines = verify_units(systemd_analyze, units, host_units)
    ours = [line for line in lines if about(line, units)]
    for line in lines:
        (report.fail if line in ours else report.note)(f"systemd-analyze: {line}")
    if status != 0:
        report.fail(f"systemd-analyze verify exited {status}")
    if status == 0 and not ours:
        for unit in units:
            report.ok(f"{rel(unit)}: systemd-analyze verify prints nothing about it")


# ---------------------------------------------------------------- Dockerfile


def check_dockerfile(report: Report) -> None:
    print("== Dockerfile: against the workspace")
    text = DOCKERFILE.read_text()
    workspace = tomllib.loads((ROOT / "Cargo.toml").read_text())
    packages: dict[str, set[str]] = {}
    for member in workspace["workspace"]["members"]:
        manifest = tomllib.loads((ROOT / member / "Cargo.toml").read_text())
        packages[manifest["package"]["name"]] = {b["name"] for b in manifest.get("bin", [])}
    built = re.findall(r"-p\s+([A-Za-z0-9_-]+)", text)
    copied = re.findall(r"target/release/([A-Za-z0-9_-]+)", text)
    errors = [f"{rel(DOCKERFILE)}: builds -p {p}, which is no workspace package" for p in built if p not in packages]
    binaries = set().union(*(packages.get(p, set()) for p in built)) if built else set()
    errors += [f"{rel(DOCKERFILE)}: copies target/release/{b}, which the packages it builds do not make" for b in copied if b not in binaries]
    wanted = set(PROGRAMS)
    if set(copied) != wanted:
        errors.append(f"{rel(DOCKERFILE)}: copies {sorted(set(copied))}, expected {sorted(wanted)}")
    tag = f"longhaul:{workspace['workspace']['package']['version']}"
    if tag not in text:
        errors.append(f"{rel(DOCKERFILE)}: does not mention the image {tag} that the manifests run")
    for error in errors:
        report.fail(error)
    if not errors:
        report.ok(f"{rel(DOCKERFILE)}: builds {', '.join(built)}; copies {', '.join(copied)}; image {tag}")


# ------------------------------------------------------------ command lines


def expand_unit(value: str, unit: str, environment: dict[str, str]) -> list[str]:
    """An Exec*= value as systemd would run it (the specifiers these units use)."""
    specifiers = {"%S": "/var/lib", "%d": f"/run/credentials/{unit}", "%t": "/run", "%%": "%"}
    for specifier, replacement in specifiers.items():
        value = value.replace(specifier, replacement)
    if re.search(r"%[A-Za-z]", value):
        raise CheckFailed(f"{unit}: a specifier in {value!r} has no sample value here")
    words = []
    for word in shlex.split(value.lstrip("-@:+!|")):
        whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if whole:  # $VAR: split into words
            words += environment.get(whole.group(1), "").split()
            continue
        words.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: environment.get(m.group(1), ""), word))
    return words


def environment_file(path: Path | None) -> dict[str, str]:
    values = {}
    if path is not None and path.is_file():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith(("#", ";")) and "=" in line:
                key, value = line.split("=", 1)
                values[key.strip()] = value.strip().strip('"')
    return values


def shell_commands(script: str, variables: dict[str, str], where: str) -> list[list[str]]:
    """The `exec` lines of a `sh -c` script, tokenized, variables replaced by samples."""
    commands = []
    assigned = dict(variables)
    for line in script.replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        assignment = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", line)
        if assignment:
            assigned[assignment.group(1)] = "1"  # a sample: the scripts assign numbers (ids)
            continue
        if not line.startswith("exec "):
            continue

        def sample(match: re.Match[str]) -> str:
            name = match.group(1) or match.group(2)
            if name not in assigned:
                raise CheckFailed(f"{where}: ${name} has no sample value")
            return assigned[name]

        if "$(" in line or "`" in line:
            raise CheckFailed(f"{where}: command substitution in an exec line cannot be checked: {line}")
        expanded = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)", sample, line)
        commands.append(shlex.split(expanded)[1:])
    return commands


def container_variables(obj: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    values = {"HOSTNAME": f"{obj['metadata']['name']}-0"}
    for variable in container.get("env") or []:
        if "value" in variable:
            values[variable["name"]] = str(variable["value"])
        elif ((variable.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath") == "metadata.name":
            values[variable["name"]] = f"{obj['metadata']['name']}-0"  # StatefulSet pod 0
        else:
            values[variable["name"]] = "sample"
    return values


def command_lines() -> list[dict[str, Any]]:
    import yaml  # noqa: PLC0415 (a dependency of kubernetes-validate)

    found: list[dict[str, Any]] = []

    def add(source: str, argv: list[str]) -> None:
        if argv and Path(argv[0]).name in PROGRAMS:
            found.append({"source": source, "program": Path(argv[0]).name, "argv": [Path(argv[0]).name, *argv[1:]]})

    for unit in sorted(SYSTEMD_DIR.glob("*.service")):
        environment = environment_file(example_file(unit, "EnvironmentFile"))
        for section, key, value in unit_entries(unit.read_text()):
            if section == "Service" and key in EXEC_KEYS:
                add(f"{rel(unit)}: {key}", expand_unit(value, unit.name, environment))
    for path, obj in load_manifests(yaml):
        spec = pod_spec(obj)
        if spec is None:
            continue
        for container in containers(spec):
            variables = container_variables(obj, container)
            where = f"{rel(path)}: {describe(obj)}: {container['name']}"
            runs = [("command", [*(container.get("command") or []), *(container.get("args") or [])])]
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                command = ((container.get(probe) or {}).get("exec") or {}).get("command")
                if command:
                    runs.append((probe, list(command)))
            for what, argv in runs:
                if len(argv) >= 3 and Path(argv[0]).name in ("sh", "bash") and argv[1] == "-c":
                    for command in shell_commands(argv[2], variables, f"{where} {what}"):
                        add(f"{where} {what}", command)
                else:
                    add(f"{where} {what}", argv)
    return found


# ---------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", action="store_true", help="print the command lines as JSON and exit")
    args = parser.parse_args()
    if args.commands:
        try:
            print(json.dumps(command_lines(), indent=2))
        except ImportError as error:
            print(f"skipped: cannot import {error.name}: python3 -m pip install -r deploy/requirements.txt", file=sys.stderr)
            return SKIPPED
        except CheckFailed as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        return 0

    report = Report()
    check_kubernetes(report)
    check_systemd(report)
    check_dockerfile(report)
    print()
    if report.failures:
        print(f"deploy/validate.py: FAILED: {len(report.failures)} problem(s):")
        for failure in report.failures:
            print(f"  - {failure}")
        if report.missing:
            print(f"  (and not checked, missing: {'; '.join(report.missing)})")
        return 1
    if report.missing:
        message = f"missing {'; '.join(report.missing)}"
        if os.environ.get(REQUIRE) == "1":
            print(f"deploy/validate.py: FAILED: {message}, and {REQUIRE}=1 requires every check")
            return 1
        print(f"deploy/validate.py: skipped: {message} (set {REQUIRE}=1 to make this a failure)")
        return SKIPPED
    print("deploy/validate.py: every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
