"""Keys, validation, diff and rendering of the WireGuard Core (no programs run here)."""

from __future__ import annotations

import base64
import os
import stat
import subprocess
import shutil

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils import wireguard as wgmod
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ExternalCommandError, InputError
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import (
    InterfaceState,
    LinkState,
    LivePeer,
    Peer,
    PeerDiff,
    PeerRequest,
    diff_peers,
    parse_dump,
    parse_peer_list,
)


def _pub() -> str:
    return wgmod.pub_key_from_priv_key(wgmod.generate_priv_key())


K1, K2, K3, K4 = (_pub() for dummy_i in range(4))


def _live(*peers: LivePeer, pub_key: str | None = None) -> InterfaceState:
    return InterfaceState("wg0", pub_key, 51820, 0, {p.pub_key: p for p in peers})


def _lp(key, ip, endpoint=None, keepalive=10, handshake=0) -> LivePeer:
    return LivePeer(key, endpoint, ("%s/32" % ip,), handshake, 0, 0, keepalive)


# ---------------------------------------------------------------- keys

@pytest.mark.skipif(shutil.which("wg") is None, reason="needs wg")
def test_pub_key_matches_wg_pubkey():
    priv = wgmod.generate_priv_key()
    out = subprocess.run(["wg", "pubkey"], input=priv + "\n", capture_output=True, text=True, check=True).stdout.strip()
    assert wgmod.pub_key_from_priv_key(priv) == out


def test_generated_keys_differ_and_are_44_chars():
    a, b = wgmod.generate_priv_key(), wgmod.generate_priv_key()
    assert a != b
    assert len(a) == 44 and len(base64.b64decode(a)) == 32


@pytest.mark.parametrize("bad", ["", "abc", "A" * 44, base64.b64encode(b"x" * 31).decode(), "!" * 44, None, 5])
def test_malformed_key_refused(bad):
    with pytest.raises(InputError) as err:
        wgmod.key_bytes(bad, "peers[0].pub_key")
    assert err.value.field == "peers[0].pub_key"


def test_key_error_never_echoes_the_value():
    secret = base64.b64encode(b"s" * 31).decode()
    with pytest.raises(InputError) as err:
        wgmod.pub_key_from_priv_key(secret)
    assert secret not in str(err.value)


def test_key_file_created_0600_and_stable(tmp_path):
    path = str(tmp_path / "wg0.key")
    state, changed = wgmod.ensure_key_file(path, check_mode=True)
    assert changed and not state.exists and not os.path.exists(path)
    state, changed = wgmod.ensure_key_file(path)
    assert changed and state.exists
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open(path) as handle:
        assert wgmod.pub_key_from_priv_key(handle.read().strip()) == state.pub_key
    again, changed = wgmod.ensure_key_file(path)
    assert not changed and again.pub_key == state.pub_key
    os.chmod(path, 0o644)
    fixed, changed = wgmod.ensure_key_file(path)
    assert changed and fixed.pub_key == state.pub_key and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.listdir(tmp_path) == ["wg0.key"]  # no temp files left


def test_key_file_with_garbage_is_an_input_error(tmp_path):
    path = tmp_path / "wg0.key"
    path.write_text("not a key\n")
    with pytest.raises(InputError) as err:
        wgmod.ensure_key_file(str(path))
    assert err.value.field == "priv_key_file"
    assert path.read_text() == "not a key\n"


# ---------------------------------------------------------------- validation

def test_valid_list_is_normalised():
    reqs = parse_peer_list([
        {"pub_key": K1, "vpn_ip": "10.118.0.1/32", "endpoint": "10.42.0.11:51820"},
        {"pub_key": K2, "vpn_ip": "10.118.0.12", "persistent_keepalive": 0},
        {"pub_key": K3, "state": "absent"},
    ])
    assert reqs[0] == PeerRequest(Peer(K1, "10.118.0.1", "10.42.0.11:51820", 10))
    assert reqs[1].peer.persistent_keepalive == 0 and reqs[1].peer.endpoint is None
    assert reqs[2].present is False and reqs[2].peer.pub_key == K3


