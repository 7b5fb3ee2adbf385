"""python -m lab {up,grow,down,status,tamper,reimage,reboot,stop,foreign-tpm,exec,pod,prove}: the lab of simulated hosts (make demo runs site.yml on it)."""

from __future__ import annotations

import argparse
import json
import sys

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.choose import VARIANT_NAMES
from lab.lab import LAB_STORES, LAB_VARIANT, Lab, LabError
from lab.snp_platform import TAMPERS as SNP_TAMPERS


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab", description=__doc__)
    p.add_argument("--name", default="lab", help="lab name (namespaces cl-<name>-*), default: lab")
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="build N simulated hosts (repairs a broken lab)")
    up.add_argument("--hosts", type=int, default=4)
    up.add_argument("--no-tpm", action="store_true", help="skip swtpm (network only)")
    up.add_argument("--agents", action="store_true", help="start the node agent on every host")
    up.add_argument("--bare", action="store_true",
                    help="bare hosts: no agent, an sshd on each (root, the lab's SSH key) for playbooks/bootstrap.yml")
    up.add_argument("--store", default="file", choices=LAB_STORES,
                    help="the Coordinator's store: file (default) or etcd (a real etcd in h1's namespace)")
    up.add_argument("--coordinators", type=int, default=1,
                    help="how many of the first hosts are Coordinators (odd, 1..7; default 1): with more than one, "
                         "the agents of the Coordinators run an etcd member each")
    up.add_argument("--variant", default=LAB_VARIANT, choices=VARIANT_NAMES,
                    help="attestation variant of the lab (default %s; the lab CA is the EK root)" % LAB_VARIANT)
    g = sub.add_parser("grow", help="add hosts to a running lab (new machines booting)")
    g.add_argument("--hosts", type=int, required=True, help="the lab's new number of hosts")
    sub.add_parser("down", help="remove every namespace, process, mount and file of the lab")
    sub.add_parser("status", help="show the hosts and their parts")
    t = sub.add_parser("tamper", help="extend a PCR of HOST differently, to stand for a modified host; with --snp, "
                                      "change what its SEV-SNP platform reports instead")
    t.add_argument("host")
    t.add_argument("--pcr", type=int, default=9)
    t.add_argument("--snp", choices=SNP_TAMPERS + ("genuine",),
                   help="SEV-SNP variants: debug (the guest's DEBUG policy bit), measurement (a modified guest), tcb "
                        "(a platform below the lab's TCB minimum, with a genuine VCEK for it), foreign (reports "
                        "signed by a VCEK of another AMD: software-signed); genuine undoes them")
    r = sub.add_parser("reimage", help="reboot HOST into another image (its PCRs 4, 9, 11 measure NAME)")
    r.add_argument("host")
    r.add_argument("--image", required=True, help="the image name (lab.image.lab_measurements(NAME) is its policy)")
    rb = sub.add_parser("reboot", help="reboot HOST into the image it booted last; its agent starts again from "
                                       "the code installed on it")
    rb.add_argument("host")
    st = sub.add_parser("stop", help="stop HOST's agent: to the cluster the host is dead (its endpoint refuses "
                                     "connections); `reboot HOST` starts it again")
    st.add_argument("host")
    f = sub.add_parser("foreign-tpm", help="give HOST a TPM whose EK certificate comes from another CA")
    f.add_argument("host")
    e = sub.add_parser("exec", help="run a command inside HOST (or 'admin')")
    e.add_argument("host")
    e.add_argument("argv", nargs=argparse.REMAINDER)
    pod = sub.add_parser("pod", help="pods (lab/pods.py): add|del HOST NAME (a network namespace inside HOST "
                                     "attached by the CNI plugins with HOST's conflist), exec HOST NAME -- ARGV, "
                                     "list HOST")
    pod.add_argument("action", choices=("add", "del", "exec", "list"))
    pod.add_argument("host")
    pod.add_argument("pod", nargs="?")
    pod.add_argument("argv", nargs=argparse.REMAINDER)
    sub.add_parser("prove", help="verify every host's TPM quote and ping all pairs")
    args = p.parse_args(argv)
    lab = Lab(args.name)
    try:
        if args.cmd == "up":
            lab.up(hosts=args.hosts, tpm=not args.no_tpm, agents=args.agents, variant=args.variant, store=args.store,
                   coordinators=args.coordinators, bare=args.bare)
            print("lab %s: %d hosts up (%d Coordinators); inventory: %s"
                  % (lab.name, len(lab.hosts), len(lab.coordinators), lab.inventory_dir))
        elif args.cmd == "grow":
            new = lab.grow(args.hosts)
            print("lab %s: added %s" % (lab.name, ", ".join(h.name for h in new)))
        elif args.cmd == "down":
            lab.down()
            print("lab %s: down" % lab.name)
        elif args.cmd == "status":
            print(json.dumps(lab.status(), indent=2))
        elif args.cmd == "tamper" and args.snp:
            lab.tamper_snp(args.host, args.snp)
            print("lab %s: %s SEV-SNP platform: %s" % (lab.name, args.host, args.snp))
        elif args.cmd == "tamper":
            lab.tamper(args.host, args.pcr)
            print("lab %s: %s PCR %d tampered" % (lab.name, args.host, args.pcr))
        elif args.cmd == "reimage":
            lab.reimage(args.host, args.image)
            print("lab %s: %s rebooted into image %s" % (lab.name, args.host, args.image))
        elif args.cmd == "reboot":
            lab.reboot(args.host)
            print("lab %s: %s rebooted" % (lab.name, args.host))
        elif args.cmd == "stop":
            lab.stop_agent(args.host)
            print("lab %s: %s's agent stopped" % (lab.name, args.host))
        elif args.cmd == "foreign-tpm":
            lab.foreign_tpm(args.host)
            print("lab %s: %s has a TPM of another vendor (EK certificate of another CA)" % (lab.name, args.host))
        elif args.cmd == "exec":
            argv_ = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
            run = lab.admin_run if args.host == "admin" else lab.host(args.host).run
            proc = run(argv_, check=False, capture_output=False)
            return proc.returncode
        elif args.cmd == "pod":
            return _pod(lab, args)
        elif args.cmd == "prove":
            from lab.prove import prove, print_report
            report = prove(lab)
            print_report(report)
            return 0 if report["ok"] else 1
    except LabError as err:
        print("lab: error: %s" % err, file=sys.stderr)
        return 2
    return 0


def _pod(lab: Lab, args) -> int:
    if args.action == "list":
        print("\n".join(lab.pods(args.host)))
        return 0
    if not args.pod:
        raise LabError("pod %s: expected HOST NAME" % args.action)
    if args.action == "add":
        print(json.dumps(lab.pod_add(args.host, args.pod), indent=2))
    elif args.action == "del":
        lab.pod_del(args.host, args.pod)
        print("lab %s: pod %s of %s deleted" % (lab.name, args.pod, args.host))
    else:
        argv_ = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        if not argv_:
            raise LabError("pod exec: expected HOST NAME -- ARGV")
        return lab.pod_run(args.host, args.pod, argv_, check=False, capture_output=False).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
