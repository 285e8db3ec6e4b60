"""The README's promises that code can check: the delegate's report fields it documents, the
address forms it shows, the make targets it names."""
from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

from delegate.delegation_report import DelegationReport, NodeReport

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_every_report_field_is_documented():
    """`delegate_obj.report`: a field added to DelegationReport or NodeReport must be described."""
    fields = [f.name for f in dataclasses.fields(DelegationReport)] + ["delegated"]
    missing = [f for f in fields if f"r.{f}" not in README]
    missing += [f.name for f in dataclasses.fields(NodeReport)
                if f.name != "backend" and f"n.{f.name}" not in README and f.name not in README.split(
                    "NodeReport:", 1)[1].split("```", 1)[0]]
    assert not missing, f"README does not describe report fields {missing}"


def test_both_address_forms_are_shown():
    assert "unix:PATH" in README and "--service-address host:50051 --tls-ca-file" in README
    assert re.search(r"bare\s+socket path", README)


def test_every_make_target_the_readme_names_exists():
    targets = set(re.findall(r"^make ([a-z-]+)", README, re.M)) | set(re.findall(r"`make ([a-z-]+)`", README))
    help_text = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True).stdout
    known = set(re.findall(r"make (\S+)", help_text))
    assert targets and targets <= known, targets - known
