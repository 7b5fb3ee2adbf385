# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The client's side of the vpnapi's ``PeerAuth`` (docs/protocol.md): a mixin of ``client.VPNAPIClient``.
The crypto lives in wireguard/peer_auth.py, imported only when a proof is made."""

from __future__ import annotations

from typing import Any, Dict, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import ProtocolError, b64e


class PeerAuthClient:
    """Needs ``stream`` and ``sock`` (a ``client.Channel``)."""

    def peer_auth(self, vpn_priv_key, server_vpn_pub_key: Optional[str] = None) -> Dict[str, Any]:
        """Proves this peer's WireGuard private key for this connection. ``vpn_priv_key``: the key (base64,
        as ``wg genkey``) or a ``peer_auth.PairKeys`` (its pair keys cached). ``server_vpn_pub_key``: the
        Coordinator's WireGuard key as this peer knows it from its peers; a server announcing another gets
        no proof (ProtocolError). Without it the announced key is used: the proof is bound to it, so it is
        worth nothing to anyone else."""
        from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import peer_auth

        keys = vpn_priv_key if isinstance(vpn_priv_key, peer_auth.PairKeys) else peer_auth.PairKeys(vpn_priv_key)
        self.stream.send_request("PeerAuth", {})  # type: ignore[attr-defined]
        step = self.stream.recv_msg("a challenge")  # type: ignore[attr-defined]
        try:
            proof = keys.answer(step, self.sock.getsockname()[0], self.sock.getpeername()[0],  # type: ignore[attr-defined]
                                server_vpn_pub_key)
        except InputError as err:
            raise ProtocolError("PeerAuth: %s" % err) from None
        self.stream.send_msg({"proof": b64e(proof)})  # type: ignore[attr-defined]
        return self.stream.recv_end()  # type: ignore[attr-defined]
