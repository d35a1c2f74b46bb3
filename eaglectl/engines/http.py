"""One small HTTP client for the servers eaglectl drives (`smoke --server`, `capture --engine server`), and
the one lookup both make: the model a server serves (`server_model`, the first of `/v1/models`).

A server is untrusted input, like a file. Every call has a connect timeout (`http_connect_timeout_s`)
and a time limit for the whole reply (the caller's `timeout_s`, at most `http_read_timeout_s`, and
never past the command's `Deadline`), enforced by a watchdog that closes the socket, so a server
that answers one byte at a time is cut off too. A reply is capped at `server_reply_bytes`, whether it
announces its length or not. Redirects are followed only to the same scheme, host and port (at most
`http_redirects`); another host is refused. JSON goes through the bounded parser (`io/jsonio.py`). Every
failure is a ServerReplyError naming the URL (exit 22).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import socket
import threading
import time
from typing import Any
from urllib.parse import urljoin, urlsplit

from ..errors import CorruptCheckpointError, EaglectlError, ServerReplyError, SmokeFailedError
from ..io.jsonio import loads
from ..limits import limit

CHUNK = 1 << 16
REDIRECTS = (301, 302, 303, 307, 308)


class Deadline:
    """The time budget of a whole command that talks to a server (its --timeout-s)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = min(float(seconds), float(limit("server_total_s")))
        self.end = time.monotonic() + self.seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def get_json(url: str, *, timeout_s: float, deadline: Deadline | None = None) -> Any:
    return _json(url, _request("GET", url, None, timeout_s, deadline))


def post_json(url: str, body: Any, *, timeout_s: float, deadline: Deadline | None = None) -> Any:
    return _json(url, _request("POST", url, json.dumps(body).encode(), timeout_s, deadline))


def get_text(url: str, *, timeout_s: float, deadline: Deadline | None = None) -> str:
    raw = _request("GET", url, None, timeout_s, deadline)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ServerReplyError(f"{url}: the reply is not UTF-8 text (byte {e.start})", url=url) from None


def server_model(base: str, timeout_s: float, deadline: Deadline, empty: type[EaglectlError] = SmokeFailedError) -> str:
    """The first model a server lists (`/v1/models`); a server that lists none is an `empty` error."""
    doc = get_json(f"{base}/v1/models", timeout_s=timeout_s, deadline=deadline)
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        raise ServerReplyError(f"{base}/v1/models: the reply has no 'data' list (not an OpenAI-compatible server?)")
    if not data:
        raise empty(f"{base}/v1/models: the server lists no model")
    model = data[0].get("id") if isinstance(data[0], dict) else None
    if not isinstance(model, str) or not model or len(model) > 4096:
        raise ServerReplyError(f"{base}/v1/models: the first model has no 'id' string")
    return model


def check_url(url: str) -> str:
    """`url` without a trailing slash, when it is an http(s) URL with a host; else a ServerReplyError."""
    try:
        parts = urlsplit(url)
        host, _ = parts.hostname, parts.port  # either raises ValueError on a malformed host or port
    except ValueError as e:
        raise ServerReplyError(f"{_shown(url)}: not a valid URL ({e})", url=url) from None
    if parts.scheme not in ("http", "https") or not host:
        raise ServerReplyError(f"{_shown(url)}: not an http:// or https:// URL with a host", url=url)
    return url.rstrip("/")


def _json(url: str, raw: bytes) -> Any:
    try:
        return loads(raw, url, max_bytes=limit("server_reply_bytes"))
    except CorruptCheckpointError as e:
        raise ServerReplyError(f"{e.message.replace('not valid JSON', 'the reply is not JSON')}", url=url) from None


def _origin(url: str) -> tuple[str, str, int]:
    p = urlsplit(url)
    return p.scheme, (p.hostname or "").lower(), p.port or (443 if p.scheme == "https" else 80)


