#!/usr/bin/env python3
"""Lattice's structure check: dependencies point down the layers, and no module import cycles.

1. Crates. Every workspace crate sits on a layer (LAYERS, bottom 0 to top). Its [dependencies] and
   [build-dependencies] (target-specific too; not dev-dependencies) on workspace crates must point to a
   strictly lower layer, so the pure engine never grows a path up to the runtime; a new crate must be
   placed in the table. FORBIDDEN: crates that must never reach another crate, transitively, through
   normal dependencies with any features (`cargo tree`; skipped while the crate does not exist).
2. Modules. Within each crate target (the lib; every bin is its own root) the graph of file modules
   (src/foo.rs, src/foo/mod.rs, src/foo/bar.rs -> foo, foo::bar; inline `mod x {}` folded into its file)
   has no cycles. An edge is any `crate::`, `super::`, `self::`, child-module or `use`-bound module path,
   in `use` trees and in code, to the deepest module it names (a child naming its parent's items is an
   edge to the parent; declaring `mod child` is not). `#[cfg(test)]` items are ignored. A cycle means
   neither module can be understood, tested or moved without the other.

3. Sizes. No source file (src/, up to its `#[cfg(test)] mod`) over MAX_FILE_LINES lines and no function
   there over MAX_FN_LINES lines (from its `fn` line to its closing brace at the same indentation, as
   rustfmt lays it out): a file or function past them is asking to be split.

Usage: .ci/layers.py [--report] [--crates a,b] [--self-test]   (exits 1 on any finding, except --report)
"""
import argparse, glob, re, shutil, subprocess, sys, tempfile, tomllib
from collections import deque
from pathlib import Path

LAYERS = {
    "lattice-engine": 0, "lattice-agent-protocol": 0, "lattice-util": 0,
    "lattice-traces": 1, "lattice-node-adapters": 1,
    "lattice-sim": 2, "lattice-adapters": 2, "lattice-agent": 2, "lattice-control": 2,
    "lattice-reports": 3, "lattice-runtime": 3, "lattice-client": 3,
    "lattice-dst": 4, "lattice-cli": 4, "lattice-testkit": 4,
}
# Module cycles that exist today and are still to be broken (issue 41): each entry is one strongly
# connected component, exactly as found. A cycle not listed fails the check, and so does a listed one
# that changed or is gone: shrinking a component means updating its entry, so this list only shrinks.
KNOWN_CYCLES = {
    ("lattice-engine", "lib"): [
        {"crate", "controller"},
        {"alloc", "autoscale", "broker", "engine", "error", "preempt", "staging"},
    ],
}
# (crate, crate it must not depend on, transitively, through normal dependencies with any features)
FORBIDDEN = [("lattice-control", "tokio"), ("lattice-client", "tokio"), ("lattice-agent", "openraft"), ("lattice-runtime", "turmoil"), ("lattice-runtime", "lattice-agent")]
DEP_TABLES = ("dependencies", "build-dependencies")
MAX_FILE_LINES, MAX_FN_LINES = 1500, 250

# ---------------------------------------------------------------------------------------------- crates

def workspace(root):
    """{crate: (dir, manifest)} for the workspace members, and {crate: workspace crates it depends on}."""
    ws = tomllib.loads((root / "Cargo.toml").read_text())
    members = {Path(d).resolve(): tomllib.loads((Path(d) / "Cargo.toml").read_text())
               for pattern in ws["workspace"].get("members", []) for d in sorted(glob.glob(str(root / pattern)))
               if (Path(d) / "Cargo.toml").is_file()}
    names = {d: m["package"]["name"] for d, m in members.items()}
    ws_deps, deps = ws["workspace"].get("dependencies", {}), {}
    for d, man in members.items():
        tables = [man.get(t, {}) for t in DEP_TABLES]
        tables += [tgt.get(t, {}) for tgt in man.get("target", {}).values() for t in DEP_TABLES]
        deps[names[d]] = set()
        for key, spec in ((k, s) for table in tables for k, s in table.items()):
            base = d
            if isinstance(spec, dict) and spec.get("workspace"):
                spec, base = ws_deps.get(key), root
            if isinstance(spec, dict) and "path" in spec and (base / spec["path"]).resolve() in names:
                deps[names[d]].add(names[(base / spec["path"]).resolve()])
    return {names[d]: (d, m) for d, m in members.items()}, deps

def layer_errors(deps, layers):
    errors = [f"layers: {c} is not in the LAYERS table of .ci/layers.py: place it on a layer"
              for c in sorted(deps) if c not in layers]
    return errors + [f"layers: {c} (layer {layers[c]}) depends on {d} (layer {layers[d]}): dependencies point "
                     "down only" for c in sorted(deps) for d in sorted(deps[c])
                     if c in layers and d in layers and layers[d] >= layers[c]]

