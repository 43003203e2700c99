"""One line of text per object for dump-replay's text view, and the names --grep searches."""

from __future__ import annotations

from replayfmt.dump.fields import label_of
from replayfmt.dump.graphs import graph_summary
from replayfmt.format import model as m
from replayfmt.format.names import demangle
from replayfmt.format.targets import CodeTargets


def object_names(obj: m.ObjectDef) -> list[str]:
    names = [obj.label] if obj.label else []
    if isinstance(obj, m.Device):
        names.append(obj.name)
    elif isinstance(obj, m.Executable):
        names += [fn.name for fn in obj.functions] + [demangle(fn.name) for fn in obj.functions]
    elif isinstance(obj, m.Global):
        names += [obj.symbol, demangle(obj.symbol)]
    elif isinstance(obj, m.FileReference):
        names.append(obj.path)
    return names


def object_text(obj: m.ObjectDef, code: CodeTargets | None = None) -> str:
    label = "unknown_object" if isinstance(obj, m.UnknownObject) else obj.kind.label
    head = f"obj {obj.id:>6} {label:<18}"
    tag = f" {obj.label!r}" if obj.label else ""
    if isinstance(obj, m.Device):
        return f"{head}{tag} {obj.name} sm_{obj.compute_capability[0]}{obj.compute_capability[1]} ordinal={obj.ordinal}"
    if isinstance(obj, m.Buffer):
        shape = f" {label_of(obj.dtype)}{list(obj.shape)}" if obj.dtype else ""
        if obj.ranges:
            shape += " ranges=" + ",".join(f"[{r.offset},{r.offset + r.size}):{label_of(r.dtype)}" for r in obj.ranges)
        storage = f" global={obj.module_global}" if obj.module_global else ""
        return f"{head}{tag} size={obj.size} device={obj.device} address={obj.address:#x}{shape}{storage}"
    if isinstance(obj, m.Executable):
        names = ", ".join(demangle(fn.name) for fn in obj.functions)
        loads = f" loads on: {code.describe()}" if code is not None else ""
        return f"{head}{tag} {label_of(obj.format)} {obj.target_arch} payload#{obj.payload}{loads} functions: {names}"
    if isinstance(obj, m.FileReference):
        policy, validation = label_of(obj.policy), label_of(obj.validation)
        return f"{head}{tag} {obj.path} size={obj.size} policy={policy} validation={validation}"
    if isinstance(obj, m.Global):
        return f"{head}{tag} {demangle(obj.symbol)} exe={obj.executable} size={obj.size}"
    if isinstance(obj, m.Stream | m.Event):
        return f"{head}{tag} device={obj.device} flags={obj.flags}"
    if isinstance(obj, m.Graph):
        return f"{head}{tag} {graph_summary(obj)}"
    return f"{head}{tag}"
