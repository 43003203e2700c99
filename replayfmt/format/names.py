"""Kernel names as people read them: Itanium C++ symbols (``_ZN2at6native...``, what CUDA stores)
demangled by a maintained demangler, never by one of our own.

The demangler is libstdc++'s ``abi::__cxa_demangle`` through ctypes (present wherever CPython runs
on Linux); where that library cannot be loaded, binutils' ``c++filt``. A name that is not a mangled
C++ symbol (a C kernel such as ``saxpy``, a Triton kernel), is longer than ``MAX_MANGLED`` or that
neither demangler accepts comes back unchanged, so callers can always show ``demangle(name)``.
Files keep the raw symbol: it is what the driver looks functions up by.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import re
import shutil
import subprocess

MAX_MANGLED = 16 * 1024  # longer symbols are shown raw: bounded work for hostile captures


def demangle(symbol: str) -> str:
    """``symbol`` demangled (``_Z5saxpyfPKfPfi`` -> ``saxpy(float, float const*, float*, int)``), or
    ``symbol`` itself when it is not a mangled C++ name or cannot be demangled."""
    if not symbol.startswith("_Z") or len(symbol) > MAX_MANGLED or "\0" in symbol:
        return symbol
    return _demangle_cached(symbol)


def matches_kernel(pattern: re.Pattern[str], symbol: str) -> bool:
    """Whether a ``--kernel``/``--kernels`` pattern finds ``symbol``, raw or demangled."""
    return pattern.search(symbol) is not None or (
        symbol.startswith("_Z") and pattern.search(demangle(symbol)) is not None
    )


@functools.lru_cache(maxsize=4096)
def _demangle_cached(symbol: str) -> str:
    cxa = _cxa_demangle()
    if cxa is not None:
        return _with_cxa(cxa, symbol) or symbol
    return _with_cxxfilt(symbol) or symbol


@functools.cache
def _cxa_demangle() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """libstdc++'s ``__cxa_demangle`` (None where it cannot be loaded)."""
    for name in ("libstdc++.so.6", ctypes.util.find_library("stdc++")):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
            fn = lib.__cxa_demangle
        except (OSError, AttributeError):
            continue
        fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
        fn.restype = ctypes.c_void_p  # a malloc'd buffer we must free, so not c_char_p
        return fn
    return None


@functools.cache
def _libc_free() -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    free = ctypes.CDLL(None).free
    free.argtypes = [ctypes.c_void_p]
    free.restype = None
    return free


def _with_cxa(cxa: ctypes._CFuncPtr, symbol: str) -> str | None:  # type: ignore[name-defined]
    status = ctypes.c_int(0)
    out = cxa(symbol.encode("utf-8", "surrogateescape"), None, None, ctypes.byref(status))
    if not out:
        return None
    try:
        text = ctypes.string_at(out)
    finally:
        _libc_free()(out)
    return text.decode("utf-8", "replace") if status.value == 0 else None


def _with_cxxfilt(symbol: str) -> str | None:
    tool = shutil.which("c++filt")
    if tool is None:
        return None
    try:
        done = subprocess.run([tool, symbol], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    text = done.stdout.strip()
    return text if done.returncode == 0 and text and text != symbol else None


_OPEN, _CLOSE = "(<[{", ")>]}"
_QUALIFIERS = frozenset(("const", "volatile", "__restrict__", "__restrict", "restrict"))
_FUNDAMENTAL = frozenset(
    (
        "bool", "char", "signed char", "unsigned char", "wchar_t", "char8_t", "char16_t", "char32_t",
        "short", "unsigned short", "int", "unsigned int", "long", "unsigned long", "long long",
        "unsigned long long", "__int128", "unsigned __int128", "float", "double", "long double",
        "decltype(nullptr)", "std::nullptr_t",
    )
)  # fmt: skip


def parameter_types(demangled: str) -> tuple[str, ...] | None:
    """The declared type of each parameter of a demangled function signature, in order
    (``saxpy(float, float const*, float*, int)`` -> ``("float", "float const*", "float*", "int")``),
    or None where the name carries no parameter list (a C or Triton kernel, a name that did not
    demangle) or its brackets do not balance."""
    text = demangled.rstrip()
    if not text.endswith(")") or len(text) > MAX_MANGLED * 4:
        return None
    depth, start = 0, -1
    for i in range(len(text) - 1, -1, -1):  # the '(' that opens the final ')': the parameter list
        c = text[i]
        if c in _CLOSE:
            depth += 1
        elif c in _OPEN:
            depth -= 1
            if depth == 0:
                start = i
                break
    if start <= 0 or text[start] != "(":
        return None
    out, depth, begin = [], 0, start + 1
    for i in range(start + 1, len(text) - 1):
        c = text[i]
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
            if depth < 0:
                return None
        elif c == "," and depth == 0:
            out.append(text[begin:i].strip())
            begin = i + 1
    last = text[begin:-1].strip()
    if depth != 0 or (out and not last):
        return None
    if last and last != "void":
        out.append(last)
    return tuple(out)


def type_kind(declared: str) -> str:
    """What a declared parameter type is: ``"pointer"`` (a pointer or a reference: an address),
    ``"scalar"`` (a fundamental type: its bytes are its value) or ``"class"`` (a class, union or
    enumeration passed by value, whose bytes may include padding and unused members)."""
    words = declared.replace("*", " * ").replace("&", " & ").split()
    while words and words[-1] in _QUALIFIERS:
        words.pop()
    if (words and words[-1] in ("*", "&")) or "(*)" in declared or "(&)" in declared:
        return "pointer"  # a pointer or reference, to data or to a function
    base = " ".join(w for w in words if w not in _QUALIFIERS)
    return "scalar" if base in _FUNDAMENTAL or base.removeprefix("signed ") in _FUNDAMENTAL else "class"
