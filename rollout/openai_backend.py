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
other backends). Retries with exponential backoff and the timeout come from the ``openai``
client; at most ``concurrency`` requests are in flight. The API key is read only from the
environment variable ``api_key_env`` (never from a config file or the command line).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agentkit.rollout.backend import Generation, SamplingParams, row_seeds

from agentkit.core.errors import ConfigError, ModelError

_TOKEN_ID = re.compile(r"^token_id:(\d+)$")
_CHATML = re.compile(r"<\|im_start\|>(system|user|assistant|tool)\n(.*?)<\|im_end\|>", re.DOTALL)


def decode_chatml(tokenizer: Any, ids: Sequence[int]) -> list[dict[str, str]]:
    """The messages of a ChatML prompt that ends with an open assistant turn."""
    text = tokenizer.decode(list(ids), skip_special_tokens=False)
    messages = [{"role": role, "content": content} for role, content in _CHATML.findall(text)]
    if not messages or not text.rstrip().endswith("<|im_start|>assistant"):
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


class OpenAIBackend:
    """Sampling through an OpenAI-compatible HTTP server.

    Args:
        base_url: the server's API root, e.g. ``http://127.0.0.1:8000/v1``.
        tokenizer: the served model's tokenizer (local folder or loaded); it formats prompts and
            must give the same ids as the server's (checked against vLLM's ``/tokenize``).
        model: the served model name (default: the first of ``GET /models``).
        api: "completions" (token-id prompts, exact) or "chat".
        api_key_env: environment variable holding the API key (unset: a placeholder key).
        timeout_s: per-request timeout.
        max_retries: retries on connection errors, 408/409/429 and 5xx, with exponential backoff.
        concurrency: requests in flight at once.
        max_context: prompt + response tokens the server accepts (default: the tokenizer's
            ``model_max_length`` capped at 32768).
    """

    def __init__(self, base_url: str, tokenizer: Any, *, model: str | None = None, api: str = "completions",
                 api_key_env: str = "OPENAI_API_KEY", timeout_s: float = 120.0, max_retries: int = 4,
                 concurrency: int = 16, max_context: int | None = None, name: str | None = None) -> None:
        try:
            import openai
        except ImportError as err:
            raise ConfigError("The OpenAI-compatible backend needs the openai package: pip install 'agentkit[openai]'") from err
        if api not in ("completions", "chat"):
            raise ConfigError(f"api must be 'completions' or 'chat', got {api!r}.")
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"--base-url {base_url!r}: give an http(s) URL such as http://127.0.0.1:8000/v1")
        if isinstance(tokenizer, (str, os.PathLike)):
            from agentkit.rollout.hf_backend import load_tokenizer

            tokenizer = load_tokenizer(tokenizer)
        self.tokenizer, self.api, self.base_url = tokenizer, api, base_url.rstrip("/")
        self.client = openai.OpenAI(base_url=self.base_url, api_key=os.environ.get(api_key_env) or "EMPTY",
                                    timeout=timeout_s, max_retries=max_retries)
        self._openai = openai
        self.model = model or self._first_model()
        self.name = name or f"openai:{self.base_url}#{self.model}"
        limit = int(getattr(tokenizer, "model_max_length", 32768) or 32768)
        self.max_context = max_context or min(limit, 32768)
        self.concurrency = concurrency
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="agentkit-openai")
        self._im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def _first_model(self) -> str:
        try:
            models = self.client.models.list().data
        except self._openai.APIError as err:
            raise ModelError(f"Could not list the models of {self.base_url}: {err}. Pass the served model's name.") from err
        if not models:
            raise ModelError(f"{self.base_url} serves no model.")
        return models[0].id

    def check_tokenizer(self, probe: str = "go north <action>take key</action>") -> bool | None:
        """Compare local token ids with the server's (vLLM ``POST /tokenize``); None when the server
        has no such route. Raises ModelError on a mismatch."""
        import httpx

        root = self.base_url.removesuffix("/v1")
        try:
            response = httpx.post(f"{root}/tokenize", json={"model": self.model, "prompt": probe,
                                                           "add_special_tokens": False}, timeout=30)
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        theirs = response.json().get("tokens")
        ours = self.tokenizer.encode(probe, add_special_tokens=False)
        if theirs != ours:
            raise ModelError(f"The server at {self.base_url} tokenizes differently from the local tokenizer "
                             f"({theirs[:8]} vs {ours[:8]}): point --model at the served model's folder.")
        return True

    # -- sampling -----------------------------------------------------------------------------
    def _body(self, params: SamplingParams) -> dict[str, Any]:
        extra: dict[str, Any] = {"return_token_ids": True, "include_stop_str_in_output": True,
                                 "skip_special_tokens": False}
        if params.top_k > 0:
            extra["top_k"] = params.top_k
        return extra

    def _complete(self, prompt: Sequence[int], params: SamplingParams, seed: int | None) -> Generation:
        kwargs = dict(model=self.model, max_tokens=params.max_new_tokens, temperature=params.temperature,
                      top_p=params.top_p, stop=list(params.stop) or None, seed=seed)
        if self.api == "completions":
            body = self._body(params) | {"return_tokens_as_token_ids": True}
            response = self.client.completions.create(prompt=list(prompt), logprobs=1, extra_body=body, **kwargs)
            choice = response.choices[0]
            ids = _extra(choice, "token_ids")
            lp = choice.logprobs
            tokens = list(lp.tokens or []) if lp is not None else []
            logprobs = list(lp.token_logprobs or []) if lp is not None else []
            if ids is None and tokens and all(_TOKEN_ID.match(t) for t in tokens):
                ids = [int(_TOKEN_ID.match(t).group(1)) for t in tokens]
            text = choice.text or ""
        else:
            messages = decode_chatml(self.tokenizer, prompt)
            response = self.client.chat.completions.create(messages=messages, logprobs=True,
                                                           extra_body=self._body(params), **kwargs)
            choice = response.choices[0]
            ids = _extra(choice, "token_ids")
            content = choice.logprobs.content if choice.logprobs is not None and choice.logprobs.content else []
            logprobs = [c.logprob for c in content]
            text = choice.message.content or ""
        exact = ids is not None
        if ids is None:  # the server gave text only: tokenize it here
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            if choice.finish_reason == "stop" and not any(text.endswith(s) for s in params.stop if s):
                ids.append(self._im_end)
        ids = [int(i) for i in ids]
        have_logprobs = len(logprobs) == len(ids) and all(x is not None for x in logprobs)
        if not have_logprobs:
            logprobs = [0.0] * len(ids)
        finish = "length" if choice.finish_reason == "length" else "stop"
        return Generation(ids, [float(x) for x in logprobs], finish,
                          extra={"exact_tokens": exact, "has_logprobs": have_logprobs})

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 seeds: Sequence[int] | None = None) -> list[Generation]:
        rows = row_seeds(prompts, params, seeds)
        futures = [self._pool.submit(self._complete, p, params, s) for p, s in zip(prompts, rows, strict=True)]
        return [f.result() for f in futures]

    # -- teacher scoring ------------------------------------------------------------------------
    def _prompt_logprobs(self, ids: Sequence[int], topk: int) -> list[dict[int, tuple[float, int]] | None]:
        response = self.client.completions.create(
            model=self.model, prompt=list(ids), max_tokens=1, temperature=0.0,
            extra_body={"prompt_logprobs": max(1, topk), "return_token_ids": True})
        rows = _extra(response.choices[0], "prompt_logprobs")
        if rows is None:
            raise ModelError(f"{self.base_url} returned no prompt_logprobs: teacher scoring needs a vLLM (or "
                             "compatible) server.")
        out: list[dict[int, tuple[float, int]] | None] = []
        for row in rows:
            if row is None:
                out.append(None)
                continue
            out.append({int(k): (float(v["logprob"]), int(v.get("rank") or 0)) for k, v in row.items()})
        return out

    def prompt_logprobs(self, sequences: Sequence[Sequence[int]], topk: int = 1
                        ) -> list[list[dict[int, tuple[float, int]] | None]]:
        """Per sequence and position j: {token id: (logprob, rank)} of the model's distribution
        over token j given tokens < j; it holds the actual token j and the top ``topk``."""
        futures = [self._pool.submit(self._prompt_logprobs, s, topk) for s in sequences]
        return [f.result() for f in futures]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()
