"""deploy/: the Dockerfile and the Kubernetes example (docs/deploy.md). Their `nnhal` command lines
are parsed by nnhal's own parser (a renamed flag fails here, not in a cluster), the probe command
runs against a real service, and the image is built when a container tool answers."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from nnhal.cli import build_parser
from nnhal.cli import main as nnhal_main
from tests.service.conftest import ServerProcess

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "deploy" / "Dockerfile"
MANIFEST = REPO / "deploy" / "kubernetes.yaml"


def dockerfile_command() -> list[str]:
    text = DOCKERFILE.read_text()
    entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", text, re.M).group(1))
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M).group(1))
    return entry + cmd


def manifest_lists(key: str) -> list[list[str]]:
    """Every ``key: [...]`` flow list of the manifest (its command lines are written as JSON lists)."""
    return [json.loads(m) for m in re.findall(rf"^\s*{key}: (\[.*\])$", MANIFEST.read_text(), re.M)]


def test_the_images_command_is_a_valid_nnhal_serve():
    cmd = dockerfile_command()
    assert cmd[:2] == ["nnhal", "serve"]
    args = build_parser().parse_args(cmd[1:])
    assert args.listen == "0.0.0.0:50051" and args.tls_cert and args.tls_key and args.cache_dir
    assert "EXPOSE 50051" in DOCKERFILE.read_text() and "USER 10001" in DOCKERFILE.read_text()


def test_the_kubernetes_example_runs_nnhal_serve_and_probes_its_health():
    text = MANIFEST.read_text()
    assert re.search(r"kind: Service\b.*?clusterIP: None", text, re.S), "the Service must be headless"
    [serve_args] = manifest_lists("args")
    args = build_parser().parse_args(["serve", *serve_args])
    assert args.listen.endswith(":50051") and args.cache_dir and args.tls_client_ca
    probes = manifest_lists("command")
    assert len(probes) == 2 and re.search(r"readinessProbe:\s*\n\s*exec:", text) and "livenessProbe:" in text
    for probe in probes:
        assert probe[:2] == ["nnhal", "health"]
        p = build_parser().parse_args(probe[1:])
        assert p.address == "127.0.0.1:50051" and p.tls_server_name in text.split("dns:///")[1]


def test_nnhal_health_says_whether_a_service_serves(tmp_path, capsys):
    server = ServerProcess(tmp_path)
    try:
        assert nnhal_main(["health", server.address]) == 0
    finally:
        server.stop()
    assert nnhal_main(["health", server.address, "--timeout", "0.5"]) == 1
    assert "UNAVAILABLE" in capsys.readouterr().err


def _container_tool() -> tuple[str | None, str]:
    """A docker or podman that answers, or why none does."""
    why = []
    for tool in ("docker", "podman"):
        path = shutil.which(tool)
        if path is None:
            why.append(f"no {tool}")
            continue
        r = subprocess.run([path, "info"], capture_output=True, text=True, timeout=60)
        if r.returncode == 0:
            return path, ""
        why.append(f"{tool} does not answer ({(r.stderr.strip().splitlines() or ['?'])[-1]})")
    return None, "; ".join(why)


def test_the_dockerfile_builds():
    tool, why = _container_tool()
    if tool is None:
        pytest.skip(f"no container tool to build deploy/Dockerfile with: {why}")
    r = subprocess.run([tool, "build", "-f", str(DOCKERFILE), "-t", "nnhal-test:latest", str(REPO)],
                       capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([tool, "run", "--rm", "--entrypoint", "nnhal", "nnhal-test:latest", "serve", "--help"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "--listen" in r.stdout, r.stderr[-3000:]
