"""A hardened fleet on loopback, made and run as docs/federation.md says.

TLS (certificates from ``deploy/make-certs.sh``), SuperNode authentication
(``--enable-supernode-auth``, keys registered with ``flwr supernode register``),
the SuperLink on an admin-only address and the public Fleet endpoint behind
``deploy/nginx-fleet.conf``, which forwards only the Fleet API. Each
organisation's SuperNode reads only its own data file (``dataset = "members"``) and
proves its name with its own key, against the roster the coordinator made of the
members' ``fedamp-flwr identity`` lines; a registered node that claims a member's
name is refused at once, and the member trains.
"""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from experiments.processes import wait_for_port

from .helpers import FLEET_SCHEMA, ROOT, app_files, free_port, member_file

FLWR = shutil.which("flwr")
TOOLS = {t: shutil.which(t) for t in ("openssl", "ssh-keygen", "nginx")}
pytestmark = [pytest.mark.flower, pytest.mark.skipif(
    FLWR is None or not all(TOOLS.values()),
    reason=f"needs flwr, openssl, ssh-keygen and nginx (missing: "
           f"{[t for t, p in TOOLS.items() if not p]})")]


def _post(port: int, path: str, cafile) -> int:
    """HTTP status of an empty POST to https://localhost:<port><path>."""
    ctx = ssl.create_default_context(cafile=str(cafile))
    req = urllib.request.Request(f"https://localhost:{port}{path}", data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def _wait_exit(proc, timeout: float) -> int | None:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def test_tls_authentication_and_a_fleet_endpoint_without_the_control_api(processes):
    tmp = processes.tmp
    subprocess.run([str(ROOT / "deploy" / "make-certs.sh"), str(tmp), "4", "localhost", "127.0.0.1"],
                   check=True, capture_output=True)
    certs, keys = tmp / "certs", tmp / "keys"
    admin, fleet = free_port(), free_port()
    # the SuperLink, on an address for admins only
    processes.start(["flower-superlink", "--ssl-ca-certfile", str(certs / "ca.crt"),
                     "--ssl-certfile", str(certs / "server.pem"),
                     "--ssl-keyfile", str(certs / "server.key"), "--enable-supernode-auth",
                     "--host", "127.0.0.1", "--port", str(admin)], "superlink")
    home = tmp / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "admin"\n\n[superlink.admin]\naddress = "127.0.0.1:{admin}"\n'
        f'root-certificates = "{certs / "ca.crt"}"\n')
    # the public Fleet endpoint
    conf = (ROOT / "deploy" / "nginx-fleet.conf").read_text()
    for key, value in {"WORK": tmp, "FLEET": f"127.0.0.1:{fleet}", "SUPERLINK": f"127.0.0.1:{admin}",
                       "CERTS": certs, "TLS_NAME": "localhost"}.items():
        conf = conf.replace("${" + key + "}", str(value))
    (tmp / "nginx.conf").write_text(conf)
    processes.start(["nginx", "-c", str(tmp / "nginx.conf"), "-p", str(tmp), "-g", "daemon off;"],
                    "nginx")
    assert wait_for_port(admin, 60) and wait_for_port(fleet, 60), processes.log("superlink")
    for i in (0, 1, 3):  # register three of the four keys (3: a node that is no member)
        subprocess.run([FLWR, "supernode", "register", str(keys / f"client_{i}.pub"), "admin"],
                       env=processes.env, cwd=tmp, check=True, capture_output=True, timeout=60)

    data = {i: member_file(tmp / f"org-{i}.npz", seed=i) for i in (0, 1)}
    # each member's key, made on its machine; the coordinator's roster of their lines
    tool = str(Path(FLWR).parent / "fedamp-flwr")
    roster = tmp / "roster.txt"
    roster.write_text("".join(subprocess.run(
        [tool, "identity", "--client-id", f"org-{i}", "--identity-dir", str(tmp / f"id-{i}")],
        capture_output=True, text=True, check=True, timeout=60).stdout for i in (0, 1)))

    def supernode(name: str, org: int, *extra: str, keys_of: str = ""):
        return processes.start(
            ["flower-supernode", "--superlink", f"127.0.0.1:{fleet}", "--port", str(free_port()),
             "--node-config", f"data-path='{data[org]}' client-id='org-{org}' "
             f"identity-dir='{tmp / (keys_of or f'id-{org}')}'", *extra], name)

    for i in (0, 1):
        supernode(f"supernode{i}", i, "--root-certificates", str(certs / "ca.crt"),
                  "--auth-supernode-private-key", str(keys / f"client_{i}"))
    # a registered node that claims org-0's name, with a member key of its own
    supernode("impostor", 0, "--root-certificates", str(certs / "ca.crt"),
              "--auth-supernode-private-key", str(keys / "client_3"), keys_of="id-impostor")
    retry = ("--max-retries", "1", "--max-wait-time", "10")
    refused = {
        "unregistered": supernode("unregistered", 0, "--root-certificates", str(certs / "ca.crt"),
                                  "--auth-supernode-private-key", str(keys / "client_2"), *retry),
        "without-ca": supernode("without-ca", 1, "--auth-supernode-private-key",
                                str(keys / "client_0"), *retry),
        "plaintext": supernode("plaintext", 1, "--insecure", *retry),
    }
    for name, proc in refused.items():
        assert _wait_exit(proc, 90) not in (None, 0), f"{name} was not refused"
    assert "Failed to activate SuperNode" in processes.log("unregistered")
    assert "CERTIFICATE_VERIFY_FAILED" in processes.log("without-ca")
    assert "could not establish a connection" in processes.log("plaintext")

    # the Control API answers on the admin address only
    assert _post(fleet, "/v1/control/list-nodes", certs / "ca.crt") == 404
    assert _post(admin, "/v1/control/list-nodes", certs / "ca.crt") != 404

    results = tmp / "results"
    out = subprocess.run(
        [FLWR, "run", str(app_files()), "admin", "--stream", "--run-config",
         f"{FLEET_SCHEMA} fedamp-sigma=10.0 num-server-rounds=1 min-nodes=2 alone=false "
         f"results-dir='{results}' run-name='tls' member-roster='{roster}'"],
        env=processes.env, cwd=tmp, capture_output=True, text=True, timeout=400)
    metrics_path = results / "tls" / "metrics.json"
    assert metrics_path.is_file(), out.stdout[-3000:] + out.stderr[-2000:]
    metrics = json.loads(metrics_path.read_text())
    assert metrics["finished"] and [r["trained_clients"] for r in metrics["rounds"]] == [[0, 1]]
    assert metrics["client_names"] == ["org-0", "org-1"]
    (attempt,) = metrics["impostors"]
    assert "claims member 'org-0': its key SHA256:" in attempt["why"]
    assert "the roster's" in attempt["why"]
    assert "Impostor refused: node" in out.stdout + out.stderr
    listed = subprocess.run([FLWR, "supernode", "list", "admin", "--format", "json"],
                            env=processes.env, cwd=tmp, capture_output=True, text=True, timeout=60)
    online = [n for n in json.loads(listed.stdout)["nodes"] if n["status"] == "online"]
    assert len(online) == 3
