# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a text file of ours cites, and whether it exists: the rules tests/unit/test_layout.py applies to the
repository and tests/unit/test_galaxy_tarball.py to the built collection (which must not cite what it lacks)."""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from pathlib import Path

# What is not the repository's text: ignored by git (.gitignore), or not ours.
NOT_OURS = {".git", ".venv", "collections", "output", "__pycache__", ".pytest_cache", ".hypothesis", ".ansible",
            ".lab", "build", "context", "node_modules", ".tox"}
TEXT_SUFFIXES = {".py", ".md", ".rst", ".yml", ".yaml", ".sh", ".cfg", ".toml", ".txt", ".j2", ".ini", ".json"}
# The changelog is history by design.
HISTORY = ("CHANGELOG.md", "CHANGELOG.rst", "changelogs/")
# docs/bench.md is a log of measurements: each run is named by the issue whose code it measured.
MEASUREMENT_LOG = {"docs/bench.md"}
# Forbidden: the upstream spec's and the design notes' names (neither file is in the repository), and
# "issue N" (a comment says why the code is as it is, not which issue changed it; "issue 7.8 ms" is a verb).
# A name in code (``valid_args(SPEC)``, ``SPEC = dict(...)``) is not a citation.
UPSTREAM_NOTES = re.compile(r"(?:(?<![\w.(])|(?<=\()(?<![\w.]\())(?:S[P]EC|DES[I]GN)(?:\.md\b|\s*§|\s+\d|\s*[;:)](?!\s*dict))")
ISSUE_NUMBER = re.compile(r"(?i)\bissues?\s+#?\d+\b(?![.,]\d)")
# A cited path: relative (not after "/", "~", "$", "{" or a word), at least one folder, a file name with one of
# these suffixes, not followed by a word character or a "/".
CITED_PATH = re.compile(r"(?<![\w./~$<{}-])((?:[\w.-]+/)+[\w-][\w.-]*\.(?:py|md|rst|yml|yaml|sh))(?![\w/])")


# A cited section: ``docs/<name>.md, "Heading"`` (or ``<name>.md "Heading"``); a bare upper-case document name: ``README.md``.
CITED_SECTION = re.compile(r'((?:[\w.-]+/)*[\w-]+\.md),? "([^"\n]+)"')
BARE_DOCUMENT = re.compile(r"(?<![\w./~$<{}-])([A-Z][A-Z_]*\.md)\b")


def sections(path: Path):
    """What a section citation may name: a Markdown heading, or a paragraph's bold lead-in (``**Text.**``);
    backticks are ignored, and the citation may give the title's beginning only."""
    titles = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            titles.append(line.lstrip("#").strip())
        elif line.startswith("**") and "**" in line[2:]:
            titles.append(line[2:line.index("**", 2)])
    return [title.replace("`", "") for title in titles]


def cited_section_missing(root: Path, doc: str, title: str, rel: str) -> bool:
    for path in (root / doc, (root / rel).parent / doc):
        if path.is_file():
            title = title.replace("`", "")
            return not any(section.startswith(title) for section in sections(path))
    return False  # a missing document is the path rule's finding


def repository_text_files(root: Path):
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in NOT_OURS and not d.endswith(".egg-info")
                         and not os.path.islink(os.path.join(folder, d)))
        for name in sorted(files):
            path = Path(folder) / name
            rel = path.relative_to(root).as_posix()
            if rel.startswith("inventories/lab/") or path.is_symlink():
                continue
            if path.suffix in TEXT_SUFFIXES or name in ("Makefile", "README", "LICENSE"):
                yield path, rel


def python_comments_and_docstrings(text: str):
    """The comments and the docstrings of a Python file: where a citation is prose, not code."""
    parts = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                parts.append(token.string)
        tree = ast.parse(text)
    except (SyntaxError, tokenize.TokenError):
        return [text]
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                parts.append(doc)
    return parts


def prose(path: Path, rel: str):
    """Where a file cites: all of a document (.md, .rst, .txt), the comments and docstrings of Python, the
    comments (from a ``#`` at a line's start or after a blank) of YAML, shell and the other text files."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix in (".md", ".rst", ".txt"):
        return [text]
    if path.suffix == ".py":
        return python_comments_and_docstrings(text)
    return [m.group(1) for m in re.finditer(r"(?:^|\s)(#.*)$", text, re.M)]


def ignored_folders(root: Path):
    """The folders .gitignore names: what the tools generate (the lab's inventory), never kept."""
    lines = (root / ".gitignore").read_text(encoding="utf-8").splitlines()
    return tuple(line.strip("/") + "/" for line in lines if line.endswith("/") and "*" not in line)


def cited_bases(root: Path, rel: str):
    """Where a relative path may start: the repository root, plugins/module_utils (the modules' own relative
    form: ``core/status.py``), plugins/, playbooks/ (a play's ``vars/`` and ``tasks/``), the citing file's folder
    and a role's folder (in a role: its own; elsewhere: any, as docs/roles.md says ``meta/main.yml`` of every
    role)."""
    parts = rel.split("/")
    if parts[0] == "roles" and len(parts) > 2:
        roles = [root / "roles" / parts[1]]
    else:
        roles = sorted(path for path in (root / "roles").iterdir() if path.is_dir())
    return [root, root / "plugins" / "module_utils", root / "plugins", root / "playbooks", (root / rel).parent] + roles


def operators_inventory(root: Path, cited: str) -> bool:
    """inventories/ keeps the example: an operator's own ``inventories/<name>/`` (the README's) is not ours."""
    parts = cited.split("/")
    return parts[0] == "inventories" and len(parts) > 2 and not (root / "inventories" / parts[1]).is_dir()


def cited_path_missing(root: Path, cited: str, rel: str, ignored) -> bool:
    """A path whose first folder is in none of the bases is not ours (an operator's ``group_vars/``,
    Kubernetes' ``manifests/``): not a citation. Ours must exist, or lie in a folder .gitignore names, or in
    an operator's inventory."""
    bases = [base for base in cited_bases(root, rel) if (base / cited.split("/")[0]).is_dir()]
    if not bases or cited.startswith(ignored) or operators_inventory(root, cited):
        return False
    return not any((base / cited).exists() for base in bases)


def repository_file(root: Path, cited: str, rel: str):
    """The repository's file or folder (relative to ``root``) that a path cited in ``rel`` names, or None: not a
    path of ours, or one that does not exist (the repository rule's finding)."""
    bases = [base for base in cited_bases(root, rel) if (base / cited.split("/")[0]).is_dir()]
    if cited.startswith(ignored_folders(root)) or operators_inventory(root, cited):
        return None
    for base in bases:
        if (base / cited).exists():
            return (base / cited).relative_to(root).as_posix()
    return None
