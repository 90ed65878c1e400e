#!/usr/bin/env python3
"""Checks the include structure of the tree (python3 stdlib only; run by `meson test layers`).

1. daemon/ has no circle of files: the dependency graph has one node per file stem ("x" for x.c and
   x.h, in any folder under daemon/) and an edge a -> b when a.c or a.h includes b.h. Every strongly
   connected component with more than one node (or a node including itself) is listed with one
   concrete cycle through it.
2. A few daemon/ headers only the layer above may include: server.h only main.c (the server is
   the top), conn.h only server.c, and the operations (ops.c, op_*.c) go through tier.h for
   anything that depends on a layer's tier, never gpu.h.
3. proto/ and client/ include nothing from lib/src/ or daemon/ (lib/ only through lib/include/).

Usage: check_layers.py [ROOT]   (ROOT defaults to the parent of this script's folder)
Exit status 0 when clean, 1 with every finding on stdout.
"""
import fnmatch
import os
import re
import sys

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]', re.M)


def sources(top):
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(('.c', '.h')):
                yield os.path.join(dirpath, name)


def includes(path):
    with open(path, encoding='utf-8', errors='replace') as f:
        text = f.read()
    return [(m.group(1), m.group(2)) for m in INCLUDE_RE.finditer(text)]


def stem(path):
    return os.path.splitext(os.path.basename(path))[0]


def daemon_graph(root):
    daemon = os.path.join(root, 'daemon')
    files = list(sources(daemon))
    headers = {}
    for p in files:
        if p.endswith('.h'):
            headers.setdefault(os.path.basename(p), p)
    graph = {}
    for p in files:
        a = stem(p)
        graph.setdefault(a, set())
        for _, inc in includes(p):
            target = headers.get(os.path.basename(inc))
            if target is None:
                continue  # lib/, proto/, cuda/ or system header
            b = stem(target)
            if b != a or p.endswith('.h'):
                graph[a].add(b)
            graph.setdefault(b, set())
    return graph


def sccs(graph):
    """Tarjan's algorithm, iterative."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    advanced = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def cycle_in(graph, comp):
    """One shortest cycle through the first node of comp, staying inside comp."""
    members = set(comp)
    first = comp[0]
    prev = {first: None}
    queue = [first]
    for v in queue:
        for w in sorted(graph[v]):
            if w not in members:
                continue
            if w == first:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [first]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return comp


def check_daemon(root):
    graph = daemon_graph(root)
    problems = []
    for comp in sccs(graph):
        if len(comp) == 1 and comp[0] not in graph[comp[0]]:
            continue
        problems.append('daemon/: cycle of %d files: %s\n  e.g. %s' % (
            len(comp), ' '.join(comp), ' -> '.join(cycle_in(graph, comp))))
    return problems


# header -> the daemon files (by name, or a glob on the name) that may include it
RESTRICTED = {
    'server.h': ['main.c', 'server.c'],
    'conn.h': ['conn.c', 'server.c'],
}
# daemon files (glob on the name) -> headers they must not include
FORBIDDEN = {
    'op_*.c': ['gpu.h', 'gpu_internal.h'],
    'ops.c': ['gpu.h', 'gpu_internal.h'],
}


def check_rules(root):
    problems = []
    for p in sources(os.path.join(root, 'daemon')):
        base = os.path.basename(p)
        rel = os.path.relpath(p, root)
        for _, inc in includes(p):
            h = os.path.basename(inc)
            allowed = RESTRICTED.get(h)
            if allowed is not None and not any(fnmatch.fnmatch(base, a) for a in allowed):
                problems.append('%s includes %s (only %s may)' % (rel, inc, ', '.join(allowed)))
            for pattern, banned in FORBIDDEN.items():
                if fnmatch.fnmatch(base, pattern) and h in banned:
                    problems.append('%s includes %s (operations reach the GPU through tier.h)' % (rel, inc))
    return problems


def check_outer(root):
    forbidden = {}
    for top in ('lib/src', 'daemon'):
        for p in sources(os.path.join(root, top)):
            forbidden.setdefault(os.path.basename(p), os.path.relpath(p, root))
    problems = []
    for top in ('proto', 'client'):
        for p in sources(os.path.join(root, top)):
            here = os.path.dirname(p)
            for kind, inc in includes(p):
                if 'lib/src' in inc or inc.startswith('daemon/') or '/daemon/' in inc:
                    problems.append('%s includes %s' % (os.path.relpath(p, root), inc))
                    continue
                if kind == '"' and os.path.exists(os.path.join(here, inc)):
                    continue  # its own folder
                hit = forbidden.get(os.path.basename(inc)) if '/' not in inc else None
                if hit is not None:
                    problems.append('%s includes %s (%s)' % (os.path.relpath(p, root), inc, hit))
    return problems


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    problems = check_daemon(root) + check_rules(root) + check_outer(root)
    for p in problems:
        print(p)
    if problems:
        print('check_layers: %d problem(s)' % len(problems))
        return 1
    print('check_layers: daemon/ has no include cycles and keeps its layers; proto/ and client/ include no '
          'internals')
    return 0


if __name__ == '__main__':
    sys.exit(main())