def forbidden_errors(root, crates, forbidden):
    """Errors for FORBIDDEN pairs that `cargo tree` finds, and a line per rule saying whether it was checked."""
    errors, notes, cargo = [], [], shutil.which("cargo")
    for krate, banned in forbidden:
        rule, out = f"{krate} must not depend on {banned}", None
        if krate in crates and cargo:
            out = subprocess.run([cargo, "tree", "-p", krate, "-e", "normal", "--all-features", "--prefix", "none",
                                  "--locked", "--offline"], cwd=root, capture_output=True, text=True)
        if krate not in crates:
            notes.append(f"skipped (no crate {krate} yet): {rule}")
        elif out is None or out.returncode != 0:
            why = "cargo not found" if out is None else (out.stderr.strip().splitlines() or ["?"])[0].removeprefix("error: ")
            print(f"layers: warning: {why}; skipped: {rule}", file=sys.stderr)
            notes.append(f"skipped (cargo tree unavailable): {rule}")
        else:
            notes.append(f"checked: {rule}")
            if any(line.split(" ")[0] == banned for line in out.stdout.splitlines()):
                errors.append(f"layers: {krate} depends on {banned} (transitively; see `cargo tree -p {krate} "
                              f"-e normal --all-features -i {banned}`): {rule}")
    return errors, notes

# ------------------------------------------------------------------------------------------- modules

TOKEN = re.compile(r"""
    (?P<ws>\s+) | (?P<line>//[^\n]*) | (?P<block>/\*)
  | (?P<raw>b?r(?P<hashes>\#*)")
  | (?P<str>b?"(?:\\.|[^"\\])*")
  | (?P<char>b?'(?:\\(?:u\{[0-9a-fA-F_]*\}|x[0-9a-fA-F]{2}|.)|[^'\\\n])')
  | (?P<life>'[A-Za-z_]\w*)
  | (?P<ident>(?:r\#)?[A-Za-z_]\w*)
  | (?P<num>\d\w*)
  | (?P<path>::)
  | (?P<punct>.)""", re.X | re.S)
BLOCK_EDGE = re.compile(r"/\*|\*/")
IDENT = re.compile(r"(?:r#)?[A-Za-z_]\w*")
TEST_ATTR = ["#", "[", "cfg", "(", "test", ")", "]"]

def lex(src):
    """Rust tokens without comments; string, char and number literals become the placeholder "0"."""
    toks, i = [], 0
    while i < len(src):
        m = TOKEN.match(src, i)
        kind, i = m.lastgroup, m.end()
        if kind == "block":  # block comments nest
            depth = 1
            while depth and (e := BLOCK_EDGE.search(src, i)):
                depth, i = depth + (1 if e[0] == "/*" else -1), e.end()
            i = len(src) if depth else i
        elif kind == "raw":
            end = src.find('"' + m["hashes"], i)
            i = len(src) if end < 0 else end + 1 + len(m["hashes"])
        if kind in ("raw", "str", "char", "num"):
            toks.append("0")
        elif kind not in ("ws", "line", "block"):
            toks.append(m[0])
    return toks

def strip_test_items(toks):
    """Drop every `#[cfg(test)]` item: its further attributes, then up to its `;` or closing brace."""
    out, i = [], 0
    while i < len(toks):
        if toks[i:i + 7] != TEST_ATTR:
            out.append(toks[i])
            i += 1
            continue
        i, depth = i + 7, 0
        while i < len(toks):  # nesting of ( [ {
            t, i = toks[i], i + 1
            depth += (t in "([{") - (t in ")]}") if len(t) == 1 else 0
            if depth == 0 and t in (";", "}"):
                break
    return out

def parse_use(toks, i):
    """The use tree at toks[i] (after `use`), flattened: (index after its `;`, [(segments, alias or "*" or None)])."""
    leaves, prefixes, segs, alias = [], [[]], [], None
    while i < len(toks):
        t, i = toks[i], i + 1
        if t in (",", "}", ";", "*"):
            if len(segs) > len(prefixes[-1]) or t == "*":
                leaves.append((segs, "*" if t == "*" else alias))
            prefixes = prefixes[:-1] if t == "}" and len(prefixes) > 1 else prefixes
            segs, alias = list(prefixes[-1]), None
            if t == ";":
                break
        elif t == "{":
            prefixes.append(list(segs))
        elif t == "as":
            alias, i = toks[i], i + 1
        elif t != "::":
            segs.append(t)
    return i, leaves

