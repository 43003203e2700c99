"""The house rules of docs/ARCHITECTURE.md, checked on the source: which package may import which,
the library never imports the command-line tools, no module takes or touches another's private
names, no import circles (through imports inside functions too), and no room grows too big to
live in."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "replayfmt"
GENERATED = PACKAGE / "format" / "fb"
TOOLS = ROOT / "tools"
TOOLS_PACKAGE = "replayfmt_tools"

# The design card's front doors, each holding its role (not a re-export shim): what must be defined
# in it, by name.
FRONT_DOORS: dict[str, set[str]] = {
    "replayfmt/schema.fbs": {"table Object", "table Operation", "table Index"},
    "replayfmt/writer.py": {"class CaptureWriter"},
    "replayfmt/reader.py": {"class Capture", "def open_capture"},
    "replayfmt/execute.py": {"class ReplaySession", "def open_replay", "def execute"},
    "tools/dump_replay.py": {"def main"},
    "tools/run_replay.py": {"def main"},
    "tools/benchmark_replay.py": {"def main"},
}

# What each part of the library may import (besides itself). Data flows one way:
# capture -> writer -> file -> reader -> plan -> replay -> measure/dump/tools.
ALLOWED: dict[str, set[str]] = {
    "version": set(),
    "errors": set(),
    "format": {"errors", "version"},
    "container": {"errors", "format"},
    "cuda": {"errors", "format"},
    "replay": {"errors", "format", "container", "cuda", "reader"},
    "dump": {"errors", "version", "format", "container", "reader"},
    "measure": {"errors", "format", "container", "cuda", "replay", "reader", "execute"},
    # the recorder writes; what its file is worth it asks the replay side (replay.replayable, and
    # the verify verb in a child process, by module name): it never reads a capture itself
    "capture": {"errors", "format", "container", "cuda", "replay", "writer"},
    # cutting captures apart and comparing them: reads one, writes another, replays a prefix on a GPU
    "edit": {"errors", "version", "format", "cuda", "reader", "writer", "replay", "execute"},
    # The design card's front doors: the public writing and reading API over container/, and the
    # executor's entry over replay/.
    "writer": {"errors", "format", "container"},
    "reader": {"errors", "format", "container"},
    "execute": {"errors", "format", "reader", "replay"},
    "": {"errors", "version", "format", "container", "writer", "reader"},  # replayfmt/__init__.py: the public API
    # one function per verb, typed options in and a typed result out, composing everything below
    "verbs": {
        "errors",
        "version",
        "format",
        "container",
        "cuda",
        "reader",
        "writer",
        "replay",
        "execute",
        "measure",
        "edit",
        "capture",
    },
}
MAX_MODULE_LINES = 600
MAX_REPLAYER_LINES = 350


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name
    imported: str  # dotted module name (a package or module of replayfmt)
    names: tuple[str, ...]
    line: int
    top_level: bool  # at module level (not inside a function: lazy imports break cycles on purpose)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def library_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if GENERATED not in p.parents)


def imports_of(path: Path) -> Iterator[Import]:
    tree = ast.parse(path.read_text(), filename=str(path))
    importer = module_name(path)
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if is_library(alias.name) or is_tools(alias.name):
                    yield Import(importer, alias.name, (), node.lineno, id(node) in top)
        elif (
            isinstance(node, ast.ImportFrom) and node.level == 0 and (is_library(node.module) or is_tools(node.module))
        ):
            names = tuple(a.name for a in node.names)
            yield Import(importer, str(node.module), names, node.lineno, id(node) in top)


def is_library(module: str | None) -> bool:
    return module == "replayfmt" or (module or "").startswith("replayfmt.")


def is_tools(module: str | None) -> bool:
    """The command-line layer: top-level tools/, installed as the replayfmt_tools package."""
    return module == TOOLS_PACKAGE or (module or "").startswith(TOOLS_PACKAGE + ".")


def part_of(module: str) -> str:
    """'replayfmt.replay.plan' -> 'replay'; 'replayfmt' -> ''."""
    if is_tools(module):
        return "tools"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def is_entry_point(module: str) -> bool:
    return module.endswith(".__main__")


ALL_IMPORTS = [imp for path in library_files() for imp in imports_of(path)]


@pytest.mark.parametrize("path", sorted(FRONT_DOORS))
def test_the_design_cards_front_doors_exist_and_hold_their_roles(path):
    text = (ROOT / path).read_text()
    missing = [d for d in sorted(FRONT_DOORS[path]) if d not in text]
    assert not missing, f"{path} does not define {missing}: a front door must hold its role, not re-export it"


def test_the_command_line_tools_live_apart_from_the_library():
    assert not (PACKAGE / "tools").exists(), "the CLI belongs in top-level tools/, not inside the library"
    assert (TOOLS / "__init__.py").exists()
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'{TOOLS_PACKAGE} = "tools"' in pyproject
    for script in ("dump-replay", "run-replay", "benchmark-replay", "tune-replay"):
        assert f'{script} = "{TOOLS_PACKAGE}.' in pyproject


def test_the_rules_cover_every_part_of_the_library():
    parts = {part_of(module_name(p)) for p in library_files()} - {"tools"}
    assert parts <= set(ALLOWED), f"parts without import rules: {sorted(parts - set(ALLOWED))}"


def test_no_lower_layer_imports_a_higher_one():
    wrong = []
    for imp in ALL_IMPORTS:
        source, target = part_of(imp.importer), part_of(imp.imported)
        if source == "tools" or is_entry_point(imp.importer) or source == target:
            continue
        targets = [target]
        if imp.imported == "replayfmt":  # "from replayfmt import x": x is a part
            targets = [n for n in imp.names if n in ALLOWED or n == "tools"] or [""]
        for t in targets:
            if t not in ALLOWED[source] and t != source:
                wrong.append(f"{imp.importer}:{imp.line} imports {imp.imported} ({source or 'root'} -> {t or 'root'})")
    assert not wrong, "imports against docs/ARCHITECTURE.md:\n" + "\n".join(wrong)


def test_the_library_never_imports_the_command_line_tools():
    wrong = [
        f"{imp.importer}:{imp.line} imports {imp.imported}"
        for imp in ALL_IMPORTS
        if part_of(imp.importer) != "tools"
        and not is_entry_point(imp.importer)
        and (part_of(imp.imported) == "tools" or (imp.imported == "replayfmt" and "tools" in imp.names))
    ]
    assert not wrong, "\n".join(wrong)


def test_no_module_imports_another_modules_private_names():
    wrong = [
        f"{imp.importer}:{imp.line} takes {name} from {imp.imported}"
        for imp in ALL_IMPORTS
        for name in imp.names
        if name.startswith("_") and not name.startswith("__") and imp.imported != imp.importer
    ]
    assert not wrong, "\n".join(wrong)


# Private names that x._name may use although its module does not define them. Public API of the
# standard library despite the underscore: a namedtuple's methods (so that they never clash with a
# field's name), os._exit (a child process ends without the parent's exit handlers), and ctypes'
# function-pointer type, which has no public name.
STDLIB_UNDERSCORED = {"_replace", "_make", "_asdict", "_fields", "_exit", "_CFuncPtr"}


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_names_defined(tree: ast.Module) -> set[str]:
    """The _private names a module defines: functions, classes, methods, attributes it assigns
    (self._x = ...), module and class variables, parameters, and names in __slots__."""
    defined: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            defined.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
        elif isinstance(node, ast.alias):
            defined.add(node.asname or node.name)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):  # __slots__, getattr(x, "_name")
            defined.add(node.value)
    return {name for name in defined if is_private(name)}


def own_base_classes(tree: ast.Module) -> set[str]:
    """The names of the base classes of the classes this module defines: a class may name its own
    base's handlers (Translator's dispatch table of its mixins' _on_* methods)."""
    return {ast.unparse(base) for node in ast.walk(tree) if isinstance(node, ast.ClassDef) for base in node.bases}


