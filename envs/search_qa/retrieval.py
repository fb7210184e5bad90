"""Retrieval backends for Search-QA behind one protocol: bm25s (embedded), pyserini (Lucene), http.

- ``bm25s``: pure Python and numpy, the default. The index is built on first use and saved with
  bm25s's own ``save``/``load`` under the agentkit cache (``index_dir_for``: beside a generated
  corpus, ``$AGENTKIT_CACHE/search_qa/indexes/`` for a user's, whose folder is left alone).
- ``pyserini``: Lucene through pyserini (>= 1.6, Java 21+). The index is built from our corpus
  JSONL by pyserini's ``JsonCollection`` indexer, run as a subprocess, into the same place
  (``.lucene`` instead of ``.bm25s``). Queries are escaped (every character of Lucene's query syntax, and the
  operator words AND/OR/NOT) and parsed by Lucene's classic ``QueryParser``, so model text is
  always searched as plain words: it can neither fail to parse nor reach other fields, wildcards
  or boolean operators.
- ``http``: a client for the Search-R1 retrieval server API: ``POST {url}/retrieve`` with
  ``{"queries": [...], "topk": k, "return_scores": true}`` answered by ``{"result": [[{"document":
  {"id", "contents"}, "score"}, ...], ...]}``. ``agentkit.envs.search_qa.server`` serves our own
  indexes in that API.

Every backend returns, per query, at most ``k`` passages with a positive score, best first; a
query with no searchable words returns no passages.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from agentkit.envs.search_qa.corpus import contents_of, read_corpus_records, split_title

from agentkit.core.errors import ConfigError, EnvError, MissingDependencyError, did_you_mean
from agentkit.core.paths import cache_dir

RETRIEVERS = ("bm25s", "pyserini", "http")
MAX_K = 100
INDEX_FORMAT = 1


class RetrievalError(EnvError):
    """A retrieval backend failed (server unreachable, malformed or oversized answer, broken index)."""


@dataclass(frozen=True)
class Passage:
    """One retrieved passage."""

    id: str
    title: str
    text: str
    score: float = 0.0


@runtime_checkable
class Retriever(Protocol):
    """Top-k passage search over a corpus."""

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        """The best ``k`` passages for each query, best first (fewer when fewer match)."""
        ...

    def close(self) -> None:
        """Release indexes, JVM objects and connections."""
        ...


def _check_k(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise ConfigError(f"k (the number of passages per query) must be an integer from 1 to {MAX_K}, got {k!r}.")
    return k


def _check_queries(queries: Any) -> list[str]:
    if isinstance(queries, str) or not isinstance(queries, Sequence) or not all(isinstance(q, str) for q in queries):
        raise ConfigError(f"queries must be a list of strings, got {type(queries).__name__}.")
    return list(queries)


@dataclass(frozen=True)
class _Corpus:
    ids: list[str]
    titles: list[str]
    texts: list[str]

    def passage(self, row: int, score: float) -> Passage:
        return Passage(self.ids[row], self.titles[row], self.texts[row], float(score))


def _load_corpus(path: Path) -> _Corpus:
    ids, titles, texts = [], [], []
    for doc_id, title, text in read_corpus_records(path):
        ids.append(doc_id)
        titles.append(title)
        texts.append(text)
    if not ids:
        raise ConfigError(f"Corpus {path} holds no passages.")
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        for doc_id in ids:
            if doc_id in seen:
                raise ConfigError(f"Corpus {path} has duplicate passage id {doc_id!r}; ids must be unique.")
            seen.add(doc_id)
    return _Corpus(ids, titles, texts)


def _fingerprint(corpus_path: Path, builder: str) -> dict[str, Any]:
    """What an index was built from and by; a different corpus file or library version rebuilds it."""
    stat = corpus_path.stat()
    return {"format": INDEX_FORMAT, "builder": builder, "corpus": str(corpus_path.resolve()),
            "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def index_dir_for(corpus_path: str | os.PathLike, backend: str) -> Path:
    """Where the ``backend`` index of this corpus lives: under agentkit's cache, never beside a
    user's corpus (whose folder may be read-only, shared or under version control); a corpus
    generated into the cache keeps its index beside it."""
    corpus_path = Path(corpus_path).resolve()
    cache = cache_dir().resolve()
    if corpus_path.is_relative_to(cache):
        return corpus_path.with_name(f"{corpus_path.name}.{backend}")
    key = hashlib.sha1(str(corpus_path).encode()).hexdigest()[:16]
    return cache / "search_qa" / "indexes" / f"{corpus_path.stem}-{key}.{backend}"


def _index_is_current(folder: Path, corpus_path: Path, builder: str) -> bool:
    try:
        return json.loads((folder / "agentkit-index.json").read_text()) == _fingerprint(corpus_path, builder)
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def _building(folder: Path, corpus_path: Path, builder: str) -> Iterator[Path]:
    """A temporary folder that becomes ``folder`` (atomically) when the block succeeds, unless
    another process has meanwhile put a current index there (then that one is kept)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        yield tmp
        (tmp / "agentkit-index.json").write_text(json.dumps(_fingerprint(corpus_path, builder)))
        if _index_is_current(folder, corpus_path, builder):
            return
        old = folder.with_name(f".{folder.name}-old-{os.getpid()}")
        if folder.exists():
            os.rename(folder, old)  # a stale index; readers that opened it keep their files
        try:
            os.rename(tmp, folder)
        except OSError:
            if not _index_is_current(folder, corpus_path, builder):  # lost a race to a finished build: keep it
                raise
        shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# bm25s