def scan(toks):
    """Yield ("mod", name, inline), ("use", segs, alias, inline) and ("path", segs, inline), where inline
    names the enclosing inline `mod x {}` blocks within the file."""
    inline, depth, i, n = [], 0, 0, len(toks)
    while i < n:
        t, here = toks[i], tuple(name for name, _ in inline)
        if t in ("{", "}"):
            depth += 1 if t == "{" else -1
            if t == "}" and inline and inline[-1][1] == depth:
                inline.pop()
        elif t == "mod" and i + 2 < n and IDENT.fullmatch(toks[i + 1]) and toks[i + 2] in (";", "{"):
            if toks[i + 2] == ";":
                yield "mod", toks[i + 1], here
            else:
                inline.append((toks[i + 1], depth))
                depth += 1
            i += 2
        elif t == "use":
            i, leaves = parse_use(toks, i + 1)
            yield from (("use", segs, alias, here) for segs, alias in leaves)
            continue
        elif IDENT.fullmatch(t) and toks[i + 1:i + 2] == ["::"] and toks[i - 1:i] not in (["::"], ["."], ["$"]):
            segs, start = [t], i
            while i + 2 < n and toks[i + 1] == "::" and IDENT.fullmatch(toks[i + 2]):
                segs.append(toks[i + 2])
                i += 2
            if toks[start - 2:start] != ["(", "in"]:  # `pub(in crate::x)` is a visibility, not a use
                yield "path", segs, here
        i += 1

def resolve(segs, here, modules, aliases):
    """(the deepest file module `segs` names from the logical module `here`, whether all of its segments
    are modules), or None when the path leaves the crate (another crate, std, a local item)."""
    segs = segs[:-1] if segs[-1] == "self" else segs
    first, k = (segs or [None])[0], 1
    if first == "crate":
        base = ()
    elif first in ("self", "super"):
        base, k = here, int(first == "self")
        while k < len(segs) and segs[k] == "super":
            base, k = base[:-1], k + 1
    elif first in aliases:
        base = aliases[first]
    elif first and here + (first,) in modules:
        base, k = here, 0
    else:
        return None
    while k < len(segs) and base + (segs[k],) in modules:
        base, k = base + (segs[k],), k + 1
    whole = k == len(segs)
    while base not in modules:  # inside an inline module: fold into its file
        base, whole = base[:-1], False
    return base, whole

def module_graph(root_file):
    """{module: set of modules it imports} for the crate target rooted at root_file."""
    events, queue = {}, [((), Path(root_file), True)]
    while queue:  # follow `mod x;` declarations from the root
        mod, f, owns_dir = queue.pop()
        events[mod] = list(scan(strip_test_items(lex(f.read_text(errors="replace")))))
        for _, name, inline in (ev for ev in events[mod] if ev[0] == "mod"):
            d = (f.parent if owns_dir else f.with_suffix("")).joinpath(*inline)
            found = [(c, o) for c, o in ((d / f"{name}.rs", False), (d / name / "mod.rs", True)) if c.is_file()]
            queue += [(mod + inline + (name,), *found[0])] if found else []
    modules, graph = set(events), {m: set() for m in events}
    for mod, evs in events.items():
        aliases = {}  # `use crate::a::b;` / `use super::b as c;` bind b / c to a module
        for _, segs, alias, inline in (ev for ev in evs if ev[0] == "use" and ev[2] != "*"):
            if (r := resolve(segs, mod + inline, modules, aliases)) and r[1]:
                aliases[alias or [s for s in segs if s != "self"][-1]] = r[0]
        for ev in evs:
            if ev[0] != "mod" and (r := resolve(ev[1], mod + ev[-1], modules, aliases)) and r[0] != mod:
                graph[mod].add(r[0])
    return graph

def targets(crate_dir, manifest):
    """[(label, root file)]: the lib, then each bin (src/main.rs, src/bin/*, [[bin]] paths)."""
    found, src = {}, crate_dir / "src"
    lib = crate_dir / manifest.get("lib", {}).get("path", "src/lib.rs")
    if lib.is_file():
        found[lib.resolve()] = "lib"
    for b in [src / "main.rs"] + sorted(src.glob("bin/*.rs")) + sorted(src.glob("bin/*/main.rs")):
        name = manifest["package"]["name"] if b == src / "main.rs" else b.parent.name if b.name == "main.rs" \
            else b.stem
        found.update({b.resolve(): f"bin {name}"} if b.is_file() else {})
    for b in manifest.get("bin", []):
        if "path" in b and (crate_dir / b["path"]).is_file():
            found[(crate_dir / b["path"]).resolve()] = f"bin {b['name']}"
    return [(label, f) for f, label in found.items()]

