# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The atls connection plugin against real agents in a lab (swtpm-backed attestation).

h1, h2: activated (each as the Coordinator of its own cluster) with an admin key made here.
h3: running, never activated. h4: its boot chain measured something else after the inventory
(with the lab image's policy) was written. The controller runs in the lab's admin namespace,
as an operator's machine would reach the nodes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from lab.agent import agent_dir, start_agent, stop_agent
from lab.image import lab_measurements
from lab.lab import Lab
from lab.netns import NetNS
from tests.support import ROOT
from ansible_collections.constellation.cluster.plugins.module_utils import kms
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import Measurements
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import VTPMValidator
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient

pytestmark = pytest.mark.lab

VENV_BIN = ROOT / ".venv" / "bin"


def _write_key(path: Path) -> ed25519.Ed25519PrivateKey:
    key = ed25519.Ed25519PrivateKey.generate()
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)
    return key


class Env:
    def __init__(self, lab: Lab, tmp: Path):
        self.lab = lab
        self.tmp = tmp
        self.hosts = {h.name: h for h in lab.hosts}
        self.admin_ns = NetNS(lab.bridge_netns)
        self.procs = {}
        self.key_file = tmp / "admin.key"
        self.admin_key = _write_key(self.key_file)
        self.other_key_file = tmp / "other.key"
        _write_key(self.other_key_file)
        self.control_dir = tmp / "cp"
        self.inventory = tmp / "hosts.yml"
        host_vars = {}
        for h in lab.hosts:
            host_vars[h.name] = {"constellation_public_endpoint": h.public_endpoint}
        self.inventory.write_text(yaml.safe_dump({"all": {
            "vars": {
                "ansible_connection": "constellation.cluster.atls",
                "ansible_pipelining": True,
                "ansible_python_interpreter": str(VENV_BIN / "python"),
                "constellation_measurements": lab_measurements(),
                # The lab runs qemu-vtpm here (this file validates with VTPMValidator itself): acknowledged.
                "constellation_attestation_variant": "qemu-vtpm",
                "constellation_insecure_trust_any_ak": True,
                "constellation_admin_priv_key_file": str(self.key_file),
                "constellation_atls_control_path_dir": str(self.control_dir),
            },
            "hosts": host_vars,
        }}))

    def activate(self, name: str) -> None:
        h = self.hosts[name]
        sock = self.admin_ns.connect((h.public_ip, 9000))
        pem = self.admin_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                       serialization.PublicFormat.SubjectPublicKeyInfo).decode()
        validator = VTPMValidator(Measurements.from_dict(lab_measurements()))
        with AgentClient.connect(h.public_endpoint, [validator], sock=sock) as client:
            client.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), pem)

    def ansible(self, argv, extra_env=None, in_admin_ns=True):
        env = dict(os.environ, PATH="%s:%s" % (VENV_BIN, os.environ.get("PATH", "")),
                   ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                   ANSIBLE_HOST_KEY_CHECKING="False", ANSIBLE_LOCAL_TEMP=str(self.tmp / "ansible-local"))
        env.update(extra_env or {})
        prefix = ["ip", "netns", "exec", self.lab.bridge_netns] if in_admin_ns else []
        return subprocess.run(prefix + [str(VENV_BIN / argv[0])] + list(argv[1:]) + ["-i", str(self.inventory)],
                              capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=300, check=False)

    def playbook(self, tasks, hosts="h1,h2", extra_env=None, gather_facts=False, args=()):
        play = self.tmp / ("play-%d.yml" % len(list(self.tmp.glob("play-*.yml"))))
        play.write_text(yaml.safe_dump([{"name": "atls", "hosts": hosts, "gather_facts": gather_facts,
                                         "tasks": tasks}], sort_keys=False))
        return self.ansible(["ansible-playbook", str(play)] + list(args), extra_env)

    def admin_auth_count(self, name: str) -> int:
        log = agent_dir(self.hosts[name]) / "agent.log"
        return sum(1 for line in log.read_text(errors="replace").splitlines() if '"admin_authenticated"' in line)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    lab = Lab("cnx", inventory_dir=None)
    lab.up(hosts=4, tpm=True, variant="qemu-vtpm")  # this file validates with VTPMValidator itself
    e = Env(lab, tmp_path_factory.mktemp("atls"))
    try:
        for name in e.hosts:
            e.procs[name] = start_agent(lab, e.hosts[name])
        e.activate("h1")
        e.activate("h2")
        lab.tamper("h4")  # after the inventory (the image's policy) was written
        yield e
    finally:
        for proc in e.procs.values():
            try:
                stop_agent(proc)
            except Exception:  # pylint: disable=broad-except
                pass
        e.admin_ns.close()
        lab.down()


