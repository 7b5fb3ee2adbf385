# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the controller itself lacks is said as such, through ansible-playbook: a controller whose Python cannot import
tpm2-pytss is told that it lacks the package (not that the peer refused), and a library's warning while it is imported
never reaches Ansible's output. The stand-in package below warns as a tpm2-pytss on a newer cryptography did
(CryptographyDeprecationWarning at import), then fails to import."""

from __future__ import annotations

from tests.support.playbook import run_tasks

STAND_IN = '''
import warnings
from cryptography.utils import CryptographyDeprecationWarning
warnings.warn("TripleDES has been moved (a stand-in's deprecation)", CryptographyDeprecationWarning)
warnings.warn("a stand-in library's own deprecation", DeprecationWarning)
warnings.warn("a stand-in library's user warning", UserWarning)
raise ImportError("No module named tpm2_pytss (a test's stand-in)")
'''


def test_a_controller_without_tpm2_pytss_says_so_and_no_library_warning_is_printed(inv, tmp_path):
    lib = tmp_path / "lib" / "tpm2_pytss"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text(STAND_IN)
    defaults = {"group/constellation.cluster.attestation": {
        "variant": "qemu-vtpm-ek", "ek_ca_path": str(inv / "ek_ca.pem"),
        "measurements_file": str(inv / "measurements.json"),
        "measurements_pub_key_file": str(inv / "measurements.pub")}}
    tasks = [{"name": "Attest", "constellation.cluster.agent_state": {"endpoint": "127.0.0.1:9"}, "ignore_errors": True},
             {"name": "Verify", "constellation.cluster.verify_attestation": {"endpoint": "127.0.0.1:9"},
              "ignore_errors": True}]
    run = run_tasks(tmp_path / "run", tasks, play={"module_defaults": defaults},
                    env={"PYTHONPATH": str(tmp_path / "lib")})
    results = run.results()
    for name in ("Attest", "Verify"):
        msg = results[name].get("msg", "")
        assert results[name]["failed"], (name, results[name])
        assert msg.startswith("the controller cannot run this task: the Python package tpm2-pytss"), (name, msg)
        assert "is not installed for " in msg and "requirements.txt" in msg, (name, msg)
        assert "refused" not in msg and "127.0.0.1:9" not in msg, (name, msg)
    for text in ("TripleDES", "stand-in's deprecation", "stand-in library's", "Warning:"):
        assert text not in run.stdout, run.stdout
