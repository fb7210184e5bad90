"""The OpenAI-compatible backend against a server that fails on purpose (tests/fault_server.py):
transient faults are retried with backoff, lasting ones end in a clear BackendError within a
bounded time, and a rollout that loses its server exits cleanly with only finished episodes written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from agentkit.rollout.backend import SamplingParams
from agentkit.rollout.openai_backend import BackendError, OpenAIBackend
from fault_server import FaultServer, closed_port_url

from agentkit.core.errors import ConfigError
from agentkit.core.jsonl import read_trajectories

pytest.importorskip("openai")

PARAMS = SamplingParams(max_new_tokens=3)
TIMEOUT_S = 0.5


@pytest.fixture
def server():
    with FaultServer(hang_s=5.0, huge_bytes=300_000) as srv:
        yield srv


def fast_backend(url: str, tokenizer_dir: Path, **kwargs) -> OpenAIBackend:
    options = dict(timeout_s=TIMEOUT_S, max_retries=2, backoff_s=0.05, max_response_bytes=100_000) | kwargs
    return OpenAIBackend(url, tokenizer_dir, **options)


# ---------------------------------------------------------------------------------------------
# one backend, one request


@pytest.mark.parametrize("fault", ["500", "503", "429", "hang", "drip", "malformed", "html", "wrong_shape",
                                   "truncated", "close"])
def test_transient_faults_are_retried_with_backoff_until_one_succeeds(server, tiny_model_dir, fault):
    backend = fast_backend(server.url, tiny_model_dir)
    server.plan([fault, fault], then="ok")
    started = time.monotonic()
    [generation] = backend.generate([[1, 2, 3]], PARAMS, seeds=[0])
    elapsed = time.monotonic() - started
    assert generation.token_ids == [40, 41, 42] and generation.logprobs == [-0.5] * 3
    assert generation.extra == {"exact_tokens": True, "has_logprobs": True}
    assert server.generation_requests() == 3  # two failures, then the answer
    assert elapsed >= 0.05 * 0.75 + 0.1 * 0.75, "the attempts were spaced by the backoff"
    backend.close()


@pytest.mark.parametrize(("fault", "message"), [
    ("503", r"failed after 3 attempt\(s\).*HTTP 503: .*injected HTTP 503.*check its log"),
    ("429", r"failed after 3 attempt\(s\).*HTTP 429.*rate-limiting"),
    ("hang", r"failed after 3 attempt\(s\).*no complete answer within timeout_s=0.5 s.*raise the timeout"),
    ("drip", r"failed after 3 attempt\(s\).*no complete answer within timeout_s=0.5 s"),
    ("malformed", r"failed after 3 attempt\(s\).*not valid JSON.*API root of an OpenAI-compatible server"),
    ("html", r"failed after 3 attempt\(s\).*malformed answer.*502 Bad Gateway"),
    ("truncated", r"failed after 3 attempt\(s\).*connection failed mid-request.*incomplete answer"),
    ("close", r"failed after 3 attempt\(s\).*connection failed mid-request"),
])
def test_lasting_faults_end_in_a_clear_error_within_a_bounded_time(server, tiny_model_dir, fault, message):
    backend = fast_backend(server.url, tiny_model_dir)
    server.plan([], then=fault)
    started = time.monotonic()
    with pytest.raises(BackendError, match=message) as caught:
        backend.generate([[1, 2, 3]], PARAMS)
    elapsed = time.monotonic() - started
    assert f"A completion request at {server.url} " in str(caught.value)
    assert server.generation_requests() == 3
    # three attempts of at most timeout_s each (a drip is cut at the deadline too) plus the backoff
    assert elapsed < 3 * TIMEOUT_S + 0.5 + 1.0
    backend.close()


@pytest.mark.parametrize("fault", ["huge", "huge_chunked"])
def test_oversized_answers_are_refused_at_once(server, tiny_model_dir, fault):
    backend = fast_backend(server.url, tiny_model_dir)
    server.plan([], then=fault)
    with pytest.raises(BackendError, match=r"after 1 attempt\(s\).*over max_response_bytes=100,000|"
                                           r"after 1 attempt\(s\).*exceeded max_response_bytes=100,000"):
        backend.generate([[1, 2, 3]], PARAMS)
    assert server.generation_requests() == 1
    generous = fast_backend(server.url, tiny_model_dir, max_response_bytes=1_000_000)
    server.plan(["ok"])
    assert generous.generate([[1, 2, 3]], PARAMS)[0].token_ids == [40, 41, 42]


def test_a_server_that_is_down_fails_fast_with_a_clear_error(tiny_model_dir):
    url = closed_port_url()
    started = time.monotonic()
    with pytest.raises(BackendError, match=r"Listing the models at .* failed after 1 attempt\(s\).*could not connect"
                                           r".*Is the server running"):
        OpenAIBackend(url, tiny_model_dir, model="tiny")  # default retries and timeout: still at once
    assert time.monotonic() - started < 2.0


def test_a_server_that_goes_down_is_retried_then_a_clear_error(tiny_model_dir):
    with FaultServer() as srv:
        backend = fast_backend(srv.url, tiny_model_dir)
    # the server is gone now: a run in progress retries (it may be restarting), then gives up
    started = time.monotonic()
    with pytest.raises(BackendError, match=r"failed after 3 attempt\(s\).*could not connect"):
        backend.generate([[1, 2, 3]], PARAMS)
    assert time.monotonic() - started < 2.0


def test_client_errors_are_not_retried(tiny_model_dir, monkeypatch):
    monkeypatch.delenv("AGENTKIT_FAULT_KEY", raising=False)
    with FaultServer(api_key="right-key") as srv:
        with pytest.raises(BackendError, match=r"after 1 attempt\(s\).*HTTP 401.*\$AGENTKIT_FAULT_KEY only "
                                               r"\(which is not set\)"):
            fast_backend(srv.url, tiny_model_dir, api_key_env="AGENTKIT_FAULT_KEY")
        monkeypatch.setenv("AGENTKIT_FAULT_KEY", "right-key")
        backend = fast_backend(srv.url, tiny_model_dir, api_key_env="AGENTKIT_FAULT_KEY")
        assert backend.generate([[1, 2]], PARAMS)[0].token_ids == [40, 41, 42]
        assert srv.requests[-1][1]["authorization"] == "Bearer right-key"
        root = srv.url.removesuffix("/v1")
        with pytest.raises(BackendError, match=r"after 1 attempt\(s\).*HTTP 404.*ends in /v1"):
            fast_backend(root, tiny_model_dir, api_key_env="AGENTKIT_FAULT_KEY")


def test_one_failed_request_stops_the_others(server, tiny_model_dir):
    """When one request of a batch fails for good, generate raises and no request of that batch
    goes on retrying behind the caller's back."""
    backend = fast_backend(server.url, tiny_model_dir, max_retries=6, backoff_s=0.5, concurrency=4)
    server.plan(["503", "503", "503", "huge"], then="503")  # one request fails for good at once
    started = time.monotonic()
    with pytest.raises(BackendError, match="max_response_bytes"):
        backend.generate([[1], [2], [3], [4]], PARAMS)
    assert time.monotonic() - started < 2.0, "the others stopped waiting out their backoff"
    seen = server.generation_requests()
    time.sleep(1.0)
    assert server.generation_requests() == seen
    backend.close()
    with pytest.raises(BackendError, match="closed"):
        backend.generate([[1]], PARAMS)


