"""Builds the two C parts of replayfmt: the recorder's library (replayfmt/capture/inject.c, the
CUDA injection entry point that records programs that are not Python, and launch_ring.c, the
hot path of repeated launches for every program), and the replay's issue loop
(replayfmt/replay/issue.c: runs of launches, event records, copies and memsets issued from C).
They need a C compiler and nothing else: no Python or CUDA headers (the recorder opens libcupti
and libpython with dlopen; the issue loop is handed the driver's entry points). Both are
optional: where the recorder's cannot be built, the install still succeeds, and capture-replay
builds it on first use with the C compiler, or says in one line what is missing; without the
issue loop, replays issue every call from Python. Everything else is in pyproject.toml."""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# the same flags replayfmt.capture.c_library.compile_flags() gives a build on first use
_FLAGS = ["-O2", "-std=gnu11", "-fvisibility=hidden", "-Wall"]


class _BuildLibrary(build_ext):
    """A plain shared library, not a Python module: no PyInit_ symbol is looked for."""

    def get_export_symbols(self, ext: Extension) -> list[str]:
        return []


setup(
    ext_modules=[
        Extension(
            "replayfmt.capture._inject",
            sources=["replayfmt/capture/inject.c", "replayfmt/capture/launch_ring.c"],
            extra_compile_args=_FLAGS,
            libraries=["dl", "pthread"],
            optional=True,
        ),
        Extension(
            "replayfmt.replay._issue", sources=["replayfmt/replay/issue.c"], extra_compile_args=_FLAGS, optional=True
        ),
    ],
    cmdclass={"build_ext": _BuildLibrary},
)
