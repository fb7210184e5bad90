"""Generation from any OpenAI-compatible server (vLLM, SGLang, hosted APIs) over HTTP.

Two request styles:

- ``completions`` (default): the prompt goes as token ids (``prompt: [ids]``), so the server
  sees exactly what the collector built. With a vLLM or SGLang server the response carries the
  sampled token ids (vLLM: ``return_token_ids``; older servers: ``return_tokens_as_token_ids``)
  and their logprobs: the trajectory is token-exact, never re-tokenized.
- ``chat``: for servers that only speak chat (hosted APIs). The prompt ids are decoded back to
  messages (ChatML templates: Qwen and our tiny models), and the answer's text is tokenized
  locally when the server does not return ids. Such turns are marked ``exact_tokens=False`` in
  the generation's ``extra``.

Logprobs are the server's: vLLM reports the model's raw logprobs unless started with
``--logprobs-mode processed_logprobs`` (then they are under the sampling distribution, like the
other backends). At most ``concurrency`` requests are in flight.

Faults. The ``openai`` client's own retries are off; this module retries instead, so that every
kind of server fault is handled the same way: refused or dropped connections, timeouts, HTTP
408/409/429/5xx (``Retry-After`` honoured, capped) and answers that are not JSON or lack the
fields we read are retried with exponential backoff and jitter; other HTTP errors (401, 404, 400
...) fail at once. When a request fails for good, :class:`BackendError` says which server, what
happened on the last attempt and what to try; the other requests of the same ``generate`` call
stop retrying, so nothing half-finished is returned. A server that refuses connections when the
backend is built fails at once (nothing is listening: no point in waiting).

Bounds. Each attempt ends after ``timeout_s`` even when the server drip-feeds bytes, and an answer
larger than ``max_response_bytes`` is refused (by ``Content-Length`` before reading, else while
reading). Answers are requested uncompressed and a compressed one is refused, so the limit holds
for the bytes that are parsed. Redirects are not followed (a key is never sent to another host).

Security. The API key is read only from the environment variable ``api_key_env`` (never from a
config file, a URL or the command line); URLs must be http(s), without user info or a query, so
the backend's ``name`` (written into every trajectory) cannot carry a secret; any text a server
sends back is scrubbed of the key before it appears in an error.
"""

from __future__ import annotations

import functools
import importlib
import math
import os
import random
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, TypeVar

from agentkit.rollout.backend import Generation, SamplingParams, generation_problem, row_seeds
from agentkit.rollout.context import encode_data

from agentkit.core.errors import AgentkitError, ConfigError, ModelError

_TOKEN_ID = re.compile(r"^token_id:(\d+)$")
_ROLES = ("system", "user", "assistant", "tool")

DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024 * 1024  # teacher prompt_logprobs of a 32k-token sequence at top-20 fit
MAX_BACKOFF_S = 8.0
MAX_CHARS_PER_TOKEN = 64  # a text-only answer longer than this per asked token is not an answer to the request
MAX_RETRY_AFTER_S = 60.0
_T = TypeVar("_T")


class BackendError(AgentkitError):
    """The generation server failed for good: unreachable, too slow, or it answered with an error,
    a malformed or an oversized body."""


def _without_secrets(url: str) -> str:
    """``url`` less any user info, query and fragment: what an error message may repeat."""
    return re.sub(r"[?#].*$", "", re.sub(r"//[^/?#]*@", "//", url))


def check_http_url(url: Any, what: str = "the server URL") -> str:
    """``url`` stripped, or ConfigError unless it is an http(s) URL with a host and no user info,
    query or fragment (``what`` names the setting in the message). Messages never repeat the
    parts of a URL that may hold a secret."""
    example = "http://127.0.0.1:8000/v1"
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(f"{what} must be an http(s) URL such as {example}, got {url!r}.")
    url = url.strip()
    shown = _without_secrets(url)
    try:
        parts = urllib.parse.urlsplit(url)
        host, _ = parts.hostname, parts.port  # .port raises on a bad port number
    except ValueError as err:
        raise ConfigError(f"{what} {shown!r} is not a valid URL ({err}); give one such as {example}.") from err
    if parts.scheme not in ("http", "https") or not host:
        raise ConfigError(f"{what} {shown!r} is not an http:// or https:// URL with a host (file://, ftp://, bare "
                          f"paths and other schemes are refused); give one such as {example}.")
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        raise ConfigError(f"{what} {shown!r} (as given, with user info, a query or a fragment: not shown) must be the "
                          f"API root only, such as {example}. An API key goes in the environment ($OPENAI_API_KEY), "
                          "never in a URL.")
    if any(ch.isspace() or not ch.isprintable() for ch in url):
        raise ConfigError(f"{what} {shown!r} contains spaces or control characters.")
    return url


