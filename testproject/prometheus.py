"""A private Prometheus server, started and stopped by PID, for tests of the metrics endpoint.

Like the Redis servers in ``harness.py``, it never touches a server it did not start:
it listens on a free port of 127.0.0.1, keeps its config, its TSDB and its log in a
directory of its own, scrapes the one target it is given and nothing else, and only
its own PID is ever signalled. A system Prometheus on 9090, if any, is left alone.

Its config is written as JSON (YAML's subset), so a token or a path needs no quoting
rules of ours, and the test environment needs no YAML library.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any, ClassVar, Self

from testproject.servers import PrivateServer, free_port, poll

JOB = "relier"

# Straight to 127.0.0.1: an HTTP(S)_PROXY in the environment must not carry the requests.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class PrometheusError(RuntimeError):
    """The private Prometheus exited, refused a request or answered with an error."""


def _duration(seconds: float) -> str:
    # Prometheus durations take integers only: milliseconds keep sub-second intervals.
    return f"{round(seconds * 1000)}ms"


def _timestamp(rfc3339: str) -> float:
    """Unix seconds of Prometheus's RFC 3339 times, whose nanoseconds Python cannot parse."""
    head, _, rest = rfc3339.partition(".")
    if not rest:
        return datetime.fromisoformat(rfc3339).timestamp()
    digits = len(rest) - len(rest.lstrip("0123456789"))
    fraction, zone = rest[:digits], rest[digits:]
    return datetime.fromisoformat(f"{head}.{fraction[:6]:0<6}{zone}").timestamp()


@dataclass
class PrometheusServer(PrivateServer):
    """A private ``prometheus`` scraping one target every ``scrape_interval_s``.

    The target is ``target`` (``host:port``) at ``metrics_path`` over plain HTTP, with
    ``Authorization: Bearer <bearer_token>`` when a token is given. ``rule_files`` are
    loaded and evaluated at the scrape interval. Without ``directory`` it makes a
    temporary one and removes it on ``stop()``; a given directory is kept.

    Use it as a context manager (``with PrometheusServer(target=...) as prom:``) or
    call ``start()`` and ``stop()``.

    Its first scrape comes 5 to 6 s after ``start()``: Prometheus hands new targets to
    its scrape loop on a fixed 5 s tick that no flag of 2.42 shortens. Share one server
    across the tests that can.
    """

    program: ClassVar[str] = "prometheus"
    error: ClassVar[type[Exception]] = PrometheusError
    log_name: ClassVar[str] = "prometheus.log"

    target: str
    metrics_path: str = "/metrics"
    bearer_token: str | None = None
    scrape_interval_s: float = 1.0
    rule_files: Sequence[Path] = ()
    directory: Path | None = None
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    _own_directory: bool = field(default=False, repr=False)
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """The base URL of its HTTP API and UI, e.g. ``http://127.0.0.1:40123``."""
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict[str, Any]:
        """The configuration it runs with: one scrape job, ``relier``, for ``target``."""
        interval = _duration(self.scrape_interval_s)
        job: dict[str, Any] = {
            "job_name": JOB,
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "metrics_path": self.metrics_path,
            "static_configs": [{"targets": [self.target]}],
        }
        if self.bearer_token is not None:
            job["authorization"] = {"type": "Bearer", "credentials": self.bearer_token}
        return {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(Path(path).resolve()) for path in self.rule_files],
            "scrape_configs": [job],
        }

    def args(self) -> list[str]:
        binary = shutil.which("prometheus")
        if binary is None:
            raise PrometheusError("prometheus is not on PATH: run ./scripts/bootstrap.sh")
        assert self.directory is not None
        return [
            binary,
            f"--config.file={self.directory / 'prometheus.json'}",
            f"--storage.tsdb.path={self.directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]

    def start(self, timeout_s: float = 30) -> Self:
        """Start it and return once ``/-/ready`` answers 200.

        Raises:
            PrometheusError: prometheus is missing, or exited before it was ready (the
                message carries its log's tail).
            TimeoutError: it was not ready within ``timeout_s`` seconds.
        """
        directory = self.directory or self._make_temp_directory()
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "prometheus.json").write_text(json.dumps(self.config(), indent=2))
        args = self.args()
        # A file, not a pipe: prometheus logs steadily, and a full pipe would stall it.
        self.process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=self._open_log(), stderr=subprocess.STDOUT
        )
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _answers(self) -> bool:
        try:
            with _OPENER.open(f"{self.url}/-/ready", timeout=2):
                return True  # urllib raises HTTPError for anything but 2xx
        except (urllib.error.URLError, ConnectionError):
            return False  # not listening yet, or 503 while the TSDB opens

    def api(self, endpoint: str, **params: str) -> Any:
        """GET ``/api/v1/<endpoint>`` and return its ``data``.

        Raises:
            PrometheusError: the server answered ``status: error`` (a malformed
                expression, say) or could not be reached.
        """
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        url = f"{self.url}/api/v1/{endpoint}{query}"
        try:
            with _OPENER.open(url, timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:  # 400 and 422 carry the error as JSON
            try:
                body = json.load(exc)
            except ValueError:
                raise PrometheusError(f"GET {url}: HTTP {exc.code}") from exc
        except urllib.error.URLError as exc:
            raise PrometheusError(f"prometheus at {self.url} is unreachable: {exc}") from exc
        if body.get("status") != "success":
            raise PrometheusError(f"{endpoint} {params}: {body.get('error', body)}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Evaluate the PromQL ``expr`` at the server's now (``/api/v1/query``).

        Returns:
            The result vector: one ``{"metric": {label: value}, "value": [t, "v"]}``
            per series (values are strings, as the API gives them); empty when no
            series matches. A scalar or string result comes back as one such dict
            with an empty ``metric``.
        """
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def value(self, expr: str) -> float | None:
        """The one number ``expr`` evaluates to, None for no series.

        Raises:
            PrometheusError: ``expr`` gave more than one series.
        """
        result = self.query(expr)
        if not result:
            return None
        if len(result) > 1:
            raise PrometheusError(f"{expr} gave {len(result)} series, not one: {result}")
        return float(result[0]["value"][1])

    def targets(self) -> list[dict[str, Any]]:
        """The active targets, as ``/api/v1/targets`` describes them (``health``,
        ``lastScrape``, ``lastError``, ``scrapeUrl``, ...)."""
        active: list[dict[str, Any]] = self.api("targets", state="active")["activeTargets"]
        return active

    def wait_for_scrape(self, since: float, timeout_s: float = 15) -> dict[str, Any]:
        """Wait for a successful scrape of the target that began after ``since``.

        A scrape's time is when it started, so whatever the target exposed at
        ``since`` is in the TSDB (and ``query`` sees it) once this returns.

        Args:
            since: Unix time in seconds (``time.time()``), on this host's clock, which
                the server shares.
            timeout_s: how long to wait, in seconds.

        Returns:
            The target as ``targets()`` describes it.

        Raises:
            TimeoutError: no such scrape within ``timeout_s``; the message carries the
                target's last error.
            PrometheusError: the server exited.
        """
        last: list[dict[str, Any]] = []

        def scraped() -> dict[str, Any] | None:
            self._check_alive()
            last[:] = self.targets()
            for target in last:
                if target["health"] == "up" and _timestamp(target["lastScrape"]) > since:
                    return target
            return None

        try:
            return poll(scraped, timeout_s, f"a scrape of {self.target} after {since:.3f}")
        except TimeoutError as exc:
            seen = [(t.get("scrapeUrl"), t.get("health"), t.get("lastError")) for t in last]
            raise TimeoutError(f"{exc}; targets: {seen}") from None