def _ok(proc):
    assert proc.returncode == 0, "rc=%d\n%s\n%s" % (proc.returncode, proc.stdout[-4000:], proc.stderr[-4000:])
    return proc


def test_modules_run_over_atls(env):
    src = env.tmp / "in.txt"
    src.write_text("hello over atls\n")
    template = env.tmp / "t.j2"
    template.write_text("host={{ inventory_hostname }} ip={{ ansible_facts.eth0.ipv4.address }}\n")
    fetched = env.tmp / "fetched"
    tasks = [
        {"name": "setup", "ansible.builtin.setup": {"gather_subset": ["min", "network"]}},
        {"name": "command with stdin", "ansible.builtin.command": {"cmd": "cat", "stdin": "to the node"},
         "register": "cat", "changed_when": False},
        {"name": "copy", "ansible.builtin.copy": {
            "src": str(src), "dest": "/tmp/atls-{{ inventory_hostname }}.txt", "mode": "0640"}},
        {"name": "template", "ansible.builtin.template": {
            "src": str(template), "dest": "/tmp/atls-{{ inventory_hostname }}.conf", "mode": "0600"}},
        {"name": "fetch", "ansible.builtin.fetch": {
            "src": "/tmp/atls-{{ inventory_hostname }}.conf", "dest": str(fetched) + "/"}},
        {"name": "collection module", "constellation.cluster.attestation_info": {
            "tcti": "swtpm:host=127.0.0.1,port=2321"},
         "register": "att"},
        {"name": "report", "ansible.builtin.copy": {
            "dest": "/tmp/atls-result-{{ inventory_hostname }}.json", "mode": "0600",
            "content": "{{ {'cat': cat.stdout, 'pcrs': att.pcrs, 'initialized': att.initialized} | to_json }}"}},
    ]
    proc = _ok(env.playbook(tasks))
    assert "unreachable=0" in proc.stdout and "failed=0" in proc.stdout
    for name in ("h1", "h2"):
        h = env.hosts[name]
        # The template ran on the controller with facts gathered inside the node's namespace.
        got = (fetched / name / "tmp" / ("atls-%s.conf" % name)).read_text()
        assert got == "host=%s ip=%s\n" % (name, h.public_ip)
        assert Path("/tmp/atls-%s.txt" % name).read_text() == "hello over atls\n"
        assert oct(Path("/tmp/atls-%s.txt" % name).stat().st_mode & 0o777) == "0o640"
    for name in ("h1", "h2"):
        result = json.loads(Path("/tmp/atls-result-%s.json" % name).read_text())
        assert result["cat"] == "to the node"
        # The collection's module read this node's TPM: the lab image's PCR 9 and the node lock.
        assert result["pcrs"]["9"] == lab_measurements()["9"]["expected"]
        assert result["initialized"] is True


def test_one_attested_connection_per_host_and_run(env):
    before = env.admin_auth_count("h1")
    tasks = [{"name": "t%d" % i, "ansible.builtin.command": "/bin/true", "changed_when": False} for i in range(6)]
    _ok(env.playbook(tasks, hosts="h1"))
    assert env.admin_auth_count("h1") - before == 1  # 6 tasks, one TLS connection, attested once
    # A new run attests again; a reset_connection drops the kept connection.
    tasks.insert(3, {"name": "reset", "ansible.builtin.meta": "reset_connection"})
    _ok(env.playbook(tasks, hosts="h1"))
    assert env.admin_auth_count("h1") - before == 3
    # persist=0: every task opens and attests its own connection.
    _ok(env.playbook(tasks[:3], hosts="h1", extra_env={"CONSTELLATION_ATLS_PERSIST": "0"}))
    assert env.admin_auth_count("h1") - before == 6


