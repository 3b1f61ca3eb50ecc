"""The documentation site on ``amptrain up``: built once into the data directory and
served by the API at ``/guide/``.

The site's sources (``mkdocs.yml`` and ``docs/``) live in the repository beside the
package, not in the wheel: ``up`` from a checkout (the README's run command installs it
editable, with the ``docs`` extra) builds them with MkDocs in a child process of its own
while the service starts, so nothing waits for it, into a staging folder that replaces
:data:`~amptrain.core.settings.GUIDE_DIR` only once the build succeeded. Each build is keyed by a digest
of its sources (the pages, ``mkdocs.yml`` and the package's code, from which the reference
pages are generated): a later ``up`` with nothing changed serves the folder as it is.
Without MkDocs, or without the sources (an installed wheel), ``up`` starts all the same
and says how to get the docs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from amptrain.cli.up_stop import say
from amptrain.core.lifeline import DieWithSpawner

CHECKOUT = Path(__file__).resolve().parents[2]
"""Where ``mkdocs.yml`` is when the package runs from a checkout (an editable install)."""
DIGEST_FILE = ".sources-sha256"
"""Inside a built site: the digest of the sources it was built from."""


def sources_digest(root: Path) -> str:
    """SHA-256 over the site's sources under ``root``: names and contents of
    ``mkdocs.yml``, everything under ``docs/`` and the package's Python files."""
    files = [root / "mkdocs.yml", *(root / "docs").rglob("*"), *(root / "amptrain").rglob("*.py")]
    digest = hashlib.sha256()
    for path in sorted(p for p in files if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def built_digest(site: Path) -> str | None:
    """The digest ``site`` was built from, or None when there is no finished build."""
    try:
        return (site / DIGEST_FILE).read_text().strip()
    except OSError:
        return None


class _Background(DieWithSpawner):
    """The build dies with ``up`` and runs at a low CPU priority: on a small machine the
    worker and the API starting beside it, and the first jobs, come first."""

    def __call__(self) -> None:
        super().__call__()
        os.nice(10)


class GuideBuild:
    """The site for one ``up``: :meth:`start` says where it is (building it when stale),
    :meth:`poll` (between ``up``'s looks at its parts) says once when a build ended, and
    :meth:`stop` ends a build still running when ``up`` stops."""

    def __init__(self, site: Path, url: str, root: Path = CHECKOUT) -> None:
        self.site = site
        self.url = url
        self.root = root
        self.staging = site.with_name(site.name + ".building")
        self.log = site.with_name(site.name + "-build.log")
        self.digest = ""
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        """The line ``up`` prints about the docs; starts a build when the site is stale."""
        if not (self.root / "mkdocs.yml").is_file():
            return (
                "docs: this installation has no docs/ to build; read them in the amptrain "
                "repository (docs/), or install amptrain from a checkout with the docs extra"
            )
        if (
            importlib.util.find_spec("mkdocs") is None
            or importlib.util.find_spec("material") is None
        ):
            return (
                f'docs: not served (MkDocs is not installed): pip install -e ".[docs]" in '
                f"{self.root} and restart, or read docs/ there"
            )
        self.digest = sources_digest(self.root)
        if built_digest(self.site) == self.digest:
            return f"docs: {self.url}"
        shutil.rmtree(self.staging, ignore_errors=True)
        command = [sys.executable, "-m", "mkdocs", "build", "--quiet"]
        command += ["--config-file", str(self.root / "mkdocs.yml"), "--site-dir", str(self.staging)]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                command,
                cwd=self.root,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches only `up`, which stops it
                preexec_fn=_Background(),
            )
        return f"docs: {self.url} (building them from {self.root / 'docs'}; ready shortly)"

    def poll(self) -> None:
        if self.proc is None or self.proc.poll() is None:
            return
        code, self.proc = self.proc.returncode, None
        if code != 0:
            say(f"docs: the build failed (exit {code}; see {self.log}); everything else runs")
            return
        (self.staging / DIGEST_FILE).write_text(self.digest)
        # Swapped in whole: the API never serves half a site.
        old = self.site.with_name(self.site.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if self.site.exists():
            self.site.rename(old)
        self.staging.rename(self.site)
        shutil.rmtree(old, ignore_errors=True)
        say(f"docs: ready at {self.url}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
