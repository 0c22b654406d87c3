"""A task module a project loads only through Celery's ``imports`` (CELERY_IMPORTS),
for relier.W003's test: no app's ``tasks`` module imports it."""

from relier_django import rl_task


@rl_task(name="checks.imported_invoice", queue="invoices")
def imported_invoice(invoice_id: int) -> int:
    return invoice_id
