"""The lab of simulated hosts (``python -m lab``, docs/site.md, "The lab"): a product-side tool, used by the demo,
Molecule, the tests and the benchmarks; it imports the collection's module_utils and never the test kit
(tests/support). ``lab.lab.Lab`` composes the parts, one module each:

- ``names``: the lab's constants, ``LabError`` and ``Host`` (names, addresses, folders from the lab's name);
- ``state``: ``LabState``, the record in ``<state dir>/state.json``;
- ``procs``, ``network``: processes by pid, namespaces and mounts; the bridge and the hosts' namespaces;
- ``image``, ``tpms``, ``swtpm``, ``hostcmd``: the simulated measured boot, the hosts' swtpms, commands run
  inside a host;
- ``trust``, ``inventory``: the init secret, measurements signing key, EK CA, admin key; the inventories;
- ``amd``, ``snp_platform``, ``snp``: the SEV-SNP variants' AMD (ARK, ASK, ASVK, VCEKs), each host's platform that
  signs reports (and its socket service), and how the lab uses them;
- ``agent``, ``etcd``, ``netns``: the node agent on a host, a real etcd, sockets from another namespace;
- ``pods``, ``capture``: pods (network namespaces inside a host, attached by the CNI plugins with its conflist) and
  each host's own CNI folders; tcpdump on the underlay bridge and the frames it saw;
- ``prove``, ``__main__``: ``python -m lab prove`` and the command line.
"""

import sys
from pathlib import Path

# The lab uses the collection's Core (plugins/module_utils) through the link that
# scripts/setup.sh makes: collections/ansible_collections/constellation/cluster -> root.
_COLLECTIONS = str(Path(__file__).resolve().parent.parent / "collections")
if _COLLECTIONS not in sys.path:
    sys.path.insert(0, _COLLECTIONS)
