"""The collector's HTTP/1.1 server over real loopback sockets: bodies, keep-alive, pipelining, refusals."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tinkertrace.collector.http_server import HttpServer, Request, Response
from tinkertrace.netutil import free_port


class EchoHandler:
    """Answers with the method, path and the length and sum of the body; refuses paths under /refuse."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.abandoned: list[str] = []

    def admit(self, request: Request) -> Response | None:
        if request.path.startswith("/refuse"):
            return Response(403, b"refused " + request.path.encode())
        return None

    def abandon(self, request: Request) -> None:
        self.abandoned.append(request.path)

    def body_too_large(self, request: Request) -> Response:
        return Response(413, b"too large")

    async def respond(self, request: Request) -> Response:
        self.bodies.append(request.body)
        text = f"{request.method} {request.path} {len(request.body)} {sum(request.body)}"
        return Response(200, text.encode(), headers=[(b"x-test", b"yes")])


@pytest.fixture
def server() -> Iterator[tuple[HttpServer, EchoHandler]]:
    handler = EchoHandler()
    http = HttpServer(handler, "127.0.0.1", free_port(), max_body_bytes=4 << 20, keep_alive_s=1.0)
    http.start()
    yield http, handler
    http.stop()


def _url(http: HttpServer, path: str = "/echo") -> str:
    return f"http://127.0.0.1:{http.port}{path}"


def _read_responses(sock: socket.socket, count: int) -> list[bytes]:
    """Read ``count`` responses (each with a content-length) from a raw socket; returns their bodies."""
    data, bodies = b"", []
    sock.settimeout(10)
    while len(bodies) < count:
        head_end = data.find(b"\r\n\r\n")
        if head_end >= 0:
            head = data[:head_end].decode().lower()
            length = int(head.split("content-length: ")[1].split("\r\n")[0])
            if len(data) >= head_end + 4 + length:
                bodies.append(data[:head_end] + b"|" + data[head_end + 4 : head_end + 4 + length])
                data = data[head_end + 4 + length :]
                continue
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return bodies


def test_bodies_of_every_size_arrive_whole_on_one_keep_alive_connection(server: tuple) -> None:
    """Bodies reach the handler whole as ``bytes``, whether they arrive with the head, after it, or over
    many reads."""
    http, handler = server
    sizes = [0, 1, 100, 65_535, 65_536, 65_537, 1_400_000, 3_000_000]
    payloads = [bytes((i * 7 + n) % 251 for i in range(n)) for n in sizes]
    with httpx.Client() as client:
        for body in payloads:
            response = client.post(_url(http), content=body)
            assert response.status_code == 200 and response.headers["x-test"] == "yes"
            assert response.text == f"POST /echo {len(body)} {sum(body)}"
        assert http.open_connections == 1  # every request reused the connection
    assert handler.bodies == payloads
    assert {type(body) for body in handler.bodies} == {bytes}


