#!/usr/bin/env python3
"""Writes userstored.yaml(5) in roff from docs/configuration.md: its prose and its table of keys
(every key the daemon knows is in that table: ConfigurationKeyTests checks it).
Usage: python3 scripts/config-manpage.py docs/configuration.md DATE > userstored.yaml.5"""
import re
import sys


def roff(text):
    """Markdown inline text as roff: `code` bold, [text](link) as text, escapes."""
    text = text.replace("\\", "\\e")
    text = re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", text)
    text = re.sub(r"`([^`]+)`", lambda m: "\\fB" + m.group(1) + "\\fR", text)
    text = text.replace("\\|", "|")
    # A line starting with . or ' would be a roff request.
    return re.sub(r"^([.'])", r"\\&\1", text)


def main():
    path, date = sys.argv[1], sys.argv[2]
    lines = open(path, encoding="utf-8").read().split("\n")
    out = [
        '.TH USERSTORED.YAML 5 "%s" "userstore" "File Formats"' % date,
        ".SH NAME",
        "userstored.yaml \\- configuration of userstored, the per-user SQLite store daemon",
        ".SH SYNOPSIS",
        "/etc/userstore/userstored.yaml",
        ".SH DESCRIPTION",
    ]
    keys = 0
    paragraph = []

    def flush():
        if paragraph:
            out.append(".PP")
            out.append(roff(" ".join(paragraph)))
            paragraph.clear()

    in_keys = False
    for line in lines[1:]:
        if line.startswith("| key |") or line.startswith("|---"):
            flush()
            if not in_keys:
                out.append(".SH KEYS")
                in_keys = True
            continue
        cells = re.match(r"^\| `([^`]+)` \| (.*?) \| (.*) \|$", line)
        if cells:
            key, default, meaning = cells.groups()
            out.append(".TP")
            out.append("\\fB%s\\fR (default: %s)" % (key, roff(default)))
            out.append(roff(meaning))
            keys += 1
            continue
        heading = re.match(r"^#+ (.*)", line)
        if heading:
            flush()
            out.append(".SH " + roff(heading.group(1)).upper())
            in_keys = False
            continue
        if not line.strip():
            flush()
            if in_keys:
                in_keys = False
                out.append(".SH NOTES")
            continue
        if line.startswith("```"):
            continue
        paragraph.append(line.strip())
    flush()
    out += [".SH SEE ALSO", "userstored(8), userstorectl(1), /usr/share/doc/userstore/configuration.md"]
    if keys < 50:
        sys.exit("config-manpage: only %d keys found in %s" % (keys, path))
    print("\n".join(out))


main()
