"""``python -m replayfmt.capture -o out.kreplay [OPTIONS] script.py ARGS...``"""

from replayfmt_tools.capture_replay import MODULE_NAME, main

main(prog_name=MODULE_NAME)
