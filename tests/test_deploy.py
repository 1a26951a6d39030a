"""What a member trusts: the confined member's node (deploy/member-supernode.service), whose
every node-config path is inside what the sandbox lets it read or write, whose network is the
SuperLink's only, and whose directives systemd itself takes (where systemd-analyze is on the
machine); and the app a SuperNode installed, checked against the reviewed one."""

from __future__ import annotations

import hashlib
import math
import shutil
import subprocess
import sys
from pathlib import Path
from string import Template

import pytest
from flwr.app import Context, RecordDict
from flwr.common.config import parse_config_args

from fedamp_flwr.config import RunConfig
from fedamp_flwr.member.ledger import NodePrivacy

UNIT = Path(__file__).resolve().parents[1] / "deploy" / "member-supernode.service"


def _render(tmp_path: Path) -> tuple[str, dict[str, str]]:
    values = {"CLIENT_ID": "site-3", "USER": "root", "STATE_DIR": str(tmp_path / "state"),
              "VENV": sys.prefix, "SUPERLINK_HOST": "superlink.example.org",
              "SUPERLINK_PORT": "9092", "CA_CERT": str(tmp_path / "ca.crt"),
              "NODE_KEY": str(tmp_path / "node_key"), "DATA_DIR": str(tmp_path / "data"),
              "DATA_FILE": "records.csv", "MAX_EPSILON": "8.0", "SUPERLINK_IP": "203.0.113.7"}
    text = Template(UNIT.read_text()).substitute(values)  # a placeholder left: KeyError
    return text, values


def _directives(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", "[")) and "=" in line:
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def _inside(path: str, folders: list[str]) -> bool:
    return any(Path(path).is_relative_to(f) for f in folders)


def test_the_node_reads_its_data_only_and_writes_only_its_state(tmp_path):
    text, values = _render(tmp_path)
    d = _directives(text)
    node = parse_config_args([d["ExecStart"][0].split("--node-config ", 1)[1].strip('"')])
    env = dict(e.split("=", 1) for e in d["Environment"])
    readable = d["ReadOnlyPaths"][0].split()
    writable = d["ReadWritePaths"][0].split()
    assert d["ProtectSystem"] == ["strict"] and d["ProtectHome"] == ["yes"]
    assert _inside(node["data-path"], readable) and not _inside(node["data-path"], writable)
    for path in (node["model-dir"], node["privacy-dir"], node["identity-dir"],
                 env["FLWR_HOME"], env["FEDAMP_CACHE_DIR"], env["FEDAMP_STATE_DIR"]):
        assert _inside(path, writable), path
    from fedamp_flwr.identity import identity_dir

    assert _inside(str(identity_dir(node)), writable)  # the member's key, where it may write
    assert d["IPAddressDeny"] == ["any"]
    assert d["IPAddressAllow"][0].split() == ["localhost", values["SUPERLINK_IP"]]
    assert d["NoNewPrivileges"] == ["yes"] and d["UMask"] == ["0077"]
    # the node config is one this app takes: its ledger where the sandbox lets it write
    context = Context(run_id=1, node_id=1, node_config=node, state=RecordDict(), run_config={})
    privacy = NodePrivacy.of(context, RunConfig.from_run_config({"dp": "update"}), "run", True)
    assert privacy.max_epsilon == 8.0 and math.isfinite(privacy.max_epsilon)
    assert privacy.ledger_dir is not None and _inside(str(privacy.ledger_dir), writable)


def test_systemd_takes_every_directive(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not on this machine: the unit's directives are not "
                    "checked by systemd here")
    text, _ = _render(tmp_path)
    unit = tmp_path / "member-supernode.service"
    unit.write_text(text)
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                          text=True, timeout=60)
    said = [line for line in (done.stdout + done.stderr).splitlines() if unit.name in line]
    assert done.returncode == 0 and not said, said


@pytest.mark.slow
def test_a_member_checks_the_installed_app_against_the_reviewed_one(tmp_path, capsys,
                                                                     monkeypatch):
    from flwr.cli.build import build_fab_from_disk
    from flwr.cli.install import install_from_fab

    from fedamp_flwr.tools import cli

    root = Path(__file__).resolve().parents[1]
    data = build_fab_from_disk(root)
    assert build_fab_from_disk(root) == data  # reproducible: rebuilt, the same bytes
    # named as flwr build names it (publisher.name.version.sha256-prefix)
    fab = tmp_path / f"fedamp-flwr.fedamp-flwr.0-1-0.{hashlib.sha256(data).hexdigest()[:8]}.fab"
    fab.write_bytes(data)
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home"))
    installed = install_from_fab(fab, None, skip_prompt=True)  # as a SuperNode does
    assert cli.main(["verify-app", str(installed), "--fab", str(fab)]) == 0
    assert "is the reviewed app" in capsys.readouterr().out
    code = installed / "fedamp_flwr" / "client_app.py"
    code.write_text(code.read_text() + "\nprint('exfiltrate')\n")
    (installed / "fedamp_flwr" / "extra.py").write_text("")
    assert cli.main(["verify-app", str(installed), "--fab", str(fab)]) == 1
    said = capsys.readouterr().out
    assert "changed: fedamp_flwr/client_app.py" in said
    assert "not in the reviewed app: fedamp_flwr/extra.py" in said and "is NOT" in said