def _attest_task(netns=None):
    """agent_state from the controller, as site.yml's step 1 attests every peer."""
    args = {"endpoint": "{{ constellation_public_endpoint }}", "measurements": "{{ constellation_measurements }}",
            "variant": "qemu-vtpm", "insecure_trust_any_ak": True}
    if netns:
        args["netns"] = netns
    return {"name": "attest", "constellation.cluster.agent_state": args, "register": "attested"}


def test_an_attested_activated_host_gets_its_relay_started_in_the_background(env):
    def play(hosts, prestart, checks):
        # A control folder of its own: what is in it after the attestation was made by this run.
        control_dir = env.tmp / ("cp-%s-%s" % (hosts, prestart))
        listed = {"name": "relays", "ansible.builtin.find": {"paths": str(control_dir), "patterns": "atls-*"},
                  "delegate_to": "localhost", "register": "relays",
                  "vars": {"ansible_connection": "local", "ansible_python_interpreter": str(VENV_BIN / "python")}}
        return env.playbook([_attest_task(), listed] + checks, hosts=hosts,
                            extra_env={"CONSTELLATION_ATLS_PRESTART": prestart},
                            args=["-e", "constellation_atls_control_path_dir=%s" % control_dir])

    command = {"name": "command", "ansible.builtin.command": "echo ran", "register": "ran", "changed_when": False}
    for prestart, relays in (("true", "relays.matched > 0"), ("false", "relays.matched == 0")):
        before = env.admin_auth_count("h1")
        # Right after the attestation, before any task used the connection, the relay is starting
        # (its lock, then its socket) or not; the command then runs on it.
        _ok(play("h1", prestart, [command, {"name": "check", "ansible.builtin.assert": {
            "that": [relays, "attested.state == 'ActivatingNodes'", "ran.stdout == 'ran'"]}}]))
        assert env.admin_auth_count("h1") - before == 1  # one attested connection either way
    # A host whose admin channel is closed (never activated) gets no relay; nothing fails.
    _ok(play("h3", "true", [{"name": "none", "ansible.builtin.assert": {
        "that": ["relays.matched == 0", "attested.state == 'AcceptingInit'"]}}]))


def test_tampered_host_is_unreachable_with_the_pcr(env):
    for persist in ("60", "0"):
        proc = env.ansible(["ansible", "h4", "-m", "ansible.builtin.command", "-a", "/bin/true"],
                           {"CONSTELLATION_ATLS_PERSIST": persist})
        assert proc.returncode == 4, proc.stdout + proc.stderr  # 4: unreachable
        out = proc.stdout + proc.stderr
        assert "UNREACHABLE" in out and "attestation refused" in out
        policy = lab_measurements()["9"]["expected"]
        assert "PCR 9: expected %s, found " % policy in out
    assert env.admin_auth_count("h4") == 0  # nothing reached its admin channel


def test_wrong_admin_key_is_not_authorised(env):
    for persist in ("60", "0"):
        proc = env.ansible(["ansible", "h1", "-m", "ansible.builtin.command", "-a", "/bin/true",
                            "-e", "constellation_admin_priv_key_file=%s" % env.other_key_file],
                           {"CONSTELLATION_ATLS_PERSIST": persist})
        assert proc.returncode == 4, proc.stdout + proc.stderr
        assert "not authorised" in proc.stdout + proc.stderr
    # The relay started in the background after the attestation fails quietly; the first task over
    # the connection reports why.
    proc = env.playbook([_attest_task(), {"name": "command", "ansible.builtin.command": "/bin/true"}], hosts="h1",
                        args=["-e", "constellation_admin_priv_key_file=%s" % env.other_key_file])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4, out
    assert re.search(r"^ok: \[h1\]", out.split("TASK [command]", 1)[0], re.M), out  # attested
    assert "not authorised" in out.split("TASK [command]", 1)[1]


