"""The views behind ``dump-replay``: summaries, text and JSONL rows, filters and payload export."""
