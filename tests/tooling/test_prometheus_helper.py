"""The private Prometheus the metrics tests rely on: it scrapes with the bearer token, its
query API returns what it scraped, and stop() leaves no process behind.

The target is a throw-away HTTP server in this process serving a fixed exposition, so
the helper is proved apart from relier's own endpoint.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psutil
import pytest

from testproject.prometheus import PrometheusServer

TOKEN = "s3cret-token"
EXPOSITION = b"# TYPE relier_tasks_pushed_total counter\nrelier_tasks_pushed_total 7\n"


class _Exposition(BaseHTTPRequestHandler):
    """``/relier/metrics`` with ``Authorization: Bearer TOKEN``; 401 otherwise."""

    authorizations: list[str | None] = []

    def do_GET(self) -> None:
        self.authorizations.append(self.headers.get("Authorization"))
        if self.path != "/relier/metrics":
            self.send_error(404)
        elif self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.send_error(401)
        else:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(EXPOSITION)))
            self.end_headers()
            self.wfile.write(EXPOSITION)

    def log_message(self, format: str, *args: object) -> None:
        pass  # one line per scrape on stderr is noise


@pytest.fixture
def exposition() -> Iterator[tuple[ThreadingHTTPServer, list[str | None]]]:
    handler = type("Handler", (_Exposition,), {"authorizations": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, handler.authorizations
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_private_prometheus_scrapes_with_the_bearer_token_and_answers_queries(exposition):
    server, authorizations = exposition
    since = time.time()
    with PrometheusServer(
        target=f"127.0.0.1:{server.server_address[1]}",
        metrics_path="/relier/metrics",
        bearer_token=TOKEN,
    ) as prometheus:
        assert prometheus.port != 9090
        target = prometheus.wait_for_scrape(since, timeout_s=10)
        assert target["scrapeUrl"].endswith("/relier/metrics")
        result = prometheus.query("relier_tasks_pushed_total")
        assert [float(series["value"][1]) for series in result] == [7.0]
        assert result[0]["metric"]["job"] == "relier"
        assert prometheus.value("relier_tasks_pushed_total * 2") == 14.0
        assert prometheus.value("relier_tasks_never_exposed") is None
        pid, directory = prometheus.pid, prometheus.directory
        assert directory is not None and directory.exists()
    assert authorizations and set(authorizations) == {f"Bearer {TOKEN}"}
    assert not psutil.pid_exists(pid)
    assert not prometheus.alive()
    assert not directory.exists()
