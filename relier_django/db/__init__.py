"""The database's side of exactly-once: a push deferred to its transaction's commit
(``transactions``), the transactional outbox and its relay (``outbox``), and the fenced
inbox (``inbox``). Imports the core and the models; nothing else of the Django layer
but ``conf`` and the task-module discovery."""
