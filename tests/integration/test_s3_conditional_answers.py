"""S3-compatible stores answer a conditional create (``If-None-Match: *``) in ways s3fs cannot read as "exists": 412
without its ``<Condition>``, 409 ConditionalRequestConflict, or no answer at all. The decision is then read back and
compared, never failed as if it were lost. The S3 server is the harness's (moto); a loopback HTTP proxy in front of it
rewrites the answers of conditional PUTs."""

from __future__ import annotations

import http.client
import http.server
import threading
import uuid
from collections.abc import Iterator

import pytest

from kafka2pc import PreparedTxnState
from kafka2pc.errors import DecisionConflictError, RetriableError
from kafka2pc.sink.integration import Decision, FileDecisionLog, PreparedTransaction
from kafka2pc.sink.storage import RemoteFolder
from kafka2pc_harness.proxy import LOOPBACK

s3fs = pytest.importorskip("s3fs")

CONFLICT = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>ConditionalRequestConflict</Code><Message>A "
            b"conflicting conditional operation is currently in progress against this resource.</Message></Error>")
PRECONDITION = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>PreconditionFailed</Code><Message>At least one "
                b"of the pre-conditions you specified did not hold</Message></Error>")  # no <Condition>


class AnswerRewriter(http.server.ThreadingHTTPServer):
    """Forwards to the S3 server; a conditional PUT is answered as ``mode`` says."""

    def __init__(self, upstream: str):
        super().__init__((LOOPBACK, 0), _Handler)
        self.upstream = upstream.removeprefix("http://")
        self.mode = "forward"
        self.rewritten = 0


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: AnswerRewriter

    def log_message(self, *args: object) -> None:
        pass

    def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        connection = http.client.HTTPConnection(self.server.upstream, timeout=30)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
            connection.request(self.command, self.path, body=body, headers=headers)
            answer = connection.getresponse()
            return answer.status, answer.getheaders(), answer.read()
        finally:
            connection.close()

    def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response(status)
        for name, value in headers:
            if name.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _handle(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        conditional = self.command == "PUT" and self.headers.get("If-None-Match") == "*"
        mode = self.server.mode if conditional else "forward"
        if mode == "conflict-before":  # another conditional write in flight: nothing stored
            self.server.rewritten += 1
            self._answer(409, [("Content-Type", "application/xml")], CONFLICT)
            return
        status, headers, answer = self._forward(body)
        if mode == "conflict-after":  # stored, but the answer says otherwise
            self.server.rewritten += 1
            status, headers, answer = 409, [("Content-Type", "application/xml")], CONFLICT
        elif mode == "bare-412" and status == 412:
            self.server.rewritten += 1
            headers, answer = [("Content-Type", "application/xml")], PRECONDITION
        elif mode == "lost":  # stored, and the connection dropped before the answer
            self.server.rewritten += 1
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self._answer(status, headers, answer)

    do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _handle


@pytest.fixture
def rewriter(s3_server) -> Iterator[AnswerRewriter]:
    server = AnswerRewriter(s3_server.endpoint)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def log_behind(rewriter: AnswerRewriter, s3_server, prefix: str = "job") -> FileDecisionLog:
    filesystem = s3fs.S3FileSystem(endpoint_url=f"http://{LOOPBACK}:{rewriter.server_address[1]}",
                                   key="kafka2pc-test", secret="kafka2pc-test-secret", use_listings_cache=False,
                                   skip_instance_cache=True, config_kwargs={"retries": {"max_attempts": 1}})
    path = f"{s3_server.bucket}/answers-{uuid.uuid4().hex[:8]}"
    return FileDecisionLog(RemoteFolder(filesystem, path, f"s3://{path}"), prefix)


def decision(checkpoint: int, producer_id: int) -> Decision:
    return Decision(checkpoint, [PreparedTransaction("job-0-0", PreparedTxnState(producer_id, 0), 0, checkpoint)])


@pytest.mark.parametrize("mode", ["conflict-after", "lost"])
def test_a_create_that_landed_though_its_answer_says_otherwise_is_recorded(rewriter, s3_server, mode):
    log = log_behind(rewriter, s3_server)
    rewriter.mode = mode
    log.record(decision(1, 7))  # read back: the store holds exactly this decision
    assert rewriter.rewritten >= 1
    rewriter.mode = "forward"
    assert log.decision(1) == decision(1, 7) and [d.checkpoint for d in log.undone()] == [1]


def test_a_bare_412_is_read_back_and_compared(rewriter, s3_server):
    log = log_behind(rewriter, s3_server)
    log.record(decision(1, 7))
    rewriter.mode = "bare-412"
    # the race the log's own look cannot see: the file appeared after the look, and the store refuses the create
    # with a 412 that names no condition (s3fs raises OSError for it, not FileExistsError)
    assert log.folder.create(f"{1:020d}.decision.json", b"another writer's decision") is False
    assert rewriter.rewritten == 1
    log.record(decision(1, 7))  # the same decision again: a no-op
    with pytest.raises(DecisionConflictError, match="with another decision"):
        log.record(decision(1, 8))  # another writer's: a conflict, never "recorded"
    assert log.decision(1) == decision(1, 7)


def test_a_409_while_another_write_is_in_flight_is_retriable_and_a_retry_records(rewriter, s3_server, monkeypatch):
    monkeypatch.setattr("kafka2pc.sink.decision_log.CREATE_RETRY_S", 1.0)  # the create is sent again for 1 s
    log = log_behind(rewriter, s3_server)
    rewriter.mode = "conflict-before"
    with pytest.raises(RetriableError):
        log.record(decision(1, 7))  # nothing is stored, nothing is concluded
    assert rewriter.rewritten == 3  # sent again after 0.2 and 0.4 s, then given up
    rewriter.mode = "forward"
    assert log.decision(1) is None
    log.record(decision(1, 7))
    assert log.decision(1) == decision(1, 7)