def private_reach_ins(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, x._name) for every private attribute used on something other than self or cls that
    the module does not define itself."""
    defined, bases = private_names_defined(tree), own_base_classes(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not is_private(node.attr):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if node.attr in defined or node.attr in STDLIB_UNDERSCORED or ast.unparse(owner) in bases:
            continue
        found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_module_reaches_into_another_modules_private_names():
    """x._name names only what its own module defines: a private attribute of an object from
    another module is that module's business (make what is needed public there instead)."""
    wrong = [
        f"{path.relative_to(ROOT)}:{line} uses {use}, which its module does not define"
        for path in [*library_files(), *sorted(TOOLS.rglob("*.py"))]
        for line, use in private_reach_ins(ast.parse(path.read_text(), filename=str(path)))
    ]
    assert not wrong, "\n".join(wrong)


def test_the_reach_in_rule_tells_a_reach_in_from_a_modules_own_names():
    code = (
        "import os\n"
        "class Base:\n    pass\n"
        "class Mine(Base):\n"
        "    _table = {1: Base._on_one}\n"
        "    def f(self, cap, other):\n"
        "        os._exit(0)\n"
        "        return self._x, other._table, cap.rows._replace(a=1), cap._batch(0), cap.public\n"
    )
    assert private_reach_ins(ast.parse(code)) == [(8, "cap._batch")]


