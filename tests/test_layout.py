"""The package's shape (tx/__init__.py's map): every module lives in a wing, imports run only
down the wings' order, no two modules import each other in a circle, and no module grows past
about 400 lines unless its docstring says why it reads better whole.

A config section belongs to the wing that reads it: `tx.<wing>.settings` holds its fields,
defaults and checks, and sits at tx.config's layer (tx.config composes the sections, so a
settings module imports nothing of tx above tx.model). No module outside the wing, tx.config
included, defines that section's fields or checks them."""

from __future__ import annotations

import ast
import pathlib

import pytest

import tx
from tx import config

PACKAGE = pathlib.Path(tx.__file__).parent
MAX_LINES = 420  # "about 400"


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(path: pathlib.Path) -> set[str]:
    """The tx modules `path` imports anywhere in it (function-level imports too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from tx.a import b` imports tx.a.b when b is a module, else tx.a
            names = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
                for a in node.names
            ]
        else:
            continue
        found.update(n for n in names if n == "tx" or n.startswith("tx."))
    return found


def _layer(module: str) -> str | None:
    """The entry of tx.LAYERS that `module` belongs to: itself or its wing (a wing's settings
    module, its config section, is at tx.config's layer)."""
    parts = module.split(".")
    if len(parts) == 3 and parts[1] in tx.WINGS and parts[2] == "settings":
        return "tx.config"
    top = ".".join(parts[:2])
    return top if top in tx.LAYERS else None


def _rank(module: str) -> int:
    return tx.LAYERS.index(_layer(module))


def test_every_module_is_in_a_layer():
    homeless = [m for m in MODULES if m not in ("tx", "tx.__main__") and _layer(m) is None]
    assert not homeless, f"modules in no layer of tx.LAYERS: {homeless}"
    assert {f"tx.{w}" for w in tx.WINGS} <= set(tx.LAYERS)


def test_every_wing_says_what_lives_there_and_what_it_may_import():
    for wing in tx.WINGS:
        doc = ast.get_docstring(ast.parse((PACKAGE / wing / "__init__.py").read_text()))
        assert doc and "May import" in doc, f"tx/{wing}/__init__.py: docstring without 'May import'"


@pytest.mark.parametrize("module", [m for m in MODULES if m not in ("tx", "tx.__main__")])
def test_imports_run_only_down(module):
    up = sorted(
        i
        for i in _imports(MODULES[module])
        if i not in ("tx", "tx.__main__") and _rank(i) > _rank(module)
    )
    assert not up, f"{module} imports from a higher wing: {up} (order: {tx.LAYERS})"


def test_no_import_cycle():
    graph = {m: {i for i in _imports(p) if i in MODULES and i != "tx"} for m, p in MODULES.items()}
    done, stack = set(), []

    def visit(m):
        if m in stack:
            cycle = stack[stack.index(m) :] + [m]
            pytest.fail(f"import cycle: {' -> '.join(cycle)}")
        if m in done:
            return
        stack.append(m)
        for n in graph[m]:
            visit(n)
        stack.pop()
        done.add(m)

    for m in graph:
        visit(m)


def test_modules_stay_short_or_say_why():
    long = []
    for m, path in MODULES.items():
        n = len(path.read_text().splitlines())
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if n > MAX_LINES and "reads better whole" not in doc:
            long.append(f"{m} ({n} lines)")
    assert not long, f"over {MAX_LINES} lines without saying why in the docstring: {long}"


def test_each_config_section_is_owned_by_a_settings_module_in_its_wing():
    for section, owner in config.SECTIONS.items():
        if section == "model":  # the families' frozen dataclasses
            assert owner.__name__.startswith("tx.model."), owner
            continue
        _, wing, name = owner.__name__.split(".")
        assert wing in tx.WINGS and name == "settings", f"{section}: owned by {owner.__name__}"
        assert pathlib.Path(owner.__file__) == PACKAGE / wing / "settings.py"
        assert section in owner.defaults() and f"`{section}`" in owner.__doc__


def _keys_and_dotted_names(tree: ast.AST) -> set[str]:
    """Every dict key and `dict(key=...)` keyword, and every string naming a `section.key`."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            found.update(k.value for k in node.keys if isinstance(k, ast.Constant))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "dict":
            found.update(k.arg for k in node.keywords if k.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.update(w.strip("'`\"(),:") for w in node.value.split() if "." in w)
    return found


def test_no_module_outside_a_wing_defines_its_config_section():
    """tx.config holds no wing's field (a default, a check naming `data.max_len`) but the older
    values of saved runs (OLDER), and no section is defined by two wings' settings modules."""
    names = _keys_and_dotted_names(ast.parse(MODULES["tx.config"].read_text()))
    owners = {o for s, o in config.SECTIONS.items() if s != "model"}
    for section, owner in config.SECTIONS.items():
        if section != "model":
            fields = set(owner.defaults()[section])
            stray = names & (fields | {f"{section}.{f}" for f in fields}) - set(config.OLDER)
            assert not stray, f"tx.config defines or checks {owner.__name__}'s {section}: {stray}"
    defined = [s for o in owners for s in o.defaults()]
    assert sorted(defined) == sorted(set(defined)), f"a section defined twice: {defined}"


def test_the_command_registry_is_the_only_list_of_commands():
    """tx.cli.COMMANDS names the commands once: each is a module tx/cli/<name>.py (or
    tx.cli.MODULE_NAMES') and each such module is one, and no other module spells out three or
    more of their names in a literal."""
    from tx.cli import COMMANDS, MODULE_NAMES

    shared = {"__init__", "main", "options", "compile_cache"}  # what every command uses
    modules = {p.stem for p in (PACKAGE / "cli").glob("*.py")} - shared
    named = {MODULE_NAMES.get(c, c) for c in COMMANDS}
    assert modules == named, f"tx/cli/*.py vs tx.cli.COMMANDS: {modules ^ named}"
    lists = []
    for m, path in MODULES.items():
        if m == "tx.cli":  # the registry itself
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", [])
            named = {i.value for i in items if isinstance(i, ast.Constant)} & set(COMMANDS)
            if len(named) >= 3:
                lists.append(f"{m}:{node.lineno}")
    assert not lists, f"command names listed outside tx.cli.COMMANDS: {lists}"


MAX_FUNCTION_LINES = 60  # from `def` to the last line, the docstring included
MAX_POSITIONAL = 6  # parameters before `*`, but self / cls and custom_vjp's static ones
# Functions in modules that other work is reshaping now, each with why it may wait; shrink it.
TOO_LONG_FOR_NOW = {
    "tx/paper/real_page.py:markdown": "not split yet: the real-scale page's sections, in order",
}


def _nondiff_argnums(decorator: ast.expr) -> set[int] | None:
    """`@jax.custom_vjp` -> {}; `@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))`
    -> {5, 6} (custom_jvp alike); any other decorator -> None."""
    call = decorator if isinstance(decorator, ast.Call) else None
    if call and ast.unparse(call.func).endswith("partial") and call.args:
        decorator = call.args[0]
    if ast.unparse(decorator).split(".")[-1] not in ("custom_vjp", "custom_jvp"):
        return None
    keywords = {k.arg: k.value for k in call.keywords} if call else {}
    return set(ast.literal_eval(keywords.get("nondiff_argnums", ast.Tuple([]))))


def _static_parameters(tree: ast.Module) -> dict[str, set[int]]:
    """Module-level function -> the positions of its parameters that are a custom_vjp's (or
    custom_jvp's) nondiff_argnums, which jax passes positionally: the decorated function's,
    its forward rule's (the same arguments: `f.defvjp(fwd, bwd)`), and the leading ones of the
    backward rule and of a jvp rule (`f.defjvp(jvp)`), which take those arguments first."""
    static = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            found = [a for a in map(_nondiff_argnums, node.decorator_list) if a is not None]
            static.update({node.name: found[0]} if found else {})
    for node in ast.walk(tree):
        func = getattr(node, "func", None)
        primal = getattr(getattr(func, "value", None), "id", None)
        if primal not in static or getattr(func, "attr", None) not in ("defvjp", "defjvp"):
            continue
        rules = [a.id for a in node.args if isinstance(a, ast.Name)]
        leading = set(range(len(static[primal])))
        if func.attr == "defvjp":
            static.update(zip(rules, (static[primal], leading), strict=False))
        elif rules:
            static[rules[0]] = leading
    return static


def _functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, node) of every function and method, nested ones too."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def _positional(node: ast.FunctionDef, static: set[int]) -> int:
    """Parameters before `*`, but self / cls and the custom_vjp's static ones."""
    params = node.args.posonlyargs + node.args.args
    if params and params[0].arg in ("self", "cls"):
        return len(params) - 1
    return len([p for i, p in enumerate(params) if i not in static])


def test_functions_stay_short_and_take_few_positional_parameters():
    """No function in tx/ over MAX_FUNCTION_LINES lines or with more than MAX_POSITIONAL
    parameters before `*`, but those TOO_LONG_FOR_NOW names."""
    found, waiting = [], set()
    for path in MODULES.values():
        tree = ast.parse(path.read_text())
        static = _static_parameters(tree)
        for name, node in _functions(tree):
            lines = node.end_lineno - node.lineno + 1
            count = _positional(node, static.get(name, set()))
            where = f"{path.relative_to(PACKAGE.parent).as_posix()}:{name}"
            if lines <= MAX_FUNCTION_LINES and count <= MAX_POSITIONAL:
                continue
            if where in TOO_LONG_FOR_NOW:
                waiting.add(where)
            else:
                found.append(f"{where} ({lines} lines, {count} parameters before *)")
    assert not found, f"over {MAX_FUNCTION_LINES} lines or {MAX_POSITIONAL} parameters: {found}"
    done = set(TOO_LONG_FOR_NOW) - waiting
    assert not done, f"short now: take them off TOO_LONG_FOR_NOW: {sorted(done)}"
