"""Pure values, no I/O: the envelope and its signing, task specs and schema versions,
the frozen ``Config``, errors, rates, outcomes, backoff, failure reasons, the replies of
fenced writes, redaction and the argument rule.

Imports nothing from the other rooms; every other room may import it.
"""
