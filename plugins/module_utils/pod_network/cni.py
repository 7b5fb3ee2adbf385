# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runs the real CNI plugins on a conflist, as a container runtime does (the CNI specification's
"network configuration lists"): ADD runs the plugins in order, each handed the previous one's result as
``prevResult``; DEL runs them in reverse, each handed the cached ADD result. A plugin gets its configuration on
standard input and ``CNI_COMMAND``, ``CNI_CONTAINERID``, ``CNI_NETNS``, ``CNI_IFNAME``, ``CNI_PATH`` (and
``CNI_ARGS``) in its environment; it answers with a result or an error object on standard output.

The ADD result is cached as libcni caches it (``<cache_dir>/<network>-<container id>-<ifname>``, kind
``cniCacheV1``), so DEL hands each plugin what ADD made. A failed ADD is undone with a DEL before its error is
raised, as a runtime does, so a half-made pod leaves no veth and no address lease behind.

Programs run through the one ``CommandRunner`` (module_utils/command.py): a lab host's ``nsenter`` prefix runs
the plugins inside that host. ``cache_dir`` is a path of the process that runs this code (None: no cache).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import os
import re
from typing import Any, List, Mapping, Optional, Sequence

from ansible_collections.constellation.cluster.plugins.module_utils.command import CommandRunner
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    ExternalCommandError,
    InputError,
    StateError,
)
from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import atomic_write
from ansible_collections.constellation.cluster.plugins.module_utils.pod_network.conflist import parse_conflist

# Debian's containernetworking-plugins installs the plugins here.
CNI_PATH = "/usr/lib/cni"
CACHE_DIR = "/var/lib/cni/results"
IFNAME = "eth0"
PACKAGE = "containernetworking-plugins"
_CONTAINER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,254}$")


class CNIError(ExternalCommandError):
    """A CNI plugin refused or failed: names the plugin, the command, the CNI error code and message."""

    def __init__(self, plugin: str, command: str, rc: int, code: Any, msg: str, details: str = ""):
        self.plugin = plugin
        self.command = command
        self.code = code
        self.msg = msg
        suffix = " (%s)" % details if details else ""
        text = "CNI plugin %s %s failed (code %s): %s%s" % (plugin, command, code, msg, suffix)
        super().__init__([plugin, command], rc, text)
        self.args = (text,)

    def __str__(self) -> str:
        return self.args[0]


def check_container_id(value: Any) -> str:
    if not isinstance(value, str) or not _CONTAINER_ID.match(value):
        raise InputError("container_id", "1-255 letters, digits, '_', '.' or '-', starting with a letter or digit",
                         value)
    return value


def check_ifname(value: Any) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= 15 or any(c in value for c in "/: \t\n") \
            or value in (".", ".."):
        raise InputError("ifname", "an interface name of 1-15 characters without '/', ':' or spaces", value)
    return value