def test_before_activation_exec_is_refused_but_attestation_works(env):
    proc = env.ansible(["ansible", "h3", "-m", "ansible.builtin.command", "-a", "/bin/true"])
    assert proc.returncode == 4, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert "attested, but the admin channel is refused" in out and "only after activation" in out
    # Attestation itself still works for that host:
    h = env.hosts["h3"]
    validator = VTPMValidator(Measurements.from_dict(lab_measurements()))
    with AgentClient.connect(h.public_endpoint, [validator], sock=env.admin_ns.connect((h.public_ip, 9000))) as c:
        assert c.get_state()["state"] == "AcceptingInit"


def test_large_and_binary_files_survive_put_and_fetch(env):
    big = env.tmp / "big.bin"
    with open(big, "wb") as handle:
        for _mib in range(100):
            handle.write(os.urandom(1 << 20))
    every_byte = env.tmp / "bytes.bin"
    every_byte.write_bytes(bytes(range(256)) * 4 + b"\x00\r\n\x1a" + bytes(range(255, -1, -1)))
    fetched = env.tmp / "fetched-big"
    tasks = []
    for src in (big, every_byte):
        tasks += [
            {"name": "put %s" % src.name, "ansible.builtin.copy": {"src": str(src), "dest": "/tmp/atls-%s" % src.name,
                                                                   "mode": "0600"}},
            {"name": "fetch %s" % src.name, "ansible.builtin.fetch": {"src": "/tmp/atls-%s" % src.name,
                                                                      "dest": str(fetched) + "/", "flat": False}},
        ]
    _ok(env.playbook(tasks, hosts="h1"))
    for src in (big, every_byte):
        want = hashlib.sha256(src.read_bytes()).hexdigest()
        assert hashlib.sha256(Path("/tmp/atls-%s" % src.name).read_bytes()).hexdigest() == want
        assert hashlib.sha256((fetched / "h1" / "tmp" / ("atls-%s" % src.name)).read_bytes()).hexdigest() == want
        os.unlink("/tmp/atls-%s" % src.name)


