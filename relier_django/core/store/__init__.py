"""How a process talks to Redis: the key schema (``keys``), the Lua scripts and their
loader (``scripts`` and ``lua/``), the clients and their fast lane (``connection``),
the pipelined connection, the per-process event loop (``bridge``), checkpoint files,
and ``Receipt``, which reads a task's outcome.

Imports only ``model``.
"""