def test_teacher_scoring_is_retried_and_checked(server, tiny_model_dir):
    backend = fast_backend(server.url, tiny_model_dir)
    server.plan(["503", "truncated"], then="ok")
    rows = backend.prompt_logprobs([[5, 6, 7]], topk=1)
    assert rows == [[None, {6: (-1.0, 1)}, {7: (-1.0, 1)}]]
    server.plan([], then="wrong_shape")
    with pytest.raises(BackendError, match="A prompt_logprobs request .* malformed answer"):
        backend.prompt_logprobs([[5, 6, 7]], topk=1)


# ---------------------------------------------------------------------------------------------
# URLs


BAD_URLS = ["file:///etc/passwd", "ftp://example.org/v1", "/tmp/socket", "javascript:alert(1)", "localhost:8000",
            "http://", "http://user:secret@127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1?api_key=sk-1",
            "http://127.0.0.1:99999/v1", "http://[::1/v1", "", " "]


@pytest.mark.parametrize("url", BAD_URLS)
def test_only_http_urls_reach_the_backend_teacher_and_judge(url):
    from agentkit.teachers import make_judge, make_teacher

    with pytest.raises(ConfigError, match="URL"):
        OpenAIBackend(url, tokenizer=None)  # refused before the tokenizer or the network is touched
    with pytest.raises(ConfigError, match="URL"):
        make_teacher(f"openai:{url}", policy=None, tokenizer=None)
    with pytest.raises(ConfigError, match="URL"):
        make_judge(f"openai:{url}", tokenizer=object())


