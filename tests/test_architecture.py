"""The house rules of docs/ARCHITECTURE.md, checked on the source: which package may import which,
the library never imports the command-line tools, no module takes or touches another's private
names, no class shares private state with another through ``self`` (a mixin and its host), no
import circles (through imports inside functions too), and no room grows too big to live in."""

from __future__ import annotations

import ast
import functools
import re
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
    base's handlers (CuptiSource's table of decoders names its GraphCalls mixin's)."""
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


# A class keeps its private state to itself. A mixin that uses private attributes its host class
# provides, or a subclass that uses its base's, shares that state across modules through ``self``,
# where the rules above do not look: the concern is then one class spread over several files.
# Collaborators own their state and are handed what they use (the recorder's translator).
# Classes that still do it, each with what it shares; the list only shrinks.
SHARES_PRIVATE_STATE: dict[str, set[str]] = {
    # the CUPTI source's graph decoders, a mixin of it
    "replayfmt.capture.graphs.GraphCalls": {"_deliver", "_kernel", "_launch_results", "_pending_updates", "_succeeded"},
    "replayfmt.capture.cupti_source.CuptiSource": {
        "_captures",
        "_deliver",
        "_graphs",
        "_kernel",
        "_launch_results",
        "_pending_updates",
        "_sink",
        "_succeeded",
    },
    # the shadow whose payload bytes are read on demand, a subclass of the shadow
    "replayfmt.edit.lazy_shadow.LazyShadow": {"_range", "_read_payload", "_write"},
}


@dataclass
class ClassState:
    """The private attributes a class uses and defines through ``self`` or ``cls``."""

    path: Path
    module: str
    name: str
    bases: tuple[str, ...]  # as written
    used: dict[str, int]  # name -> first line
    defined: set[str]


def class_body_nodes(node: ast.ClassDef) -> Iterator[ast.AST]:
    """The nodes of a class, those of classes nested in it left out (their ``self`` is theirs)."""
    todo: list[ast.AST] = list(node.body)
    while todo:
        child = todo.pop()
        yield child
        if not isinstance(child, ast.ClassDef):
            todo.extend(ast.iter_child_nodes(child))


def declares_fields(node: ast.ClassDef) -> bool:
    """A dataclass or NamedTuple: its annotated names are its fields, defined by the class."""
    decorators = [ast.unparse(d) for d in node.decorator_list]
    return any("dataclass" in d for d in decorators) or any("NamedTuple" in ast.unparse(b) for b in node.bases)


