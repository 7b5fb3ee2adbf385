# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pod network of a node: pods reach pods on other nodes only through the attested WireGuard mesh.

* ``conflist``: the node's settings (``PodNetworkSpec``) and the CNI configuration list rendered from them.
* ``cni``: the real CNI plugins run on a conflist as a container runtime runs them (ADD, DEL).
* ``nft``: the nftables table ``inet constellation_pod_network`` (pod-range traffic only via wg0 or cni0;
  pod egress masqueraded), applied atomically.
* ``network``: ``PodNetwork`` ties them on one host: what must change, apply, remove.
"""

from __future__ import annotations

# pylint: disable=unused-import
from ansible_collections.constellation.cluster.plugins.module_utils.pod_network.conflist import (  # noqa: F401
    BRIDGE,
    CONF_DIR,
    CONFLIST_PATH,
    NETWORK_NAME,
    PodNetworkSpec,
    dump_conflist,
    parse_conflist,
    parse_pod_network_spec,
    render_conflist,
)
from ansible_collections.constellation.cluster.plugins.module_utils.pod_network.cni import (  # noqa: F401
    CNI,
    CNI_PATH,
    CNIError,
    load_conflist,
    result_addresses,
)
from ansible_collections.constellation.cluster.plugins.module_utils.pod_network.nft import NFTables, render_table  # noqa: F401
from ansible_collections.constellation.cluster.plugins.module_utils.pod_network.network import (  # noqa: F401
    PodNetwork,
    PodNetworkState,
)
