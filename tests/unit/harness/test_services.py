"""A test service that never answers is stopped, not left running (the last CI left an S3 server behind when its
first answer timed out)."""

from __future__ import annotations

import sys

import pytest

from kafka2pc.testing.errors import HarnessSetupError
from kafka2pc_harness.services import ServiceProcess


class Silent(ServiceProcess):
    name = "silent"


@pytest.mark.parametrize("answers", ["never", "raises"])
def test_a_service_that_never_answers_is_stopped(answers):
    service = Silent()

    def answer() -> bool:
        if answers == "raises":
            raise TimeoutError("timed out")
        return False

    with pytest.raises((HarnessSetupError, TimeoutError)):
        service._launch([sys.executable, "-c", "import time; time.sleep(600)"], answer, timeout_s=0.5)
    assert service._process is not None and service._process.poll() is not None
