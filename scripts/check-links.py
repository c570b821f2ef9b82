#!/usr/bin/env python3
"""Checks every relative link and #anchor in README.md and docs/*.md (and docs/*/*.md): the file
exists, and the anchor is a heading of it (GitHub's slugs: lower case, punctuation dropped,
spaces to hyphens, -1, -2 for repeats). Exits 1 naming each broken link. Run by scripts/test.sh.

usage: check-links.py [REPOSITORY]"""
import os
import re
import sys

root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~)")


def slug(heading):
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    found, seen, fenced = set(), {}, False
    with open(path, encoding="utf-8") as file:
        for line in file:
            if FENCE.match(line):
                fenced = not fenced
                continue
            match = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if match:
                base = slug(match.group(1))
                count = seen.get(base, 0)
                found.add(base if count == 0 else f"{base}-{count}")
                seen[base] = count + 1
            for explicit in re.findall(r'<a (?:name|id)="([^"]+)"', line):
                found.add(explicit)
    return found


def documents():
    yield os.path.join(root, "README.md")
    for folder, _, names in os.walk(os.path.join(root, "docs")):
        for name in sorted(names):
            if name.endswith(".md"):
                yield os.path.join(folder, name)


broken = []
cache = {}
for document in documents():
    fenced = False
    with open(document, encoding="utf-8") as file:
        for number, line in enumerate(file, 1):
            if FENCE.match(line):
                fenced = not fenced
                continue
            if fenced:
                continue
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                    continue  # http:, https:, mailto:
                path, _, anchor = target.partition("#")
                resolved = os.path.normpath(os.path.join(os.path.dirname(document), path)) if path else document
                where = f"{os.path.relpath(document, root)}:{number}: {target}"
                if not os.path.exists(resolved):
                    broken.append(f"{where}: no such file")
                    continue
                if anchor and resolved.endswith(".md"):
                    if resolved not in cache:
                        cache[resolved] = anchors(resolved)
                    if anchor not in cache[resolved]:
                        broken.append(f"{where}: no heading #{anchor} in {os.path.relpath(resolved, root)}")
for line in broken:
    print(line)
print(f"check-links: {len(broken)} broken links" if broken else "check-links: every relative link and anchor resolves")
sys.exit(1 if broken else 0)
