# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How every action plugin of the collection reads its task's arguments: ansible-core's own
``ActionBase.validate_argument_spec()`` against the argument spec its documentation stub in plugins/modules
declares (plugins/module_utils/controller_options.py), plus the two things an AnsibleModule does and that method
does not: a deprecated alias or option the task uses is shown as a deprecation, and a no_log value never appears
in an error message."""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional, Sequence, Tuple

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.parameters import remove_values
from ansible.plugins.action import ActionBase


def valid_args(*specs: Dict[str, Dict[str, Any]]) -> frozenset:
    """Every name an action accepts (its ``_VALID_ARGS``): the options of ``specs`` and their aliases."""
    names = []
    for spec in specs:
        for name, option in spec.items():
            names.append(name)
            names.extend(option.get("aliases", []))
    return frozenset(names)


def deprecations(spec: Dict[str, Dict[str, Any]], task_args) -> Iterator[Tuple[str, Optional[str], Optional[str]]]:
    """(message, version, collection) of each deprecated name in ``task_args``: a deprecated alias, or an option
    to be removed, with the message an AnsibleModule gives."""
    for name, option in spec.items():
        for alias in option.get("deprecated_aliases", []):
            if alias["name"] in task_args:
                yield ("Alias '%s' is deprecated. See the module docs for more information" % alias["name"],
                       alias.get("version"), alias.get("collection_name"))
        if option.get("removed_in_version") and any(
                task_args.get(given) is not None for given in [name] + list(option.get("aliases", []))):
            yield ("Param '%s' is deprecated. See the module docs for more information" % name,
                   option["removed_in_version"], option.get("removed_from_collection"))


def no_log_values(spec: Dict[str, Dict[str, Any]], task_args) -> frozenset:
    """The values ``task_args`` gives options that ``spec`` marks no_log (under their names or aliases)."""
    values = set()
    for name, option in spec.items():
        if option.get("no_log"):
            for given in [name] + list(option.get("aliases", [])):
                value = task_args.get(given)
                if value is not None and str(value):
                    values.add(str(value))
    return frozenset(values)


class ArgSpecAction(ActionBase):
    """An action plugin that validates its task's arguments with ``validated_args``."""

    def validated_args(self, argument_spec: Dict[str, Dict[str, Any]],
                       mutually_exclusive: Optional[Sequence[Sequence[str]]] = None) -> dict:
        """The task's arguments validated, converted and with their defaults (``validate_argument_spec()``; its
        error names the option and fails the task, no_log values masked). A deprecated name the task uses is
        shown as a deprecation; an option and its alias both given, as a warning."""
        args = self._task.args
        try:
            validated = self.validate_argument_spec(argument_spec=argument_spec,
                                                    mutually_exclusive=mutually_exclusive)[1]
        except AnsibleActionFail as err:
            secrets = no_log_values(argument_spec, args)
            if not secrets:
                raise
            raise AnsibleActionFail(remove_values(err.message, secrets), obj=args) from None
        for msg, version, collection in deprecations(argument_spec, args):
            self._display.deprecated(msg, version=version, collection_name=collection)
        for name, option in argument_spec.items():
            for alias in option.get("aliases", []):
                if name in args and alias in args:
                    self._display.warning("Both option %s and its alias %s are set." % (name, alias))
        return validated