# -- bounded HTTP ----------------------------------------------------------------------------------


class _ResponseRefused(Exception):
    """The answer was refused before parsing (too large, compressed); not worth retrying."""


def _http_library(openai: Any) -> Any:
    """The httpx-style package the installed openai client is built on (httpx for openai 1.x,
    httpx2 for later releases); the bounded client below must be an instance of its ``Client``."""
    for cls in openai.DefaultHttpxClient.__mro__:
        if cls.__name__ == "Client":
            return importlib.import_module(cls.__module__.split(".")[0])
    import httpx

    return httpx


@functools.cache
def _bounded_client_class(http: Any) -> type:
    """An ``http.Client`` whose every response is size- and time-bounded (see the module docstring)."""

    class BoundedStream(http.SyncByteStream):
        """A response body that stops at ``limit`` bytes or at ``deadline`` (time.monotonic())."""

        def __init__(self, inner: Any, request: Any, limit: int, deadline: float) -> None:
            self._inner, self._request, self._limit, self._deadline = inner, request, limit, deadline

        def __iter__(self):
            seen = 0
            for chunk in self._inner:
                seen += len(chunk)
                if seen > self._limit:
                    raise _ResponseRefused(f"the answer exceeded max_response_bytes={self._limit:,}")
                if time.monotonic() > self._deadline:
                    raise http.ReadTimeout("the answer took longer than the timeout to arrive", request=self._request)
                yield chunk

        def close(self) -> None:
            self._inner.close()

    class BoundedClient(http.Client):
        def __init__(self, *, max_response_bytes: int, timeout_s: float) -> None:
            super().__init__(timeout=timeout_s, follow_redirects=False, headers={"Accept-Encoding": "identity"},
                             limits=http.Limits(max_connections=1000, max_keepalive_connections=100))
            self.max_response_bytes, self.timeout_s = max_response_bytes, timeout_s

        def send(self, request: Any, *, stream: bool = False, **kwargs: Any) -> Any:
            deadline = time.monotonic() + self.timeout_s
            response = super().send(request, stream=True, **kwargs)
            try:
                encoding = response.headers.get("content-encoding", "identity").strip().lower()
                if encoding not in ("", "identity"):
                    raise _ResponseRefused(f"the answer came compressed ({encoding}) although asked for identity, "
                                           "so its size cannot be bounded")
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > self.max_response_bytes:
                    raise _ResponseRefused(f"the answer declared {int(declared):,} bytes, over "
                                           f"max_response_bytes={self.max_response_bytes:,}")
                response.stream = BoundedStream(response.stream, request, self.max_response_bytes, deadline)
                if not stream:
                    response.read()
            except BaseException:
                response.close()
                raise
            return response

    return BoundedClient


