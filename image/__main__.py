# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""python -m image {build,boot}: the node image (docs/image.md)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError

from image.paths import DEFAULT_OUT
from image.run import ImageError


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m image", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build disk.raw, uki.efi, cmdline, measurements.json(.sig), manifest.json")
    b.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default %s)" % DEFAULT_OUT)
    b.add_argument("--ek-ca", type=Path, action="append", required=True,
                   help="PEM file of the CA(s) the TPMs' EK certificates chain to (repeatable); baked into the image")
    b.add_argument("--signing-key", type=Path, help="the measurements signing key (PEM): the image pins its public "
                   "half and the build signs measurements.json with it")
    b.add_argument("--measurements-pub-key", type=Path,
                   help="without --signing-key: the public key to pin (measurements.json is then left unsigned)")
    b.add_argument("--policy", type=Path, help="a signed measurements document (FILE + FILE.sig) baked in as the "
                   "agent's policy for its peers")
    b.add_argument("--deployment-mode", default="image", choices=("image", "host"),
                   help="the baked agent's deployment_mode (default image)")
    b.add_argument("--debug", action="store_true", help="add a serial console root login (measures differently)")
    r = sub.add_parser("boot", help="boot an image under QEMU (TCG, OVMF, swtpm) until the agent serves")
    r.add_argument("--disk", type=Path, default=DEFAULT_OUT / "disk.raw")
    r.add_argument("--work", type=Path, required=True, help="folder for the TPM state, firmware variables, disks, log")
    r.add_argument("--ca-dir", type=Path, required=True, help="the EK CA's folder (lab/trust.py LabTrust.ca_dir)")
    r.add_argument("--node-settings", type=Path, help="a JSON file of this node's settings (public_endpoint, "
                   "public_ip, init_secret_hash): written to the per-node settings disk")
    r.add_argument("--port", type=int, default=0, help="host port forwarded to the agent's 9000 (0: a free one)")
    r.add_argument("--timeout", type=float, default=300.0, help="seconds until the agent must serve")
    r.add_argument("--keep", action="store_true", help="keep the guest running once the agent serves, until this "
                   "command gets SIGTERM or Ctrl-C (its pid is printed)")
    args = p.parse_args(argv)
    try:
        if args.cmd == "build":
            from image.build import BuildOptions, build  # pylint: disable=import-outside-toplevel
            manifest = build(BuildOptions(out=args.out, ek_ca=args.ek_ca, signing_key=args.signing_key,
                                          measurements_pub_key=args.measurements_pub_key, policy=args.policy,
                                          deployment_mode=args.deployment_mode, debug=args.debug))
            print(json.dumps({k: manifest[k] for k in ("set_name", "root_hash", "cmdline", "sizes", "times", "pcrs")},
                             indent=2))
            return 0
        from image.boot import Guest, write_node_settings  # pylint: disable=import-outside-toplevel
        # SIGTERM ends the boot like Ctrl-C: the guest and its swtpm are stopped (finally below).
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        settings = None
        if args.node_settings is not None:
            settings = write_node_settings(args.work / "node-settings.raw", json.loads(args.node_settings.read_text()))
        guest = Guest(args.disk, args.work, args.ca_dir, node_settings=settings, port=args.port)
        guest.start()
        try:
            seconds = guest.wait_agent(args.timeout)
            print(json.dumps({"endpoint": guest.endpoint, "agent_seconds": round(seconds, 1),
                              "serial_log": str(guest.serial_log), "pid": os.getpid()}), flush=True)
            if args.keep:  # until the guest powers off or this process gets SIGTERM / Ctrl-C (holding the lock)
                guest.wait_exit()
        finally:
            guest.stop()
        return 0
    except (ImageError, ConstellationError) as err:
        print("image: %s" % err, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
