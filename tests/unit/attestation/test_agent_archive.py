# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An agent's PCR 13 computed away from the agent (attestation/agent_measurement.py): from the node_agent role's
code archive (read, never unpacked) and from a source tree, and its entry kept in a measurements document."""

from __future__ import annotations

import copy
import io
import subprocess
import tarfile

import pytest
import yaml

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import agent_measurement as am
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from tests.support import ROOT

PCR = {"4": {"expected": "ab" * 32, "warnOnly": False}}


def _tree(root, files):
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def _role_archive(module_utils, archive):
    """The archive as the node_agent role builds it: its own tar command (read from the role's tasks), fed the
    sorted *.py paths relative to module_utils, as the role's find and set_fact list them."""
    title = "The code as one archive (on the controller)"

    def steps(tasks):
        for one in tasks or []:
            yield one
            yield from steps(one.get("block"))

    found = [step for path in sorted((ROOT / "roles" / "node_agent" / "tasks").glob("*.yml"))
             for step in steps(yaml.safe_load(path.read_text())) if step.get("name") == title]
    assert len(found) == 1, "the node_agent role builds its code archive in one task named %r" % title
    argv = found[0]["ansible.builtin.command"]["argv"]
    assert argv[4:] == ["{{ node_agent_code_archive }}", "{{ node_agent_source_dir }}/plugins/module_utils"]
    files = sorted(p.relative_to(module_utils).as_posix() for p in module_utils.rglob("*.py"))
    subprocess.run(argv[:4] + [str(archive), str(module_utils)], input="\n".join(files).encode(), check=True)
    return archive


def test_the_role_s_archive_of_a_tree_gives_the_tree_s_digest(tmp_path):
    src = tmp_path / "collection"
    module_utils = _tree(src / "plugins" / "module_utils", {"a.py": "A", "attestation/b.py": "B\n", "core/c/d.py": ""})
    archive = _role_archive(module_utils, tmp_path / "agent.tar.gz")
    assert am.archive_code_digest(str(archive)) == am.code_digest(str(module_utils))
    assert am.source_code_digest(str(src)) == am.source_code_digest(str(module_utils)) == am.code_digest(str(module_utils))
    with open(archive, "rb") as handle:  # a file object too
        assert am.archive_code_digest(handle) == am.code_digest(str(module_utils))


def test_this_collection_s_archive_gives_the_running_agent_s_digest(tmp_path):
    archive = _role_archive(ROOT / "plugins" / "module_utils", tmp_path / "agent.tar.gz")
    assert am.archive_code_digest(str(archive)) == am.code_digest(am.code_root())


def _archive(tmp_path, members):
    """A .tar.gz of ``members``: (TarInfo, bytes or None)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    path = tmp_path / "bad.tar.gz"
    path.write_bytes(buf.getvalue())
    return str(path)


def _info(name, kind=tarfile.REGTYPE, target=""):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info


@pytest.mark.parametrize("member, data, said", [
    (_info("/etc/evil.py"), b"x", "relative to plugins/module_utils"),
    (_info("../evil.py"), b"x", "without .."),
    (_info("a/../../evil.py"), b"x", "without .."),
    (_info("link.py", tarfile.SYMTYPE, "/etc/passwd"), None, "link.py is a symbolic link"),
    (_info("hard.py", tarfile.LNKTYPE, "a.py"), None, "hard.py is a hard link"),
    (_info("dev.py", tarfile.CHRTYPE), None, "dev.py is a device"),
    (_info("fifo.py", tarfile.FIFOTYPE), None, "fifo.py is a FIFO"),
    (_info("attestation", tarfile.DIRTYPE), None, "attestation is a folder"),
])
def test_a_member_the_agent_s_archive_never_holds_is_refused(tmp_path, member, data, said):
    path = _archive(tmp_path, [(_info("a.py"), b"A"), (member, data)])
    with pytest.raises(InputError, match="archive: expected") as err:
        am.archive_code_digest(path)
    assert said in str(err.value)


def test_a_duplicate_member_an_empty_archive_and_no_archive_are_refused(tmp_path):
    with pytest.raises(InputError, match="a.py is in the archive twice"):
        am.archive_code_digest(_archive(tmp_path, [(_info("a.py"), b"A"), (_info("./a.py"), b"B")]))
    with pytest.raises(InputError, match=r"no \*.py member"):
        am.archive_code_digest(_archive(tmp_path, [(_info("README"), b"A")]))
    with pytest.raises(InputError, match="archive: expected a readable gzipped tar.*missing.tar.gz"):
        am.archive_code_digest(str(tmp_path / "missing.tar.gz"))
    (tmp_path / "plain.tar.gz").write_bytes(b"not gzip at all")
    with pytest.raises(InputError, match="archive: expected a readable gzipped tar"):
        am.archive_code_digest(str(tmp_path / "plain.tar.gz"))
    with pytest.raises(InputError, match="src: expected a collection's root"):
        am.source_code_digest(str(tmp_path / "nothing"))


def _entry(code=b"\x01" * 32, config=b"\x02" * 32):
    return am.AgentMeasurement(code, config).to_dict()


def test_an_agent_is_listed_once_and_the_version_raised_once():
    document = {"version": 3, "accepted": {"v1": PCR}}
    kept = copy.deepcopy(document)
    listed, changed = am.set_agent_entry(document, "0.3.0", _entry())
    assert changed and listed == {"version": 4, "accepted": {"v1": PCR}, "agents": {"0.3.0": _entry()}}
    assert document == kept  # never modified
    again, changed = am.set_agent_entry(listed, "0.3.0", _entry())
    assert not changed and again == listed
    other, changed = am.set_agent_entry(listed, "0.3.0", _entry(code=b"\x03" * 32))  # the same name, new code
    assert changed and other["version"] == 5 and other["agents"]["0.3.0"] == _entry(code=b"\x03" * 32)


def test_an_agent_is_retired_and_a_plain_policy_becomes_the_named_form():
    listed, changed = am.set_agent_entry(dict(PCR), "next", _entry())
    assert changed and listed == {"version": 1, "accepted": {"default": PCR}, "agents": {"next": _entry()}}
    two = am.set_agent_entry(listed, "0.3.0", _entry(code=b"\x03" * 32))[0]
    assert list(two["agents"]) == ["next", "0.3.0"] and two["version"] == 2
    one, changed = am.set_agent_entry(two, "next", None)
    assert changed and one["version"] == 3 and list(one["agents"]) == ["0.3.0"]
    none, changed = am.set_agent_entry(one, "0.3.0", None)
    assert changed and none == {"version": 4, "accepted": {"default": PCR}}  # no agents: today's rule again
    same, changed = am.set_agent_entry(none, "0.3.0", None)
    assert not changed and same == none


def test_a_bad_name_a_bad_entry_and_a_17th_agent_are_refused():
    document = {"version": 1, "accepted": {"v1": PCR}}
    with pytest.raises(InputError, match="name: expected an agent name"):
        am.set_agent_entry(document, "../x", _entry())
    bad = dict(_entry(), value="00" * 32)
    with pytest.raises(InputError, match="agents.x.events: expected events that replay"):
        am.set_agent_entry(document, "x", bad)
    with pytest.raises(InputError, match="version: an integer"):
        am.set_agent_entry(dict(document, version="7"), "x", _entry())
    full = dict(document, agents={"a%d" % i: _entry() for i in range(16)})
    with pytest.raises(InputError, match="at most 16 agents"):
        am.set_agent_entry(full, "one-more", _entry())
    assert am.set_agent_entry(full, "a3", _entry())[1] is False  # listed already: no 17th