class BM25sRetriever:
    """BM25 (Lucene variant, k1=1.5, b=0.75) with bm25s: English stopwords, no stemming.

    Args:
        corpus: the corpus JSONL file.
        index_dir: where the index is saved (default: ``index_dir_for(corpus, "bm25s")``).
    """

    STOPWORDS = "en"

    def __init__(self, corpus: str | os.PathLike, index_dir: str | os.PathLike | None = None) -> None:
        import bm25s

        self._bm25s = bm25s
        self._builder = f"bm25s {bm25s.__version__} stopwords={self.STOPWORDS}"
        self.corpus_path = Path(corpus)
        self._corpus = _load_corpus(self.corpus_path)
        folder = Path(index_dir) if index_dir else index_dir_for(self.corpus_path, "bm25s")
        if not _index_is_current(folder, self.corpus_path, self._builder):
            self._build(folder)
        try:
            self._index = bm25s.BM25.load(str(folder), show_progress=False)
        except (OSError, ValueError) as err:
            raise RetrievalError(f"Cannot load the bm25s index {folder}: {err}. Delete the folder to rebuild it.") from err
        if self._index.scores["num_docs"] != len(self._corpus.ids):
            raise RetrievalError(f"The bm25s index {folder} does not match {self.corpus_path}; delete the folder to rebuild it.")

    def _build(self, folder: Path) -> None:
        bm25s = self._bm25s
        texts = [f"{t}\n{x}" for t, x in zip(self._corpus.titles, self._corpus.texts, strict=True)]
        tokens = bm25s.tokenize(texts, stopwords=self.STOPWORDS, show_progress=False)
        index = bm25s.BM25()
        index.index(tokens, show_progress=False)
        with _building(folder, self.corpus_path, self._builder) as tmp:
            index.save(str(tmp), show_progress=False)

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        queries, k = _check_queries(queries), _check_k(k)
        if self._index is None:
            raise RetrievalError("search() after close().")
        if not queries:
            return []
        tokens = self._bm25s.tokenize(queries, stopwords=self.STOPWORDS, return_ids=False, show_progress=False)
        rows, scores = self._index.retrieve(tokens, k=min(k, len(self._corpus.ids)), show_progress=False)
        return [
            [self._corpus.passage(int(r), s) for r, s in zip(row, score, strict=True) if s > 0]
            for row, score in zip(rows, scores, strict=True)
        ]

    def close(self) -> None:
        self._index = None


