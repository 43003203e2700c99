"""``python -m replayfmt.verbs verify OPTIONS CAPTURE RESULT``: :func:`replayfmt.verbs.verify` in a
process of its own, for the recorder's self-check (a fault on the device kills the process's CUDA
context, and the recorder's process holds the program's).

OPTIONS is a pickled :class:`~replayfmt.verbs.VerifyOptions` written by the caller; the
:class:`~replayfmt.verbs.VerifyResult` is written to RESULT as one JSON object (a ReplayError
becomes the result it means). The exit status is the result's. What the replay says as it goes
goes to stderr. No result file: the child died (a crash, a kill), and stderr says how.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from pathlib import Path

from replayfmt.cuda.address_space import restart_without_aslr
from replayfmt.errors import ReplayError
from replayfmt.verbs import VerifyOptions, VerifyResult, verify

USAGE = "usage: python -m replayfmt.verbs verify OPTIONS.pickle CAPTURE RESULT.json"


def main(argv: list[str]) -> int:
    if len(argv) != 4 or argv[0] != "verify":
        print(USAGE, file=sys.stderr)
        return 2
    options_path, capture, result_path = argv[1:]
    options = pickle.loads(Path(options_path).read_bytes())  # written by our parent, in its own folder
    if not isinstance(options, VerifyOptions):
        print(f"{options_path}: not a VerifyOptions", file=sys.stderr)
        return 2
    if options.plan.fixed_addresses and not options.dry_run:
        restart_without_aslr()  # recorded addresses are reachable only so (see address_space)
    try:
        result = verify(capture, options, progress=lambda line: print(line, file=sys.stderr))
    except ReplayError as exc:
        result = VerifyResult.from_error(capture, exc)
    partial = result_path + ".partial"
    Path(partial).write_text(json.dumps(result.to_dict()))
    os.replace(partial, result_path)  # whole or absent: a reader never sees half an object
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
