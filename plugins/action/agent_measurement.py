# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin agent_measurement: an agent's PCR 13 computed on the controller, and its entry in the signed
measurements document (attestation/agent_measurement.py). Documentation in plugins/modules/agent_measurement.py.

An action plugin because the default code is this collection's own (``agent_measurement.code_root()``): a module
packed by Ansible holds only the files it imports, and would measure another tree."""

from __future__ import annotations

import hashlib
import json
import os

from ansible.plugins.action import ActionBase

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import agent_measurement as am
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose
from ansible_collections.constellation.cluster.plugins.module_utils.controller_options import AGENT_MEASUREMENT_ARGS
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, InputError
from ansible_collections.constellation.cluster.plugins.plugin_utils.cluster_action import valid_args, validated_args


def _resolve(path, basedir):
    return os.path.join(basedir, path) if path and basedir and not os.path.isabs(path) else path


def measure(args, basedir):
    """(AgentMeasurement, extra results) of the task's code (archive, src or this collection's) and trust
    configuration, as the agent measures itself (unsealing.py: the variant and the EK CAs it loads)."""
    if args.get("archive") and args.get("src"):
        raise InputError("archive", "either archive or src, not both", "both")
    extra = {}
    if args.get("archive"):
        path = _resolve(args["archive"], basedir)
        code = am.archive_code_digest(path, "archive")
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        extra["archive_sha256"] = digest.hexdigest()
    elif args.get("src"):
        code = am.source_code_digest(_resolve(args["src"], basedir), "src")
    else:
        code = am.code_digest(am.code_root())
    variant = args["variant"]
    trust = choose.load_trust(variant, args.get("ek_ca_path"), basedir, "ek_ca_path", args.get("insecure_trust_any_ak"))
    config = am.config_digest(am.measured_config(variant, trust.ek_ca_certs))
    return am.AgentMeasurement(code, config), extra


def _document_text(data, path):
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError("measurements_file", "UTF-8 text", "%s: an invalid byte at offset %d" % (path, err.start)) \
            from None


def _same_key(one, other) -> bool:
    from cryptography.hazmat.primitives import serialization

    def der(key):
        return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return der(one) == der(other)


def keep(args, basedir, entry, check_mode):
    """Lists (or retires) the agent ``args["name"]`` in the document ``measurements_file``, re-signed: a dict of
    results (changed, version, entry, diff texts). Nothing is written in check mode, nor when the document lists
    the agent as asked already; on a failure the old document and signature stay as they were."""
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation import signature as sig
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
        AGENTS_KEY, parse_policy)
    from ansible_collections.constellation.cluster.plugins.module_utils.encoding import load_yaml, read_text
    from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import atomic_write

    if args.get("measurements") is not None or not args.get("measurements_file"):
        raise InputError("measurements_file", "the measurements document to keep the agent in (a file: inline "
                         "measurements cannot be kept)", None)
    path = _resolve(args["measurements_file"], basedir)
    sig_path = sig.signature_path(path)
    key = pinned = None
    if args.get("priv_key_file"):
        key = sig.load_private_key_file(_resolve(args["priv_key_file"], basedir), "priv_key_file",
                                        args.get("priv_key_passphrase"))
    if args.get("measurements_pub_key_file"):
        pinned = sig.load_public_key_file(_resolve(args["measurements_pub_key_file"], basedir),
                                          "measurements_pub_key_file")
        if key is not None and not _same_key(key.public_key(), pinned):
            raise InputError("priv_key_file", "the key whose public half measurements_pub_key_file pins",
                             args["priv_key_file"])
    signed = os.path.exists(sig_path)
    if signed and (key is not None or pinned is not None):
        # The document is checked before it is changed: re-signing an altered document would vouch for it.
        data = sig.read_signed_file(path, pinned or key.public_key(), "measurements_file")
    elif pinned is not None:
        raise InputError("measurements_file", "a document signed with the key measurements_pub_key_file pins "
                         "(%s is missing)" % sig_path, path)
    else:
        data = read_text(path, "measurements_file", sig.MAX_SIGNED_FILE,
                         "an existing measurements document (JSON or YAML)").encode("utf-8")
    text = _document_text(data, path)
    document = load_yaml(text, "measurements_file", int_keys=True)  # YAML may spell PCR indices as integers
    new, changed = am.set_agent_entry(document, args["name"], entry if args["state"] == "present" else None)
    parse_policy(new)  # what every validator will read
    new_text = json.dumps(new, indent=2) + "\n" if changed else text
    sign = key is not None and (changed or not signed)
    if changed and signed and key is None:
        raise InputError("priv_key_file", "the signing key: %s is signed (%s), and changing it without re-signing "
                         "would leave a document no peer accepts" % (path, sig_path), None)
    listed = (new if args["state"] == "present" else document).get(AGENTS_KEY) or {}
    result = {"changed": changed or sign, "version": new.get("version", 0), "entry": listed.get(args["name"]),
              "measurements_file": path, "signature_file": sig_path if (signed or sign) else None,
              "before": text, "after": new_text}
    if check_mode or not result["changed"]:
        return result
    new_data = new_text.encode("utf-8")
    signature = sig.sign_blob(key, new_data) + "\n" if sign else None
    mode = os.stat(path).st_mode & 0o777
    if changed:
        atomic_write(path, new_data, mode)
    if signature is not None:
        try:
            atomic_write(sig_path, signature.encode("ascii"), 0o644)
        except BaseException:
            if changed:
                atomic_write(path, data, mode)  # the old document again: its old signature still verifies it
            raise
    return result


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = valid_args(AGENT_MEASUREMENT_ARGS)
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        args = validated_args(AGENT_MEASUREMENT_ARGS, self._task.args)
        basedir = self._loader.get_basedir()
        try:
            measurement, extra = measure(args, basedir)
            entry = measurement.to_dict()
            result.update(changed=False, value=entry["value"], events=entry["events"], code_digest=measurement.code.hex(),
                          config_digest=measurement.config.hex(), entry=entry, **extra)
            warning = choose.insecure_warning(args["variant"])
            if warning:
                result["warnings"] = [warning]
            if args["state"] == "absent" and not args.get("name"):
                raise InputError("name", "the agent to retire (state=absent)", None)
            if args.get("name"):
                kept = keep(args, basedir, entry, self._task.check_mode)
                before, after = kept.pop("before"), kept.pop("after")
                result.update(kept)
                if self._task.diff:
                    result["diff"] = {"before": before, "after": after, "before_header": kept["measurements_file"],
                                      "after_header": kept["measurements_file"]}
        except ConstellationError as err:
            result.update(failed=True, changed=False, msg=str(err))
        except OSError as err:
            result.update(failed=True, changed=False, msg="%s: %s" % (err.filename or "agent_measurement", err.strerror or err))
        return result