def test_netns_option_reaches_the_lab_from_outside(env):
    proc = env.ansible(["ansible", "h2", "-m", "ansible.builtin.command", "-a", "ip -4 -o addr show dev eth0",
                        "-e", "constellation_atls_netns=%s" % env.lab.bridge_netns], in_admin_ns=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert env.hosts["h2"].public_ip in proc.stdout


def _agent_events(env, name, event):
    log = agent_dir(env.hosts[name]) / "agent.log"
    events = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == event:
            events.append(record)
    return events


VOLATILE = {"start", "end", "delta", "ansible_date_time"}


def _stable(value):
    """A result without what differs between any two runs (times, the controller's temp paths)."""
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    if isinstance(value, str):
        return re.sub(r"ansible-tmp-[0-9.-]+", "ansible-tmp-X", value)
    return value


def test_warm_interpreter_gives_the_same_results_as_a_fresh_one(env):
    src = env.tmp / "warm.j2"
    src.write_text("{{ inventory_hostname }} {{ 6 * 7 }}\n")
    tasks = [
        {"name": "command", "ansible.builtin.command": {"cmd": "cat", "stdin": "warm?"}, "register": "r_command",
         "changed_when": False},
        {"name": "copy", "ansible.builtin.copy": {"content": "c\n", "dest": "/tmp/atls-warm-{{ inventory_hostname }}-"
                                                  "{{ mode }}.txt", "mode": "0600"}, "register": "r_copy"},
        {"name": "template", "ansible.builtin.template": {
            "src": str(src), "dest": "/tmp/atls-warm-{{ inventory_hostname }}-{{ mode }}.conf", "mode": "0600"},
         "register": "r_template"},
        {"name": "setup", "ansible.builtin.setup": {"gather_subset": ["min"]}, "register": "r_setup"},
        {"name": "failing", "ansible.builtin.command": "/bin/false", "register": "r_fail", "ignore_errors": True},
        {"name": "failing module", "ansible.builtin.copy": {"src": "/nonexistent/atls", "remote_src": True,
                                                            "dest": "/tmp/atls-never"},
         "register": "r_fail_module", "ignore_errors": True},
        {"name": "report", "ansible.builtin.copy": {
            "dest": "/tmp/atls-warm-result-{{ inventory_hostname }}-{{ mode }}.json", "mode": "0600",
            "content": "{{ {'command': r_command, 'copy': r_copy, 'template': r_template, 'setup': r_setup, "
                       "'fail': r_fail, 'fail_module': r_fail_module} | to_json }}"}},
    ]
    warm_before = len([e for e in _agent_events(env, "h1", "exec_module") if e.get("warm")])
    for mode, flag in (("warm", "1"), ("cold", "0")):
        _ok(env.ansible(["ansible-playbook", str(_play(env, tasks, "h1")), "-e", "mode=%s" % mode],
                        {"CONSTELLATION_ATLS_WARM_INTERPRETER": flag}))
        if mode == "warm":
            warm_runs = len([e for e in _agent_events(env, "h1", "exec_module") if e.get("warm")]) - warm_before
            assert warm_runs >= 8  # every module of the play (copy and template run several)
    results = {}
    for mode in ("warm", "cold"):
        text = Path("/tmp/atls-warm-result-h1-%s.json" % mode).read_text()
        results[mode] = json.loads(text.replace("-%s." % mode, "-MODE."))
    warm, cold = _stable(results["warm"]), _stable(results["cold"])
    assert warm["fail"]["rc"] == 1 and warm["fail"]["failed"] is True
    assert "/nonexistent/atls" in warm["fail_module"]["msg"] and warm["fail_module"]["failed"] is True
    assert warm["command"]["stdout"] == "warm?"
    assert warm == cold
    # No task's values reach the agent's log.
    assert "warm?" not in (agent_dir(env.hosts["h1"]) / "agent.log").read_text(errors="replace")


def _play(env, tasks, hosts):
    play = env.tmp / ("play-%d.yml" % len(list(env.tmp.glob("play-*.yml"))))
    play.write_text(yaml.safe_dump([{"name": "atls", "hosts": hosts, "gather_facts": False, "tasks": tasks}],
                                   sort_keys=False))
    return play


def test_warm_interpreter_off_and_raw_use_plain_exec_and_a_dead_fork_server_is_replaced(env):
    before = len(_agent_events(env, "h2", "exec_module"))
    _ok(env.playbook([{"name": "cold", "ansible.builtin.command": "/bin/true", "changed_when": False},
                      {"name": "raw", "ansible.builtin.raw": "echo raw"}],
                     hosts="h2", extra_env={"CONSTELLATION_ATLS_WARM_INTERPRETER": "0"}))
    _ok(env.playbook([{"name": "raw", "ansible.builtin.raw": "echo raw"}], hosts="h2"))
    assert len(_agent_events(env, "h2", "exec_module")) == before  # all ran as Exec
    task = [{"name": "warm", "ansible.builtin.command": "/bin/true", "changed_when": False}]
    _ok(env.playbook(task, hosts="h2"))
    started = _agent_events(env, "h2", "warm_server_started")
    assert started and _agent_events(env, "h2", "exec_module")[-1]["warm"] is True
    # The next playbook run rebuilds the module zip (new timestamps): its server is still warm.
    _ok(env.playbook(task, hosts="h2"))
    assert _agent_events(env, "h2", "exec_module")[-1]["warm"] is True
    assert _agent_events(env, "h2", "warm_server_started") == started
    for record in started:
        try:
            os.kill(record["pid"], 9)
        except ProcessLookupError:
            pass
    _ok(env.playbook(task, hosts="h2"))
    assert _agent_events(env, "h2", "exec_module")[-1]["warm"] is True
    assert len(_agent_events(env, "h2", "warm_server_started")) == len(started) + 1


def _tamper_tasks(env, name):
    """A command, then (on the controller) the host's PCR 9 extended as a modified boot would, then a
    command again."""
    tamper = {"name": "tamper", "ansible.builtin.command": {
        "argv": [str(VENV_BIN / "python"), "-m", "lab", "--name", env.lab.name, "tamper", name],
        "chdir": str(ROOT)}, "delegate_to": "localhost", "changed_when": False,
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": str(VENV_BIN / "python")}}
    return [{"name": "before", "ansible.builtin.command": "echo before-ran", "changed_when": False}, tamper,
            {"name": "after", "ansible.builtin.command": "echo after-ran", "changed_when": False}]


def _tamper_between_two_tasks(env, name, extra_env=None):
    """A play of three tasks on ``name`` (_tamper_tasks): the second command runs on the connection
    the first task used."""
    play = env.tmp / ("tamper-%s.yml" % name)
    play.write_text(yaml.safe_dump([{"name": "atls", "hosts": name, "gather_facts": False,
                                     "tasks": _tamper_tasks(env, name)}], sort_keys=False))
    # The controller stays in the root namespaces (the lab's tamper enters the host's mount namespace,
    # which it cannot from inside `ip netns exec`); the plugin opens its sockets in the admin's.
    return env.ansible(["ansible-playbook", str(play), "-e", "constellation_atls_netns=%s" % env.lab.bridge_netns],
                       extra_env, in_admin_ns=False)


# Last in the file: these tamper h1 and h2 for good (PCRs only extend).
def test_a_host_tampered_between_two_tasks_is_refused_for_the_second(env):
    # Without fresh proofs the kept connection's handshake vouches for every task it serves: the
    # second task still runs on the modified host (the weakness fresh proofs close).
    proc = _ok(_tamper_between_two_tasks(env, "h1", {"CONSTELLATION_ATLS_FRESH_PROOF": "false"}))
    assert re.search(r"^ok: \[h1\]", proc.stdout.split("TASK [after]", 1)[1], re.M), proc.stdout[-3000:]
    # By default every task on a kept connection gets a new quote over a new nonce, bound to that
    # connection: the modified host is unreachable for the second task, with its PCR, and nothing ran.
    before = env.admin_auth_count("h2")
    proc = _tamper_between_two_tasks(env, "h2")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4, out[-4000:]
    assert re.search(r"^ok: \[h2\]", out.split("TASK [tamper]", 1)[0], re.M), out[-4000:]  # before ran
    assert "UNREACHABLE!" in out.split("TASK [after]", 1)[1]
    assert "fresh attestation refused on the kept connection, nothing was sent" in out
    assert "PCR 9: expected %s, found " % lab_measurements()["9"]["expected"] in out
    assert env.admin_auth_count("h2") - before == 1  # one connection: the refusal came on the kept one


def test_a_host_tampered_after_its_relay_was_started_in_the_background_is_refused(env):
    # The attestation starts h3's relay, whose handshake is then attested; the host is modified
    # before any task used it: the first task gets a fresh proof, not the handshake's, and is refused.
    env.activate("h3")
    control_dir = env.tmp / "cp-prestart-tamper"
    # The relay listens only once its handshake was attested and AdminAuth passed: wait for its socket
    # (bounded), so the host is modified after that handshake, never before it.
    find = {"paths": str(control_dir), "patterns": "atls-*.sock", "file_type": "any"}
    listening = {"name": "relay listening", "ansible.builtin.find": find, "register": "relays", "until": "relays.matched > 0", "retries": 100, "delay": 0.1,
                 "delegate_to": "localhost",
                 "vars": {"ansible_connection": "local", "ansible_python_interpreter": str(VENV_BIN / "python")}}
    play = env.tmp / "prestart-tamper.yml"
    tasks = [_attest_task(netns=env.lab.bridge_netns), listening] + _tamper_tasks(env, "h3")[1:]
    play.write_text(yaml.safe_dump([{"name": "atls", "hosts": "h3", "gather_facts": False, "tasks": tasks}],
                                   sort_keys=False))
    before = env.admin_auth_count("h3")
    proc = env.ansible(["ansible-playbook", str(play), "-e", "constellation_atls_netns=%s" % env.lab.bridge_netns,
                        "-e", "constellation_atls_control_path_dir=%s" % control_dir], in_admin_ns=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4, out[-4000:]
    assert re.search(r"^ok: \[h3\]", out.split("TASK [tamper]", 1)[0], re.M), out[-4000:]  # attested
    assert "UNREACHABLE!" in out.split("TASK [after]", 1)[1] and "after-ran" not in out
    assert "fresh attestation refused on the kept connection, nothing was sent" in out
    assert env.admin_auth_count("h3") - before == 1  # the relay's connection, started before the tamper
