#!/usr/bin/env python3
"""Lines per type across its declaration and extensions in Sources/ (top-level declarations
only: a nested type counts with its parent). Usage: scripts/type-sizes.py [limit]"""
import os, re, sys
from collections import Counter
decl = re.compile(r'^(?:public |package |private |fileprivate |internal |final |@\w+(?:\([^)]*\))? )*(class|struct|enum|actor|extension|protocol)\s+([A-Za-z_][\w.]*)')
sizes = Counter()
for root, _, files in os.walk(os.path.join(os.path.dirname(__file__), '..', 'Sources')):
    for name in files:
        if not name.endswith('.swift'):
            continue
        current, start = None, 0
        lines = open(os.path.join(root, name)).read().split('\n')
        for number, line in enumerate(lines):
            match = decl.match(line)
            if match:
                if current: sizes[current] += number - start
                current, start = match.group(2).split('.')[0], number
        if current: sizes[current] += len(lines) - start
limit = int(sys.argv[1]) if len(sys.argv) > 1 else 0
for type_name, count in sizes.most_common():
    if count < limit: break
    print(f"{count:6} {type_name}")