def class_states(path: Path, module: str | None = None) -> list[ClassState]:
    """Every class of the module at ``path`` (named ``module``: default, its place in the tree)."""
    module = module or module_name(path)
    tree = ast.parse(path.read_text(), filename=str(path))
    states = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        used: dict[str, int] = {}
        defined: set[str] = set()
        for stmt in node.body:  # what the class body itself defines
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                defined.add(stmt.name)
            elif isinstance(stmt, ast.Assign):
                defined |= {n.id for t in stmt.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            elif (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and (stmt.value is not None or declares_fields(node))  # a bare annotation only declares
            ):
                defined.add(stmt.target.id)
        for child in class_body_nodes(node):
            if (
                isinstance(child, ast.Attribute)
                and isinstance(child.value, ast.Name)
                and child.value.id in ("self", "cls")
            ):
                if is_private(child.attr):
                    used.setdefault(child.attr, child.lineno)
                    if isinstance(child.ctx, ast.Store):
                        defined.add(child.attr)
            elif isinstance(child, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__slots__" for t in child.targets
            ):
                defined |= {
                    c.value for c in ast.walk(child.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)
                }
        bases = tuple(ast.unparse(b).split("[")[0] for b in node.bases)
        states.append(ClassState(path, module, node.name, bases, used, {d for d in defined if is_private(d)}))
    return states


@functools.cache
def imported_classes(path: Path) -> dict[str, str]:
    """Names a module imports from the library, each with the module it comes from."""
    found = {}
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and is_library(node.module):
            for alias in node.names:
                found[alias.asname or alias.name] = str(node.module)
    return found


ALL_CLASSES = {(c.module, c.name): c for path in library_files() for c in class_states(path)}


def own_bases(cls: ClassState) -> list[ClassState]:
    """The class's base classes defined in its own module, theirs too."""
    found, todo = [], list(cls.bases)
    while todo:
        base = ALL_CLASSES.get((cls.module, todo.pop()))
        if base is not None and base not in found:
            found.append(base)
            todo += base.bases
    return found


def foreign_bases(cls: ClassState) -> list[ClassState]:
    """The class's (and its own module's ancestors') base classes defined in other library modules."""
    found = []
    for c in (cls, *own_bases(cls)):
        imported = imported_classes(c.path)
        for base in c.bases:
            origin = imported.get(base)
            other = ALL_CLASSES.get((origin, base)) if origin is not None else None
            if other is not None and other.module != cls.module:
                found.append(other)
    return found


def shared_private_state(cls: ClassState) -> dict[str, str]:
    """What a class shares of private state with other classes through ``self``: the private
    attributes it uses that neither it nor a base class of its module defines (a host's, or a
    foreign base's), and those it uses or defines that a base class of another module uses or
    defines too (a mixin's host assigning them, a subclass overriding them). Name -> why."""
    own = [cls, *own_bases(cls)]
    defined = set().union(*(c.defined for c in own))
    shared = {
        name: f"uses self.{name} (line {line}), which neither it nor a base class in its module defines"
        for name, line in cls.used.items()
        if name not in defined and name not in STDLIB_UNDERSCORED
    }
    mine = set(cls.used) | cls.defined
    for base in foreign_bases(cls):
        for c in (base, *own_bases(base)):
            for name in sorted(mine & (set(c.used) | c.defined)):
                shared.setdefault(name, f"shares self.{name} with {c.name} of {c.module}")
    return shared


def test_no_class_shares_private_state_with_another_through_self():
    """A class is one concern in one module: what another class needs of it is public, and a
    class that needs another's state is handed that class (a collaborator), not mixed into it."""
    wrong, stale = [], []
    for (module, name), cls in sorted(ALL_CLASSES.items()):
        shared = shared_private_state(cls)
        allowed = SHARES_PRIVATE_STATE.get(f"{module}.{name}", set())
        wrong += [f"{cls.path.relative_to(ROOT)}: {name} {why}" for n, why in shared.items() if n not in allowed]
        if allowed - set(shared):
            stale.append(f"{module}.{name} no longer shares {sorted(allowed - set(shared))}: take it off the list")
    assert not wrong, "private state shared between classes:\n" + "\n".join(wrong)
    assert not stale, "\n".join(stale)


def test_the_shared_state_rule_finds_a_mixin_and_a_subclass_reaching_into_their_host(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "host.py").write_text(
        "class Base:\n    def _helper(self):\n        return self._table\n    def __init__(self):\n"
        "        self._table = {}\n"
    )
    (package / "mixin.py").write_text(
        "from replayfmt.pkg.host import Base\n"
        "class Handlers:\n    _sink: object\n    def on(self):\n        self._sink(self._count)\n"
        "class Child(Base):\n    def more(self):\n        return self._helper(), self._own\n"
        "    def __init__(self):\n        super().__init__()\n        self._own = 1\n"
        "class Alone:\n    __slots__ = ('_x',)\n    _limit = 3\n"
        "    def get(self):\n        return self._x, self._limit\n"
    )
    (package / "fields.py").write_text(
        "from dataclasses import dataclass\n@dataclass\nclass Row:\n    _hidden: int = 0\n"
        "    def value(self):\n        return self._hidden\n"
    )
    states = {
        (cls.module, cls.name): cls
        for path in sorted(package.glob("*.py"))
        for cls in class_states(path, "replayfmt.pkg." + path.stem)
    }
    saved = dict(ALL_CLASSES)
    ALL_CLASSES.clear()
    ALL_CLASSES.update(states)
    try:
        found = {name: sorted(shared_private_state(cls)) for (_, name), cls in states.items()}
    finally:
        ALL_CLASSES.clear()
        ALL_CLASSES.update(saved)
    assert found == {"Base": [], "Handlers": ["_count", "_sink"], "Child": ["_helper"], "Alone": [], "Row": []}


def test_the_architecture_page_names_every_module():
    """docs/ARCHITECTURE.md says which module owns what: a module it does not name is one whose
    concern a reader cannot find there (named as `stem`, `stem.py` or a dotted `package.stem`)."""
    page = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    named = {word.split(".")[-1] for word in re.findall(r"`([\w.]+?)(?:\.py)?`", page)}
    unnamed = [
        str(path.relative_to(ROOT))
        for path in library_files()
        if path.name not in ("__init__.py", "__main__.py") and path.stem not in named
    ]
    assert not unnamed, "modules docs/ARCHITECTURE.md does not name: " + ", ".join(unnamed)


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
