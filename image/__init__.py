# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node image (docs/image.md): ``python -m image build`` makes a measured, immutable Debian 12 disk with the
agent inside (dm-verity root, a UKI whose command line carries the root hash, no login) and its signed
predicted measurements; ``python -m image boot`` boots it under QEMU (TCG, OVMF, swtpm).

Rooms: ``paths.py`` (cache and output folders, the pinned host tools), ``run.py`` (the process boundary),
``rootfs.py`` (the cached mmdebstrap root file system), ``contents.py`` (what the build puts into it: agent,
baked trust configuration, units), ``assemble.py`` (ext4, dm-verity, UKI, ESP, GPT), ``measure.py`` (the
signed measurements document), ``build.py`` (the steps and the manifest), ``boot.py`` (the QEMU harness)."""

# The Core (plugins/module_utils) through the link scripts/setup.sh makes, as the lab finds it (lab/__init__.py).
import lab  # noqa: F401,E402  pylint: disable=unused-import,wrong-import-position
