"""downloadModel through the Python bindings against a local HTTP server
(http.server with Range support): progress then the verified path, resume
after cancel, a wrong hash, a 404, arguments checked before anything starts."""

import hashlib
import http.server
import os
import threading
import time

import pytest

import pocket

DATA = bytes((i * 31 + i // 7) & 0xFF for i in range(3_000_000))
SHA = hashlib.sha256(DATA).hexdigest()


class Handler(http.server.BaseHTTPRequestHandler):
    """Serves DATA at /m.gguf with ranges (throttled under /slow/), 404 elsewhere."""

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self.answer(body=False)

    def do_GET(self):
        self.answer(body=True)

    def answer(self, body):
        if not self.path.endswith("/m.gguf"):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        start = 0
        rng = self.headers.get("Range")
        if rng and self.headers.get("If-Range") in (None, '"v1"'):
            start = int(rng.removeprefix("bytes=").removesuffix("-"))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(DATA) - 1}/{len(DATA)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(DATA) - start))
        self.send_header("ETag", '"v1"')
        self.end_headers()
        if not body:
            return
        slow = self.path.startswith("/slow/")
        step = 32 * 1024
        try:
            for at in range(start, len(DATA), step):
                self.wfile.write(DATA[at : at + step])
                if slow:
                    time.sleep(0.01)  # ~3 MB/s
        except (BrokenPipeError, ConnectionResetError):
            pass


@pytest.fixture(scope="module")
def base():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


class Listener(pocket.DownloadListener):
    def __init__(self, on_progress=None):
        self.progress = []
        self.path = None
        self.error = None
        self.done = threading.Event()
        self.hook = on_progress

    def on_progress(self, done_bytes, total_bytes):
        self.progress.append((done_bytes, total_bytes))
        if self.hook:
            self.hook(done_bytes)

    def on_finished(self, path):
        self.path = path
        self.done.set()

    def on_failed(self, error):
        self.error = error
        self.done.set()


def run(request, listener=None):
    listener = listener or Listener()
    handle = pocket.download_model(request, listener)
    assert listener.done.wait(60), "the download did not end"
    handle.join()
    return listener


def test_download_reports_progress_then_the_verified_path(base, tmp_path):
    dest = tmp_path / "m.gguf"
    got = run(pocket.DownloadRequest(urls=[f"{base}/m.gguf"], sha256=[SHA], destination=str(dest)))
    assert got.error is None and got.path == str(dest)
    assert dest.read_bytes() == DATA
    assert got.progress[-1] == (len(DATA), len(DATA))
    assert all(a[0] <= b[0] for a, b in zip(got.progress, got.progress[1:]))
    assert sorted(os.listdir(tmp_path)) == ["m.gguf"]


def test_a_cancelled_download_resumes(base, tmp_path):
    dest = tmp_path / "m.gguf"
    request = pocket.DownloadRequest(urls=[f"{base}/slow/m.gguf"], sha256=[SHA], destination=str(dest))
    holder = {}
    listener = Listener(on_progress=lambda done: done > 500_000 and holder["handle"].cancel())
    holder["handle"] = pocket.download_model(request, listener)
    assert listener.done.wait(60)
    assert isinstance(listener.error, pocket.PocketError.Cancelled), listener.error
    assert not dest.exists()
    had = (tmp_path / "m.gguf.part").stat().st_size
    assert had > 500_000
    got = run(request)
    assert got.error is None and dest.read_bytes() == DATA
    # The first report already counts the resumed bytes.
    assert got.progress[0][0] >= had


def test_a_wrong_hash_is_an_integrity_error_and_nothing_stays(base, tmp_path):
    dest = tmp_path / "m.gguf"
    got = run(pocket.DownloadRequest(urls=[f"{base}/m.gguf"], sha256=["0" * 64], destination=str(dest)))
    assert isinstance(got.error, pocket.PocketError.Integrity), got.error
    assert "SHA-256" in got.error.reason
    assert os.listdir(tmp_path) == []


def test_not_found_is_a_network_error(base, tmp_path):
    got = run(pocket.DownloadRequest(urls=[f"{base}/nope"], sha256=[SHA], destination=str(tmp_path / "x")))
    assert isinstance(got.error, pocket.PocketError.Network), got.error
    assert "404" in got.error.reason


def test_requests_are_checked_before_the_download_starts(base, tmp_path):
    dest = str(tmp_path / "m.gguf")
    for request in (
        pocket.DownloadRequest(urls=[f"{base}/m.gguf"], sha256=[], destination=dest),
        pocket.DownloadRequest(urls=[f"{base}/m.gguf"], sha256=["xyz"], destination=dest),
        pocket.DownloadRequest(urls=[], sha256=[], destination=dest),
    ):
        with pytest.raises(pocket.PocketError.InvalidArgument):
            pocket.download_model(request, Listener())
    # Unverified on request: accepted.
    got = run(pocket.DownloadRequest(urls=[f"{base}/m.gguf"], sha256=[], destination=dest, allow_unverified=True))
    assert got.error is None and open(dest, "rb").read() == DATA
