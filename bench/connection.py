# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Per-task cost of the atls connection against ssh and local, measured in one run.

The same playbook (TASKS x ``ansible.builtin.command: /bin/true``) runs against HOSTS lab hosts
in each mode, with forks = HOSTS and pipelining on everywhere:
  atls   the agent on each host, attested and admin-authenticated (constellation.cluster.atls),
         default options: a fresh proof per task (a new quote over a new nonce, bound to the kept
         connection: the admin channel's Attest) and modules in the agent's pre-warmed interpreter
  atls-nofresh  the same with fresh_proof off: the handshake's attestation serves every task
  atls-cold  the default with warm_interpreter off: a fresh interpreter per module, as ssh and local
  ssh    an sshd started by this bench inside each host (ControlPersist, pipelining)
  mitogen  the ssh inventory with Mitogen's strategy (mitogen_linear, from PyPI's mitogen)
  local  ansible_connection=local with a shell that enters the host's namespaces (the lab's way)
The controller runs in the lab's admin namespace (10.42.0.1). Everything is torn down at the end.
Last line: one JSON object with the figures.

    .venv/bin/python bench/connection.py [--hosts 5] [--tasks 40] [--rounds 1] [--profile]

--profile first takes one task apart on the first host (docs/connection.md, "Where the time of one task goes"):
the aTLS connect, attestation and AdminAuth; an Exec round trip; the node's fresh interpreter
(start-up, imports, the whole module) against ExecModule's warm one; and, from a one-host
playbook, what is left on the controller (worker, payload, relay).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "collections"), str(Path(__file__).resolve().parents[1])]

import yaml  # noqa: E402  pylint: disable=wrong-import-position
from cryptography.hazmat.primitives import serialization  # noqa: E402  pylint: disable=wrong-import-position
from cryptography.hazmat.primitives.asymmetric import ed25519  # noqa: E402  pylint: disable=wrong-import-position

from lab.agent import start_agent, stop_agent  # noqa: E402  pylint: disable=wrong-import-position
from lab.image import lab_measurements  # noqa: E402  pylint: disable=wrong-import-position
from lab.lab import Lab  # noqa: E402  pylint: disable=wrong-import-position
from lab.netns import NetNS  # noqa: E402  pylint: disable=wrong-import-position
from ansible_collections.constellation.cluster.plugins.module_utils import kms  # noqa: E402  pylint: disable=wrong-import-position
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (  # noqa: E402  pylint: disable=wrong-import-position
    Measurements)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import VTPMValidator  # noqa: E402  pylint: disable=wrong-import-position
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient  # noqa: E402  pylint: disable=wrong-import-position
from tests.support import ROOT, VENV_BIN  # noqa: E402  pylint: disable=wrong-import-position

PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
RUN_TIMEOUT = 900


def sshd_config(work: Path, host) -> Path:
    cfg = work / ("sshd-%s.conf" % host.name)
    cfg.write_text("\n".join([
        "ListenAddress %s" % host.public_ip,
        "Port 22",
        "HostKey %s" % (work / "host_key"),
        "PidFile /run/sshd-bench.pid",
        "AuthorizedKeysFile %s" % (work / "authorized_keys"),
        "UsePAM no",
        "PermitRootLogin prohibit-password",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "StrictModes no",
        "UseDNS no",
        "MaxSessions 100",
        "MaxStartups 100",
        "",
    ]))
    return cfg


def start_sshd(work: Path, host) -> None:
    host.run(["mkdir", "-p", "/run/sshd"])  # the host's private /run
    host.run(["/usr/sbin/sshd", "-f", str(sshd_config(work, host))])


def stop_sshd(host) -> None:
    proc = host.run(["cat", "/run/sshd-bench.pid"], check=False)
    if proc.returncode == 0 and proc.stdout.strip().isdigit():
        try:
            os.kill(int(proc.stdout.strip()), 15)
        except ProcessLookupError:
            pass