def cycles(graph):
    """[(a shortest cycle through its first member, e.g. [a, b, a]; the sorted SCC)] for SCCs of size > 1."""
    index, low, on, stack, comps, succ = {}, {}, set(), [], [], {}
    for top in sorted(graph):  # Tarjan, iterative: `work` is the DFS path
        work = [] if top in index else [top]
        while work:
            v = work[-1]
            if v not in index:
                index[v] = low[v] = len(index)
                stack.append(v), on.add(v)
                succ[v] = iter(sorted(graph[v]))
            for w in succ[v]:
                if w not in index:
                    work.append(w)
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1]] = min(low[work[-1]], low[v])
                if low[v] == index[v]:
                    comp = [stack.pop()]
                    while comp[-1] != v:
                        comp.append(stack.pop())
                    on.difference_update(comp)
                    comps += [sorted(comp)] if len(comp) > 1 else []
    return [(shortest_cycle(graph, comp), comp) for comp in sorted(comps)]

def shortest_cycle(graph, comp):
    """A shortest cycle through the SCC's first member (breadth first inside the SCC)."""
    start, members, prev, queue = comp[0], set(comp), {comp[0]: None}, deque([comp[0]])
    while queue:
        v = queue.popleft()
        if start in graph[v]:
            path = [v]
            while prev[path[-1]] is not None:
                path.append(prev[path[-1]])
            return path[::-1] + [start]
        for w in sorted((graph[v] & members) - prev.keys()):
            prev[w] = v
            queue.append(w)

def show(mod):
    return "::".join(mod) or "crate"

# ---------------------------------------------------------------------------------------------- main

# ----------------------------------------------------------------------------------------------- sizes

FN_START = re.compile(r"^(\s*)(pub(\([^)]*\))? )?((const|async|unsafe|extern \"C\") )*fn \w+")

def size_errors(root, crate_dir, max_file=MAX_FILE_LINES, max_fn=MAX_FN_LINES):
    """Files and functions under crate_dir/src past the limits (test modules at a file's end excluded)."""
    errors = []
    for f in sorted((crate_dir / "src").rglob("*.rs")):
        lines = f.read_text().split("\n")
        for i in range(len(lines) - 1):
            if lines[i].strip() == "#[cfg(test)]" and lines[i + 1].lstrip().startswith(("mod ", "pub mod ")):
                lines = lines[:i]
                break
        rel = f.resolve().relative_to(root.resolve())
        if len(lines) > max_file:
            errors.append(f"sizes: {rel} has {len(lines)} lines (at most {max_file}): split it")
        i = 0
        while i < len(lines):
            m = FN_START.match(lines[i])
            if m and not lines[i].rstrip().endswith(";"):
                indent, j = m[1], i + 1
                while j < len(lines) and lines[j] != indent + "}" and not lines[j].startswith(indent + "} "):
                    j += 1
                if j - i + 1 > max_fn:
                    name = lines[i].split("fn ", 1)[1].split("(")[0].split("<")[0]
                    errors.append(f"sizes: {rel}:{i + 1}: fn {name} has {j - i + 1} lines (at most {max_fn}): "
                                  "split it")
                i = j
            i += 1
    return errors

