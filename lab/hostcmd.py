"""Runs inside a lab host (its network namespace), where its swtpm listens on loopback.

python -m lab.hostcmd --tcti T --extend 4=<hex> ...   simulated measured boot
python -m lab.hostcmd --tcti T --attest <nonce hex>   prints a qemu-vtpm attestation document
python -m lab.hostcmd --tcti T --unseal-file PATH     prints (base64) a file of an agent's sealed state, unsealed
                                                      with this host's TPM in its current state (root on the host)
python -m lab.hostcmd --tcti T --nv-read INDEX          prints an NV index's content (hex)
python -m lab.hostcmd --tcti T --azure-hcl HOST_DIR LAB_STATE   Azure's paravisor at boot (lab/azure_hcl.py): the AK
                                                      at 0x81000003, the HCL report in NV 0x01400001, the VCEK cache
"""

from __future__ import annotations

import argparse
import base64
import os
import sys

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import tpm


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="lab.hostcmd")
    p.add_argument("--tcti", required=True)
    p.add_argument("--extend", action="append", default=[], metavar="PCR=HEX")
    p.add_argument("--attest", metavar="NONCE_HEX")
    p.add_argument("--user-data", default="lab-proof")
    p.add_argument("--unseal-file", metavar="PATH")
    p.add_argument("--azure-hcl", nargs=2, metavar=("HOST_DIR", "LAB_STATE"))
    p.add_argument("--nv-read", metavar="INDEX")
    args = p.parse_args(argv)
    for item in args.extend:
        pcr, digest = item.split("=", 1)
        tpm.extend_pcr(args.tcti, int(pcr), bytes.fromhex(digest))
    if args.attest:
        from ansible_collections.constellation.cluster.plugins.module_utils.attestation import vtpm

        issuer = vtpm.VTPMIssuer(tcti=args.tcti)
        sys.stdout.write(issuer.issue(args.user_data.encode(), bytes.fromhex(args.attest)).decode())
    if args.azure_hcl:
        from pathlib import Path

        from lab.azure_hcl import CERT_FOLDER, provision
        from lab.snp_platform import SNPPlatform

        host_dir, lab_state = (Path(p) for p in args.azure_hcl)
        provision(args.tcti, SNPPlatform(host_dir, lab_state), host_dir / CERT_FOLDER)
    if args.nv_read:
        with tpm.TPM(args.tcti) as opened:
            sys.stdout.write(opened.nv_read(int(args.nv_read, 0)).hex() + "\n")
    if args.unseal_file:
        from ansible_collections.constellation.cluster.plugins.module_utils.core.at_rest import SEALED_KEY_FILE, SealedStorage

        folder = os.path.dirname(os.path.abspath(args.unseal_file))
        if not os.path.exists(os.path.join(folder, SEALED_KEY_FILE)):
            sys.stderr.write("%s: no sealed storage key in %s\n" % (args.unseal_file, folder))
            return 1
        storage = SealedStorage.open(folder, lambda: tpm.open_tpm(args.tcti), [])  # any blob of the key file
        sys.stdout.write(base64.b64encode(storage.read_file(args.unseal_file) or b"").decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
