#!/usr/bin/env python3
"""Download speed over loopback: pocket-download (hash included) against
`curl -o` (no hash), the same file from the same local server in one run.

    cargo build --release -p pocket-download --example fetch
    python3 scripts/download-bench.py [--gb 4] [--rounds 2] [--dir /tmp/pocket-dl-bench]
    python3 scripts/download-bench.py --file MODEL.gguf   # serve an existing file instead

The server sends the file with os.sendfile (one thread per connection, HEAD
and Range supported), so that it is not what limits either client. Each
round runs curl, curl then fsync of its file (pocket syncs its file before
the rename: the same durability), then pocket, deleting each output before the next; the
page cache is not dropped (the source file stays cached for both). Prints
each run's seconds and GB/s and pocket's rate as a fraction of curl's.
"""

import argparse
import hashlib
import http.server
import json
import os
import subprocess
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    path_on_disk = ""

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self.send(body=False)

    def do_GET(self):
        self.send(body=True)

    def send(self, body):
        size = os.path.getsize(self.path_on_disk)
        start = 0
        rng = self.headers.get("Range")
        if rng:
            start = int(rng.removeprefix("bytes=").removesuffix("-"))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(size - start))
        self.send_header("ETag", '"bench"')
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.flush()
        if body:
            with open(self.path_on_disk, "rb") as f:
                offset = start
                while offset < size:
                    sent = os.sendfile(self.connection.fileno(), f.fileno(), offset, min(size - offset, 1 << 30))
                    if sent == 0:
                        break
                    offset += sent
        self.close_connection = True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dir", default="/tmp/pocket-dl-bench")
    ap.add_argument("--file", help="serve this file (e.g. synth-model's 12.9 GB Q2_K) instead of writing one")
    ap.add_argument("--fetch", default=os.path.join(ROOT, "target/release/examples/fetch"))
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    src = a.file or os.path.join(a.dir, "model.bin")
    size = os.path.getsize(src) if a.file else int(a.gb * 1e9) // (1 << 20) * (1 << 20)
    if not a.file and (not os.path.exists(src) or os.path.getsize(src) != size):
        print(f"writing {size / 1e9:.2f} GB of synthetic data to {src}")
        block = os.urandom(1 << 20)
        with open(src, "wb") as f:
            for i in range(size >> 20):
                f.write(block[i % 7 :] + block[: i % 7])
    h = hashlib.sha256()
    with open(src, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    sha = h.hexdigest()
    Handler.path_on_disk = src
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/model.bin"
    out = os.path.join(a.dir, "out.bin")
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    # curl's rate as it exits (the last GBs may still be dirty in the page
    # cache) and with its file synced after, as pocket's is before its rename.
    results = {"curl": [], "curl+fsync": [], "pocket": []}
    for r in range(a.rounds):
        for tool in ("curl", "curl+fsync", "pocket"):
            for p in (out, out + ".part", out + ".part.meta"):
                if os.path.exists(p):
                    os.remove(p)
            t = time.monotonic()
            if tool.startswith("curl"):
                subprocess.run(["curl", "-sS", "-o", out, url], check=True, env=env)
                if tool == "curl+fsync":
                    fd = os.open(out, os.O_RDONLY)
                    os.fsync(fd)
                    os.close(fd)
                info = {}
            else:
                line = subprocess.run([a.fetch, url, sha, out], check=True, env=env, capture_output=True, text=True)
                info = json.loads(line.stdout)
                assert info["sha256"] == sha and info["reread"] == 0
            s = time.monotonic() - t
            assert os.path.getsize(out) == size
            results[tool].append(s)
            print(f"round {r + 1} {tool:10}: {s:6.2f} s  {size / s / 1e9:5.2f} GB/s")
    os.remove(out)
    best = {k: min(v) for k, v in results.items()}
    print(f"file {size / 1e9:.2f} GB; best curl {size / best['curl'] / 1e9:.2f} GB/s "
          f"(file synced after: {size / best['curl+fsync'] / 1e9:.2f} GB/s), "
          f"best pocket (SHA-256 included, synced) {size / best['pocket'] / 1e9:.2f} GB/s: "
          f"{best['curl'] / best['pocket'] * 100:.0f} % of curl's rate, "
          f"{best['curl+fsync'] / best['pocket'] * 100:.0f} % of curl's with the file synced")
    server.shutdown()


if __name__ == "__main__":
    main()
