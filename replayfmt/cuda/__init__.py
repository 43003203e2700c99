"""The CUDA layer shared by replay and capture: the checked driver door (``driver``), fixed device
addresses across processes (``address_space``), payload digests computed on the device (``digest``)
and NVTX ranges (``nvtx``). Nothing here knows about captures or plans."""