# ---------------------------------------------------------------------------------------------
# pyserini

_LUCENE_SPECIAL = re.compile(r'([\\+\-!():^\[\]"{}~*?|&/])')
_LUCENE_OPERATORS = re.compile(r"\b(AND|OR|NOT)\b")


def lucene_escape(text: str) -> str:
    """Backslash-escape every character of Lucene's classic query syntax (as ``QueryParser.escape``)."""
    return _LUCENE_SPECIAL.sub(r"\\\1", text)


def lucene_query(text: str) -> str:
    """Model text as a Lucene query of plain words: escaped, and AND/OR/NOT lowercased so the
    parser reads them as words (the analyzer lowercases every term anyway)."""
    return _LUCENE_OPERATORS.sub(lambda m: m.group(1).lower(), lucene_escape(text))


def _java_major(home: Path) -> int | None:
    try:
        release = (home / "release").read_text(errors="replace")
    except OSError:
        return None
    match = re.search(r'^JAVA_VERSION="(\d+)(?:\.(\d+))?', release, flags=re.MULTILINE)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2)) if major == 1 and match.group(2) else major


def find_java_home(min_version: int = 21) -> Path:
    """A JDK with Java ``min_version``+: ``$JAVA_HOME`` if new enough, else the newest one installed
    under the usual folders (/usr/lib/jvm, /opt/java, /usr/java, /Library/Java/JavaVirtualMachines)."""
    if os.environ.get("JAVA_HOME"):
        chosen = Path(os.environ["JAVA_HOME"])
        if (_java_major(chosen) or 0) >= min_version:
            return chosen
    candidates: list[Path] = []
    for root in ("/usr/lib/jvm", "/opt/java", "/usr/java", "/Library/Java/JavaVirtualMachines"):
        if os.path.isdir(root):
            for entry in sorted(Path(root).iterdir()):
                candidates.extend([entry, entry / "Contents" / "Home"])
    found = [(v, c) for c in candidates if (v := _java_major(c)) is not None and v >= min_version]
    if not found:
        raise MissingDependencyError(
            f"The pyserini retriever needs Java {min_version}+ (pyserini 1.x runs Lucene 10); found none "
            f"(JAVA_HOME={os.environ.get('JAVA_HOME')!r}). Install a JDK {min_version}+ (e.g. Temurin) and set JAVA_HOME to it."
        )
    return max(found, key=lambda vc: vc[0])[1]


_PYSERINI_LOCK = threading.Lock()


@contextlib.contextmanager
def _temporary_env(**values: str) -> Iterator[None]:
    old = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _import_pyserini(java_home: Path) -> tuple[Any, Any, Any]:
    """(LuceneSearcher, QueryParser class, English analyzer factory).

    pyjnius reads JAVA_HOME when it starts the JVM, and pyserini builds an OpenAI client at import
    that refuses to exist without a key; both variables are set only for the import and restored,
    so neither leaks into this process or its children.
    """
    with _PYSERINI_LOCK:
        env = {"JAVA_HOME": str(java_home)}
        if not os.environ.get("OPENAI_API_KEY"):
            env["OPENAI_API_KEY"] = "unused-by-agentkit"
        try:
            with _temporary_env(**env):
                # pyserini first: it puts Anserini's jar on the class path before the JVM starts
                from pyserini.search.lucene import LuceneSearcher  # isort: skip
                from pyserini.analysis import get_lucene_analyzer  # isort: skip
                from jnius import autoclass  # isort: skip
        except ImportError as err:
            raise MissingDependencyError(
                "The pyserini retriever needs pyserini (pip install 'pyserini>=1.6') and Java 21+."
            ) from err
        except Exception as err:  # noqa: BLE001 - pyjnius raises plain Exceptions for JVM problems
            raise MissingDependencyError(
                f"pyserini failed to start its JVM from {java_home}: {type(err).__name__}: {err}. It needs Java 21+; "
                "a JVM already started in this process (by another library) cannot be replaced."
            ) from err
        query_parser = autoclass("org.apache.lucene.queryparser.classic.QueryParser")
        return LuceneSearcher, query_parser, get_lucene_analyzer


