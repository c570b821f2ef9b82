#!/usr/bin/env python3
"""Lines per type across its declaration and extensions in Sources/: the check behind
[pipeline]'s "no type spread over more than ~600 lines". A type declared inside another (or
inside an extension of it, as userstorectl's subcommands are) counts as a type of its own,
`Parent.Child`. Usage: scripts/type-sizes.py [at-least]"""
import os, re, sys
from collections import Counter
KIND = r'(?:public |package |private |fileprivate |internal |final |indirect |@\w+(?:\([^)]*\))? )*(?:class|struct|enum|actor|extension|protocol)\s+([A-Za-z_][\w.]*)'
top, nested = re.compile('^' + KIND), re.compile('^    ' + KIND)
sizes = Counter()
for root, _, files in os.walk(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'Sources')):
    for name in files:
        if not name.endswith('.swift'):
            continue
        parent = child = None
        for line in open(os.path.join(root, name)).read().split('\n'):
            match = top.match(line)
            if match:
                parent, child = match.group(1).split('.')[0], None
            elif parent and (match := nested.match(line)):
                child = match.group(1)
            elif child and line.startswith('    }') and not line.startswith('     '):
                sizes[f'{parent}.{child}'] += 1
                child = None
                continue
            if parent:
                sizes[f'{parent}.{child}' if child else parent] += 1
limit = int(sys.argv[1]) if len(sys.argv) > 1 else 0
for type_name, count in sizes.most_common():
    if count < limit:
        break
    print(f'{count:6} {type_name}')