def _request(method: str, url: str, body: bytes | None, timeout_s: float, deadline: Deadline | None) -> bytes:
    cap = limit("server_reply_bytes")
    budget = min(float(timeout_s), float(limit("http_read_timeout_s")),
                 deadline.left() if deadline is not None else math.inf)
    if budget <= 0:
        spent = f" (the command's {deadline.seconds:g} s are spent)" if deadline is not None else ""
        raise ServerReplyError(f"{url}: no time left for this request{spent}", url=url)
    end = time.monotonic() + budget
    first = url
    for _ in range(limit("http_redirects") + 1):
        check_url(url)
        status, location, data = _once(method, url, body, end, budget, cap)
        if status in REDIRECTS:
            if not location:
                raise ServerReplyError(f"{url}: HTTP {status} without a Location", url=url)
            try:
                target = check_url(urljoin(url, location))
            except (ServerReplyError, ValueError):
                raise ServerReplyError(f"{url}: redirects to a malformed URL ({_shown(location)}): refused",
                                       url=url) from None
            if _origin(target) != _origin(first):
                raise ServerReplyError(f"{url}: redirects to another host ({_shown(target)}): refused", url=url)
            if method == "POST" and status not in (307, 308):
                raise ServerReplyError(f"{url}: HTTP {status} would turn the POST into a GET: refused", url=url)
            url = target
            continue
        if status >= 400:
            raise ServerReplyError(f"{url}: HTTP {status}: {_shown(data[:300].decode('utf-8', errors='replace'))}",
                                   url=url, hint="is the server healthy, and serving this model?")
        if not 200 <= status < 300:
            raise ServerReplyError(f"{url}: HTTP {status} (expected 200)", url=url)
        return data
    raise ServerReplyError(f"{first}: more than {limit('http_redirects')} redirects", url=first)


def _once(method: str, url: str, body: bytes | None, end: float, budget: float, cap: int
          ) -> tuple[int, str | None, bytes]:
    """One request: (status, Location, body), within the time left until `end` and `cap` bytes."""
    p = urlsplit(url)
    path = (p.path or "/") + (f"?{p.query}" if p.query else "")
    left = end - time.monotonic()
    connect = max(0.001, min(float(limit("http_connect_timeout_s")), left))
    kind = http.client.HTTPSConnection if p.scheme == "https" else http.client.HTTPConnection
    conn = kind(p.hostname, p.port, timeout=connect)
    fired = threading.Event()
    held: list[socket.socket] = []  # the connection's socket (http.client drops its own reference mid-reply)

    def cut() -> None:  # the watchdog: a reply still coming at `end` is cut off
        fired.set()
        for sock in held:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(max(0.0, left), cut)
    timer.daemon = True
    timer.start()
    stage = "connect"
    try:
        conn.connect()
        stage = "reply"
        assert conn.sock is not None
        held.append(conn.sock)
        if fired.is_set():  # the watchdog fired while connecting
            raise TimeoutError
        conn.sock.settimeout(max(0.001, end - time.monotonic()))
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/plain"} if body is not None \
            else {"Accept": "application/json, text/plain"}
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        announced = resp.getheader("Content-Length")
        if announced is not None and announced.strip().isdigit() and int(announced.strip()) > cap:
            raise ServerReplyError(f"{url}: the reply announces {int(announced.strip())} bytes, over the {cap}-byte "
                                   "limit", url=url)
        chunks, size = [], 0
        while True:
            chunk = resp.read(CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > cap:
                raise ServerReplyError(f"{url}: the reply exceeds the {cap}-byte limit", url=url)
            chunks.append(chunk)
        if fired.is_set():
            raise TimeoutError
        if resp.length:  # http.client's chunked reads do not raise on a body cut short
            raise ServerReplyError(f"{url}: the reply ended {resp.length} bytes short of its Content-Length", url=url)
        return resp.status, resp.getheader("Location"), b"".join(chunks)
    except ServerReplyError:
        raise
    except ConnectionRefusedError:
        raise ServerReplyError(f"{url}: connection refused", url=url, hint="is the server running and reachable?") \
            from None
    except (http.client.HTTPException, ValueError, OSError) as e:  # TimeoutError is an OSError
        timeout = isinstance(e, TimeoutError)
        if timeout and stage == "connect" and not fired.is_set():
            raise ServerReplyError(f"{url}: no connection within {connect:.3g} s", url=url,
                                   hint="is the server running and reachable?") from None
        if timeout or fired.is_set():
            raise ServerReplyError(f"{url}: no complete reply within {budget:.3g} s", url=url,
                                   hint="raise --timeout-s if the server is just slow") from None
        reason = getattr(e, "strerror", None) or _shown(str(e).splitlines()[0] if str(e).strip() else "")
        what = "not a valid HTTP reply" if isinstance(e, (http.client.HTTPException, ValueError)) else \
            "the connection failed"
        raise ServerReplyError(f"{url}: {what} ({type(e).__name__}{': ' + reason if reason else ''})", url=url,
                               hint="is the server running and reachable?") from None
    finally:
        timer.cancel()
        conn.close()


def _shown(text: str, n: int = 200) -> str:
    """Server text as a message may carry it: one line, printable, bounded."""
    text = "".join(c if c.isprintable() else " " for c in text.replace("\n", " "))
    return text if len(text) <= n else text[: n - 3] + "..."