def decode_chatml(tokenizer: Any, ids: Sequence[int]) -> list[dict[str, str]]:
    """The messages of a ChatML prompt that ends with an open assistant turn.

    Messages are cut at the ``<|im_start|>`` and ``<|im_end|>`` token *ids*, never at their spelling in
    the decoded text, so a message whose text spells ``<|im_end|>`` (an observation can; the context
    builders encode it as plain characters) stays one message."""
    start, end = (tokenizer.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>"))
    ids = list(ids)
    messages: list[dict[str, str]] = []
    chatml = start is not None and end is not None and start != tokenizer.unk_token_id and ids[:1] == [start]
    at = 0
    while chatml and at < len(ids):
        close = ids.index(end, at) if end in ids[at:] else len(ids)
        role, newline, content = tokenizer.decode(ids[at + 1:close], skip_special_tokens=False).partition("\n")
        if ids[at] != start or not newline or role not in _ROLES or start in ids[at + 1:close]:
            chatml = False
            break
        if close == len(ids):  # the open assistant turn the model answers
            chatml = role == "assistant" and not content.strip() and bool(messages)
            break
        messages.append({"role": role, "content": content})
        at = close + 1
        while at < len(ids) and ids[at] != start and not tokenizer.decode(ids[at:at + 1]).strip():
            at += 1  # the newline between messages
    else:
        chatml = False
    if not chatml:
        raise ConfigError(
            "api=chat rebuilds messages from the prompt and understands ChatML chat templates only "
            "(<|im_start|>role ... <|im_end|>, as Qwen models use). Use api=completions (token-id prompts; "
            "vLLM and SGLang servers support it) for other templates."
        )
    return messages


def _extra(obj: Any, key: str) -> Any:
    """A non-standard field of an openai response object (vLLM adds several)."""
    value = getattr(obj, key, None)
    if value is None and getattr(obj, "model_extra", None):
        value = obj.model_extra.get(key)
    return value


class _Malformed(Exception):
    """The server answered 2xx with a body we cannot use (not JSON, or without the fields we read)."""


class _Failure:
    """What went wrong on one attempt: ``retry`` whether another attempt may pass, ``what`` for the
    message, ``hint`` what to try, ``delay`` a server-requested wait (Retry-After)."""

    def __init__(self, what: str, hint: str, *, retry: bool, refused: bool = False, delay: float | None = None):
        self.what, self.hint, self.retry, self.refused, self.delay = what, hint, retry, refused, delay


def _in_chain(err: BaseException, kind: type[BaseException] | tuple[type[BaseException], ...]) -> BaseException | None:
    seen: set[int] = set()
    cur: BaseException | None = err
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, kind):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def _retry_after(response: Any) -> float | None:
    headers = getattr(response, "headers", None) or {}
    for key, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        try:
            return min(max(float(headers.get(key)) * scale, 0.0), MAX_RETRY_AFTER_S)
        except (TypeError, ValueError):
            continue
    return None


