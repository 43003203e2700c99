"""``python -m replayfmt.capture -o out.kreplay [OPTIONS] script.py ARGS...``"""

from replayfmt_tools.capture_replay import main

main(prog_name="python -m replayfmt.capture")
