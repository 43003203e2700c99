"""Reading and writing ``.kreplay`` files: ``CaptureWriter`` (``writer``), ``replayfmt.open`` and
crash recovery (``reader``), and the external host files a capture refers to (``files``)."""
