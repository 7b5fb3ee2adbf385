# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""WireGuard: keys, peer lists, the live state of an interface, and what must change.

Three layers, lowest first (the community.crypto ``luks_device`` pattern):

* ``CommandRunner``: the one place that runs programs (``wg``, ``ip``, ``wireguard-go``), with an
  optional argv prefix so tests can run everything inside a lab host's namespaces.
* ``WireGuard``: operations on one host (read ``wg show <if> dump``, create an interface, apply a
  ``PeerDiff`` with ``wg set``).
* conditions: pure functions that compare what is wanted with what is live (``diff_peers``,
  ``interface_changes``). They decide; the operations only do.

Peers are changed in place (``wg set <if> peer K endpoint ...``), never removed and re-added, so an
unrelated change never drops a live session. A peer list is always explicit and complete: it is never
derived from whatever hosts happen to be in a play. Everything is validated before anything is touched.

Private keys are generated on the host, stored in a 0600 file and handed to ``wg`` as a file path;
they never appear on a command line, in a rendered config, a diff or a log. ``wg show dump`` prints the
private key: the parser drops it on the first line it reads.
"""

from __future__ import annotations

# pylint: disable=unused-import
from ansible_collections.constellation.cluster.plugins.module_utils.command import CommandResult, CommandRunner  # noqa: F401
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard.keys import (  # noqa: F401
    KEY_FILE_MODE,
    KeyFileState,
    LISTEN_PORT,
    MTU,
    PERSISTENT_KEEPALIVE,
    VPN_CIDR,
    WIREGUARD_GO_ENV,
    _raw_private,
    _raw_public,
    ensure_key_file,
    generate_priv_key,
    key_bytes,
    normalize_pub_key,
    pub_key_from_priv_key,
    read_key_file,
)
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard.config import (  # noqa: F401
    InterfaceSpec,
    InterfaceState,
    LinkState,
    LivePeer,
    Peer,
    PeerDiff,
    PeerRequest,
    _parse_endpoint,
    _parse_vpn_ip,
    _peer_matches,
    apply_to_peers,
    diff_peers,
    interface_changes,
    parse_interface_spec,
    parse_peer_list,
    parse_pod_cidr,
    render_peers,
    validate_interface_name,
    wg_set_argv,
)
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard.live import (  # noqa: F401
    WireGuard,
    parse_dump,
)
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard.keys import HAS_CRYPTOGRAPHY  # noqa: F401