class CNI:
    """The CNI plugins of one host. ``cni_path``: the folders that hold them, ``:``-separated (as CNI_PATH)."""

    def __init__(self, runner: Optional[CommandRunner] = None, cni_path: str = CNI_PATH,
                 cache_dir: Optional[str] = CACHE_DIR):
        self.runner = runner or CommandRunner()
        self.cni_path = cni_path
        self.cache_dir = cache_dir

    # -- plugins
    def find_plugin(self, kind: str) -> str:
        """The plugin's executable, or StateError naming the folders searched and the package that brings it."""
        for folder in self.cni_path.split(":"):
            path = os.path.join(folder, kind)
            if folder and os.path.isfile(path) and os.access(path, os.X_OK):
                return path
        raise StateError("CNI plugin %s: not found in cni_path %s (Debian's %s installs it in %s)"
                         % (kind, self.cni_path, PACKAGE, CNI_PATH))

    def check_plugins(self, kinds: Sequence[str]) -> List[str]:
        """Every plugin found (their paths), before anything runs."""
        return [self.find_plugin(kind) for kind in kinds]

    def exec_plugin(self, kind: str, command: str, conf: Mapping, container_id: str, netns: str, ifname: str,
                    cni_args: str = "") -> Optional[dict]:
        """Runs one plugin; its parsed result (None when it printed nothing, as DEL does) or CNIError."""
        env = {"CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_NETNS": netns, "CNI_IFNAME": ifname,
               "CNI_PATH": self.cni_path, "CNI_ARGS": cni_args}
        res = self.runner.run([self.find_plugin(kind)], check=False, env=env, stdin=json.dumps(conf))
        out = res.stdout.strip()
        try:
            doc = json.loads(out) if out else None
        except ValueError:
            doc = None
            if res.rc == 0:
                raise CNIError(kind, command, res.rc, "-", "unreadable result %r" % out[:200]) from None
        if res.rc != 0:
            if isinstance(doc, dict) and "msg" in doc:
                raise CNIError(kind, command, res.rc, doc.get("code"), str(doc.get("msg")), str(doc.get("details", "")))
            raise CNIError(kind, command, res.rc, "-", (res.stderr or out).strip()[-500:] or "no output")
        if doc is not None and not isinstance(doc, dict):
            raise CNIError(kind, command, res.rc, "-", "a result that is not a JSON object")
        return doc

    # -- the conflist
    @staticmethod
    def plugin_conf(conflist: Mapping, plugin: Mapping, prev_result: Optional[Mapping],
                    capability_args: Optional[Mapping] = None) -> dict:
        """One plugin's configuration within the list: its own keys plus the list's ``name`` and ``cniVersion``,
        ``prevResult`` and the ``runtimeConfig`` of the capabilities it declares (libcni's rules)."""
        conf = copy.deepcopy(dict(plugin))
        conf["name"] = conflist["name"]
        conf["cniVersion"] = conflist["cniVersion"]
        if prev_result is not None:
            conf["prevResult"] = copy.deepcopy(dict(prev_result))
        runtime = {key: value for key, value in (capability_args or {}).items()
                   if (plugin.get("capabilities") or {}).get(key)}
        if runtime:
            conf["runtimeConfig"] = runtime
        return conf

    def add(self, conflist: Any, container_id: str, netns: str, ifname: str = IFNAME, cni_args: str = "",
            capability_args: Optional[Mapping] = None) -> dict:
        """ADD: the plugins in order; returns the last result (``ips``, ``interfaces``, ``routes``). On failure the
        pod is torn down with DEL, then the ADD error is raised."""
        doc = parse_conflist(conflist)
        container_id, ifname = check_container_id(container_id), check_ifname(ifname)
        if not isinstance(netns, str) or not netns.startswith("/"):
            raise InputError("netns", "the path of the pod's network namespace, e.g. /run/netns/NAME", netns)
        self.check_plugins([p["type"] for p in doc["plugins"]])
        result: Optional[dict] = None
        try:
            for plugin in doc["plugins"]:
                conf = self.plugin_conf(doc, plugin, result, capability_args)
                result = self.exec_plugin(plugin["type"], "ADD", conf, container_id, netns, ifname, cni_args)
        except ExternalCommandError:
            with contextlib.suppress(ExternalCommandError):
                self._delete(doc, container_id, netns, ifname, cni_args, capability_args, result)
            raise
        result = result or {}
        self._cache_write(doc, container_id, ifname, cni_args, capability_args, result)
        return result

    def delete(self, conflist: Any, container_id: str, netns: str = "", ifname: str = IFNAME, cni_args: str = "",
               capability_args: Optional[Mapping] = None) -> None:
        """DEL: the plugins in reverse, each with the cached ADD result. Every plugin is run even after one fails
        (the first error is raised then); the cache entry is removed once all succeeded. ``netns`` may be empty
        (the namespace is gone): the plugins then release what lives outside it (address lease, host veth)."""
        doc = parse_conflist(conflist)
        container_id, ifname = check_container_id(container_id), check_ifname(ifname)
        cached = self._cache_read(doc["name"], container_id, ifname)
        self._delete(doc, container_id, netns or "", ifname, cni_args, capability_args, cached)
        self._cache_remove(doc["name"], container_id, ifname)

    def _delete(self, doc: Mapping, container_id: str, netns: str, ifname: str, cni_args: str,
                capability_args: Optional[Mapping], prev_result: Optional[Mapping]) -> None:
        first: Optional[ExternalCommandError] = None
        for plugin in reversed(doc["plugins"]):
            conf = self.plugin_conf(doc, plugin, prev_result, capability_args)
            try:
                self.exec_plugin(plugin["type"], "DEL", conf, container_id, netns, ifname, cni_args)
            except ExternalCommandError as err:
                first = first or err
        if first is not None:
            raise first

    # -- the result cache (libcni's layout)
    def _cache_path(self, network: str, container_id: str, ifname: str) -> Optional[str]:
        if not self.cache_dir:
            return None
        return os.path.join(self.cache_dir, "%s-%s-%s" % (network, container_id, ifname))

    def _cache_write(self, doc: Mapping, container_id: str, ifname: str, cni_args: str,
                     capability_args: Optional[Mapping], result: Mapping) -> None:
        path = self._cache_path(doc["name"], container_id, ifname)
        if path is None:
            return
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        entry = {"kind": "cniCacheV1", "containerId": container_id, "ifName": ifname, "networkName": doc["name"],
                 "config": base64.b64encode(json.dumps(doc).encode("utf-8")).decode("ascii"),
                 "cniArgs": [kv.split("=", 1) for kv in cni_args.split(";") if "=" in kv],
                 "capabilityArgs": dict(capability_args or {}), "result": result}
        atomic_write(path, json.dumps(entry).encode("utf-8"), 0o600)

    def _cache_read(self, network: str, container_id: str, ifname: str) -> Optional[dict]:
        path = self._cache_path(network, container_id, ifname)
        if path is None:
            return None
        try:
            with open(path, "rb") as handle:
                entry = json.loads(handle.read())
        except (OSError, ValueError):
            return None
        result = entry.get("result") if isinstance(entry, dict) else None
        return result if isinstance(result, dict) else None

    def _cache_remove(self, network: str, container_id: str, ifname: str) -> None:
        path = self._cache_path(network, container_id, ifname)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def load_conflist(path: str) -> dict:
    """Reads and checks a conflist file (a node's ``/etc/cni/net.d/10-constellation.conflist``)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(1 << 20)
    except OSError as err:
        raise InputError("conflist", "a readable CNI configuration list file (%s)" % err.strerror, path) from None
    return parse_conflist(data, "conflist %s" % path)


def result_addresses(result: Mapping) -> List[str]:
    """The pod's addresses (``10.244.1.2/24``) in an ADD result: those of interfaces inside the sandbox, else all."""
    interfaces = result.get("interfaces") or []
    ips = result.get("ips") or []
    inside = [ip["address"] for ip in ips if isinstance(ip, dict) and isinstance(ip.get("interface"), int)
              and 0 <= ip["interface"] < len(interfaces) and interfaces[ip["interface"]].get("sandbox")]
    return inside or [ip["address"] for ip in ips if isinstance(ip, dict) and "address" in ip]