@pytest.mark.parametrize("url", ["https://user:sk-secret@api.example.org/v1", "https://api.example.org/v1?key=sk-secret"])
def test_a_key_in_the_url_is_refused_and_never_echoed(url):
    with pytest.raises(ConfigError, match=r"environment \(\$OPENAI_API_KEY\), never in a URL") as caught:
        OpenAIBackend(url, tokenizer=None)
    assert "sk-secret" not in str(caught.value) and "https://api.example.org/v1" in str(caught.value)


def test_the_backend_name_written_into_trajectories_holds_only_the_url_and_model(server, tiny_model_dir):
    backend = fast_backend(server.url, tiny_model_dir)
    assert backend.name == f"openai:{server.url}#tiny"


# ---------------------------------------------------------------------------------------------
# a whole rollout against the faulting server


def _coin_reply(tiny_model_dir: Path):
    from agentkit.rollout.hf_backend import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    answer = tokenizer.encode("<action>take coin</action>", add_special_tokens=False)
    answer.append(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    return (lambda prompt, body: list(answer)), (lambda ids: tokenizer.decode(ids, skip_special_tokens=False))


def _rollout(url: str, model: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "agentkit.cli", "rollout", "--backend", "openai", "--base-url", url,
           "--model", str(model), "--env", "textworld/coin-v0", "--env-kwargs", "level=1", "--env-workers", "0",
           "--max-turns", "1", "--max-new-tokens", "16", "--quiet", "--out", str(out), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ))


@pytest.mark.textworld
@pytest.mark.slow  # 14-30 s here: keeps the default run under 15 minutes
def test_episodes_cut_by_a_failed_generate_are_not_handed_out(server, tiny_model_dir):
    """The collector hands out (to the writer) only episodes that ended; when generate raises, the
    episodes it was generating for are dropped, whatever turns they had."""
    pytest.importorskip("textworld")
    from agentkit.rollout.collector import Collector, EpisodeSpec
    from agentkit.rollout.run import env_factory

    backend = fast_backend(server.url, tiny_model_dir, max_retries=1)
    make_env = env_factory("textworld/coin-v0", split="train", max_turns=2, env_kwargs={"level": 1})
    collector = Collector(backend, make_env, env_id="textworld/coin-v0", sampling=SamplingParams(max_new_tokens=3),
                          max_in_flight=2)
    # episodes 0 and 1 play their two turns; 2 and 3 play one, then their second generate fails
    server.plan(["ok"] * 6, then="500")
    handed_out = []
    with pytest.raises(BackendError, match="HTTP 500"):
        collector.run([EpisodeSpec(seed=s) for s in range(4)], handed_out.append)
    collector.close()
    assert [t.seed for t in handed_out] == [0, 1]
    assert all(len(t.turns) == 2 and t.truncated and t.error is None for t in handed_out)


@pytest.mark.slow  # two CLI runs (about 15 s each on two cores) and the default backoff
@pytest.mark.textworld
def test_rollout_survives_transient_faults_and_stops_cleanly_when_the_server_is_gone(tiny_model_dir, tmp_path):
    pytest.importorskip("textworld")
    reply, decode = _coin_reply(tiny_model_dir)
    with FaultServer(reply=reply, decode=decode) as srv:
        # transient faults: every episode is played and written
        srv.plan(["503", "truncated"], then="ok")
        out = tmp_path / "ok.jsonl"
        result = _rollout(srv.url, tiny_model_dir, out, "--episodes", "2")
        assert result.returncode == 0, result.stderr[-3000:]
        trajectories = read_trajectories(out, strict=True)
        assert len(trajectories) == 2 and all(t.won and t.terminated and t.error is None for t in trajectories)
        assert all(t.model == f"openai:{srv.url}#tiny" for t in trajectories)

        # two episodes finish, then the server fails for good while two more are being played
        srv.plan(["ok", "ok"], then="500")
        out = tmp_path / "cut.jsonl"
        result = _rollout(srv.url, tiny_model_dir, out, "--episodes", "4", "--max-in-flight", "2")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert f"agentkit: error: A completion request at {srv.url} failed after 5 attempt(s)" in result.stderr
    assert "HTTP 500" in result.stderr and "check its log" in result.stderr
    lines = out.read_text().splitlines()
    assert len(lines) == 2, "only the episodes that finished before the failure are written"
    trajectories = read_trajectories(out, strict=True)
    assert sorted(t.seed for t in trajectories) == [0, 1]
    for trajectory, line in zip(trajectories, lines, strict=True):
        assert trajectory.won and trajectory.terminated and trajectory.error is None
        assert len(trajectory.turns) == 1 and trajectory.turns[0].response_ids
        assert json.loads(line)["id"] == trajectory.id
