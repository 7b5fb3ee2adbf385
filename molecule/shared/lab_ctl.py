"""Builds and removes the lab hosts of one Molecule scenario (molecule/shared/create.yml, destroy.yml).

The lab's own CLI (``python -m lab``) writes an inventory only for the default lab; a scenario needs
its own lab name and an inventory directory of its own (for the per-host shell wrappers
``<inventory>/bin/<host>-sh``), so this calls the lab's Python API. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from lab.lab import Lab, LabError  # noqa: E402  (needs the repository on sys.path)


def _link_shells(lab: Lab, inventory_dir: Path) -> dict:
    """Stable per-host wrapper paths for the scenarios' group vars: <inventory>/bin/<host>-sh.

    The lab declares each host's wrapper shell in its local-connection inventory (where the lab
    keeps it may change); this links the fixed path to it."""
    declared = {}
    local_inventory = getattr(lab, "local_inventory", None)
    if local_inventory is not None and Path(local_inventory).exists():
        import yaml

        data = yaml.safe_load(Path(local_inventory).read_text()) or {}
        for group in (data.get("all", {}).get("children") or {}).values():
            for name, hostvars in ((group or {}).get("hosts") or {}).items():
                declared[name] = (hostvars or {}).get("ansible_shell_executable")
    shells = {}
    (inventory_dir / "bin").mkdir(parents=True, exist_ok=True)
    for h in lab.hosts:
        link = inventory_dir / "bin" / ("%s-sh" % h.name)
        target = declared.get(h.name)
        if target and Path(target) != link:
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(target)
        if not link.exists():
            raise LabError("no wrapper shell for %s (looked in %s)" % (h.name, local_inventory))
        shells[h.name] = str(link)
    return shells


def _keep_logs(lab: Lab) -> None:
    """Copies every host's agent log to ``$CONSTELLATION_MOLECULE_LOGS/<lab>/<host>.agent.log`` before the lab is
    removed (scripts/molecule.sh sets it and shows them when a scenario fails); nothing when it is unset."""
    target = os.environ.get("CONSTELLATION_MOLECULE_LOGS")
    if not target:
        return
    folder = Path(target) / lab.name
    folder.mkdir(parents=True, exist_ok=True)
    for h in lab.hosts:
        log = Path(h.dir) / "agent" / "agent.log"
        if log.is_file():
            shutil.copyfile(str(log), str(folder / ("%s.agent.log" % h.name)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="lab_ctl.py", description=__doc__)
    p.add_argument("action", choices=["up", "down"])
    p.add_argument("--name", required=True, help="lab name, 1-8 characters [a-z0-9]")
    p.add_argument("--inventory-dir", required=True, help="where the lab writes hosts.yml and bin/<host>-sh")
    p.add_argument("--hosts", type=int, default=1)
    p.add_argument("--no-tpm", action="store_true")
    p.add_argument("--agents", action="store_true",
                   help="start the node agent on every host (the lab's aTLS inventory then reaches them)")
    args = p.parse_args(argv)
    try:
        lab = Lab(args.name, inventory_dir=Path(args.inventory_dir))
        if args.action == "up":
            # Always fresh hosts: a lab left behind by an interrupted run must not leak its
            # interfaces or files into the next converge (so the scenarios need no first destroy).
            lab.down()
            lab.up(hosts=args.hosts, tpm=not args.no_tpm, agents=args.agents)
            shells = _link_shells(lab, Path(args.inventory_dir))
            print(json.dumps({"changed": True, "lab": lab.name, "hosts": [h.name for h in lab.hosts],
                              "public_ips": {h.name: h.public_ip for h in lab.hosts}, "agents": args.agents,
                              "shells": shells}))
        else:
            existed = lab.state_dir.exists()
            if existed:
                _keep_logs(lab)
            lab.down()
            print(json.dumps({"changed": existed, "lab": lab.name}))
    except LabError as err:
        print("lab_ctl: %s" % err, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
