# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The release: the collection tarball that ``ansible-galaxy collection build`` makes, the changelog
that antsibull-changelog generates and the execution environment's build context.

The build runs on a copy of the checkout (tracked files plus untracked, not ignored ones) into which
the tests put the junk a working tree collects: ansible-lint's second copy of the collection in
``.ansible/``, an egg-info, caches, ``tests/output``, the lab's inventory, the ``collections/`` link...
So the tarball's file list shows what ``build_ignore`` keeps out, and the repository is never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile

import pytest
import yaml
from tests.support import ROOT

pytestmark = pytest.mark.slow

VENV_BIN = os.path.join(ROOT, ".venv", "bin")

if shutil.which("git") is None or not os.path.isdir(os.path.join(ROOT, ".git")):  # pragma: no cover
    pytest.skip("the release tests copy the git checkout", allow_module_level=True)

# Junk a working tree collects; none of it may reach the tarball.
JUNK_FILES = {
    ".ansible/collections/ansible_collections/constellation/cluster/galaxy.yml": "namespace: constellation\n",
    ".ansible/collections/ansible_collections/constellation/cluster/plugins/modules/agent_state.py": "# copy\n",
    ".ansible/roles/stale/tasks/main.yml": "---\n[]\n",
    "constellation_cluster.egg-info/PKG-INFO": "Name: constellation-cluster\n",
    ".venv/pyvenv.cfg": "home = /usr/bin\n",
    ".git/HEAD": "ref: refs/heads/main\n",
    ".pytest_cache/v/cache/nodeids": "[]\n",
    ".hypothesis/examples/0/1": "x",
    ".lab/state.json": "{}\n",
    ".yamllint": "extends: default\n",
    ".vscode/settings.json": "{}\n",
    ".env": "SECRET=1\n",
    "roles/node/.cache/x": "x",
    "plugins/modules/__pycache__/agent_state.cpython-311.pyc": "pyc",
    "plugins/module_utils/stale.pyc": "pyc",
    "tests/output/.tmp/sanity/result.txt": "x",
    "tests/output/junit/x.xml": "<x/>",
    "inventories/lab/hosts.yml": "all: {}\n",
    "inventories/lab/vault_pass": "lab-vault-password\n",
    "context/Containerfile": "FROM scratch\n",
    "dist/constellation_cluster-0.1.0.tar.gz": "x",
    "constellation-cluster-0.1.0.tar.gz": "an old build",
}
# Paths (or prefixes, ending in /) of the operator project and local configuration.
NOT_SHIPPED = ("ansible.cfg", "Makefile", "pyproject.toml", "tests/", "inventories/lab/", "collections/",
               "lab/", "bench/", "scripts/", "molecule/", "build/", "context/", "dist/")
# What a user of the collection needs, at least.
SHIPPED = ("LICENSE", "README.md", "CHANGELOG.md", "MANIFEST.json", "FILES.json", "meta/runtime.yml",
           "meta/execution-environment.yml", "requirements.txt", "bindep.txt", "execution-environment.yml",
           "changelogs/changelog.yaml", "changelogs/config.yaml", "site.yml", "playbooks/verify.yml",
           "inventories/example/hosts.yml", "bin/constellation-agent", "files/constellation-agent.service",
           "docs/attestation.md", "plugins/modules/agent_state.py", "plugins/action/agent_state.py",
           "plugins/connection/atls.py", "roles/node_agent/tasks/main.yml")


def _env(**extra):
    env = dict(os.environ)
    env["PATH"] = VENV_BIN + os.pathsep + env.get("PATH", "")
    env.pop("ANSIBLE_COLLECTIONS_PATH", None)
    env.pop("ANSIBLE_COLLECTIONS_PATHS", None)
    env.update(extra)
    return env


def _run(args, cwd, env=None, check=True):
    proc = subprocess.run(args, cwd=cwd, env=env or _env(), capture_output=True, text=True, timeout=300, check=False)
    if check:
        assert proc.returncode == 0, "%s failed (%d):\n%s\n%s" % (args, proc.returncode, proc.stdout, proc.stderr)
    return proc


def _galaxy_version(root):
    with open(os.path.join(root, "galaxy.yml")) as f:
        return yaml.safe_load(f)["version"]


