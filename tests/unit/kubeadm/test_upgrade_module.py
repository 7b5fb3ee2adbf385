"""The modules kubeadm_upgrade and kubernetes_node_drain (their main, with the arguments Ansible would pass)
on a cluster the kubeadm TEST DOUBLE made (tests/doubles/kubeadm: control-plane-0 initialised, control-plane-1
joined as a control plane, worker-0 and worker-1 joined), with the STAND-IN for the Kubernetes API server
(tests/doubles/kube_apiserver.py) serving it on loopback, and the TEST DOUBLE of the environment's kubelet
installation (tests/doubles/kubelet_package). kubeadm is driven at the process boundary; the double records
the cluster's versions, so a second run really finds nothing to do.

Against a real cluster when CONSTELLATION_TEST_KUBECONFIG names an admin kubeconfig: the read-only checks
(versions read, nothing to do at the cluster's own version, two minor versions refused)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.roll import read_cluster_versions
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.upgrade import UpgradeRefused, Version, plan_upgrade
from ansible_collections.constellation.cluster.plugins.modules import kubeadm_upgrade, kubernetes_node_drain
from ansible_collections.constellation.cluster.tests.support.kube_standin import KUBEADM_DOUBLE, ApiServerStandIn, build_double_cluster

KUBELET_PACKAGE = os.path.join(os.path.dirname(KUBEADM_DOUBLE), "kubelet_package")
REAL_KUBECONFIG = os.environ.get("CONSTELLATION_TEST_KUBECONFIG")
REAL = pytest.mark.skipif(not REAL_KUBECONFIG, reason="set CONSTELLATION_TEST_KUBECONFIG to a reachable cluster's "
                                                      "admin kubeconfig to run this against a real API server")
OLD, NEW = "v1.31.1", "v1.32.0"
NODES = ("control-plane-0", "control-plane-1", "worker-0", "worker-1")


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Template:
    """The double's cluster, made once per module (init and three joins take seconds): each test works on a
    copy of its directories, served by its own stand-in on the same loopback endpoint."""

    def __init__(self, root):
        self.endpoint = "127.0.0.1:%d" % _free_port()
        self.root = root
        build_double_cluster(root, self.endpoint, OLD, control_planes=NODES[:2], workers=NODES[2:])


class Cluster:
    """A copy of the template: ``dirs[node]`` is each node's kubernetes directory; ``log`` the double's log."""

    def __init__(self, template, tmp_path, monkeypatch):
        shutil.copytree(template.root, str(tmp_path / "nodes"), symlinks=True)
        self.dirs = {name: str(tmp_path / "nodes" / name / "kubernetes") for name in NODES}
        self.log = tmp_path / "kubeadm-double.log"
        monkeypatch.setenv("KUBEADM_DOUBLE_LOG", str(self.log))
        monkeypatch.setenv("KUBEADM_DOUBLE_CLUSTER", self.dirs["control-plane-0"])
        monkeypatch.setenv("KUBEADM_DOUBLE_VERSION", NEW)  # the hosts' kubeadm is the new one already
        self.apiserver = ApiServerStandIn(self.dirs["control-plane-0"], str(tmp_path), listen=template.endpoint)
        self.admin = os.path.join(self.dirs["control-plane-0"], "admin.conf")

    def state(self):
        with open(os.path.join(self.dirs["control-plane-0"], ".kubeadm-double", "state.json"), encoding="utf-8") as handle:
            return json.load(handle)

    def put_pods(self, *pods):
        state = self.state()
        state["pods"] = list(pods)
        path = os.path.join(self.dirs["control-plane-0"], ".kubeadm-double", "state.json")
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(state, handle)

    def calls(self, command=None):
        if not self.log.exists():
            return []
        calls = [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]
        return [c for c in calls if command is None or c.get("command") == command]

    def kubelet(self, node, *args):
        return subprocess.run([KUBELET_PACKAGE] + list(args) + ["--kubernetes-dir", self.dirs[node]],
                              capture_output=True, text=True, check=False)


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    return Template(str(tmp_path_factory.mktemp("upgrade-template")))


@pytest.fixture
def cluster(template, tmp_path, monkeypatch):
    made = Cluster(template, tmp_path, monkeypatch)
    yield made
    made.apiserver.stop()


def run(capsys, module, args, check_mode=False):
    with patch_module_args(dict(args, _ansible_check_mode=check_mode)), pytest.raises(SystemExit) as done:
        module.main()
    result = json.loads(capsys.readouterr().out)
    assert (done.value.code == 0) != bool(result.get("failed"))
    result.pop("invocation", None)
    return result


def upgrade(capsys, cluster, node, step, version=NEW, check_mode=False, **extra):
    args = dict(kubernetes_version=version, step=step, kubeadm_path=KUBEADM_DOUBLE, kubernetes_dir=cluster.dirs[node],
                node_name=node)
    args.update(extra)
    return run(capsys, kubeadm_upgrade, args, check_mode)


def drain(capsys, cluster, node, state="drained", check_mode=False, **extra):
    return run(capsys, kubernetes_node_drain, dict(node_name=node, state=state, kubeconfig=cluster.admin, **extra),
               check_mode)


def test_plan_reads_every_version_and_predicts_the_roll(cluster, capsys):
    for check_mode in (True, False):
        result = upgrade(capsys, cluster, "control-plane-0", "plan", check_mode=check_mode,
                         first_control_plane="control-plane-0")
        assert not result.get("failed") and result["changed"] is False, result
        assert result["cluster_version"] == OLD and result["target"] == NEW
        assert result["order"] == ["control-plane-0", "control-plane-1", "worker-0", "worker-1"]
        assert result["pending"] == result["order"]
        assert {n["name"]: (n["control_plane"], n["control_plane_version"], n["kubelet_version"]) for n in result["nodes"]} \
            == {"control-plane-0": (True, OLD, OLD), "control-plane-1": (True, OLD, OLD),
                "worker-0": (False, None, OLD), "worker-1": (False, None, OLD)}
        assert result["upgrades"][2] == {"node": "worker-0", "role": "worker", "parts": ["kubelet"], "from": OLD,
                                         "kubelet_from": OLD, "to": NEW}
        assert result["node"]["upgrade"] == ["control-plane", "kubelet"]
        # kubeadm's own plan, from `kubeadm upgrade plan v1.32.0 -o json` on the first control plane
        assert {"name": "kube-apiserver", "current_version": OLD, "new_version": NEW,
                "node_name": "control-plane-1"} in result["kubeadm_plan"]
    assert [c["argv"][:3] for c in cluster.calls("upgrade plan")] == [["upgrade", "plan", NEW]] * 2
    assert cluster.calls("upgrade apply") == [] and cluster.calls("upgrade node") == []


def test_two_minor_versions_are_refused_before_anything_naming_each_control_plane(cluster, capsys):
    result = upgrade(capsys, cluster, "control-plane-0", "plan", version="v1.33.0", first_control_plane="control-plane-0")
    assert result["failed"]
    assert [(r["node"], r["found"], r["wanted"], r["rule"]) for r in result["refusals"]] == [
        ("control-plane-0", "API server v1.31.1", "v1.33.0", "one-minor"),
        ("control-plane-1", "API server v1.31.1", "v1.33.0", "one-minor")]
    assert "one minor version at a time (one-minor): upgrade to v1.32 first" in result["msg"]
    result = upgrade(capsys, cluster, "control-plane-0", "apply", version="v1.33.0")
    assert result["failed"] and result["refusals"][0]["rule"] == "one-minor"
    result = upgrade(capsys, cluster, "control-plane-0", "apply", version="v1.31.0")
    assert result["failed"] and {r["rule"] for r in result["refusals"]} == {"downgrade"}
    assert cluster.calls("upgrade apply") == [] and cluster.calls("upgrade plan") == []


def test_the_roll_control_planes_first_then_workers_and_a_second_run_changes_nothing(cluster, capsys):
    cluster.put_pods({"namespace": "default", "name": "web-0", "node": "worker-0"},
                     {"namespace": "kube-system", "name": "cni-worker-0", "node": "worker-0", "daemonset": True})
    # Check mode predicts and runs nothing that changes anything.
    result = upgrade(capsys, cluster, "control-plane-0", "apply", check_mode=True)
    assert result["changed"] and result["from_version"] == OLD and result["command"][:4] == ["kubeadm", "upgrade", "apply", NEW]
    assert cluster.calls("upgrade apply") == []
    # A worker before the control planes: refused (the kubelet would be newer than the API server).
    result = upgrade(capsys, cluster, "control-plane-0", "plan", first_control_plane="control-plane-0",
                     node_name="worker-0")
    assert result["failed"] and result["refusals"][0]["rule"] == "control-planes-first", result
    # A further control plane before apply: kubeadm upgrade node has nothing to do yet; the module says why.
    result = upgrade(capsys, cluster, "control-plane-1", "node", kubeconfig=cluster.admin)
    assert result["failed"] and "(apply-first)" in result["msg"]
    assert cluster.calls("upgrade node")[-1]["upgrade"]["noop"] is True

    result = upgrade(capsys, cluster, "control-plane-0", "apply")
    assert result["changed"] and result["control_plane"] and result["to_version"] == NEW, result
    assert cluster.state()["kubernetes_version"] == NEW
    assert upgrade(capsys, cluster, "control-plane-0", "apply")["changed"] is False  # at NEW: nothing runs
    assert len(cluster.calls("upgrade apply")) == 1

    assert upgrade(capsys, cluster, "control-plane-1", "node", check_mode=True)["changed"] is True
    result = upgrade(capsys, cluster, "control-plane-1", "node")
    assert result["changed"] and result["control_plane"] and result["from_version"] == OLD, result
    assert upgrade(capsys, cluster, "control-plane-1", "node")["changed"] is False
    for node in ("control-plane-0", "control-plane-1"):
        assert cluster.kubelet(node, "install", NEW).returncode == 0
        assert cluster.kubelet(node, "restart").returncode == 0, cluster.kubelet(node, "restart").stderr

    # The worker: drain (the web pod goes, the DaemonSet's pod stays), kubeadm upgrade node, kubelet, uncordon.
    assert drain(capsys, cluster, "worker-0", check_mode=True) == {
        "changed": True, "node": "worker-0", "unschedulable": True, "evicted": ["default/web-0"]}
    assert not cluster.state()["nodes"]["worker-0"].get("unschedulable")
    result = drain(capsys, cluster, "worker-0")
    assert result["changed"] and result["evicted"] == ["default/web-0"]
    assert [p["name"] for p in cluster.state()["pods"]] == ["cni-worker-0"]
    assert cluster.state()["nodes"]["worker-0"]["unschedulable"] is True
    assert drain(capsys, cluster, "worker-0")["changed"] is False
    worker_kubeconfig = os.path.join(cluster.dirs["worker-0"], "kubelet.conf")  # the node's own credentials
    assert upgrade(capsys, cluster, "worker-0", "node", kubeconfig=worker_kubeconfig)["changed"] is True
    assert cluster.kubelet("worker-0", "install", NEW).returncode == 0
    assert cluster.kubelet("worker-0", "restart").returncode == 0
    result = upgrade(capsys, cluster, "worker-0", "node")  # kubelet.conf by default
    assert result["changed"] is False and result["from_version"] == NEW
    assert drain(capsys, cluster, "worker-0", state="uncordoned")["changed"] is True
    assert drain(capsys, cluster, "worker-0", state="uncordoned")["changed"] is False

    result = upgrade(capsys, cluster, "control-plane-0", "plan", first_control_plane="control-plane-0")
    assert result["pending"] == ["worker-1"] and result["kubeadm_plan"] == []  # apply done: no kubeadm plan
    ups = cluster.state()["upgrades"]
    assert [(u["command"], u["node"]) for u in ups] == [("apply", "control-plane-0"), ("node", "control-plane-1"),
                                                        ("node", "worker-0")]


def test_a_kubeadm_older_than_the_version_is_refused_naming_the_host(cluster, capsys, monkeypatch):
    monkeypatch.setenv("KUBEADM_DOUBLE_VERSION", OLD)
    result = upgrade(capsys, cluster, "control-plane-0", "apply")
    assert result["failed"] and result["refusals"] == [{
        "node": "control-plane-0", "found": "kubeadm " + OLD, "wanted": NEW, "rule": "kubeadm-version",
        "message": "control-plane-0: found kubeadm v1.31.1, wanted v1.32.0: kubeadm must be at least the wanted version: "
                   "install it first (kubeadm-version)"}]
    assert cluster.calls("upgrade apply") == []


def test_bad_input_names_the_field(cluster, capsys):
    result = upgrade(capsys, cluster, "control-plane-0", "plan", version="latest")
    assert result["failed"] and result["msg"].startswith("kubernetes_version: expected a Kubernetes version")
    result = upgrade(capsys, cluster, "worker-0", "node", node_name="Worker_0")
    assert result["failed"] and result["msg"].startswith("node_name: expected an RFC 1123 subdomain")
    result = upgrade(capsys, cluster, "worker-0", "apply")
    assert result["failed"] and "runs on the first control plane" in result["msg"]


def test_drain_waits_for_a_disruption_budget_and_names_the_pod(cluster, capsys):
    cluster.put_pods({"namespace": "db", "name": "db-0", "node": "worker-1", "pdb_blocked": True})
    result = drain(capsys, cluster, "worker-1", timeout=1)
    assert result["failed"] and result["msg"] == "node worker-1: drain of worker-1: pods still there after 1.0s: db/db-0"
    result = drain(capsys, cluster, "ghost")
    assert result["failed"] and "nodes \"ghost\" not found" in result["msg"]


def _double(*args, cwd_dir, env=None):
    return subprocess.run([KUBEADM_DOUBLE] + list(args), capture_output=True, text=True, check=False,
                          env=dict(os.environ, **(env or {})), cwd=cwd_dir)


def test_the_double_checks_version_arguments_order_and_skew(cluster):
    cp0, cp1, w0 = cluster.dirs["control-plane-0"], cluster.dirs["control-plane-1"], cluster.dirs["worker-0"]
    admin = ["--kubeconfig", os.path.join(cp0, "admin.conf")]
    refused = {
        "no --yes": _double("upgrade", "apply", NEW, *admin, cwd_dir=cp0),
        "two minors": _double("upgrade", "apply", "v1.33.0", "--yes", *admin, cwd_dir=cp0,
                              env={"KUBEADM_DOUBLE_VERSION": "v1.33.0"}),
        "downgrade": _double("upgrade", "apply", "v1.30.0", "--yes", *admin, cwd_dir=cp0),
        "newer than kubeadm": _double("upgrade", "apply", NEW, "--yes", *admin, cwd_dir=cp0,
                                      env={"KUBEADM_DOUBLE_VERSION": OLD}),
        "no version": _double("upgrade", "plan", *admin, cwd_dir=cp0),
        "bad version": _double("upgrade", "plan", "1.32", *admin, cwd_dir=cp0),
        "apply on a worker": _double("upgrade", "apply", NEW, "--yes", "--kubeconfig",
                                     os.path.join(w0, "kubelet.conf"), cwd_dir=w0),
    }
    messages = {name: proc.stderr for name, proc in refused.items() if proc.returncode != 0}
    assert set(messages) == set(refused), {n: p.stdout for n, p in refused.items()}
    assert "pass --yes" in messages["no --yes"]
    assert "kubeadm can upgrade only 1 minor version at a time" in messages["two minors"]
    assert "Downgrades are not supported" in messages["downgrade"]
    assert "Upgrade kubeadm first" in messages["newer than kubeadm"]
    assert "takes exactly one version" in messages["no version"] and "Unable to parse version" in messages["bad version"]
    assert "runs on a control plane" in messages["apply on a worker"]
    # Order: a worker's kubeadm upgrade node while a control plane lags behind the cluster's version.
    assert _double("upgrade", "apply", NEW, "--yes", *admin, cwd_dir=cp0).returncode == 0
    worker = _double("upgrade", "node", "--kubeconfig", os.path.join(w0, "kubelet.conf"), cwd_dir=w0)
    assert worker.returncode == 1 and "control planes first: the API server of control-plane-1 at v1.31.1" in worker.stderr
    # A kubelet newer than the API server it talks to is refused by the kubelet double.
    assert cluster.kubelet("worker-0", "install", NEW).returncode == 0
    restart = cluster.kubelet("worker-0", "restart")
    assert restart.returncode == 1 and "newer than the API server of control-plane-1 at v1.31.1" in restart.stderr
    assert _double("upgrade", "node", "--kubeconfig", os.path.join(cp1, "admin.conf"), cwd_dir=cp1).returncode == 0
    assert cluster.kubelet("worker-0", "restart").returncode == 0
    assert cluster.state()["nodes"]["worker-0"]["kubelet_version"] == NEW


@REAL
def test_real_cluster_versions_are_read_and_its_own_version_plans_nothing_to_do():
    nodes = read_cluster_versions(REAL_KUBECONFIG)
    planes = [n for n in nodes if n.control_plane]
    assert planes and all(n.control_plane_version for n in planes) and all(n.kubelet_version for n in nodes)
    current = min(n.control_plane_version for n in planes)
    plan = plan_upgrade(nodes, current)  # the cluster's own version: never refused
    assert plan.cluster_version == current
    assert {n.name for n in plan.pending} == {n.name for n in nodes if n.needs(current)}


@REAL
def test_real_cluster_plan_through_the_module_changes_nothing(capsys):
    current = min(n.control_plane_version for n in read_cluster_versions(REAL_KUBECONFIG) if n.control_plane)
    for check_mode in (True, False):
        result = run(capsys, kubeadm_upgrade, {"kubernetes_version": str(current), "step": "plan",
                                               "kubeconfig": REAL_KUBECONFIG}, check_mode)
        assert not result.get("failed") and result["changed"] is False and result["cluster_version"] == str(current)
        assert result["kubeadm_plan"] == []  # no first control plane named: kubeadm is not asked


@REAL
def test_real_cluster_two_minor_versions_up_are_refused():
    nodes = read_cluster_versions(REAL_KUBECONFIG)
    current = min(n.control_plane_version for n in nodes if n.control_plane)
    with pytest.raises(UpgradeRefused) as refused:
        plan_upgrade(nodes, Version(current.major, current.minor + 2, 0))
    assert {r.rule for r in refused.value.refusals} >= {"one-minor"}