def test_chunked_body_query_string_and_size_limit(server: tuple) -> None:
    http, _ = server

    def pieces(total: int) -> Iterator[bytes]:
        for _ in range(total // 1000):
            yield b"x" * 1000

    with httpx.Client() as client:
        response = client.post(_url(http, "/echo?a=1"), content=pieces(200_000))  # no content-length
        assert response.text == f"POST /echo 200000 {200_000 * ord('x')}"
        too_big = client.post(_url(http), content=pieces(5 << 20))
        assert too_big.status_code == 413 and too_big.text == "too large"
        assert client.post(_url(http), content=b"ok").text == f"POST /echo 2 {sum(b'ok')}"


def test_pipelined_requests_are_answered_in_order(server: tuple) -> None:
    http, _ = server
    requests = b"".join(
        f"POST /p{i} HTTP/1.1\r\nhost: x\r\ncontent-length: {i}\r\n\r\n".encode() + b"a" * i
        for i in range(20)
    )
    with socket.create_connection(("127.0.0.1", http.port)) as sock:
        sock.sendall(requests)
        bodies = _read_responses(sock, 20)
    assert [b.split(b"|")[1].decode() for b in bodies] == [f"POST /p{i} {i} {97 * i}" for i in range(20)]


def test_refused_request_body_is_dropped_and_the_connection_stays_usable(server: tuple) -> None:
    http, handler = server
    with httpx.Client() as client:
        refused = client.post(_url(http, "/refuse/me"), content=b"z" * 1_000_000)
        assert refused.status_code == 403 and refused.text == "refused /refuse/me"
        assert client.post(_url(http), content=b"abc").text == f"POST /echo 3 {sum(b'abc')}"
        assert http.open_connections == 1
    assert handler.bodies == [b"abc"]  # the refused body never reached the handler


def test_expect_100_continue(server: tuple) -> None:
    http, _ = server
    with socket.create_connection(("127.0.0.1", http.port)) as sock:
        sock.settimeout(10)
        sock.sendall(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\nexpect: 100-continue\r\n\r\n")
        assert sock.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(b"hello")
        assert _read_responses(sock, 1)[0].endswith(f"POST /echo 5 {sum(b'hello')}".encode())
        sock.sendall(b"POST /refuse HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\nexpect: 100-continue\r\n\r\n")
        refused = _read_responses(sock, 1)[0]
        assert refused.startswith(b"HTTP/1.1 403") and b"connection: close" in refused
        assert sock.recv(100) == b""  # closed: the client will not send the announced body


def test_malformed_http_gets_400_and_the_server_keeps_serving(server: tuple) -> None:
    http, _ = server
    for garbage in (b"NOT HTTP AT ALL\r\n\r\n", b"POST /echo HTTP/1.1\r\ncontent-length: nope\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", http.port)) as sock:
            sock.sendall(garbage)
            answer = _read_responses(sock, 1)[0]
            assert answer.startswith(b"HTTP/1.1 400") and b"connection: close" in answer
    assert httpx.post(_url(http), content=b"fine").status_code == 200


def test_idle_keep_alive_connections_are_closed(server: tuple) -> None:
    http, _ = server
    with socket.create_connection(("127.0.0.1", http.port)) as sock:
        sock.sendall(b"GET /echo HTTP/1.1\r\nhost: x\r\n\r\n")
        assert _read_responses(sock, 1)[0].endswith(b"GET /echo 0 0")
        sock.settimeout(10)
        started = time.monotonic()
        assert sock.recv(100) == b""  # closed by the server after keep_alive_s (1 s) of silence
        assert 0.5 < time.monotonic() - started < 5


def test_http_1_0_and_connection_close_end_the_connection(server: tuple) -> None:
    http, _ = server
    for request in (
        b"GET /echo HTTP/1.0\r\n\r\n",
        b"GET /echo HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    ):
        with socket.create_connection(("127.0.0.1", http.port)) as sock:
            sock.sendall(request)
            answer = _read_responses(sock, 1)[0]
            assert b"connection: close" in answer and answer.endswith(b"GET /echo 0 0")
            assert sock.recv(100) == b""


def test_a_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot listen for HTTP on 127.0.0.1:{port}"):
            HttpServer(EchoHandler(), "127.0.0.1", port, max_body_bytes=1).start()


@pytest.fixture
def strict_server() -> Iterator[tuple[HttpServer, EchoHandler]]:
    """Short deadlines (0.5 s for a head, 0.5 s + 1 s per MiB for a body) and at most 3 connections."""
    handler = EchoHandler()
    http = HttpServer(
        handler, "127.0.0.1", free_port(), max_body_bytes=4 << 20, header_timeout_s=0.5, body_timeout_s=0.5,
        max_connections=3,
    )  # fmt: skip
    http.start()
    yield http, handler
    http.stop()


def _trickle(sock: socket.socket, data: bytes, seconds: float) -> bytes:
    """Send ``data`` a byte every 50 ms for up to ``seconds`` (stopping when the server closes); then
    everything the server sent."""
    sock.settimeout(0.05)
    received = b""
    deadline = time.monotonic() + seconds
    for byte in data:
        if time.monotonic() > deadline:
            break
        try:
            sock.send(bytes([byte]))
            chunk = sock.recv(65536)
            if not chunk:
                return received
            received += chunk
        except TimeoutError:
            continue
        except OSError:
            return received
    sock.settimeout(5)
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except OSError:
        pass
    return received


def test_a_trickling_request_head_gets_408_and_is_closed(strict_server: tuple) -> None:
    http, _ = strict_server
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", http.port)) as sock:
        answer = _trickle(sock, b"POST /echo HTTP/1.1\r\nhost: x\r\nx-slow: " + b"a" * 200, seconds=5)
    assert answer.startswith(b"HTTP/1.1 408") and b"request head did not arrive in time" in answer
    assert time.monotonic() - started < 3
    assert http.timed_out == 1


def test_a_trickling_body_gets_408_is_closed_and_its_request_abandoned(strict_server: tuple) -> None:
    http, handler = strict_server
    with socket.create_connection(("127.0.0.1", http.port)) as sock:
        sock.sendall(b"POST /slow HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n")
        answer = _trickle(sock, b"b" * 1000, seconds=5)
    assert answer.startswith(b"HTTP/1.1 408") and b"body did not arrive in time" in answer
    # the request learns of the close after the 408 is on the wire: give its task a moment
    deadline = time.monotonic() + 5
    while not handler.abandoned and time.monotonic() < deadline:
        time.sleep(0.01)
    assert handler.abandoned == ["/slow"] and handler.bodies == []
    assert httpx.post(_url(http), content=b"fine").status_code == 200


def test_a_declared_body_over_the_limit_is_413_before_any_byte_of_it(strict_server: tuple) -> None:
    http, handler = strict_server
    with socket.create_connection(("127.0.0.1", http.port)) as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 100000000\r\n\r\n")
        sock.settimeout(3)
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 413") and b"connection: close" in answer
        assert sock.recv(100) == b""  # closed: the body is not read
    assert handler.abandoned == []


def test_a_request_refused_from_its_head_is_answered_before_its_body_is_sent(strict_server: tuple) -> None:
    http, _ = strict_server
    with socket.create_connection(("127.0.0.1", http.port)) as sock:
        sock.sendall(b"POST /refuse HTTP/1.1\r\nhost: x\r\ncontent-length: 300000\r\n\r\n")
        assert _read_responses(sock, 1)[0].endswith(b"refused /refuse")
        sock.sendall(b"z" * 300_000 + b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nhi")
        assert _read_responses(sock, 1)[0].endswith(b"POST /echo 2 209")  # same connection, still usable


def test_connections_beyond_the_cap_get_503_and_the_cap_frees_up(strict_server: tuple) -> None:
    http, _ = strict_server
    held = [socket.create_connection(("127.0.0.1", http.port)) for _ in range(3)]
    time.sleep(0.1)
    with socket.create_connection(("127.0.0.1", http.port)) as extra:
        extra.settimeout(3)
        answer = extra.recv(65536)
    assert answer.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in answer
    for sock in held:  # silent connections get 408 and are closed after the head deadline (0.5 s)
        sock.settimeout(3)
        assert _read_responses(sock, 1)[0].startswith(b"HTTP/1.1 408")
        assert sock.recv(100) == b""
        sock.close()
    assert httpx.post(_url(http), content=b"fine").status_code == 200


def test_the_deadlines_protocol_subclass_is_used_only_on_the_tested_uvicorn() -> None:
    """The fence around uvicorn's non-public httptools protocol: this fails after a uvicorn upgrade;
    run this file with the new version and extend TESTED_UVICORN (or leave the public path on)."""
    import uvicorn

    from tinkertrace.collector.http_server import TESTED_UVICORN, limited_protocol_supported

    assert limited_protocol_supported(), (uvicorn.__version__, TESTED_UVICORN)
    assert not limited_protocol_supported("0.99.0")
    handler = EchoHandler()
    assert HttpServer(handler, "127.0.0.1", 0, max_body_bytes=1).limited_protocol
    assert not HttpServer(handler, "127.0.0.1", 0, max_body_bytes=1, limited_protocol=False).limited_protocol


def test_on_uvicorn_public_options_it_still_serves_refuses_and_caps(caplog: pytest.LogCaptureFixture) -> None:
    """Outside the tested versions: uvicorn's own protocol, public options only — bodies arrive, 413
    from the head, 503 past the connection cap; it says once which deadlines are off."""
    handler = EchoHandler()
    http = HttpServer(
        handler, "127.0.0.1", free_port(), max_body_bytes=4 << 20, max_connections=2, limited_protocol=False
    )
    with caplog.at_level("WARNING", logger="tinkertrace.collector"):
        http.start()
    try:
        assert "without the request head and body deadlines" in caplog.text
        assert httpx.post(_url(http), content=b"abc").text == "POST /echo 3 294"
        with socket.create_connection(("127.0.0.1", http.port)) as sock:
            sock.sendall(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 100000000\r\n\r\n")
            sock.settimeout(5)
            assert sock.recv(65536).startswith(b"HTTP/1.1 413")
        held = [socket.create_connection(("127.0.0.1", http.port)) for _ in range(2)]
        try:
            time.sleep(0.1)
            with socket.create_connection(("127.0.0.1", http.port)) as extra:
                extra.sendall(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nhi")
                extra.settimeout(5)
                assert extra.recv(65536).startswith(b"HTTP/1.1 503")
        finally:
            for sock in held:
                sock.close()
    finally:
        http.stop()