def import_graph(*, top_level_only: bool) -> dict[str, set[str]]:
    """Module -> the modules it imports, at module level or (top_level_only=False) anywhere."""
    modules = {module_name(p) for p in library_files()}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for imp in ALL_IMPORTS:
        if top_level_only and not imp.top_level:
            continue
        targets = {imp.imported}
        targets |= {f"{imp.imported}.{n}" for n in imp.names if f"{imp.imported}.{n}" in modules}
        graph[imp.importer] |= {t for t in targets if t in modules and t != imp.importer}
    # a package's __init__ importing its own modules is how packages export: not a cycle
    for module, targets in graph.items():
        graph[module] = {t for t in targets if not module.startswith(t + ".")}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_no_import_cycles_at_module_level():
    cycle = find_cycle(import_graph(top_level_only=True))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_import_circles_through_imports_inside_functions():
    """An import inside a function defers a circle to the first call, and hides it: the modules
    still depend on each other both ways. They count as edges too."""
    cycle = find_cycle(import_graph(top_level_only=False))
    assert cycle is None, "import circle (imports inside functions included): " + " -> ".join(cycle or [])


def test_the_circle_finder_finds_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


@pytest.mark.parametrize("path", library_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_is_too_big_to_live_in(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{path.relative_to(ROOT)} has {lines} lines (at most {MAX_MODULE_LINES})"


def test_the_replayer_stays_short():
    for path in (PACKAGE / "replay").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name == "Replayer":
                length = node.end_lineno - node.lineno + 1
                assert length <= MAX_REPLAYER_LINES, f"Replayer is {length} lines (at most {MAX_REPLAYER_LINES})"
                return
    pytest.fail("no Replayer class in replayfmt/replay")


# A console script's main parses flags into a verb's options (replayfmt.verbs), calls it and
# prints; its body (the docstring aside) stays short: the workflow lives in the library.
MAX_CLI_MAIN_LINES = 40


def cli_main_lines(path: Path) -> int:
    """Lines of ``main``'s body in a tools/ module, its docstring left out."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name == "main":
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]
            return body[-1].end_lineno - body[0].lineno + 1 if body else 0
    return 0


@pytest.mark.parametrize("path", sorted(TOOLS.glob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_command_line_main_only_parses_calls_and_prints(path):
    name = str(path.relative_to(ROOT))
    lines = cli_main_lines(path)
    assert lines <= MAX_CLI_MAIN_LINES, (
        f"{name}: main has {lines} lines (at most {MAX_CLI_MAIN_LINES}): move the workflow into a library verb "
        "(replayfmt.verbs) and keep flags, the call and the printing here"
    )
