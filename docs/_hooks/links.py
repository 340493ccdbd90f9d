"""mkdocs hook: the guide's links out of docs/ work in the site as they do on GitHub (mkdocs.yml).

The same Markdown is read on GitHub, so docs/ pages link to the lab notebook and the benchmarks with
relative paths out of docs/ (``../studies/longer-preset/README.md``), and studies pages link back
(``../../docs/training.md``). This hook publishes studies/ and benchmarks/ (Markdown and figures) as
pages under ``studies/...`` and ``benchmarks/...`` (and CHANGELOG.md), and rewrites every relative inline link
(``[text](path)``, ``![alt](path)``) of every page to its target's path in the site, or, where the
target is not in the site (code, configs, data, folders), to the file on GitHub. Links that resolve to
nothing are left as written, for ``mkdocs build --strict`` to report. A page cited as plain text by its path in
the repository (``see docs/math.md#worked-example``, as the code and the generated reports cite pages) becomes a
link to it first (:func:`mention_links`). tests/test_docs_site.py checks it.
"""

from __future__ import annotations

import functools
import os
import posixpath
import re
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

# The repository's trees (and files) published beside docs/, and the files of them that become part of the site.
INCLUDED = ("studies/**/*", "benchmarks/*", "CHANGELOG.md")
SITE_SUFFIXES = (".md", ".png")
STUDIES_SECTION = "Studies"  # mkdocs.yml's nav section that lists each study's README.md

# An inline code span (left as it is), or the target of an inline link: what follows "](" up to the
# closing parenthesis or the space before a title.
TOKEN = re.compile(r"(?P<code>(`+).*?(?<!`)\2(?!`))|(?<=\]\()(?P<target>[^)\s]+)")
FENCE = re.compile(r"\s*(```|~~~)")
URL = re.compile(r"[A-Za-z][\w+.-]*:")  # https:, mailto:, ...
# Inline code or a link (left as they are), or a page of the site named by its path from the repository's root.
MENTION = re.compile(r"(?P<code>(`+).*?(?<!`)\2(?!`))|(?P<link>!?\[[^\]]*\]\([^)]*\))"
                     r"|(?<![\w/\[])(?P<path>(?:docs|studies|benchmarks)/[\w./+-]*\.md)(?P<anchor>#[\w-]+)?")


def root_of(config) -> Path:
    return Path(os.path.abspath(config.config_file_path)).parent


def included(root: Path) -> list[Path]:
    return sorted(p for pattern in INCLUDED for p in root.glob(pattern) if p.suffix in SITE_SUFFIXES and p.is_file())


def on_config(config):
    """mkdocs.yml's Studies section gives each study a short title (its README's title is its whole question, too
    long for the nav) in the order of studies/README.md; a study it leaves out fails the build."""
    missing = unlisted_studies(root_of(config), config.nav or [])
    if missing:
        raise PluginError(f"mkdocs.yml's {STUDIES_SECTION} section lacks {', '.join(missing)}: give each a title there")
    return config


def unlisted_studies(root: Path, nav: list) -> list[str]:
    """The studies/<study>/README.md files that the nav's Studies section does not list."""
    section = next((item[STUDIES_SECTION] for item in nav if isinstance(item, dict) and STUDIES_SECTION in item), [])
    listed = {path for entry in section for path in (entry.values() if isinstance(entry, dict) else [entry])}
    return [p.relative_to(root).as_posix() for p in sorted(root.glob("studies/*/README.md"))
            if p.relative_to(root).as_posix() not in listed]


def on_files(files, config):
    root = root_of(config)
    for path in included(root):
        file = File.generated(config, path.relative_to(root).as_posix(), abs_src_path=str(path))
        # edit_uri is relative to docs_dir, so the page's "edit" button needs the path from there.
        file.edit_uri = Path(os.path.relpath(path, config.docs_dir)).as_posix()
        files.append(file)
    return files


def on_page_markdown(markdown, page, config, files):
    site = {os.path.normpath(f.abs_src_path): f.src_uri for f in files if f.abs_src_path and f.inclusion.is_included()}
    root = str(root_of(config))
    markdown = mention_links(markdown, page.file.abs_src_path, root)
    return rewrite_links(markdown, page.file.abs_src_path, page.file.src_uri, site, root, config.repo_url)


@functools.cache
def anchors(path: str) -> frozenset[str]:
    """The anchors of the Markdown file's headings outside code blocks, as GitHub and mkdocs.yml's toc make them
    (lower case, punctuation but '-' and '_' dropped, each space a '-'; a repeated heading numbered)."""
    out, seen, fenced = set(), {}, False
    for line in Path(path).read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        heading = None if fenced else re.match(r"#{1,6} (.+)", line)
        if heading:
            text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading[1]).replace("`", "").strip().lower()
            base = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
            out.add(base if base not in seen else f"{base}-{seen[base]}")
            seen[base] = seen.get(base, 0) + 1
        out.update(re.findall(r'<a id="([^"]+)"', line))
    return frozenset(out)


def mention_links(markdown: str, source: str, root: str) -> str:
    """``markdown`` of the page read from ``source`` with each plain-text mention of a page by its path from the
    repository's ``root`` (``docs/math.md#worked-example``, ``studies/s/README.md``) made a link to it, relative to
    the page, its text the path as written. Code, links, and mentions of a file or heading that does not exist (a
    study's record of a section since moved) are left alone."""
    def link(m: re.Match) -> str:
        path = os.path.join(root, m["path"] or "")
        if not m["path"] or not os.path.isfile(path) or (m["anchor"] and m["anchor"][1:] not in anchors(path)):
            return m[0]
        target = os.path.relpath(os.path.join(root, m["path"]), os.path.dirname(source)).replace(os.sep, "/")
        return f"[{m['path']}{m['anchor'] or ''}]({target}{m['anchor'] or ''})"
    lines, fenced = markdown.split("\n"), False
    for i, line in enumerate(lines):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines[i] = MENTION.sub(link, line)
    return "\n".join(lines)


def rewrite_links(markdown: str, source: str, src_uri: str, site: dict[str, str], root: str, repo_url: str) -> str:
    """``markdown`` of the page read from ``source`` (published at ``src_uri``) with each relative link
    rewritten by :func:`site_target`; fenced code blocks and inline code are left untouched."""
    lines, fenced = markdown.split("\n"), False
    for i, line in enumerate(lines):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines[i] = TOKEN.sub(lambda m: m["code"] or site_target(m["target"], source, src_uri, site, root, repo_url), line)
    return "\n".join(lines)


def site_target(target: str, source: str, src_uri: str, site: dict[str, str], root: str, repo_url: str) -> str:
    """Where the link ``target`` written in ``source`` points in the site: the target's ``src_uri`` (``site``
    maps normalised absolute paths to them) relative to the page's, or its GitHub URL when it is a file or
    folder of the repository ``root`` not in the site. URLs, same-page anchors and links that resolve to
    nothing come back as written. Paths are joined lexically, as GitHub resolves a relative link."""
    if URL.match(target) or target.startswith(("#", "/")):
        return target
    path, hash_, fragment = target.partition("#")
    real = os.path.normpath(os.path.join(os.path.dirname(source), path))
    if real in site:
        return posixpath.relpath(site[real], posixpath.dirname(src_uri) or ".") + hash_ + fragment
    if not os.path.exists(real) or os.path.commonpath([real, root]) != root:
        return target
    kind = "tree" if os.path.isdir(real) else "blob"
    return f"{repo_url.rstrip('/')}/{kind}/main/{Path(real).relative_to(root).as_posix()}" + hash_ + fragment
