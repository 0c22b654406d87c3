"""What `pip install relier-django` gets: the wheel, built from the sdist as pip and
tox build it, ships every file of the package (Lua scripts, templates, static files,
migrations, py.typed) with no "Package would be ignored" warning on the way, and the
metadata names the project's URLs and needs neither django-environ nor django-redis
outside their extras. Installed with `pip install --no-deps` into a fresh virtual
environment, as docs/install.md tells a user to install a wheel they built, the
package is there whole and works from there: it imports, and Django finds its
templates, static files and migrations in the installed copy, not in the checkout.

One build for the module (a few seconds), from a copy of only what the build reads,
so it leaves nothing in the checkout; one install (a few seconds more).
"""

from __future__ import annotations

import configparser
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from testproject.harness import REPO_ROOT

BUILD_INPUTS = ("setup.cfg", "pyproject.toml", "README.md")
PACKAGE = REPO_ROOT / "relier_django"
HOMEPAGE = "https://github.com/relier-django/relier-django"


@dataclass(frozen=True)
class Build:
    output: str  # everything the sdist and the wheel builds printed
    files: frozenset[str]  # the wheel's entries
    metadata: str  # the wheel's METADATA
    wheel: Path  # the wheel itself, in the module's temp dir


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("dist")
    for name in BUILD_INPUTS:
        shutil.copy2(REPO_ROOT / name, source / name)
    shutil.copytree(
        PACKAGE, source / PACKAGE.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    # No build isolation and no index: setuptools comes from the test extra, offline.
    sdist = _run(
        [sys.executable, "-c", "import sys, setuptools.build_meta as b; "
         "print(b.build_sdist(sys.argv[1]))", str(out)],
        cwd=source,
    )  # fmt: skip
    (archive,) = out.glob("*.tar.gz")
    wheel = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-v", "-w", str(out), str(archive)],
        cwd=out,
    )  # fmt: skip
    (built,) = out.glob("*.whl")
    with zipfile.ZipFile(built) as whl:
        files = frozenset(whl.namelist())
        (meta,) = (n for n in files if n.endswith(".dist-info/METADATA"))
        return Build(sdist + wheel, files, whl.read(meta).decode(), built)


def _run(args: list[str], cwd: Path) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=240)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output


def _package_files(pattern: str) -> list[str]:
    found = [
        p.relative_to(REPO_ROOT).as_posix()
        for p in PACKAGE.glob(pattern)
        if p.is_file() and "__pycache__" not in p.parts
    ]
    assert found, f"no relier_django/{pattern} in the checkout"
    return found


def test_the_build_leaves_no_folder_of_the_package_out(build):
    assert "Package would be ignored" not in build.output, build.output


@pytest.mark.parametrize(
    "pattern", ["**/*.lua", "templates/**/*", "static/**/*", "migrations/*.py", "py.typed"]
)
def test_the_wheel_ships_the_package_data(build, pattern):
    missing = sorted(set(_package_files(pattern)) - build.files)
    assert missing == []


def test_the_wheel_ships_every_file_of_the_package(build):
    missing = sorted(set(_package_files("**/*")) - build.files)
    assert missing == []


def test_the_metadata_names_the_project_urls(build):
    # pip show prints Home-page; PyPI's sidebar lists the Project-URLs.
    assert f"Home-page: {HOMEPAGE}" in build.metadata
    assert f"Project-URL: Homepage, {HOMEPAGE}" in build.metadata
    assert f"Project-URL: Documentation, {HOMEPAGE}/tree/main/docs" in build.metadata


@pytest.mark.parametrize(("package", "extra"), [("django-environ", "environ"),
                                                ("django-redis", "django-redis")])  # fmt: skip
def test_environ_and_django_redis_are_each_required_only_by_their_extra(build, package, extra):
    requires = [
        line.removeprefix("Requires-Dist: ")
        for line in build.metadata.splitlines()
        if line.startswith(f"Requires-Dist: {package}")
    ]
    assert requires, build.metadata
    assert all("; extra ==" in r for r in requires), requires
    assert any(r.endswith(f'; extra == "{extra}"') for r in requires), requires