def _install(tarball, tmp_path):
    """Installs the tarball into tmp_path/collections with an Ansible configuration that knows no other
    copy of the collection (the checkout's ansible.cfg would find the repository itself)."""
    install = str(tmp_path / "collections")
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text("[defaults]\n")
    env = _env(ANSIBLE_CONFIG=str(cfg), ANSIBLE_COLLECTIONS_PATH=install)
    _run([os.path.join(VENV_BIN, "ansible-galaxy"), "collection", "install", "--offline", "-p", install, tarball],
         str(tmp_path), env=env)
    installed = os.path.join(install, "ansible_collections", "constellation", "cluster")
    assert os.path.isfile(os.path.join(installed, "MANIFEST.json"))
    return install, installed, env


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A copy of the checkout as it is now, plus the junk of JUNK_FILES and the collections/ link."""
    dest = str(tmp_path_factory.mktemp("release") / "src")
    listed = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], ROOT).stdout
    for rel in sorted(set(filter(None, listed.split("\0")))):
        src = os.path.join(ROOT, rel)
        if not os.path.isfile(src) or os.path.islink(src):  # deleted in the work tree, or a link
            continue
        os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
        shutil.copy2(src, os.path.join(dest, rel))
    for rel, content in JUNK_FILES.items():
        path = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(content)
    # What scripts/setup.sh makes: a link back to the root (a loop for anything that follows it).
    os.makedirs(os.path.join(dest, "collections/ansible_collections/constellation"))
    os.symlink("../../..", os.path.join(dest, "collections/ansible_collections/constellation/cluster"))
    return dest


@pytest.fixture(scope="module")
def tarball(source, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("dist"))
    _run([os.path.join(VENV_BIN, "ansible-galaxy"), "collection", "build", "--output-path", out, source], source)
    built = [name for name in os.listdir(out) if name.endswith(".tar.gz")]
    assert built == ["constellation-cluster-%s.tar.gz" % _galaxy_version(source)]
    return os.path.join(out, built[0])


@pytest.fixture(scope="module")
def members(tarball):
    with tarfile.open(tarball) as tar:
        return {m.name.rstrip("/"): m for m in tar.getmembers()}


def test_the_junk_is_really_in_the_source_tree(source):
    # Guards the test itself: without the junk the next test would prove nothing.
    for rel in JUNK_FILES:
        assert os.path.isfile(os.path.join(source, rel)), rel
    assert os.path.isfile(os.path.join(source, "ansible.cfg"))
    assert os.path.isfile(os.path.join(source, "collections/ansible_collections/constellation/cluster/galaxy.yml"))


def test_the_tarball_leaves_out_tool_state_local_config_and_the_project(members):
    names = sorted(members)
    offenders = []
    for name in names:
        parts = name.split("/")
        if any(part.startswith(".") for part in parts):
            offenders.append((name, "dotfile or dot-directory"))
        if "ansible_collections" in parts:
            offenders.append((name, "a second copy of a collection"))
        if any(part.endswith(".egg-info") for part in parts):
            offenders.append((name, "egg-info"))
        if "__pycache__" in parts or name.endswith(".pyc"):
            offenders.append((name, "Python cache"))
        if name.endswith(".tar.gz"):
            offenders.append((name, "a build artifact"))
        for path in NOT_SHIPPED:
            if name == path.rstrip("/") or (path.endswith("/") and name.startswith(path)):
                offenders.append((name, "not shipped: " + path))
    assert not offenders, offenders
    assert "tests" not in members and "ansible.cfg" not in members and "inventories/lab" not in members


def test_the_tarball_ships_what_a_user_needs(source, members):
    missing = [name for name in SHIPPED if name not in members or not members[name].isfile()]
    assert not missing, missing
    # Nothing of the collection proper is dropped: every plugin, role and playbook file of the source.
    expected = set()
    for top in ("plugins", "roles", "playbooks", "docs", "meta", "changelogs"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(source, top)):
            dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "__pycache__"]
            for filename in filenames:
                if not filename.startswith(".") and not filename.endswith(".pyc"):
                    expected.add(os.path.relpath(os.path.join(dirpath, filename), source))
    # The documents of the repository's tests and benchmarks are not shipped (galaxy.yml build_ignore).
    assert expected - set(members) == {"docs/bench.md", "docs/testing.md"}


def test_the_license_is_the_gpl_3_text(tarball, members):
    assert members["LICENSE"].isfile()
    with tarfile.open(tarball) as tar:
        shipped = tar.extractfile("LICENSE").read()
    with open(os.path.join(ROOT, "LICENSE"), "rb") as f:
        assert shipped == f.read()
    assert shipped.startswith(b"                    GNU GENERAL PUBLIC LICENSE\n                       Version 3, 29 June 2007")
    if os.path.exists("/usr/share/common-licenses/GPL-3"):
        with open("/usr/share/common-licenses/GPL-3", "rb") as f:
            assert shipped == f.read()


def test_manifest_matches_galaxy_yml_and_files_json_matches_the_tarball(source, tarball, members):
    with tarfile.open(tarball) as tar:
        manifest = json.load(tar.extractfile("MANIFEST.json"))
        files = json.load(tar.extractfile("FILES.json"))
    with open(os.path.join(source, "galaxy.yml")) as f:
        galaxy = yaml.safe_load(f)
    info = manifest["collection_info"]
    assert info["version"] == galaxy["version"]
    assert (info["namespace"], info["name"]) == ("constellation", "cluster")
    repo = "https://github.com/constellation-cluster/constellation.cluster"
    assert info["repository"] == repo and info["homepage"] == repo
    assert info["documentation"] == repo + "/tree/main/docs"
    assert info["issues"] == repo + "/issues"
    assert info["license"] == ["GPL-3.0-or-later"]
    listed = {entry["name"] for entry in files["files"] if entry["name"] != "."}
    assert listed == set(members) - {"MANIFEST.json", "FILES.json"}


def test_the_version_is_released_in_the_changelog(source):
    version = _galaxy_version(source)
    with open(os.path.join(source, "changelogs", "changelog.yaml")) as f:
        changelog = yaml.safe_load(f)
    assert version in changelog["releases"]
    assert changelog["releases"][version].get("release_date")
    with open(os.path.join(source, "CHANGELOG.md")) as f:
        text = f.read()
    assert "unreleased" not in text.lower()
    assert "v%s" % version.replace(".", "\\.") in text


def test_changelog_fragments_lint_and_changelog_md_is_generated_not_edited(source):
    antsibull = os.path.join(VENV_BIN, "antsibull-changelog")
    lint = _run([antsibull, "lint"], source)
    assert lint.stdout.strip() == ""
    fragments = [name for name in os.listdir(os.path.join(source, "changelogs", "fragments"))
                 if name.endswith((".yml", ".yaml"))]
    assert fragments
    with open(os.path.join(source, "CHANGELOG.md")) as f:
        committed = f.read()
    _run([antsibull, "generate"], source)
    with open(os.path.join(source, "CHANGELOG.md")) as f:
        assert f.read() == committed, "CHANGELOG.md differs from what antsibull-changelog generates"


def test_the_installed_tarball_is_usable(tarball, tmp_path):
    install, installed, env = _install(tarball, tmp_path)
    doc = _run([os.path.join(VENV_BIN, "ansible-doc"), "--json", "constellation.cluster.agent_state"],
               str(tmp_path), env=env)
    entry = json.loads(doc.stdout)["constellation.cluster.agent_state"]["doc"]
    assert os.path.realpath(entry["filename"]).startswith(os.path.realpath(installed) + os.sep)
    assert any("tpm2-pytss" in line for line in entry["requirements"])
    listing = _run([os.path.join(VENV_BIN, "ansible-doc"), "--json", "-l", "constellation.cluster"],
                   str(tmp_path), env=env)
    modules = {name.rsplit(".", 1)[1] for name in json.loads(listing.stdout)}
    expected = {name[:-3] for name in os.listdir(os.path.join(ROOT, "plugins", "modules")) if name.endswith(".py")}
    assert modules == expected
    verify = _run([os.path.join(VENV_BIN, "ansible-galaxy"), "collection", "verify", "--offline", "-p", install,
                   "constellation.cluster"], str(tmp_path), env=env)
    assert "Successfully verified" in verify.stdout


# Execution environment (ansible-builder create needs no container engine).

@pytest.fixture(scope="module")
def ee_context(source, tarball, tmp_path_factory):
    """`ansible-builder create` as the README says: the tarball in build/, then create."""
    os.makedirs(os.path.join(source, "build"), exist_ok=True)
    shutil.copy2(tarball, os.path.join(source, "build", os.path.basename(tarball)))
    context = str(tmp_path_factory.mktemp("ee") / "context")
    _run([os.path.join(VENV_BIN, "ansible-builder"), "create", "--file", "execution-environment.yml",
          "--context", context, "--output-filename", "Containerfile"], source)
    return context


def test_ee_definition_names_the_tarball_of_this_version(source):
    with open(os.path.join(source, "execution-environment.yml")) as f:
        ee = yaml.safe_load(f)
    name = "constellation-cluster-%s.tar.gz" % _galaxy_version(source)
    assert ee["version"] == 3
    assert ee["additional_build_files"] == [{"src": "build/" + name, "dest": "collection"}]
    assert ee["dependencies"]["galaxy"]["collections"] == [{"name": "collection/" + name, "type": "file"}]
    with open(os.path.join(source, "meta", "execution-environment.yml")) as f:
        meta = yaml.safe_load(f)
    assert meta == {"version": 1, "dependencies": {"python": "requirements.txt", "system": "bindep.txt"}}


def test_ee_build_context_installs_the_collection_tpm2_pytss_and_libtss2(source, tarball, ee_context):
    build = os.path.join(ee_context, "_build")
    with open(os.path.join(ee_context, "Containerfile")) as f:
        containerfile = f.read()
    # The galaxy stage copies _build (with the tarball) to /build and installs requirements.yml there.
    assert "COPY _build /build" in containerfile
    assert ('ansible-galaxy collection install $ANSIBLE_GALAXY_CLI_COLLECTION_OPTS -r requirements.yml '
            '--collections-path "/usr/share/ansible/collections"') in containerfile
    assert "COPY --from=galaxy /usr/share/ansible /usr/share/ansible" in containerfile
    assert 'ARG ANSIBLE_INSTALL_REFS="ansible-core==2.19.14 ansible-runner==2.4.3"' in containerfile
    with open(os.path.join(build, "requirements.yml")) as f:
        galaxy = yaml.safe_load(f)
    (entry,) = galaxy["collections"]
    assert entry["type"] == "file"
    with open(os.path.join(build, entry["name"]), "rb") as f, open(tarball, "rb") as g:
        assert f.read() == g.read()
    with open(os.path.join(build, "requirements.txt")) as f:
        python = [line.split("#")[0].strip() for line in f if line.split("#")[0].strip()]
    assert "tpm2-pytss>=3.0.0" in python and any(line.startswith("cryptography") for line in python)
    bindep_cmd = [os.path.join(VENV_BIN, "bindep"), "-f", os.path.join(build, "bindep.txt"), "-l", "newline"]
    runtime_dpkg = _run(bindep_cmd, source).stdout.split()
    compile_dpkg = _run(bindep_cmd + ["compile"], source).stdout.split()
    assert "libtss2-esys-3.0.2-0" in runtime_dpkg and "libtss2-dev" not in runtime_dpkg
    assert {"libtss2-dev", "pkg-config", "gcc"} <= set(compile_dpkg)
    with open(os.path.join(build, "bindep.txt")) as f:
        bindep = f.read()
    assert "tpm2-tss [platform:rpm]" in bindep and "tpm2-tss-devel [platform:rpm compile]" in bindep


def test_ee_introspection_finds_the_collections_own_declarations(tarball, ee_context, tmp_path):
    """What the builder stage runs over the installed collections: it reads our
    meta/execution-environment.yml, so an EE that only installs the collection gets them too."""
    install, _installed, env = _install(tarball, tmp_path)
    out = _run([os.path.join(VENV_BIN, "python"), os.path.join(ee_context, "_build", "scripts", "introspect.py"),
                "introspect", install], str(tmp_path), env=env).stdout
    found = yaml.safe_load(out)
    python = "\n".join(found["python"])
    system = "\n".join(found["system"])
    assert "tpm2-pytss>=3.0.0" in python and "constellation.cluster" in python
    assert "libtss2-dev" in system and "constellation.cluster" in system
