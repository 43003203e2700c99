"""``python -m replayfmt.capture -o out.kreplay [OPTIONS] script.py ARGS...``"""

from replayfmt.tools.capture_replay import main

main(prog_name="python -m replayfmt.capture")
