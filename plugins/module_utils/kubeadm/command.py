# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The command layer: finding kubeadm, its command lines through the one command runner
(module_utils/command.py), and parsers of its structured outputs (never free-text scraping)."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    ConstellationError,
    ExternalCommandError,
    StateError,
)
from ansible_collections.constellation.cluster.plugins.module_utils.command import CommandResult, run_command
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.validate import (  # noqa: F401
    KUBERNETES_DIR,
    _TOKEN_RE,
    _validate_path,
    validate_token_id,
)


# --------------------------------------------------------------------------- command seam


class KubeadmMissing(StateError):
    """No kubeadm executable where we looked."""


def find_kubeadm(kubeadm_path: Optional[str] = None) -> str:
    if kubeadm_path:
        if os.path.isfile(kubeadm_path) and os.access(kubeadm_path, os.X_OK):
            return kubeadm_path
        raise KubeadmMissing("kubeadm_path: %s is not an executable file" % kubeadm_path)
    found = shutil.which("kubeadm")
    if not found:
        raise KubeadmMissing("kubeadm was not found on PATH (%s); install it or set kubeadm_path"
                             % os.environ.get("PATH", ""))
    return found


@dataclass(frozen=True)
class TokenInfo:
    """A listed bootstrap token, without its secret half."""

    token_id: str
    description: str = ""
    expires: Optional[str] = None
    usages: tuple = ()
    groups: tuple = ()

    def as_dict(self) -> dict:
        return {"token_id": self.token_id, "description": self.description,
                "expires": self.expires, "usages": list(self.usages), "groups": list(self.groups)}


