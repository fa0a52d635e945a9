#!/usr/bin/env python3
"""An HTTP proxy between S3 clients and an S3 server that counts requests
by kind and can inject faults: error replies, delays and cut connections.

    proxy.py LISTEN_PORT TARGET_PORT [SEED]

Prints "ready" once listening. Control (answered by the proxy itself):
    GET /__stats          JSON counts: PUT, GET, LIST, DELETE, HEAD, POST,
                          bytes in and out, faults injected
    GET /__reset          zero the counts
    GET /__faults?error=P&delay_ms=N&cut=P&put_only=1
                          reply 503 with probability P, wait N ms before
                          each request, close the connection before
                          forwarding with probability P (put_only: only
                          PUTs are faulted)
Request signatures stay valid: the Host header is passed on unchanged and
moto does not check it against its own address.
"""
import http.client
import json
import random
import socket
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LISTEN, TARGET = int(sys.argv[1]), int(sys.argv[2])
RNG = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
LOCK = threading.Lock()
STATS = {}
FAULTS = {"error": 0.0, "delay_ms": 0, "cut": 0.0, "put_only": False}


def reset():
    STATS.clear()
    STATS.update({k: 0 for k in ("PUT", "GET", "LIST", "DELETE", "HEAD", "POST", "bytes_in", "bytes_out",
                                 "errors_injected", "cuts_injected")})


reset()


def kind(method, path):
    parsed = urllib.parse.urlsplit(path)
    query = urllib.parse.parse_qs(parsed.query, keep_blank_values=True)
    key = parsed.path.strip("/").split("/", 1)
    if method == "GET" and (len(key) == 1 or "list-type" in query or "prefix" in query):
        return "LIST"
    return method


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def control(self):
        parsed = urllib.parse.urlsplit(self.path)
        if parsed.path == "/__reset":
            with LOCK:
                reset()
        elif parsed.path == "/__faults":
            q = urllib.parse.parse_qs(parsed.query)
            with LOCK:
                FAULTS["error"] = float(q.get("error", ["0"])[0])
                FAULTS["delay_ms"] = int(q.get("delay_ms", ["0"])[0])
                FAULTS["cut"] = float(q.get("cut", ["0"])[0])
                FAULTS["put_only"] = q.get("put_only", ["0"])[0] == "1"
        with LOCK:
            body = json.dumps(STATS).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))

    def forward(self):
        if self.path.startswith("/__"):
            return self.control()
        data = self.body()
        k = kind(self.command, self.path)
        with LOCK:
            STATS[k] = STATS.get(k, 0) + 1
            STATS["bytes_in"] += len(data)
            faults = dict(FAULTS)
            faulted = not faults["put_only"] or self.command == "PUT"
            roll_cut, roll_err = RNG.random(), RNG.random()
        if faults["delay_ms"] and faulted:
            time.sleep(faults["delay_ms"] / 1000)
        if faulted and roll_cut < faults["cut"]:
            with LOCK:
                STATS["cuts_injected"] += 1
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        if faulted and roll_err < faults["error"]:
            with LOCK:
                STATS["errors_injected"] += 1
            body = b"<Error><Code>ServiceUnavailable</Code><Message>injected</Message></Error>"
            self.send_response(503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("transfer-encoding", "connection")}
        headers["Content-Length"] = str(len(data))
        conn = http.client.HTTPConnection("127.0.0.1", TARGET, timeout=60)
        try:
            conn.request(self.command, self.path, body=data if data or self.command in ("PUT", "POST") else None,
                         headers=headers)
            resp = conn.getresponse()
            out = resp.read()
        finally:
            conn.close()
        with LOCK:
            STATS["bytes_out"] += len(out)
        self.send_response(resp.status)
        for h, v in resp.getheaders():
            if h.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                self.send_header(h, v)
        # A HEAD reply says the object's length, with no body.
        length = resp.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(out))
        self.send_header("Content-Length", length)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(out)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = forward


server = ThreadingHTTPServer(("127.0.0.1", LISTEN), Handler)
server.daemon_threads = True
print("ready", flush=True)
server.serve_forever()