class OpenAIBackend:
    """Sampling through an OpenAI-compatible HTTP server.

    Args:
        base_url: the server's API root, e.g. ``http://127.0.0.1:8000/v1`` (http or https only).
        tokenizer: the served model's tokenizer (local folder or loaded); it formats prompts and
            must give the same ids as the server's (checked against vLLM's ``/tokenize``).
        model: the served model name (default: the first of ``GET /models``).
        api: "completions" (token-id prompts, exact) or "chat".
        api_key_env: environment variable holding the API key (unset: a placeholder key).
        timeout_s: the longest one attempt of one request may take.
        max_retries: further attempts after a failure that may pass (connection errors, timeouts,
            408/409/429/5xx, malformed answers), with exponential backoff from ``backoff_s``.
        backoff_s: the first wait between attempts (doubled each time, at most 8 s, with jitter).
        concurrency: requests in flight at once.
        max_context: prompt + response tokens the server accepts (default: the tokenizer's
            ``model_max_length`` capped at 32768).
        max_response_bytes: larger answers are refused.
    """

    syncs_weights = False  # a remote server's weights are not ours to change
    can_sleep = False
    prefix_caching = False  # the server's cache, if it has one, is not ours to know

    def __init__(self, base_url: str, tokenizer: Any, *, model: str | None = None, api: str = "completions",
                 api_key_env: str = "OPENAI_API_KEY", timeout_s: float = 120.0, max_retries: int = 4,
                 backoff_s: float = 0.5, concurrency: int = 16, max_context: int | None = None,
                 name: str | None = None, max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES) -> None:
        try:
            import openai
        except ImportError as err:
            raise ConfigError("The OpenAI-compatible backend needs the openai package: pip install 'agentkit[openai]'") from err
        if api not in ("completions", "chat"):
            raise ConfigError(f"api must be 'completions' or 'chat', got {api!r}.")
        base_url = check_http_url(base_url, "--base-url")
        if not timeout_s > 0 or max_retries < 0 or backoff_s < 0 or concurrency <= 0 or max_response_bytes <= 0:
            raise ConfigError(f"OpenAIBackend: timeout_s ({timeout_s}), concurrency ({concurrency}) and max_response_bytes "
                              f"({max_response_bytes}) must be positive; max_retries ({max_retries}) and backoff_s "
                              f"({backoff_s}) non-negative.")
        if isinstance(tokenizer, (str, os.PathLike)):
            from agentkit.rollout.hf_backend import load_tokenizer

            tokenizer = load_tokenizer(tokenizer)
        self.tokenizer, self.api, self.base_url = tokenizer, api, base_url.rstrip("/")
        self.api_key_env = api_key_env
        self.timeout_s, self.max_retries, self.backoff_s = float(timeout_s), int(max_retries), float(backoff_s)
        self.max_response_bytes = int(max_response_bytes)
        self._key = os.environ.get(api_key_env) or ""
        self._httplib = _http_library(openai)
        self._http = _bounded_client_class(self._httplib)(max_response_bytes=self.max_response_bytes,
                                                          timeout_s=self.timeout_s)
        # retries are ours (see the module docstring), so the client makes one attempt per call
        self.client = openai.OpenAI(base_url=self.base_url, api_key=self._key or "EMPTY", timeout=timeout_s,
                                    max_retries=0, http_client=self._http)
        self._openai = openai
        self._closed = threading.Event()
        self.model = self._check_server(model)
        self.name = name or f"openai:{self.base_url}#{self.model}"
        limit = int(getattr(tokenizer, "model_max_length", 32768) or 32768)
        self.max_context = max_context or min(limit, 32768)
        self.concurrency = concurrency
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="agentkit-openai")
        self._im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self._vocab_size = len(tokenizer)

    # -- faults -------------------------------------------------------------------------------
    def _scrub(self, text: str) -> str:
        """Server text with the API key (should a server echo it) blanked out, cut to 300 characters."""
        text = str(text)
        if self._key:
            text = text.replace(self._key, "***")
        return text if len(text) <= 300 else text[:300] + "..."

    def _classify(self, err: Exception) -> _Failure | None:
        """What ``err`` means for this request; None for errors that are not the server's doing."""
        openai = self._openai
        refused = _in_chain(err, _ResponseRefused)
        if refused is not None:
            return _Failure(str(refused), "If such answers are expected (long prompt_logprobs), raise max_response_bytes; "
                            "otherwise check that the URL points at the intended server.", retry=False)
        if isinstance(err, openai.APITimeoutError) or _in_chain(err, self._httplib.TimeoutException):
            return _Failure(f"no complete answer within timeout_s={self.timeout_s:g} s",
                            "The server may be overloaded or hung: check its log, lower the concurrency, or raise "
                            "the timeout.", retry=True)
        if isinstance(err, openai.APIConnectionError):
            cause = err.__cause__ or err
            refused_connection = _in_chain(err, self._httplib.ConnectError) is not None
            what = (f"could not connect ({type(cause).__name__}: {self._scrub(cause)})" if refused_connection
                    else f"the connection failed mid-request ({type(cause).__name__}: {self._scrub(cause)})")
            hint = ("Is the server running and listening at this address? Start it (e.g. `vllm serve MODEL --port "
                    "8000`) or fix the URL." if refused_connection else
                    "The server dropped the connection or sent an incomplete answer: check its log (it may have "
                    "crashed or run out of memory).")
            return _Failure(what, hint, retry=True, refused=refused_connection)
        if isinstance(err, openai.APIStatusError):
            status = err.status_code
            body = self._scrub(re.sub(r"^Error code: \d+ - ", "", str(err.message)))  # the client's prefix
            what = f"HTTP {status}: {body}"
            if status in (401, 403):
                state = "is set" if self._key else "is not set"
                return _Failure(what, f"The server wants a valid API key: it is read from ${self.api_key_env} only "
                                f"(which {state}). Export the right key there.", retry=False)
            if status == 404:
                served = f" and that the server serves a model named {self.model!r}" if hasattr(self, "model") else ""
                return _Failure(what, f"Check that the URL is the API root (it usually ends in /v1){served}.",
                                retry=False)
            if 300 <= status < 400:
                return _Failure(what, f"The server redirects (to {err.response.headers.get('location')!r}); redirects "
                                "are not followed: give the final URL.", retry=False)
            if status == 429:
                return _Failure(what, "The server is rate-limiting: lower the concurrency or wait.", retry=True,
                                delay=_retry_after(err.response))
            if status in (408, 409) or status >= 500:
                return _Failure(what, "The server failed: check its log.", retry=True, delay=_retry_after(err.response))
            return _Failure(what, "The server refused the request: the prompt may be longer than the served "
                            "model's context, or a sampling setting unsupported.", retry=False)
        if isinstance(err, _Malformed):
            return _Failure(f"a malformed answer ({err})", "Check that the URL is the API root of an OpenAI-compatible "
                            "server (vLLM, SGLang), not a proxy's error page or another service.", retry=True)
        if isinstance(err, ValueError):  # the openai client's JSON decoding of a broken body
            return _Failure(f"an answer that is not valid JSON ({type(err).__name__}: {self._scrub(err)})",
                            "Check that the URL is the API root of an OpenAI-compatible server (vLLM, SGLang); "
                            "a truncated answer means the server or a proxy cut it off.", retry=True)
        return None

    def _call(self, what: str, attempt_once: Callable[[], _T], *, abort: threading.Event | None = None,
              retry_refused: bool = True) -> _T:
        """``attempt_once()`` with retries and backoff; BackendError when it fails for good (or when
        ``abort`` is set by a sibling request that already did)."""
        started = time.monotonic()
        attempts = self.max_retries + 1
        for attempt in range(1, attempts + 1):
            try:
                return attempt_once()
            except AgentkitError:
                raise
            except Exception as err:  # noqa: BLE001 - sorted by _classify; anything else is re-raised
                failure = self._classify(err)
                if failure is None:
                    raise
                stop = (not failure.retry or attempt == attempts or (failure.refused and not retry_refused)
                        or self._closed.is_set() or (abort is not None and abort.is_set()))
                if not stop:
                    delay = min(self.backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S) * (1 - 0.25 * random.random())
                    delay = max(delay, failure.delay or 0.0)
                    interrupted = (abort or self._closed).wait(delay)
                    if not interrupted and not self._closed.is_set():
                        continue
                raise BackendError(
                    f"{what} at {self.base_url} failed after {attempt} attempt(s) in {time.monotonic() - started:.1f} s: "
                    f"{failure.what}. {failure.hint}"
                ) from err
        raise AssertionError("unreachable")

    def _check_server(self, model: str | None) -> str:
        """Contact the server once (``GET /models``) so that a wrong URL, a missing key or a server
        that is not running fails here, before any work; the served model's name."""
        def list_models() -> list[str]:
            try:
                page = self.client.models.list()
                data = page.data
                if not isinstance(data, list):
                    raise TypeError("'data' is not a list")
                return [str(m.id) for m in data]
            except (AttributeError, TypeError, KeyError) as err:  # an HTML page, a list of strings, ...
                raise _Malformed(f"GET /models answered something else than {{'data': [{{'id': ...}}]}} "
                                 f"({type(err).__name__}: {self._scrub(err)})") from err

        try:
            names = self._call("Listing the models", list_models, retry_refused=False)
        except BackendError as err:
            if model is not None and isinstance(err.__cause__, self._openai.NotFoundError):
                return model  # a server without /models: the given name is used as is
            raise
        if model is not None:
            return model
        if not names:
            raise ModelError(f"{self.base_url} serves no model; start the server with a model.")
        return names[0]

    def check_tokenizer(self, probe: str = "go north <action>take key</action>") -> bool | None:
        """Compare local token ids with the server's (vLLM ``POST /tokenize``); None when the server
        has no such route. Raises ModelError on a mismatch."""
        root = self.base_url.removesuffix("/v1")
        headers = {"Authorization": f"Bearer {self._key}"} if self._key else {}
        try:
            response = self._http.post(f"{root}/tokenize", json={"model": self.model, "prompt": probe,
                                                                 "add_special_tokens": False}, headers=headers)
            theirs = response.json().get("tokens") if response.status_code == 200 else None
        except (self._httplib.HTTPError, _ResponseRefused, ValueError, AttributeError):
            return None
        if theirs is None:
            return None
        ours = self.tokenizer.encode(probe, add_special_tokens=False)
        if theirs != ours:
            raise ModelError(f"The server at {self.base_url} tokenizes differently from the local tokenizer "
                             f"({str(theirs)[:60]} vs {ours[:8]}): point --model at the served model's folder.")
        return True

    # -- sampling -----------------------------------------------------------------------------
    def _body(self, params: SamplingParams) -> dict[str, Any]:
        extra: dict[str, Any] = {"return_token_ids": True, "include_stop_str_in_output": True,
                                 "skip_special_tokens": False}
        if params.top_k > 0:
            extra["top_k"] = params.top_k
        return extra

    def _complete_once(self, prompt: Sequence[int], params: SamplingParams, seed: int | None) -> Generation:
        kwargs = dict(model=self.model, max_tokens=params.max_new_tokens, temperature=params.temperature,
                      top_p=params.top_p, stop=list(params.stop_strings) or None, seed=seed)
        if self.api == "completions":
            body = self._body(params) | {"return_tokens_as_token_ids": True}
            response = self.client.completions.create(prompt=list(prompt), logprobs=1, extra_body=body, **kwargs)
        else:
            messages = decode_chatml(self.tokenizer, prompt)
            response = self.client.chat.completions.create(messages=messages, logprobs=True,
                                                           extra_body=self._body(params), **kwargs)
        try:
            return self._generation(response, params)
        except (AttributeError, TypeError, KeyError, IndexError, ValueError) as err:
            raise _Malformed(f"{type(err).__name__}: {self._scrub(err)}; the answer began "
                             f"{self._scrub(str(response)[:200])!r}") from err

    def _generation(self, response: Any, params: SamplingParams) -> Generation:
        if isinstance(response, str):  # the client hands back the text of a non-JSON answer
            raise ValueError("the answer is not JSON")
        choice = response.choices[0]
        if self.api == "completions":
            ids = _extra(choice, "token_ids")
            lp = choice.logprobs
            tokens = list(lp.tokens or []) if lp is not None else []
            logprobs = list(lp.token_logprobs or []) if lp is not None else []
            if ids is None and tokens and all(_TOKEN_ID.match(t) for t in tokens):
                ids = [int(_TOKEN_ID.match(t).group(1)) for t in tokens]
            text = choice.text or ""
        else:
            ids = _extra(choice, "token_ids")
            content = choice.logprobs.content if choice.logprobs is not None and choice.logprobs.content else []
            logprobs = [c.logprob for c in content]
            text = choice.message.content or ""
        if not isinstance(text, str):
            raise TypeError(f"the answer's text is a {type(text).__name__}")
        exact = ids is not None
        if ids is None and len(text) > MAX_CHARS_PER_TOKEN * params.max_new_tokens:
            raise ValueError(f"{len(text):,} characters of text for at most {params.max_new_tokens} tokens")
        if ids is None:  # the server gave text only: tokenize it here, as data (markup it spells stays text)
            ids = encode_data(self.tokenizer, text)
            if choice.finish_reason == "stop" and not any(text.endswith(s) for s in params.stop_strings):
                ids.append(self._im_end)
            ids = ids[:params.max_new_tokens]  # tokenized here, it may come out a little longer than sampled
        ids = [int(i) for i in ids]
        have_logprobs = len(logprobs) == len(ids) and all(x is not None for x in logprobs)
        logprobs = [float(x) for x in logprobs] if have_logprobs else [0.0] * len(ids)
        finish = "length" if choice.finish_reason == "length" else "stop"
        generation = Generation(ids, logprobs, finish, extra={"exact_tokens": exact, "has_logprobs": have_logprobs})
        problem = generation_problem(generation, params, self._vocab_size)
        if problem is not None:
            raise ValueError(problem)
        return generation

    def _complete(self, prompt: Sequence[int], params: SamplingParams, seed: int | None,
                  abort: threading.Event | None = None) -> Generation:
        return self._call("A completion request", lambda: self._complete_once(prompt, params, seed), abort=abort)

    def _gather(self, calls: list[Callable[[threading.Event], _T]]) -> list[_T]:
        """Run ``calls`` on the pool; on the first failure the others stop retrying and it is raised."""
        if self._closed.is_set():
            raise BackendError(f"The backend for {self.base_url} is closed.")
        abort = threading.Event()
        futures = [self._pool.submit(call, abort) for call in calls]
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((f for f in futures if f in done and f.exception() is not None), None)
        if failed is not None:
            abort.set()
            for future in pending:
                future.cancel()
            wait(pending)  # in-flight attempts end within timeout_s; nothing keeps running behind our back
            raise failed.exception()
        return [f.result() for f in futures]

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 seeds: Sequence[int] | None = None) -> list[Generation]:
        """One generation per prompt; BackendError (and no generations) when any request fails for good."""
        rows = row_seeds(prompts, params, seeds)
        return self._gather([lambda abort, p=p, s=s: self._complete(p, params, s, abort)
                             for p, s in zip(prompts, rows, strict=True)])

    # -- teacher scoring ------------------------------------------------------------------------
    def _prompt_logprobs_once(self, ids: Sequence[int], topk: int) -> list[dict[int, tuple[float, int]] | None]:
        response = self.client.completions.create(
            model=self.model, prompt=list(ids), max_tokens=1, temperature=0.0,
            extra_body={"prompt_logprobs": max(1, topk), "return_token_ids": True})
        if isinstance(response, str):
            raise _Malformed("the answer is not JSON")
        try:
            rows = _extra(response.choices[0], "prompt_logprobs")
        except (AttributeError, TypeError, IndexError) as err:
            raise _Malformed(f"no choices in {self._scrub(str(response)[:200])!r}") from err
        if rows is None:
            raise ModelError(f"{self.base_url} returned no prompt_logprobs: teacher scoring needs a vLLM (or "
                             "compatible) server.")
        out: list[dict[int, tuple[float, int]] | None] = []
        try:
            for row in rows:
                if row is None:
                    out.append(None)
                    continue
                entry = {int(k): (float(v["logprob"]), int(v.get("rank") or 0)) for k, v in row.items()}
                if not all(0 <= k < self._vocab_size and math.isfinite(lp) and lp <= 1e-6 for k, (lp, _) in entry.items()):
                    raise ValueError(f"a row {self._scrub(str(row)[:120])} holds a token id outside the vocabulary "
                                     "or a logprob that is not a finite number <= 0")
                out.append(entry)
        except (AttributeError, TypeError, KeyError, ValueError) as err:
            raise _Malformed(f"prompt_logprobs rows are not {{token id: {{logprob, rank}}}} ({type(err).__name__}: "
                             f"{self._scrub(err)})") from err
        if len(out) != len(ids):
            raise _Malformed(f"{len(out)} prompt_logprobs rows for a {len(ids)}-token prompt")
        return out

    def prompt_logprobs(self, sequences: Sequence[Sequence[int]], topk: int = 1
                        ) -> list[list[dict[int, tuple[float, int]] | None]]:
        """Per sequence and position j: {token id: (logprob, rank)} of the model's distribution
        over token j given tokens < j; it holds the actual token j and the top ``topk``."""
        return self._gather([
            lambda abort, s=s: self._call("A prompt_logprobs request", lambda: self._prompt_logprobs_once(s, topk),
                                          abort=abort)
            for s in sequences])

    def sync_weights(self, module) -> None:
        raise ConfigError(f"{self.name}: a server's weights cannot be updated from here (syncs_weights is False); "
                          "train with the hf or vllm backend.")

    def reset_prefix_cache(self) -> None:
        pass  # the server's cache, if it has one, is not ours to reset

    def sleep(self, level: int = 1) -> None:
        pass  # the server's memory is not ours to free

    def wake_up(self, tags: list[str] | None = None) -> None:
        pass

    def close(self) -> None:
        self._closed.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()
