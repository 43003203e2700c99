"""The wire format of a ``.kreplay`` file, with no I/O: byte layout and limits (``layout``), the
FlatBuffers schema and its verifying decoder (``schema``, ``decoder``, generated ``fb``), the Python
model of objects and operations (``model``) and its mapping to records (``records``), the payload
codec (``payloads``), and the executable images a capture carries (``cubin``)."""