def write_inventories(work: Path, lab: Lab, key_file: Path) -> dict:
    hosts = lab.hosts
    common = {"ansible_pipelining": True, "ansible_python_interpreter": PYTHON}
    atls = dict(common, ansible_connection="constellation.cluster.atls", constellation_measurements=lab_measurements(),
                constellation_admin_priv_key_file=str(key_file),
                constellation_atls_control_path_dir=str(work / "cp"),
                # The lab runs qemu-vtpm (no EK CA here): chosen explicitly, with its acknowledgement.
                constellation_attestation_variant="qemu-vtpm", constellation_insecure_trust_any_ak=True)
    ssh = dict(common, ansible_connection="ssh", ansible_user="root",
               ansible_ssh_private_key_file=str(work / "client_key"),
               ansible_ssh_common_args="-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
               ansible_ssh_args="-o ControlMaster=auto -o ControlPersist=60s",
               ansible_control_path_dir=str(work / "cp-ssh"))
    local = dict(common, ansible_connection="local")
    atls_cold = dict(atls, constellation_atls_warm_interpreter=False)
    atls_nofresh = dict(atls, constellation_atls_fresh_proof=False)
    inventories = {}
    for mode, group_vars in (("atls", atls), ("atls-nofresh", atls_nofresh), ("atls-cold", atls_cold), ("ssh", ssh),
                             ("mitogen", ssh), ("local", local)):
        host_vars = {}
        for h in hosts:
            if mode.startswith("atls"):
                host_vars[h.name] = {"constellation_public_endpoint": h.public_endpoint}
            elif mode in ("ssh", "mitogen"):
                host_vars[h.name] = {"ansible_host": h.public_ip}
            else:
                shell = work / ("%s-sh" % h.name)
                shell.write_text("#!/bin/sh\nexec %s /bin/sh \"$@\"\n" % " ".join(h.nsenter_prefix))
                shell.chmod(0o755)
                host_vars[h.name] = {"ansible_shell_executable": str(shell)}
        path = work / ("%s.yml" % mode)
        path.write_text(yaml.safe_dump({"all": {"vars": group_vars, "hosts": host_vars}}))
        inventories[mode] = path
    return inventories


def activate_all(lab: Lab, admin_key) -> None:
    pem = admin_key.public_key().public_bytes(serialization.Encoding.PEM,
                                              serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    validator = VTPMValidator(Measurements.from_dict(lab_measurements()))
    with NetNS(lab.bridge_netns) as admin_ns:
        for h in lab.hosts:
            sock = admin_ns.connect((h.public_ip, 9000))
            with AgentClient.connect(h.public_endpoint, [validator], sock=sock) as client:
                client.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), pem)


def _median_s(func, n: int) -> float:
    samples = []
    for _i in range(n):
        start = time.perf_counter()
        func()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def module_payload(work: Path) -> bytes:
    """A real AnsiballZ payload of ``command: /bin/true`` for PYTHON (ansible keeps it on request)."""
    env = dict(os.environ, ANSIBLE_KEEP_REMOTE_FILES="1", ANSIBLE_PIPELINING="0", ANSIBLE_NOCOLOR="1",
               ANSIBLE_REMOTE_TEMP=str(work / "remote-tmp"), ANSIBLE_LOCAL_TEMP=str(work / "ansible-local"))
    subprocess.run([str(VENV_BIN / "ansible"), "localhost", "-c", "local", "-m", "ansible.builtin.command", "-a",
                    "/bin/true", "-e", "ansible_python_interpreter=%s" % PYTHON], env=env, cwd=str(ROOT),
                   capture_output=True, check=True, timeout=RUN_TIMEOUT)
    (found,) = list((work / "remote-tmp").glob("ansible-tmp-*/AnsiballZ_command.py"))
    return found.read_bytes()


