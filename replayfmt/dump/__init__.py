"""The views behind ``dump-replay``: summaries, text and JSONL rows, filters and payload export."""

from replayfmt.dump.filters import DumpFilter, PayloadMode
from replayfmt.dump.summary import Summary, render_summary_text, summarize
from replayfmt.dump.views import Dumper

__all__ = ["DumpFilter", "Dumper", "PayloadMode", "Summary", "render_summary_text", "summarize"]
