"""The shape docs/ARCHITECTURE.md promises, checked: the crates depend on
each other only downwards (from `cargo metadata`), and no crate has a
cycle between its own modules (from the `crate::module` paths each source
file names)."""

import json
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Each crate and the espgate crates it may depend on (normal dependencies;
# dev-dependencies on the test kit are allowed everywhere).
ALLOWED = {
    "espgate-core": set(),
    "espgate-ike": {"espgate-core"},
    "espgate-config": {"espgate-core", "espgate-ike"},
    "espgate-api": {"espgate-core"},
    "espgate-daemon": {"espgate-core", "espgate-ike", "espgate-config", "espgate-api"},
    "espgate-lab": {"espgate-core", "espgate-ike", "espgate-config", "espgate-api"},
    # The cluster agent talks to its daemon through the control API only.
    "espgate-cluster": {"espgate-core", "espgate-config", "espgate-api"},
    "espgate": {"espgate-core", "espgate-ike", "espgate-config", "espgate-api", "espgate-daemon",
                "espgate-lab", "espgate-cluster"},
    "espgate-testkit": {"espgate-core"},
}


def metadata():
    r = subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps", "--offline"],
                       cwd=ROOT, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        r = subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps"],
                           cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def test_crates_depend_only_downwards():
    packages = {p["name"]: p for p in metadata()["packages"]}
    assert set(packages) == set(ALLOWED), sorted(packages)
    for name, p in packages.items():
        normal = {d["name"] for d in p["dependencies"] if d["kind"] is None and d["name"] in ALLOWED}
        assert normal <= ALLOWED[name], (name, sorted(normal - ALLOWED[name]))
        dev = {d["name"] for d in p["dependencies"] if d["kind"] == "dev" and d["name"] in ALLOWED}
        assert dev <= ALLOWED[name] | {"espgate-testkit"}, (name, sorted(dev))
    # The core and the IKE engine stay sans-IO: no runtime, sockets crate or
    # threads pool among their dependencies.
    for name in ("espgate-core", "espgate-ike"):
        deps = {d["name"] for d in packages[name]["dependencies"] if d["kind"] is None}
        assert not deps & {"tokio", "libc", "rustix", "nix", "socket2", "hyper"}, (name, deps)


def module_of(src: pathlib.Path, f: pathlib.Path) -> str:
    """`a::b` for src/a/b.rs or src/a/b/mod.rs; the crate root is ``."""
    parts = list(f.relative_to(src).with_suffix("").parts)
    if parts[-1] == "mod":
        parts.pop()
    if parts in (["lib"], ["main"]):
        return ""
    return "::".join(parts)


# An inline test module (by habit the last thing in a file).
TEST_MODULE = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\(crate\))?\s+)?mod\s+\w+\s*\{")
USE = re.compile(r"\bcrate::([a-z_][a-z0-9_]*(?:::[a-z_][a-z0-9_]*)*)")


def test_no_module_cycles_inside_a_crate():
    for crate in sorted((ROOT / "crates").iterdir()):
        src = crate / "src"
        files = [f for f in src.rglob("*.rs")]
        modules = {module_of(src, f) for f in files}
        edges = {}
        for f in files:
            me = module_of(src, f)
            text = f.read_text()
            # Tests may reach anywhere in their crate; comments (doc links)
            # are not dependencies.
            text = TEST_MODULE.split(text)[0]
            text = "\n".join(line.split("//")[0] for line in text.splitlines())
            for m in USE.findall(text):
                # The longest known module the path starts with.
                parts = m.split("::")
                target = next(("::".join(parts[:i]) for i in range(len(parts), 0, -1)
                               if "::".join(parts[:i]) in modules), None)
                # A module's own submodules and its ancestors' items are not
                # edges of the module graph between siblings.
                if target is None or target == me or target.startswith(me + "::") or \
                        me.startswith(target + "::"):
                    continue
                edges.setdefault(me, set()).add(target)

        def cycle_from(start):
            stack, seen = [(start, [start])], set()
            while stack:
                node, path = stack.pop()
                for nxt in edges.get(node, ()):
                    if nxt == start:
                        return path + [nxt]
                    if nxt not in seen:
                        seen.add(nxt)
                        stack.append((nxt, path + [nxt]))
            return None

        for m in sorted(edges):
            c = cycle_from(m)
            assert c is None, f"{crate.name}: module cycle {' -> '.join(c)}"