def profile(lab: Lab, work: Path, admin_key, inventory: Path, tasks: int) -> dict:
    """One task taken apart on the first host (seconds, medians)."""
    h = lab.hosts[0]
    payload = module_payload(work)
    validator = VTPMValidator(Measurements.from_dict(lab_measurements()))
    out = {}
    with NetNS(lab.bridge_netns) as admin_ns:
        def connect():
            with AgentClient.connect(h.public_endpoint, [validator],
                                     sock=admin_ns.connect((h.public_ip, 9000))) as client:
                client.admin_auth(admin_key)

        out["connect_attest_admin_auth"] = _median_s(connect, 5)
        with AgentClient.connect(h.public_endpoint, [validator], sock=admin_ns.connect((h.public_ip, 9000))) as c:
            c.admin_auth(admin_key)
            out["exec_round_trip_bin_true"] = _median_s(lambda: c.exec_command("/bin/true"), 20)
            out["exec_python_startup"] = _median_s(lambda: c.exec_command("%s -c pass" % PYTHON), 10)
            out["exec_module_plain"] = _median_s(lambda: c.exec_command("%s && sleep 0" % PYTHON, stdin=payload), 10)
            res = c.exec_command("%s -X importtime" % PYTHON, stdin=payload)
            top, basic = 0, 0
            for line in res.stderr.decode(errors="replace").splitlines():
                parts = line.split("|")
                if line.startswith("import time:") and len(parts) == 3 and parts[1].strip().isdigit():
                    if not parts[2].startswith("  "):
                        top += int(parts[1])
                    if parts[2].strip() == "ansible.module_utils.basic":
                        basic = int(parts[1])
            out["imports_all_us_in_importtime_run"] = top
            out["imports_module_utils_basic_us_in_importtime_run"] = basic
            cmd = "/bin/sh -c '%s && sleep 0'" % PYTHON
            c.exec_module(cmd, PYTHON, payload)  # starts the fork server
            out["exec_module_warm"] = _median_s(lambda: c.exec_module(cmd, PYTHON, payload), 10)
    one_host = work / "profile-play.yml"
    one_host.write_text(yaml.safe_dump([{
        "name": "profile", "hosts": h.name, "gather_facts": False,
        "tasks": [{"name": "true %d" % i, "ansible.builtin.command": "/bin/true", "changed_when": False}
                  for i in range(tasks)]}], sort_keys=False))
    out["playbook_one_host_s_per_task"] = run_playbook(lab, work, inventory, one_host, 1) / tasks
    out["controller_and_relay_s_per_task"] = out["playbook_one_host_s_per_task"] - out["exec_module_warm"]
    for name, value in out.items():
        print("  profile %-48s %10.4f" % (name, value), file=sys.stderr, flush=True)
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}


def mitogen_strategy_dir() -> Optional[str]:
    """Mitogen's strategy plugins (the ``mitogen`` package from PyPI, in the dev extra), or None."""
    try:
        import ansible_mitogen  # pylint: disable=import-outside-toplevel
    except ImportError:
        return None
    return str(Path(ansible_mitogen.__file__).parent / "plugins" / "strategy")


