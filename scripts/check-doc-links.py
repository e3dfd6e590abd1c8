#!/usr/bin/env python3
"""Checks the links between the project's Markdown files: every relative
link names a file that exists and, with a `#fragment`, a heading of that
file (GitHub's anchor for it). Prints each broken link as FILE:LINE and
exits 1 if there is one. Run by the lint suite (scripts/test.sh)."""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def markdown_files():
    yield os.path.join(ROOT, "README.md")
    for base, dirs, files in os.walk(os.path.join(ROOT, "docs")):
        dirs.sort()
        for f in sorted(files):
            if f.endswith(".md"):
                yield os.path.join(base, f)


def lines_outside_code(path):
    fenced = False
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if FENCE.match(line):
                fenced = not fenced
                continue
            if not fenced:
                yield n, line


def anchor(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped
    (but `-` and `_`), each space a `-`."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        seen = {}
        found = set()
        for _, line in lines_outside_code(path):
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if not m:
                continue
            a = anchor(m.group(1))
            n = seen.get(a, 0)
            seen[a] = n + 1
            found.add(a if n == 0 else f"{a}-{n}")
        cache[path] = found
    return cache[path]


def main():
    broken = []
    for path in markdown_files():
        for n, line in lines_outside_code(path):
            line = re.sub(r"`[^`]*`", "", line)
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                    continue  # http:, https:, mailto:
                file_part, _, fragment = target.partition("#")
                dest = (
                    os.path.normpath(os.path.join(os.path.dirname(path), file_part))
                    if file_part
                    else path
                )
                where = f"{os.path.relpath(path, ROOT)}:{n}"
                if not os.path.exists(dest):
                    broken.append(f"{where}: {target}: no such file")
                elif fragment and dest.endswith(".md") and fragment not in anchors(dest):
                    broken.append(f"{where}: {target}: no heading with that anchor")
    for b in broken:
        print(b)
    if broken:
        print(f"{len(broken)} broken links in the docs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