class Kubeadm:
    """Command lines for kubeadm and parsers for what it returns."""

    def __init__(self, kubeadm_path: Optional[str] = None, kubernetes_dir: str = KUBERNETES_DIR,
                 runner: Callable[..., CommandResult] = run_command, verbosity: int = 5):
        self._kubeadm_path = kubeadm_path
        self._resolved: Optional[str] = None
        self.kubernetes_dir = _validate_path(kubernetes_dir, "kubernetes_dir")
        self._runner = runner
        self._verbosity = verbosity

    @property
    def path(self) -> str:
        if self._resolved is None:
            self._resolved = find_kubeadm(self._kubeadm_path)
        return self._resolved

    @property
    def admin_kubeconfig_path(self) -> str:
        return os.path.join(self.kubernetes_dir, "admin.conf")

    def run(self, args: Sequence[str], timeout: float = 900.0) -> CommandResult:
        argv = [self.path] + list(args)
        result = self._runner(argv, timeout=timeout)
        if result.rc != 0:
            raise ExternalCommandError(argv, result.rc, result.stderr or result.stdout)
        return result

    def init(self, config_path: str, upload_certs: bool) -> CommandResult:
        args = ["init", "-v=%d" % self._verbosity, "--config", config_path]
        if upload_certs:
            args.append("--upload-certs")
        return self.run(args)

    def init_phase(self, phase: Sequence[str], config_path: str) -> CommandResult:
        """``kubeadm init phase <phase...> -v=N --config F``, e.g. ``["preflight"]`` or ``["certs", "all"]``."""
        return self.run(["init", "phase"] + list(phase) + ["-v=%d" % self._verbosity, "--config", config_path])

    def init_skipping(self, config_path: str, skip_phases: Sequence[str], upload_certs: bool) -> CommandResult:
        """``kubeadm init -v=N --skip-phases=a,b --config F`` (the phases that already ran are skipped)."""
        args = ["init", "-v=%d" % self._verbosity]
        if skip_phases:
            args.append("--skip-phases=%s" % ",".join(skip_phases))
        args += ["--config", config_path]
        if upload_certs:
            args.append("--upload-certs")
        return self.run(args)

    def kubeconfig_user(self, config_path: str, client_name: str, organizations: Sequence[str]) -> str:
        """``kubeadm kubeconfig user --client-name X --config F --org O``: a kubeconfig (its stdout) for a
        client certificate signed by the cluster CA."""
        args = ["kubeconfig", "user", "--client-name", client_name, "--config", config_path]
        for org in organizations:
            args += ["--org", org]
        return self.run(args, timeout=120).stdout

    def join(self, config_path: str) -> CommandResult:
        return self.run(["join", "-v=%d" % self._verbosity, "--config", config_path])

    def token_create(self, config_path: str) -> str:
        out = self.run(["token", "create", "--config", config_path,
                        "--kubeconfig", self.admin_kubeconfig_path], timeout=120).stdout
        lines = [line.strip() for line in out.splitlines() if line.strip()]
        if not lines or not _TOKEN_RE.match(lines[-1]):
            raise ConstellationError("kubeadm token create printed no bootstrap token")
        return lines[-1]

    def token_list(self) -> list:
        out = self.run(["token", "list", "-o", "json", "--kubeconfig", self.admin_kubeconfig_path],
                       timeout=120).stdout
        return parse_token_list(out)

    def token_secrets(self) -> dict:
        """token_id -> full token, for comparing a wanted token with the live one."""
        out = self.run(["token", "list", "-o", "json", "--kubeconfig", self.admin_kubeconfig_path],
                       timeout=120).stdout
        return {obj["token"].split(".", 1)[0]: obj["token"] for obj in _json_stream(out)
                if isinstance(obj.get("token"), str) and _TOKEN_RE.match(obj["token"])}

    def token_delete(self, tid: str) -> None:
        self.run(["token", "delete", validate_token_id(tid), "--kubeconfig", self.admin_kubeconfig_path],
                 timeout=120)

    def version(self) -> str:
        """``kubeadm version -o short``: the executable's own version (``v1.31.1``)."""
        return self.run(["version", "-o", "short"], timeout=60).stdout.strip()

    def upgrade_plan(self, version: str) -> str:
        """``kubeadm upgrade plan vX -o json`` (read-only): its output, for ``upgrade.parse_upgrade_plan``."""
        return self.run(["upgrade", "plan", version, "-o", "json", "--kubeconfig", self.admin_kubeconfig_path],
                        timeout=300).stdout

    def upgrade_apply(self, version: str) -> CommandResult:
        """``kubeadm upgrade apply vX --yes`` on the first control plane (``--yes``: no prompt)."""
        return self.run(["upgrade", "apply", version, "--yes", "-v=%d" % self._verbosity,
                         "--kubeconfig", self.admin_kubeconfig_path], timeout=1800)

    def upgrade_node(self, control_plane: bool) -> CommandResult:
        """``kubeadm upgrade node``: a further control plane's static pods, or a worker's kubelet
        configuration, to the cluster's version (what apply wrote to the kubeadm-config ConfigMap). A
        worker has no admin.conf: it talks to the API server as its kubelet (``kubelet.conf``)."""
        kubeconfig = self.admin_kubeconfig_path if control_plane else os.path.join(self.kubernetes_dir, "kubelet.conf")
        return self.run(["upgrade", "node", "-v=%d" % self._verbosity, "--kubeconfig", kubeconfig], timeout=1800)

    def upload_certs(self, config_path: str) -> None:
        self.run(["init", "phase", "upload-certs", "--upload-certs", "--config", config_path,
                  "--kubeconfig", self.admin_kubeconfig_path], timeout=300)


def _json_stream(text: str) -> list:
    """kubeadm's JSON printer writes one object per token, back to back (not a JSON array)."""
    decoder = json.JSONDecoder()
    objects, pos = [], 0
    text = text.strip()
    while pos < len(text):
        try:
            obj, end = decoder.raw_decode(text, pos)
        except ValueError:
            raise ConstellationError("kubeadm token list -o json printed something that is not JSON") from None
        if isinstance(obj, list):
            objects.extend(o for o in obj if isinstance(o, dict))
        elif isinstance(obj, dict):
            objects.append(obj)
        pos = end
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return objects


def parse_token_list(text: str) -> list:
    """``kubeadm token list -o json`` -> [TokenInfo] (the secret half is dropped here)."""
    tokens = []
    for obj in _json_stream(text):
        full = obj.get("token")
        if not isinstance(full, str) or not _TOKEN_RE.match(full):
            continue
        tokens.append(TokenInfo(
            token_id=full.split(".", 1)[0],
            description=obj.get("description") or "",
            expires=obj.get("expires"),
            usages=tuple(obj.get("usages") or ()),
            groups=tuple(obj.get("groups") or ()),
        ))
    return tokens