@pytest.mark.parametrize("items, field", [
    ([{"pub_key": "bogus", "vpn_ip": "10.118.0.2"}], "peers[0].pub_key"),
    ([{"pub_key": K1, "vpn_ip": "10.118.0.2"}, {"pub_key": K2, "vpn_ip": "10.119.0.2"}], "peers[1].vpn_ip"),
    ([{"pub_key": K1, "vpn_ip": "10.118.0.2"}, {"pub_key": K2, "vpn_ip": "10.118.0.2/32"}], "peers[1].vpn_ip"),
    ([{"pub_key": K1, "vpn_ip": "10.118.0.2"}, {"pub_key": K1, "vpn_ip": "10.118.0.3"}], "peers[1].pub_key"),
    ([{"pub_key": K1, "vpn_ip": "10.118.0.0/24"}], "peers[0].vpn_ip"),
    ([{"pub_key": K1, "vpn_ip": "10.118.0.0"}], "peers[0].vpn_ip"),
    ([{"pub_key": K1, "vpn_ip": "10.118.0.2", "endpoint": "example.org:51820"}], "peers[0].endpoint"),
    ([{"pub_key": K1, "vpn_ip": "10.118.0.2", "endpoint": "10.42.0.1:70000"}], "peers[0].endpoint"),
    ([{"pub_key": K1, "vpn_ip": "10.118.0.2", "persistent_keepalive": -1}], "peers[0].persistent_keepalive"),
    ([{"pub_key": K1, "vpn_ip": "10.118.0.2", "state": "gone"}], "peers[0].state"),
    ([{"pub_key": K1, "vpn_ip": "10.118.0.2", "role": "node"}], "peers[0]"),
    ([{"pub_key": K4, "vpn_ip": "10.118.0.2"}], "peers[0].pub_key"),  # own key
])
def test_invalid_lists_name_field_and_index(items, field):
    with pytest.raises(InputError) as err:
        parse_peer_list(items, own_pub_key=K4)
    assert err.value.field == field
    assert field in str(err.value)


def test_absent_peer_may_free_its_ip_for_a_new_key():
    reqs = parse_peer_list([{"pub_key": K1, "vpn_ip": "10.118.0.12", "state": "absent"},
                            {"pub_key": K2, "vpn_ip": "10.118.0.12"}], exclusive=True)
    live = _live(_lp(K1, "10.118.0.12"))
    diff = diff_peers(reqs, live, exclusive=True)
    assert [p.pub_key for p in diff.added] == [K2] and [p.pub_key for p in diff.removed] == [K1]
    with pytest.raises(InputError) as err:
        parse_peer_list([{"pub_key": K1, "vpn_ip": "10.200.0.12", "state": "absent"}])
    assert err.value.field == "peers[0].vpn_ip"


def test_configurable_cidr():
    parse_peer_list([{"pub_key": K1, "vpn_ip": "10.7.0.5"}], vpn_cidr="10.7.0.0/24")
    with pytest.raises(InputError):
        parse_peer_list([{"pub_key": K1, "vpn_ip": "10.118.0.5"}], vpn_cidr="10.7.0.0/24")


def test_empty_exclusive_list_fails_closed():
    with pytest.raises(InputError) as err:
        parse_peer_list([], exclusive=True)
    assert err.value.field == "peers"
    with pytest.raises(InputError):
        parse_peer_list([{"pub_key": K1, "state": "absent"}], exclusive=True)
    assert parse_peer_list([], exclusive=False) == []


# ---------------------------------------------------------------- diff

def _reqs(*peers, absent=()):
    return [PeerRequest(p) for p in peers] + [PeerRequest(Peer(k, ""), present=False) for k in absent]


def test_no_change_is_empty_diff():
    live = _live(_lp(K1, "10.118.0.1", "10.42.0.11:51820"), _lp(K2, "10.118.0.12", "10.42.0.12:51820"))
    diff = diff_peers(_reqs(Peer(K1, "10.118.0.1", "10.42.0.11:51820"), Peer(K2, "10.118.0.12", "10.42.0.12:51820")), live)
    assert not diff and diff == PeerDiff()


def test_endpoint_change_is_changed_not_readded():
    live = _live(_lp(K1, "10.118.0.1", "10.42.0.11:51820"), _lp(K2, "10.118.0.12", "10.42.0.12:51820"))
    diff = diff_peers(_reqs(Peer(K1, "10.118.0.1", "10.42.0.99:51820"), Peer(K2, "10.118.0.12", "10.42.0.12:51820")), live)
    assert diff.changed == (Peer(K1, "10.118.0.1", "10.42.0.99:51820"),)
    assert diff.added == () and diff.removed == ()
    argv = wgmod.wg_set_argv("wg0", diff)
    assert "remove" not in argv and K2 not in argv and argv[argv.index("endpoint") + 1] == "10.42.0.99:51820"


def test_unset_endpoint_keeps_roaming_endpoint():
    live = _live(_lp(K1, "10.118.0.20", "10.42.0.50:40000"))
    assert not diff_peers(_reqs(Peer(K1, "10.118.0.20", None)), live)


def test_keepalive_and_allowed_ips_changes():
    live = _live(_lp(K1, "10.118.0.1", keepalive=0), _lp(K2, "10.118.0.12"))
    diff = diff_peers(_reqs(Peer(K1, "10.118.0.1"), Peer(K2, "10.118.0.13")), live)
    assert {p.pub_key for p in diff.changed} == {K1, K2}