def test_every_module_imports_and_reads_its_settings_without_environ_or_django_redis():
    # A fresh interpreter in which both packages cannot be imported, as in a project
    # that installed neither extra.
    script = textwrap.dedent(
        """
        import importlib, pkgutil, sys
        sys.modules["environ"] = sys.modules["django_redis"] = None
        import django
        from django.conf import settings
        settings.configure(
            INSTALLED_APPS=["django.contrib.admin", "django.contrib.auth",
                            "django.contrib.contenttypes", "relier_django"],
            RELIER={"REDIS_URL": "redis://127.0.0.1:1/0"},
        )
        django.setup()
        import relier_django
        from relier_django import conf
        for module in pkgutil.walk_packages(relier_django.__path__, "relier_django."):
            importlib.import_module(module.name)
        print(conf.get_config().redis_url)
        """
    )
    # Settings come from settings.configure() alone, not from the session's environment.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RELIER_", "DJANGO_SETTINGS"))}
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "redis://127.0.0.1:1/0"


@dataclass(frozen=True)
class Installed:
    site: Path  # the fresh environment's site-packages
    python: Path  # its interpreter


@pytest.fixture(scope="module")
def installed(build: Build, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    # A fresh venv with only the wheel in it (pip install --no-deps, no index). Its
    # dependencies (Django, Celery, redis-py...) come from this session's environment
    # through a .pth file: a path appended after the venv's own site-packages, so the
    # installed relier_django is found first, and the checkout (an editable install
    # here, whose own .pth a plain path does not run) is not on the path at all.
    home = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=False).create(home)
    python = home / "bin" / "python"
    _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "--no-compile", str(build.wheel)],
        cwd=home,
    )  # fmt: skip
    site = Path(_run([str(python), "-c", _PURELIB], cwd=home).strip())
    ours = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    (site / "_session_dependencies.pth").write_text("\n".join(sorted(ours)) + "\n")
    return Installed(site, python)


_PURELIB = "import sysconfig; print(sysconfig.get_paths()['purelib'])"


@pytest.mark.parametrize(
    "pattern", ["**/*.lua", "templates/**/*", "static/**/*", "migrations/*.py", "py.typed"]
)
def test_the_installed_package_holds_the_package_data(installed, pattern):
    missing = [f for f in _package_files(pattern) if not (installed.site / f).is_file()]
    assert missing == []


def test_the_installed_package_imports_and_django_finds_its_files_there(installed):
    template = _first("templates/**/*.html", under="templates")
    static = _first("static/**/*.css", under="static")
    script = textwrap.dedent(
        f"""
        import json
        import django
        from django.conf import settings
        settings.configure(
            INSTALLED_APPS=["django.contrib.admin", "django.contrib.auth",
                            "django.contrib.contenttypes", "django.contrib.sessions",
                            "django.contrib.messages", "django.contrib.staticfiles",
                            "relier_django"],
            TEMPLATES=[{{"BACKEND": "django.template.backends.django.DjangoTemplates",
                        "APP_DIRS": True}}],
            DATABASES={{"default": {{"ENGINE": "django.db.backends.sqlite3",
                                    "NAME": ":memory:"}}}},
            STATIC_URL="/static/",
            RELIER={{"REDIS_URL": "redis://127.0.0.1:1/0"}},
        )
        django.setup()
        import relier_django
        from django.contrib.staticfiles import finders
        from django.db.migrations.loader import MigrationLoader
        from django.template.loader import get_template
        migrations = MigrationLoader(None, ignore_no_migrations=True).disk_migrations
        print(json.dumps({{
            "package": relier_django.__file__,
            "version": relier_django.__version__,
            "template": get_template({template!r}).origin.name,
            "static": finders.find({static!r}),
            "migrations": sorted(n for app, n in migrations if app == "relier_django"),
        }}))
        """
    )
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RELIER_", "DJANGO_SETTINGS", "PYTHONPATH"))}  # fmt: skip
    # Run from the venv's own directory: the checkout must not be on the path.
    done = subprocess.run(
        [str(installed.python), "-c", script],
        cwd=installed.site.parent, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    for what in ("package", "template", "static"):
        assert Path(found[what]).is_relative_to(installed.site), (what, found[what])
    assert found["version"] == _metadata_version()
    on_disk = sorted(p.stem for p in (PACKAGE / "migrations").glob("0*.py"))
    assert found["migrations"] == on_disk


def _first(pattern: str, under: str) -> str:
    """A file of the checkout's package matching ``pattern``, named as Django looks it
    up (relative to the package's ``under`` folder)."""
    path = sorted(_package_files(pattern))[0]
    return path.removeprefix(f"relier_django/{under}/")


def _metadata_version() -> str:
    metadata = configparser.ConfigParser()
    metadata.read(REPO_ROOT / "setup.cfg")
    return metadata["metadata"]["version"]
