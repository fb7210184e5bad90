"""Serve a retriever in the Search-R1 retrieval server API, with the standard library only.

``POST /retrieve`` takes ``{"queries": [str, ...], "topk": int, "return_scores": bool}`` and answers
``{"result": [[{"document": {"id", "title", "text", "contents"}, "score": float}, ...], ...]}`` (with
``return_scores`` false, each hit is the document itself), as Search-R1's ``retrieval_server.py``
does; ``GET /health`` answers ``{"status": "ok"}``. Documents carry ``contents`` in the
``'"Title"\\nText'`` layout plus ``title`` and ``text``, so clients of either Search-R1 server
variant (dense: id and contents; BM25: title, text and contents) read them.

Start it from Python (``with RetrievalServer(retriever) as server: server.url``) or as a program::

    python -m agentkit.envs.search_qa.server --port 8000                # the generated corpus, bm25s
    python -m agentkit.envs.search_qa.server --corpus wiki.jsonl --retriever pyserini

It binds 127.0.0.1 unless told otherwise and has no authentication: expose it only on networks
you trust.
"""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agentkit.envs.search_qa.corpus import CORPUS_FILE, DEFAULT_NUM_PASSAGES, contents_of, generated_dir
from agentkit.envs.search_qa.retrieval import MAX_K, RETRIEVERS, Passage, Retriever, make_retriever

from agentkit.core.errors import AgentkitError

MAX_REQUEST_BYTES = 1024 * 1024
MAX_QUERIES = 1024


def _document(p: Passage) -> dict[str, Any]:
    return {"id": p.id, "title": p.title, "text": p.text, "contents": contents_of(p.title, p.text)}


class _BadRequest(Exception):
    pass


def _parse_request(body: bytes, default_k: int) -> tuple[list[str], int, bool]:
    try:
        request = json.loads(body)
    except ValueError as err:
        raise _BadRequest(f"the body is not JSON: {err}") from err
    if not isinstance(request, dict):
        raise _BadRequest("the body must be a JSON object")
    queries = request.get("queries")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise _BadRequest("'queries' must be a list of strings")
    if len(queries) > MAX_QUERIES:
        raise _BadRequest(f"at most {MAX_QUERIES} queries per request")
    k = request.get("topk") or default_k
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise _BadRequest(f"'topk' must be an integer from 1 to {MAX_K}")
    return queries, k, bool(request.get("return_scores", False))


class RetrievalServer:
    """A Search-R1-compatible retrieval server over ``retriever``, in a background thread.

    Args:
        retriever: the backend to serve (closed with the server when ``own_retriever``).
        host, port: where to listen (port 0 picks a free port; read ``url`` afterwards).
        default_k: passages per query when a request gives no ``topk``.
    """

    def __init__(self, retriever: Retriever, host: str = "127.0.0.1", port: int = 0, *, default_k: int = 3,
                 own_retriever: bool = False) -> None:
        self.retriever = retriever
        self.own_retriever = own_retriever
        lock = threading.Lock()  # backends are not all thread-safe (a Lucene QueryParser is not)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 60  # seconds a client may stall mid-request before its connection is dropped

            def _send(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                if self.path.rstrip("/") == "/health":
                    self._send(200, {"status": "ok"})
                else:
                    self._send(404, {"error": f"no such path {self.path}; POST /retrieve"})

            def do_POST(self) -> None:  # noqa: N802
                if self.path.rstrip("/") != "/retrieve":
                    self._send(404, {"error": f"no such path {self.path}; POST /retrieve"})
                    return
                length = self.headers.get("Content-Length", "")
                if not length.isdigit() or int(length) > MAX_REQUEST_BYTES:
                    self.close_connection = True
                    self._send(413 if length.isdigit() else 411, {"error": f"send a Content-Length of at most {MAX_REQUEST_BYTES} bytes"})
                    return
                try:
                    queries, k, with_scores = _parse_request(self.rfile.read(int(length)), default_k)
                except _BadRequest as err:
                    self._send(400, {"error": str(err)})
                    return
                try:
                    with lock:
                        results = retriever.search(queries, k)
                except AgentkitError as err:
                    self._send(500, {"error": f"{type(err).__name__}: {err}"})
                    return
                if with_scores:
                    out = [[{"document": _document(p), "score": p.score} for p in hits] for hits in results]
                else:
                    out = [[_document(p) for p in hits] for hits in results]
                self._send(200, {"result": out})

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet by default
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        host = f"[{host}]" if ":" in str(host) else host
        return f"http://{host}:{port}"

    def start(self) -> RetrievalServer:
        """Serve in a daemon thread (returns at once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever, name="search-qa-server", daemon=True)
            self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in this thread until interrupted."""
        self._server.serve_forever()

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()
        if self.own_retriever:
            self.retriever.close()

    def __enter__(self) -> RetrievalServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve a Search-QA corpus in the Search-R1 retrieval API.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--retriever", choices=[r for r in RETRIEVERS if r != "http"], default="bm25s")
    parser.add_argument("--corpus", help="corpus JSONL (default: the generated corpus)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated corpus")
    parser.add_argument("--num-passages", type=int, default=DEFAULT_NUM_PASSAGES, help="size of the generated corpus")
    parser.add_argument("--topk", type=int, default=3, help="passages per query when a request gives no topk")
    args = parser.parse_args(argv)
    corpus = args.corpus or generated_dir(args.seed, args.num_passages) / CORPUS_FILE
    server = RetrievalServer(make_retriever(args.retriever, corpus=corpus), args.host, args.port,
                             default_k=args.topk, own_retriever=True)
    print(f"Serving {corpus} with {args.retriever} at {server.url}/retrieve", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


if __name__ == "__main__":
    main()
