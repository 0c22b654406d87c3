"""What `pip install relier-django` gets: the wheel, built from the sdist as pip and
tox build it, ships every file of the package (Lua scripts, templates, static files,
migrations, py.typed) with no "Package would be ignored" warning on the way, and the
metadata names the project's URLs and needs neither django-environ nor django-redis
outside their extras.

One build for the module (a few seconds), from a copy of only what the build reads,
so it leaves nothing in the checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
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
        return Build(sdist + wheel, files, whl.read(meta).decode())


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
