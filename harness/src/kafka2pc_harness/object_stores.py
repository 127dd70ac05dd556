"""Google Cloud Storage and Azure storage for tests, as their emulators: fake-gcs-server (built with ``go install``
from the Go module proxy) and Azurite (``npm install``), each installed once into the jar cache and started on a
free loopback port. :meth:`environment` is what gcsfs and adlfs read (their standard chains)."""

from __future__ import annotations

import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from kafka2pc.testing.errors import HarnessSetupError
from kafka2pc.testing.jars import default_cache_dir, require_tool
from kafka2pc.testing.local import free_ports
from kafka2pc_harness.proxy import LOOPBACK
from kafka2pc_harness.services import ServiceProcess

FAKE_GCS_SERVER = "github.com/fsouza/fake-gcs-server@v1.56.1"
AZURITE = "azurite@3"
#: Azurite's well-known development account (public, documented by Microsoft for the emulator)
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def _install(what: str, command: list[str], ready: Path, cwd: Path, env: dict[str, str] | None = None) -> None:
    if ready.exists():
        return
    cwd.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False, timeout=900,
                          env={**os.environ, **(env or {})})
    if proc.returncode != 0 or not ready.exists():
        raise HarnessSetupError(f"could not install {what}: {(proc.stdout + proc.stderr).strip()[-1500:]}")


def _answers(url: str) -> Callable[[], bool]:
    def probe() -> bool:
        try:
            urllib.request.urlopen(url, timeout=2).close()
        except urllib.error.HTTPError:
            return True  # it answers
        except (urllib.error.URLError, ConnectionError):
            return False
        return True

    return probe


class FakeGcsServer(ServiceProcess):
    """fake-gcs-server, in memory; ``STORAGE_EMULATOR_HOST`` points gcsfs at it."""

    name = "gcs"

    def __init__(self) -> None:
        super().__init__()
        self.port = free_ports(1)[0]

    def start(self) -> FakeGcsServer:
        """Install (once) and start it."""
        go = require_tool("go", "to build fake-gcs-server (a GCS emulator) from the Go module proxy")
        binaries = default_cache_dir() / "go-bin"
        _install("fake-gcs-server", [go, "install", FAKE_GCS_SERVER], binaries / "fake-gcs-server", binaries,
                 {"GOBIN": str(binaries)})
        self._launch([str(binaries / "fake-gcs-server"), "-scheme", "http", "-host", LOOPBACK, "-port",
                      str(self.port), "-backend", "memory", "-public-host", f"{LOOPBACK}:{self.port}"],
                     _answers(f"http://{LOOPBACK}:{self.port}/storage/v1/b"))
        return self

    def environment(self) -> dict[str, str]:
        """What gcsfs reads."""
        return {"STORAGE_EMULATOR_HOST": f"http://{LOOPBACK}:{self.port}"}


class Azurite(ServiceProcess):
    """Azurite's blob service; ``AZURE_STORAGE_CONNECTION_STRING`` points adlfs at it."""

    name = "azurite"

    def __init__(self) -> None:
        super().__init__()
        self.port = free_ports(1)[0]

    def start(self) -> Azurite:
        """Install (once) and start it."""
        npm = require_tool("npm", "to install Azurite (an Azure storage emulator) from the npm registry")
        packages = default_cache_dir() / "azurite"
        binary = packages / "node_modules" / ".bin" / "azurite-blob"
        _install("Azurite", [npm, "install", "--silent", "--prefix", str(packages), AZURITE], binary, packages)
        self._launch([str(binary), "--blobHost", LOOPBACK, "--blobPort", str(self.port), "--location",
                      str(self.workdir / "data"), "--silent", "--skipApiVersionCheck"],
                     _answers(f"http://{LOOPBACK}:{self.port}/{AZURITE_ACCOUNT}?comp=list"))
        return self

    def environment(self) -> dict[str, str]:
        """What adlfs reads."""
        return {"AZURE_STORAGE_CONNECTION_STRING":
                f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
                f"BlobEndpoint=http://{LOOPBACK}:{self.port}/{AZURITE_ACCOUNT};"}
