"""Other libraries through their public APIs only: every use of another library's private code
in tx/ is listed here (from the source, by its syntax) and none is outside tx/compat.py; each
workaround there has a test below named by its library, which fails when a release changes
what the workaround relies on."""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import pathlib
import threading

import pytest

import tx
from tx import compat

PACKAGE = pathlib.Path(tx.__file__).parent
COMPAT = PACKAGE / "compat.py"
# Names with a leading underscore that their library documents as public.
DOCUMENTED = {
    "_exit": "os._exit",
    **{n: "collections.namedtuple" for n in ("_replace", "_asdict", "_fields", "_make")},
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _trees() -> dict[pathlib.Path, ast.Module]:
    return {path: ast.parse(path.read_text()) for path in sorted(PACKAGE.rglob("*.py"))}


def _defined_by_tx(trees) -> set[str]:
    """The private names tx defines: functions, classes, variables, attributes set on self."""
    names = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.update([node.attr] if getattr(node.value, "id", None) == "self" else [])
    return names


def _libraries(tree: ast.Module) -> dict[str, str]:
    """The names a module binds to another library's modules and objects -> their origin."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:  # `import a.b` binds a; `import a.b as c` binds c to a.b
                top = a.name.split(".")[0]
                if top != "tx":
                    bound[a.asname or top] = a.name if a.asname else top
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "tx").split(".")[0] not in ("tx", "__future__")
        ):
            bound.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
    return bound


def _dotted(node: ast.AST, bound: dict[str, str]) -> str | None:
    """`a.b.C` with `a` replaced by its origin, if `a` is another library's."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in bound:
        return ".".join([bound[node.id], *reversed(parts)])
    return None


def _resolve(dotted: str):
    """The object a dotted name of an installed library names (None if it cannot be found)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name, None)
        return obj
    return None


def _overrides(node: ast.ClassDef, bound: dict[str, str]) -> list[str]:
    """The private methods `node` defines that one of its other-library bases has."""
    bases = [b for b in (_resolve(d) for d in map(lambda b: _dotted(b, bound), node.bases) if d)]
    return [
        f"{node.name}.{item.name} overrides {base.__module__}.{base.__qualname__}'s"
        for item in node.body
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(item.name)
        for base in bases
        if inspect.isclass(base) and hasattr(base, item.name)
    ]


def private_uses() -> dict[str, list[str]]:
    """{module path: what it uses of other libraries' private code}: private modules and names
    imported, private attributes tx does not define itself (read, set or named to getattr),
    private methods of other libraries' classes overridden, and `noqa: SLF001` comments."""
    trees = _trees()
    ours = _defined_by_tx(trees) - {"_exit"}  # a name tx defines cannot hide os._exit
    found = {}
    for path, tree in trees.items():
        bound, uses = _libraries(tree), []
        for node in ast.walk(tree):
            line = getattr(node, "lineno", 0)
            if isinstance(node, (ast.Import, ast.ImportFrom)) and getattr(node, "level", 0) == 0:
                module = getattr(node, "module", None) or ""
                names = [module + "." + a.name if module else a.name for a in node.names]
                uses += [
                    f"{line}: import {n}"
                    for n in names
                    if not n.startswith(("tx.", "__future__")) and any(map(_private, n.split(".")))
                ]
            elif isinstance(node, ast.Attribute) and _private(node.attr):
                if node.attr not in ours and node.attr not in DOCUMENTED:
                    uses.append(f"{line}: .{node.attr}")
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in (
                "getattr", "setattr", "hasattr", "delattr"
            ):  # fmt: skip
                name = getattr(node.args[1], "value", None) if len(node.args) > 1 else None
                if isinstance(name, str) and _private(name) and name not in ours:
                    uses.append(f"{line}: {node.func.id}(..., {name!r})")
            elif isinstance(node, ast.ClassDef):
                uses += [f"{line}: {o}" for o in _overrides(node, bound)]
        text = path.read_text().splitlines()
        uses += [f"{i}: noqa: SLF001" for i, t in enumerate(text, 1) if "noqa: SLF001" in t]
        if uses:
            found[str(path.relative_to(PACKAGE.parent))] = sorted(set(uses))
    return found


def test_no_private_code_of_another_library_outside_the_compatibility_module():
    uses = private_uses()
    assert list(uses) == ["tx/compat.py"], {k: v for k, v in uses.items() if k != "tx/compat.py"}
    named = " ".join(uses["tx/compat.py"])
    for workaround in ("._normalize_path", "._use_gcs_driver", "._SignalingThread", "._is_tf_"):
        assert workaround in named, named  # the scan sees what it is meant to see
    assert "DefaultsInHelp._get_help_string overrides argparse." in named
    assert "import orbax.checkpoint._src.futures.future" in named


def test_the_scan_finds_each_kind_of_use(tmp_path, monkeypatch):
    """What the issue found before the compatibility module, each kind seen by the scan."""
    module = tmp_path / "tx" / "wing.py"
    module.parent.mkdir()
    module.write_text(
        "import argparse\nfrom jax._src import mesh\nimport fsspec\n"
        "def f(fs, gpath):\n    gpath._is_tf_installed.cache_clear()\n    return fs._location\n"
        "class P(argparse.ArgumentParser):\n    def _get_option_tuples(self, s):\n"
        "        return self._option_string_actions  # noqa: SLF001\n"
    )
    monkeypatch.setitem(globals(), "PACKAGE", module.parent)
    assert private_uses() == {
        "tx/wing.py": [
            "2: import jax._src.mesh",
            "5: ._is_tf_installed",
            "6: ._location",
            "7: P._get_option_tuples overrides argparse.ArgumentParser's",
            "9: ._option_string_actions",
            "9: noqa: SLF001",
        ]
    }


# ---------------------------------------------------------------- each workaround, by library
def test_orbax_checkpoint_still_routes_cloud_paths_through_the_functions_s3_replaces(monkeypatch):
    """orbax-checkpoint: `compat.orbax_s3` replaces tensorstore_utils._normalize_path and
    _use_gcs_driver and gcs_utils.get_kvstore_for_gcs; Orbax's kvstore spec of an s3:// path
    must then come from the function given, and gs:// and local paths stay Orbax's."""
    from orbax.checkpoint._src.path import gcs_utils
    from orbax.checkpoint._src.serialization import tensorstore_utils as tsu

    for module, name in [(tsu, "_normalize_path"), (tsu, "_use_gcs_driver")] + [
        (gcs_utils, "get_kvstore_for_gcs")
    ]:
        assert list(inspect.signature(getattr(module, name)).parameters) != [], name
        monkeypatch.setattr(module, name, getattr(module, name))  # put back after the test
    monkeypatch.setattr(tsu, "_tx_s3", False, raising=False)  # (and its own mark)
    local = tsu.build_kvstore_tspec("/tmp/ckpt", name="w", use_ocdbt=False)
    gcs = tsu.build_kvstore_tspec("gs://b/ckpt", name="w", use_ocdbt=False)
    compat.orbax_s3(lambda path: {"driver": "s3", "path": path})
    assert tsu.build_kvstore_tspec("s3://b/ckpt", name="w", use_ocdbt=False) == {
        "driver": "s3",
        "path": "s3://b/ckpt/w",
    }
    assert tsu.build_kvstore_tspec("s3://b/ckpt", use_ocdbt=True)["base"]["driver"] == "s3"
    assert tsu.build_kvstore_tspec("/tmp/ckpt", name="w", use_ocdbt=False) == local
    assert tsu.build_kvstore_tspec("gs://b/ckpt", name="w", use_ocdbt=False) == gcs


def test_etils_reads_the_tf_switch_once_and_forgets_it_when_told(monkeypatch):
    """etils: gpath._is_tf_installed caches its answer (EPATH_USE_TF, and whether TensorFlow
    is installed); `compat.epath_without_tf` clears it, so that cloud paths go through fsspec
    even after a path was used with the switch unset."""
    from etils.epath import gpath

    monkeypatch.setenv("EPATH_USE_TF", "1")
    gpath._is_tf_installed.cache_clear()
    installed = gpath._is_tf_installed()
    monkeypatch.setenv("EPATH_USE_TF", "0")
    assert gpath._is_tf_installed() is installed  # cached: the switch alone is not read again
    compat.epath_without_tf()
    assert gpath._is_tf_installed() is False


def test_orbax_checkpoint_commits_in_threads_that_can_be_found():
    """orbax-checkpoint: each write of a save commits in a CommitFuture's thread, which
    `compat.commit_threads` finds while it runs, and not once it has ended."""
    import asyncio

    from orbax.checkpoint._src.futures import future

    release = threading.Event()
    commit = future.CommitFuture(asyncio.to_thread(release.wait, 30), name="tx-test-commit")
    try:
        assert [t.name for t in compat.commit_threads()] == ["tx-test-commit"]
    finally:
        release.set()
        commit.result()
    assert list(compat.commit_threads()) == []


def test_argparse_still_asks_the_formatter_whether_to_show_a_default():
    """argparse: `compat.DefaultsInHelp` shows "(default: X)" where X is a default (0 is one;
    None and False are not) and the help does not speak of its default already."""
    p = argparse.ArgumentParser(prog="p", formatter_class=compat.DefaultsInHelp)
    p.add_argument("--beam", type=int, default=4, help="beam size")
    p.add_argument("--zero", type=int, default=0, help="zero")
    p.add_argument("--none", help="unset")
    p.add_argument("--flag", action="store_true", help="a flag")
    p.add_argument("--said", default=7, help="seven (default: seven)")
    text = " ".join(p.format_help().split())
    assert "beam size (default: 4)" in text and "zero (default: 0)" in text
    assert "unset --flag" in text and "a flag --said" in text
    assert text.endswith("seven (default: seven)")
    assert text.count("default") == 3


def test_argparse_underscore_spellings_need_none_of_its_private_tables():
    """tx.cli.options.Parser reads `--a_b` as `--a-b`, abbreviated too, through the public
    parse_known_args, and names what it does not know as it was written."""
    from tx.cli.options import Parser, UsageError

    p = Parser(prog="p")
    p.add_argument("--num-processes", type=int)
    p.add_argument("--nbest", type=int)
    assert p.parse_args(["--num_processes", "2"]).num_processes == 2
    assert p.parse_args(["--num_p=3"]).num_processes == 3
    assert p.parse_args(["--num", "4"]).num_processes == 4  # one option, not a pair
    with pytest.raises(UsageError, match=r"^p: unrecognized arguments: --no_such x$"):
        p.parse_args(["--no_such", "x"])