def _lucene_builder() -> str:
    return f"pyserini {importlib.metadata.version('pyserini')} JsonCollection DefaultLuceneDocumentGenerator"


def build_lucene_index(corpus: str | os.PathLike, folder: str | os.PathLike, *, java_home: str | os.PathLike | None = None,
                       threads: int = 1, timeout_s: float = 3600) -> Path:
    """Index a corpus JSONL with pyserini's ``JsonCollection`` indexer (a subprocess) into ``folder``."""
    corpus, folder = Path(corpus), Path(folder)
    home = Path(java_home) if java_home else find_java_home()
    with _building(folder, corpus, _lucene_builder()) as tmp:
        source = tmp / "source"
        source.mkdir()
        with (source / "docs.jsonl").open("w", encoding="utf-8") as out:
            for doc_id, title, text in read_corpus_records(corpus):
                out.write(json.dumps({"id": doc_id, "contents": contents_of(title, text)}, ensure_ascii=False) + "\n")
        command = [sys.executable, "-m", "pyserini.index.lucene", "--collection", "JsonCollection",
                   "--input", str(source), "--index", str(tmp / "index"),
                   "--generator", "DefaultLuceneDocumentGenerator", "--threads", str(threads)]
        env = {**os.environ, "JAVA_HOME": str(home), "OPENAI_API_KEY": os.environ.get("OPENAI_API_KEY") or "unused-by-agentkit"}
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as err:
            raise RetrievalError(f"Lucene indexing of {corpus} took over {timeout_s:.0f} s.") from err
        if done.returncode != 0 or not (tmp / "index").is_dir():
            tail = (done.stderr or done.stdout)[-2000:]
            raise RetrievalError(f"Lucene indexing of {corpus} failed (exit {done.returncode}):\n{tail}")
        shutil.rmtree(source)
    return folder


class PyseriniRetriever:
    """BM25 in Lucene (pyserini's defaults: k1=0.9, b=0.4, Porter stemming, English stopwords).

    Args:
        corpus: the corpus JSONL file.
        index_dir: the Lucene index folder (default: ``index_dir_for(corpus, "lucene")``), built on
            first use.
        java_home: a JDK 21+ (default: ``find_java_home()``).
    """

    def __init__(self, corpus: str | os.PathLike, index_dir: str | os.PathLike | None = None,
                 java_home: str | os.PathLike | None = None) -> None:
        self.corpus_path = Path(corpus)
        self._corpus = _load_corpus(self.corpus_path)
        self._rows = {doc_id: row for row, doc_id in enumerate(self._corpus.ids)}
        home = Path(java_home) if java_home else find_java_home()
        lucene_searcher, query_parser, analyzer = _import_pyserini(home)
        folder = Path(index_dir) if index_dir else index_dir_for(self.corpus_path, "lucene")
        if not _index_is_current(folder, self.corpus_path, _lucene_builder()):
            build_lucene_index(self.corpus_path, folder, java_home=home)
        self._searcher = lucene_searcher(str(folder / "index"))
        self._parser = query_parser("contents", analyzer())

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        queries, k = _check_queries(queries), _check_k(k)
        if self._searcher is None:
            raise RetrievalError("search() after close().")
        results = []
        for query in queries:
            text = " ".join("".join(ch for ch in query if ch.isprintable()).split())
            if not text:
                results.append([])
                continue
            try:
                parsed = self._parser.parse(lucene_query(text))
            except Exception as err:  # noqa: BLE001 - pyjnius wraps Java exceptions in JavaException
                raise RetrievalError(f"Lucene could not parse the escaped query {lucene_query(text)!r}: {err}") from err
            hits = self._searcher.search(parsed, k) if parsed is not None and parsed.toString() else []
            results.append([self._corpus.passage(self._rows[h.docid], h.score) for h in hits if h.score > 0])
        return results

    def close(self) -> None:
        if self._searcher is not None:
            self._searcher.close()
            self._searcher = None