def test_unlisted_peers_kept_unless_exclusive():
    live = _live(_lp(K1, "10.118.0.1"), _lp(K2, "10.118.0.12"))
    assert not diff_peers(_reqs(Peer(K1, "10.118.0.1")), live)
    diff = diff_peers(_reqs(Peer(K1, "10.118.0.1")), live, exclusive=True)
    assert [p.pub_key for p in diff.removed] == [K2]


def test_absent_peer_removed_and_absent_unknown_ignored():
    live = _live(_lp(K1, "10.118.0.1"), _lp(K2, "10.118.0.12"))
    diff = diff_peers(_reqs(absent=(K2, K3)), live)
    assert [p.pub_key for p in diff.removed] == [K2] and not diff.added


def test_reassigned_vpn_ip_removes_old_key():
    # Peers are diffed by AllowedIPs: a new key for the same /32 replaces the old peer.
    live = _live(_lp(K1, "10.118.0.12"))
    diff = diff_peers(_reqs(Peer(K2, "10.118.0.12")), live)
    assert [p.pub_key for p in diff.added] == [K2] and [p.pub_key for p in diff.removed] == [K1]
    argv = wgmod.wg_set_argv("wg0", diff)
    assert argv.index(K2) < argv.index(K1)  # add first, then remove


def test_render_has_no_private_key_and_is_sorted():
    text = wgmod.render_peers([Peer(K2, "10.118.0.12", "10.42.0.12:51820"), Peer(K1, "10.118.0.2")], listen_port=51820)
    assert "PrivateKey" not in text
    assert text.index(K1) < text.index(K2)
    assert "AllowedIPs = 10.118.0.12/32" in text and "PersistentKeepalive = 10" in text


def test_apply_to_peers_is_the_after_view():
    current = [Peer(K1, "10.118.0.1", "10.42.0.11:51820"), Peer(K2, "10.118.0.12")]
    diff = PeerDiff(added=(Peer(K3, "10.118.0.13"),), removed=(current[1],), changed=(Peer(K1, "10.118.0.1", None, 0),))
    after = {p.pub_key: p for p in wgmod.apply_to_peers(current, diff)}
    assert set(after) == {K1, K3} and after[K1].endpoint == "10.42.0.11:51820" and after[K1].persistent_keepalive == 0


# ---------------------------------------------------------------- dump / interface conditions

def test_parse_dump_drops_private_key():
    priv = wgmod.generate_priv_key()
    pub = wgmod.pub_key_from_priv_key(priv)
    text = "%s\t%s\t51820\toff\n%s\t(none)\t10.42.0.12:51820\t10.118.0.12/32\t1700000000\t92\t180\t10\n" \
           "%s\t(none)\t(none)\t(none)\t0\t0\t0\toff\n" % (priv, pub, K1, K2)
    state = parse_dump("wg0", text)
    assert state.pub_key == pub and state.listen_port == 51820
    assert state.peers[K1] == LivePeer(K1, "10.42.0.12:51820", ("10.118.0.12/32",), 1700000000, 92, 180, 10)
    assert state.peers[K2].allowed_ips == () and state.peers[K2].persistent_keepalive == 0
    assert priv not in repr(state)


def test_parse_dump_rejects_garbage():
    with pytest.raises(ExternalCommandError):
        parse_dump("wg0", "what\n")


def test_interface_conditions():
    spec = wgmod.parse_interface_spec("wg0", "10.118.0.11/16")
    assert wgmod.interface_changes(spec, LinkState(False), None, None)[0] == "create"
    live = InterfaceState("wg0", K1, 51820, 0, {})
    good = LinkState(True, True, 1420, ("10.118.0.11/16",))
    assert wgmod.interface_changes(spec, good, live, K1) == []
    assert wgmod.interface_changes(spec, good, live, K2) == ["private_key"]
    assert wgmod.interface_changes(spec, LinkState(True, False, 1300, ()), live, K1) == ["address", "mtu", "up"]
    with pytest.raises(InputError) as err:
        wgmod.parse_interface_spec("wg0", "10.119.0.11/16")
    assert err.value.field == "address"
    with pytest.raises(InputError):
        wgmod.parse_interface_spec("bad/name", "10.118.0.11/16")


def test_runner_prefix_and_error():
    runner = wgmod.CommandRunner(prefix=["env", "X_SEAM=1"])
    assert "X_SEAM=1" in runner.run(["env"]).stdout
    with pytest.raises(ExternalCommandError) as err:
        runner.run(["sh", "-c", "echo boom >&2; exit 3"])
    assert err.value.rc == 3 and "boom" in str(err.value)
    with pytest.raises(ExternalCommandError) as err:
        wgmod.CommandRunner().run(["/nonexistent/program"])
    assert err.value.rc == 127
