"""``vllm_server.send``: a request on a kept-alive connection that the server closes unanswered
is sent again on a fresh one (a 2-process fit died at step 0 of this: ``ConnectionResetError``
reading the status line, while the server's log showed only answered requests). A raw socket
server plays the race deterministically: it answers the first request on a connection, then
closes the connection once the second request has arrived, without answering; the next
connection is answered. Timeouts and refused connections are not retried. No vLLM needed."""
import socket
import threading
import time

import pytest
import requests

from ibpo_lit.rollout.vllm_server import send


def _read_request(conn) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0)
    while len(body) < length:
        body += conn.recv(4096)
    return head


def _answer(conn, text: bytes = b'{"ok": true}') -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(text), text))


class RacingServer:
    """Connection 1: answers one request, then takes the second and closes unanswered (``how``:
    a clean close, or a reset with SO_LINGER 0). Later connections: answered; ``stall`` makes
    them wait instead (a server that hangs)."""

    def __init__(self, how: str = "close", stall: bool = False):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.how, self.stall, self.requests = how, stall, []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        first = True
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if first:
                first = False
                self.requests.append(_read_request(conn))
                _answer(conn)
                self.requests.append(_read_request(conn))  # the request sent on the kept-alive connection
                if self.how == "reset":
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                conn.close()
                continue
            self.requests.append(_read_request(conn))
            if self.stall:
                time.sleep(5)
            _answer(conn, b'{"again": true}')
            conn.close()

    def close(self):
        self.sock.close()


@pytest.mark.parametrize("how", ["close", "reset"])
@pytest.mark.parametrize("method", ["GET", "POST"])
def test_a_request_the_server_dropped_on_a_kept_alive_connection_is_sent_again(how, method):
    server = RacingServer(how)
    session = requests.Session()
    try:
        assert session.get(f"{server.url}/first", timeout=10).json() == {"ok": True}
        response = send(session, method, f"{server.url}/second", json={"n": 1}, timeout=10)
        assert response.json() == {"again": True}
        lines = [r.split(b"\r\n")[0] for r in server.requests]
        assert lines == [b"GET /first HTTP/1.1", f"{method} /second HTTP/1.1".encode(),
                         f"{method} /second HTTP/1.1".encode()]
    finally:
        server.close()


def test_the_bare_session_fails_on_that_race():
    """What `send` guards against: the same race with ``session.request`` alone raises."""
    server = RacingServer("close")
    session = requests.Session()
    try:
        session.get(f"{server.url}/first", timeout=10)
        with pytest.raises(requests.ConnectionError):
            session.post(f"{server.url}/second", json={}, timeout=10)
    finally:
        server.close()


def test_a_timeout_is_not_sent_again():
    server = RacingServer(stall=True)
    session = requests.Session()
    try:
        session.get(f"{server.url}/first", timeout=10)
        with pytest.raises(requests.Timeout):  # the dropped one is retried, then its retry times out
            send(session, "GET", f"{server.url}/second", timeout=0.5)
        assert len(server.requests) == 3  # first, dropped, retried once: the timeout itself was not retried
    finally:
        server.close()


def test_a_server_that_is_gone_fails_with_its_own_error():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there
    with pytest.raises(requests.ConnectionError) as err:
        send(requests.Session(), "GET", f"http://127.0.0.1:{port}/health", timeout=5)
    assert "refused" in str(err.value).lower() or "Failed to establish" in str(err.value)