def run_playbook(lab: Lab, work: Path, inventory: Path, playbook: Path, forks: int) -> float:
    env = dict(os.environ, PATH="%s:%s" % (VENV_BIN, os.environ.get("PATH", "")),
               ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_HOST_KEY_CHECKING="False",
               ANSIBLE_LOCAL_TEMP=str(work / "ansible-local"))
    if inventory.stem == "mitogen":
        env.update(ANSIBLE_STRATEGY_PLUGINS=mitogen_strategy_dir(), ANSIBLE_STRATEGY="mitogen_linear")
    # local needs no network; its shell enters each host's namespaces with nsenter, which cannot
    # reassociate from inside `ip netns exec` (that makes a mount namespace of its own).
    prefix = [] if inventory.stem == "local" else ["ip", "netns", "exec", lab.bridge_netns]
    argv = prefix + [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), "--forks", str(forks), str(playbook)]
    start = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=RUN_TIMEOUT,
                          check=False)
    elapsed = time.monotonic() - start
    print("  %-12s %.2f s" % (inventory.stem, elapsed), file=sys.stderr, flush=True)
    if proc.returncode != 0:
        raise RuntimeError("%s failed (%d):\n%s\n%s"
                           % (inventory.name, proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:]))
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--hosts", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=1, help="runs per mode (the median is reported)")
    parser.add_argument("--lab", default="bcn")
    parser.add_argument("--profile", action="store_true", help="take one task apart on the first host first")
    args = parser.parse_args()
    if not 1 <= args.hosts <= 16 or not 1 <= args.tasks <= 400 or not 1 <= args.rounds <= 5:
        parser.error("hosts 1-16, tasks 1-400, rounds 1-5")

    load_start = round(os.getloadavg()[0], 2)
    work = Path(tempfile.mkdtemp(prefix="constellation-bench-connection-"))
    lab = Lab(args.lab, inventory_dir=None)
    agents = []
    try:
        lab.up(hosts=args.hosts, tpm=True, variant="qemu-vtpm")
        admin_key = ed25519.Ed25519PrivateKey.generate()
        key_file = work / "admin.key"
        key_file.write_bytes(admin_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption()))
        key_file.chmod(0o600)
        for h in lab.hosts:
            agents.append(start_agent(lab, h))
        activate_all(lab, admin_key)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(work / "host_key")], check=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(work / "client_key")], check=True)
        shutil.copy(work / "client_key.pub", work / "authorized_keys")
        for h in lab.hosts:
            start_sshd(work, h)
        inventories = write_inventories(work, lab, key_file)
        playbook = work / "play.yml"
        playbook.write_text(yaml.safe_dump([{
            "name": "bench", "hosts": "all", "gather_facts": False,
            "tasks": [{"name": "true %d" % i, "ansible.builtin.command": "/bin/true", "changed_when": False}
                      for i in range(args.tasks)],
        }], sort_keys=False))

        profiled = profile(lab, work, admin_key, inventories["atls"], args.tasks) if args.profile else None
        modes = ["atls", "atls-nofresh", "atls-cold", "ssh", "mitogen", "local"]
        if mitogen_strategy_dir() is None:
            print("mitogen is not installed (make setup installs it): no mitogen baseline", file=sys.stderr)
            modes.remove("mitogen")
        times = {mode: [] for mode in modes}
        for _round in range(args.rounds):
            for mode in times:  # interleaved, so load changes hit every mode alike
                times[mode].append(run_playbook(lab, work, inventories[mode], playbook, args.hosts))
        per_task = {mode: statistics.median(t) / args.tasks for mode, t in times.items()}
    finally:
        for h in lab.hosts:
            try:
                stop_sshd(h)
            except Exception:  # pylint: disable=broad-except
                pass
        for proc in agents:
            try:
                stop_agent(proc)
            except Exception:  # pylint: disable=broad-except
                pass
        lab.down()
        shutil.rmtree(work, ignore_errors=True)

    print("%d hosts x %d tasks of command: /bin/true, forks %d, pipelining on, interpreter %s, %d round(s)"
          % (args.hosts, args.tasks, args.hosts, PYTHON, args.rounds))
    print("%-13s %12s %14s %10s" % ("mode", "playbook s", "s per task", "vs ssh"))
    for mode, t in times.items():
        ratio = per_task[mode] / per_task["ssh"]
        print("%-13s %12.2f %14.4f %10.2f" % (mode, statistics.median(t), per_task[mode], ratio))
    result = {
        "hosts": args.hosts, "tasks": args.tasks, "rounds": args.rounds,
        "atls_s_per_task": round(per_task["atls"], 4),
        "ssh_s_per_task": round(per_task["ssh"], 4),
        "local_s_per_task": round(per_task["local"], 4),
        "atls_vs_ssh": round(per_task["atls"] / per_task["ssh"], 3),
        "atls_vs_local": round(per_task["atls"] / per_task["local"], 3),
        "atls_cold_s_per_task": round(per_task["atls-cold"], 4),
        "atls_cold_vs_ssh": round(per_task["atls-cold"] / per_task["ssh"], 3),
        "atls_nofresh_s_per_task": round(per_task["atls-nofresh"], 4),
        "fresh_proof_s_per_task": round(per_task["atls"] - per_task["atls-nofresh"], 4),
        "load_avg_1m_start": load_start,
        "load_avg_1m_end": round(os.getloadavg()[0], 2),
    }
    if "mitogen" in per_task:
        result["mitogen_s_per_task"] = round(per_task["mitogen"], 4)
        result["atls_vs_mitogen"] = round(per_task["atls"] / per_task["mitogen"], 3)
    if profiled:
        result["profile"] = profiled
    print("atls (fresh proof per task)/ssh %.2f (goal <= 0.5), atls/local %.2f (goal <= 1.0), atls/mitogen %s, "
          "atls-cold/ssh %.2f; a fresh proof costs %.1f ms per task; load %.2f -> %.2f"
          % (result["atls_vs_ssh"], result["atls_vs_local"], result.get("atls_vs_mitogen", "n/a"),
             result["atls_cold_vs_ssh"], 1000 * result["fresh_proof_s_per_task"], load_start,
             result["load_avg_1m_end"]))
    print(json.dumps(result, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