# ---------------------------------------------------------------------------------------------
# http


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D401 - urllib's hook
        return None  # a 3xx becomes an HTTPError: a POST is never silently re-sent elsewhere


class HttpRetriever:
    """Client of a Search-R1 retrieval server (``POST {url}/retrieve``).

    Args:
        url: the server's base URL (``http://host:8000``) or its ``/retrieve`` endpoint; http(s) only.
        timeout_s: per-request timeout.
        retries: further attempts after a failure that may pass (connection error, timeout, HTTP
            5xx/429, a body that is not JSON), with exponential backoff from ``backoff_s``.
        max_response_bytes: larger answers are refused.
        batch_size: queries per request (longer lists are sent in several requests).
    """

    def __init__(self, url: str, *, timeout_s: float = 30.0, retries: int = 3, backoff_s: float = 0.5,
                 max_response_bytes: int = 32 * 1024 * 1024, batch_size: int = 256) -> None:
        if not isinstance(url, str):
            raise ConfigError(f"retriever_url must be a string such as 'http://127.0.0.1:8000', got {url!r}.")
        try:
            parts = urllib.parse.urlsplit(url.strip())
            host = parts.hostname
        except ValueError:  # e.g. an unclosed IPv6 bracket
            parts, host = None, None
        if parts is None or parts.scheme not in ("http", "https") or not host:
            raise ConfigError(f"retriever_url must be an http:// or https:// URL with a host, got {url!r}.")
        if parts.username is not None or parts.password is not None:
            # the URL is recorded in run configs: credentials in it would be written to disk
            raise ConfigError(f"retriever_url {parts.scheme}://{host}{parts.path} (user info not shown) must not carry "
                              "user:password@; the retrieval API has no authentication: serve it on a trusted network.")
        path = parts.path.rstrip("/")
        if not path.endswith("/retrieve"):
            path += "/retrieve"
        self.url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))
        if timeout_s <= 0 or retries < 0 or backoff_s < 0 or max_response_bytes <= 0 or batch_size <= 0:
            raise ConfigError("timeout_s, max_response_bytes and batch_size must be positive; retries and backoff_s non-negative.")
        self.batch_size = batch_size
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.max_response_bytes = max_response_bytes
        self._opener = urllib.request.build_opener(_NoRedirect())

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        queries, k = _check_queries(queries), _check_k(k)
        if self._opener is None:
            raise RetrievalError("search() after close().")
        results: list[list[Passage]] = []
        for start in range(0, len(queries), self.batch_size):
            results.extend(self._search_batch(queries[start:start + self.batch_size], k))
        return results

    def _search_batch(self, queries: list[str], k: int) -> list[list[Passage]]:
        body = json.dumps({"queries": queries, "topk": k, "return_scores": True}).encode("utf-8")
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(self.backoff_s * 2 ** (attempt - 1), 30.0))
            try:
                payload = self._post(body)
            except _Transient as err:
                last = err.__cause__ or err
                continue
            return self._parse(payload, queries, k)
        raise RetrievalError(
            f"Retrieval server {self.url} failed {self.retries + 1} time(s); last error: {type(last).__name__}: {last}"
        ) from last

    def _post(self, body: bytes) -> Any:
        request = urllib.request.Request(self.url, data=body, method="POST",
                                         headers={"Content-Type": "application/json", "Accept": "application/json"})
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                declared = response.headers.get("Content-Length")
                if declared and declared.isdigit() and int(declared) > self.max_response_bytes:
                    raise RetrievalError(
                        f"Retrieval server {self.url} sent {int(declared):,} bytes, over the {self.max_response_bytes:,}-byte limit."
                    )
                data = response.read(self.max_response_bytes + 1)
        except urllib.error.HTTPError as err:
            if err.code >= 500 or err.code in (408, 429):
                raise _Transient() from err
            detail = err.read(2000).decode("utf-8", "replace") if err.fp else ""
            raise RetrievalError(f"Retrieval server {self.url} answered HTTP {err.code} {err.reason}: {detail}") from err
        except (urllib.error.URLError, OSError, http.client.HTTPException) as err:  # refused, reset, timed out, truncated
            raise _Transient() from err
        if len(data) > self.max_response_bytes:
            raise RetrievalError(f"Retrieval server {self.url} sent more than the {self.max_response_bytes:,}-byte limit.")
        try:
            return json.loads(data)
        except ValueError as err:  # not JSON (or not UTF-8): a proxy's error page, a crashed worker
            raise _Transient() from err

    def _parse(self, payload: Any, queries: list[str], k: int) -> list[list[Passage]]:
        result = payload.get("result") if isinstance(payload, dict) else None
        if not isinstance(result, list) or len(result) != len(queries):
            raise RetrievalError(
                f"Retrieval server {self.url} answered {str(payload)[:200]!r}; expected {{'result': [...]}} with one "
                f"list per query ({len(queries)})."
            )
        if not all(isinstance(hits, list) for hits in result):
            raise RetrievalError(f"Retrieval server {self.url} answered a result that is not a list of lists: {str(result)[:200]!r}")
        return [[self._passage(item) for item in hits[:k]] for hits in result]

    def _passage(self, item: Any) -> Passage:
        # with return_scores the item is {"document": {...}, "score": s}; without, the document itself
        doc, score = (item.get("document"), item.get("score", 0.0)) if isinstance(item, dict) and "document" in item else (item, 0.0)
        if not isinstance(doc, dict):
            raise RetrievalError(f"Retrieval server {self.url} sent a passage that is not an object: {str(item)[:200]!r}")
        if isinstance(doc.get("contents"), str):
            title, text = split_title(doc["contents"])
            title = doc["title"] if isinstance(doc.get("title"), str) else title
        elif isinstance(doc.get("text"), str):
            title, text = str(doc.get("title", "")), doc["text"]
        else:
            raise RetrievalError(f"Retrieval server {self.url} sent a passage without 'contents': {str(doc)[:200]!r}")
        try:
            score = float(score)
        except (TypeError, ValueError):
            score = 0.0
        return Passage(str(doc.get("id", "")), title, text, score)

    def close(self) -> None:
        self._opener = None


class _Transient(Exception):
    """A failure worth retrying; its cause is the real error."""


# ---------------------------------------------------------------------------------------------


def make_retriever(name: str, *, corpus: str | os.PathLike | None = None, url: str | None = None, **options: Any) -> Retriever:
    """Build a backend by name: ``bm25s`` and ``pyserini`` need ``corpus``; ``http`` needs ``url``."""
    if name not in RETRIEVERS:
        raise ConfigError(f"Unknown retriever {name!r}; expected one of {list(RETRIEVERS)}.{did_you_mean(str(name), RETRIEVERS)}")
    if name == "http":
        if not url:
            raise ConfigError("retriever='http' needs retriever_url, e.g. 'http://127.0.0.1:8000'.")
        return HttpRetriever(url, **options)
    if url:
        raise ConfigError(f"retriever_url is only used with retriever='http', not {name!r}.")
    if corpus is None:
        raise ConfigError(f"retriever={name!r} needs a corpus file.")
    if name == "bm25s":
        try:
            return BM25sRetriever(corpus, **options)
        except ImportError as err:
            raise MissingDependencyError("The bm25s retriever needs bm25s: pip install 'agentkit[search]'") from err
    return PyseriniRetriever(corpus, **options)