def self_test():
    """Build a tiny workspace with one layer violation, one module cycle and traps for the lexer."""
    files = {
        "Cargo.toml": '[workspace]\nmembers = ["e", "t"]\n[workspace.dependencies]\nlattice-traces = { path = "t" }\n',
        "e/Cargo.toml": '[package]\nname = "lattice-engine"\n[dependencies]\nlattice-traces.workspace = true\n',
        "t/Cargo.toml": '[package]\nname = "lattice-traces"\n[dev-dependencies]\nlattice-engine = { path = "../e" }\n',
        # Acyclic: crate -> x, y -> x; x names y only in comments, literals and test code.
        "e/src/lib.rs": "pub mod x;\nmod y;\npub use x::Thing;\n",
        "e/src/x.rs": "//! [`crate::y::Z`]\npub struct Thing<'a>(&'a str);\nfn f() -> char { let _s = "
                      "r#\"a \" crate::y::W \"#; let _t = \"}\\\" crate::y::V\"; '{' }\n/* a /* nested */ "
                      "crate::y::U */\n#[cfg(test)]\n#[allow(unused)]\nmod tests { fn g() { '}'; } "
                      "use crate::{y::*}; }\nfn h() -> u8 { super::x::k() }\nfn k() -> u8 { 1 }\n",
        "e/src/y.rs": "use crate::x::{self, Thing};\nfn f() { x::k(); }\n",
        "e/src/bin/tool/main.rs": "mod y;\nfn main() { lattice_engine::x::k(); y::go(); }\n",
        "e/src/bin/tool/y.rs": "pub fn go() { lattice_engine::x::k() }\n",
        # One cycle a -> b -> c::d -> a (an expression path, a `super::` path, a grouped `use`).
        "t/src/lib.rs": "mod a;\nmod b;\nmod c;\nmod e;\n",
        "t/src/a.rs": "pub fn f() -> u8 { crate::b::g() }\n",
        "t/src/b.rs": "pub fn g() -> u8 { super::c::d::h() }\n",
        "t/src/c/mod.rs": "pub mod d;\n",
        "t/src/c/d.rs": "use crate::{a::f as af, e};\npub fn h() -> u8 { af() + e::one() }\n",
        "t/src/e.rs": "pub fn one() -> u8 { 1 }\n",
        # Sizes: one function of 251 lines (a test module's longer one is not counted).
        "t/src/long.rs": "pub fn long() {\n" + "    let _ = 1;\n" * 249 + "}\n\nfn short() {}\n#[cfg(test)]\n"
                         "mod tests {\n    fn longer() {\n" + "        let _ = 1;\n" * 300 + "    }\n}\n",
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name, text in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
        crates, deps = workspace(root)
        errs = layer_errors(deps, LAYERS)
        assert errs == ["layers: lattice-engine (layer 0) depends on lattice-traces (layer 1): "
                        "dependencies point down only"], errs
        found = {(c, label): cycles(module_graph(f)) for c, (d, m) in crates.items() for label, f in targets(d, m)}
        assert set(found) == {("lattice-engine", "lib"), ("lattice-engine", "bin tool"), ("lattice-traces", "lib")}
        assert {k: v for k, v in found.items() if v} == {("lattice-traces", "lib"): [
            ([("a",), ("b",), ("c", "d"), ("a",)], [("a",), ("b",), ("c", "d")])]}, found
        sizes = size_errors(root, root / "t", max_file=1500, max_fn=250)
        assert len(sizes) == 1 and "fn long has 251 lines" in sizes[0], sizes
    print("layers: self-test passed (one crate-layer violation, exactly one module cycle, one long function found)")
    return 0

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--report", action="store_true", help="print every rule checked and every SCC; never fail")
    ap.add_argument("--crates", help="comma-separated crates for the module check (default: every crate)")
    ap.add_argument("--self-test", action="store_true", help="check the checker on a tiny generated tree")
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    crates, deps = workspace(args.root)
    errors, notes = forbidden_errors(args.root, crates, FORBIDDEN)
    errors = layer_errors(deps, LAYERS) + errors
    absent = ", ".join(sorted(set(LAYERS) - set(crates)))
    print(f"layers: {len(crates)} workspace crates" + (f" (not present yet: {absent})" if absent else ""))
    print("\n".join(f"layers: {note}" for note in notes))
    only = args.crates.split(",") if args.crates else sorted(crates)
    errors += [f"cycles: no workspace crate {c}" for c in only if c not in crates]
    for c, (label, f) in ((c, t) for c in only if c in crates for t in targets(*crates[c])):
        graph, name = module_graph(f), c if label == "lib" else f"{c} ({label})"
        known = [set(k) for k in KNOWN_CYCLES.get((c, label), [])]
        found, tolerated = [], []
        for path, comp in cycles(graph):
            members = set(map(show, comp))
            line = f"{name}: {' -> '.join(map(show, path))} (SCC size {len(comp)}: {', '.join(map(show, comp))})"
            if members in known:
                known.remove(members)
                tolerated.append(f"cycles: known, still to break: {line}")
            else:
                found.append(f"cycles: {line}" + ("; a known cycle changed: update KNOWN_CYCLES in .ci/layers.py"
                                                  if any(members & k for k in known) else ""))
        found += [f"cycles: {name}: the known cycle {{{', '.join(sorted(k))}}} is gone or changed: update "
                  "KNOWN_CYCLES in .ci/layers.py" for k in known]
        errors += found
        print("\n".join(tolerated), end="\n" if tolerated else "")
        if args.report:
            print(f"modules: {name}: {len(graph)} modules, {sum(map(len, graph.values()))} edges, "
                  f"{len(found)} cycle(s)")
    for c in only:
        if c in crates:
            errors += size_errors(args.root, crates[c][0])
    print("\n".join(errors + ["layers: ok" if not errors else f"layers: {len(errors)} finding(s)"]))
    return 1 if errors and not args.report else 0


if __name__ == "__main__":
    sys.exit(main())
