"""Runs inside a lab host (its network namespace), where its swtpm listens on loopback.

python -m lab.hostcmd --tcti T --extend 4=<hex> ...   simulated measured boot
python -m lab.hostcmd --tcti T --attest <nonce hex>   prints a qemu-vtpm attestation document
"""

from __future__ import annotations

import argparse
import sys

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import tpm


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="lab.hostcmd")
    p.add_argument("--tcti", required=True)
    p.add_argument("--extend", action="append", default=[], metavar="PCR=HEX")
    p.add_argument("--attest", metavar="NONCE_HEX")
    p.add_argument("--user-data", default="lab-proof")
    args = p.parse_args(argv)
    for item in args.extend:
        pcr, digest = item.split("=", 1)
        tpm.extend_pcr(args.tcti, int(pcr), bytes.fromhex(digest))
    if args.attest:
        from ansible_collections.constellation.cluster.plugins.module_utils.attestation import vtpm

        issuer = vtpm.VTPMIssuer(tcti=args.tcti)
        sys.stdout.write(issuer.issue(args.user_data.encode(), bytes.fromhex(args.attest)).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
