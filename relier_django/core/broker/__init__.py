"""The only code that hands messages to Celery and kombu: publishing an envelope
(``publish``, which owns the marker header) and relier's kombu transport
(``transport``), which keeps no unacked copy of relier's own messages.

Imports only ``model``.
"""
