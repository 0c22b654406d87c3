#!/usr/bin/env bash
# Sets up everything `make test` and `make demo` need on a fresh machine:
# an interpreter (>= $MIN_PY, from PATH or pyenv), a venv with the package and its
# test extra, redis-server, Debian's chromium + chromium-driver for the browser tests, and
# Debian's prometheus (prometheus + promtool) for the metrics tests, and Debian's postgresql
# (its server binaries) for the on_commit tests (apt-get each when it is missing; Playwright
# drives that chromium, so it never downloads a browser of its own).
# Idempotent.
#
#   VENV          venv directory                (default .venv)
#   MIN_PY        lowest acceptable Python      (default 3.12)
#   DJANGO_SPEC   pip spec pinning Django       (default: whatever setup.cfg allows)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
MIN_PY=${MIN_PY:-3.12}
DJANGO_SPEC=${DJANGO_SPEC:-}

say() { printf '[bootstrap] %s\n' "$*" >&2; }

py_ok() {  # py_ok INTERPRETER -> true when it runs and is >= MIN_PY
  "$1" -c "import sys; want = tuple(map(int, '$MIN_PY'.split('.'))); sys.exit(sys.version_info[:2] < want)" 2>/dev/null
}

find_python() {
  # Prefer the oldest acceptable minor (3.12 is the primary CI environment), then newer ones.
  local minor c root=""
  if command -v pyenv >/dev/null 2>&1; then root=$(pyenv root); elif [ -d "$HOME/.pyenv" ]; then root="$HOME/.pyenv"; fi
  for minor in 3.12 3.13 3.14 3.15; do
    if command -v "python$minor" >/dev/null 2>&1 && py_ok "$(command -v "python$minor")"; then
      command -v "python$minor"; return 0
    fi
    if [ -n "$root" ] && [ -d "$root/versions" ]; then
      # Plain CPython versions of that minor, newest patch first (skip pypy-, conda-, venvs).
      for v in $(ls "$root/versions" | grep -E "^${minor//./\\.}\.[0-9]+$" | sort -t. -k3,3nr); do
        c="$root/versions/$v/bin/python"
        if [ -x "$c" ] && py_ok "$c"; then echo "$c"; return 0; fi
      done
    fi
  done
  for c in python3 python; do
    if command -v "$c" >/dev/null 2>&1 && py_ok "$(command -v "$c")"; then command -v "$c"; return 0; fi
  done
  return 1
}

ensure_venv() {
  if [ -x "$VENV/bin/python" ] && py_ok "$VENV/bin/python"; then return 0; fi
  local py
  py=$(find_python) || { say "no Python >= $MIN_PY on PATH or in pyenv; install one (e.g. 'pyenv install 3.12')"; exit 1; }
  say "creating $VENV with $py ($("$py" -V 2>&1))"
  rm -rf "$VENV"
  "$py" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
}

ensure_packages() {
  local stamp="$VENV/.relier-installed"
  local want
  want="$(cat setup.cfg pyproject.toml | sha256sum | cut -c1-16) ${DJANGO_SPEC}"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return 0; fi
  say "installing relier-django[test] into $VENV ${DJANGO_SPEC:+with $DJANGO_SPEC}"
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m pip install -q -e ".[test]" ${DJANGO_SPEC:+"$DJANGO_SPEC"}
  echo "$want" >"$stamp"
}

CELERY_BEAT_SPEC="django-celery-beat>=2.9"

ensure_celery_beat() {
  # The optional django-celery-beat source (RELIER["CELERY_BEAT_MODELS"]): its own
  # dependencies come with the test extra; its metadata says Django<6.1, which would make
  # pip move Django off the matrix's version, so it is installed without dependencies.
  if "$VENV/bin/python" -c "import django_celery_beat" 2>/dev/null; then return 0; fi
  say "installing $CELERY_BEAT_SPEC into $VENV (--no-deps: Django stays as it is)"
  "$VENV/bin/python" -m pip install -q --no-deps "$CELERY_BEAT_SPEC"
}

ensure_redis() {
  if command -v redis-server >/dev/null 2>&1; then return 0; fi
  say "redis-server is not on PATH; installing it with apt-get"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null
  # Debian's package starts a system service on 6379; we never use it, and leave it as it is.
  command -v redis-server >/dev/null 2>&1 || { say "redis-server still missing after apt-get"; exit 1; }
}

ensure_chromium() {
  # The browser tests launch this binary through Playwright's executable_path; we never run
  # `playwright install`, so the browser comes from Debian and is updated with the system.
  if command -v chromium >/dev/null 2>&1; then return 0; fi
  say "chromium is not on PATH; installing chromium and chromium-driver with apt-get"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium chromium-driver >/dev/null
  command -v chromium >/dev/null 2>&1 || { say "chromium still missing after apt-get"; exit 1; }
}

ensure_prometheus() {
  # promtool checks and unit-tests docs/observability/alerts.yml; prometheus scrapes the
  # metrics endpoint in the integration tests (a private server each, on a free port).
  if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then return 0; fi
  say "prometheus or promtool is not on PATH; installing Debian's prometheus with apt-get"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq prometheus >/dev/null
  # Debian's package may start a system service on 9090; we never use it, and leave it as it is.
  command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 \
    || { say "prometheus or promtool still missing after apt-get"; exit 1; }
}

postgres_bindir() {  # the dir with initdb and postgres: Debian's newest, pg_config's, PATH's
  local d
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5,5nr) \
      "$(pg_config --bindir 2>/dev/null)" "$(dirname "$(command -v initdb 2>/dev/null || echo /none/initdb)")"; do
    if [ -x "$d/initdb" ] && [ -x "$d/postgres" ]; then echo "$d"; return 0; fi
  done
  return 1
}

ensure_rabbitmq() {
  # The broker tests' private node (testproject/rabbitmq.py) runs the package's scripts from
  # /usr/lib/rabbitmq/bin under a name, ports and epmd of its own.
  if [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] && command -v epmd >/dev/null 2>&1; then return 0; fi
  say "RabbitMQ is missing; installing Debian's rabbitmq-server with apt-get"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq rabbitmq-server >/dev/null
  # Debian's package starts a node of its own on 5672 and epmd on 4369; we never use them.
  [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || { say "rabbitmq-server still missing after apt-get"; exit 1; }
}

ensure_postgres() {
  # The on_commit tests' second database: each test session runs initdb and postgres from
  # here into a temp dir of its own, on a free port (testproject/postgres.py).
  if postgres_bindir >/dev/null; then return 0; fi
  say "PostgreSQL's server binaries (initdb, postgres) are missing; installing Debian's postgresql with apt-get"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq postgresql >/dev/null
  # Debian's package creates a cluster of its own and may start it on 5432; we never use it,
  # and leave it as it is.
  postgres_bindir >/dev/null || { say "initdb or postgres still missing after apt-get"; exit 1; }
}

ensure_venv
ensure_packages
ensure_celery_beat
ensure_redis
ensure_chromium
ensure_prometheus
ensure_postgres
ensure_rabbitmq
say "ready: $("$VENV/bin/python" -V 2>&1), Django $("$VENV/bin/python" -c 'import django; print(django.get_version())'), $(redis-server --version | cut -d' ' -f1-3), $(chromium --version 2>/dev/null), $(prometheus --version 2>&1 | head -n1 | cut -d' ' -f1-3), $("$(postgres_bindir)/postgres" --version)"
