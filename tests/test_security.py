"""Security properties of a run: the API key never leaves the environment, nothing is unpickled
from a user path, checkpoints hold only safetensors/JSON/YAML/tokenizer files, remote URLs are
http(s) only, and model text reaches the search backends as plain words."""

from __future__ import annotations

import ast
import importlib.util
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from fault_server import FaultServer

from agentkit.core.errors import ConfigError

PACKAGES = ("agentkit", "agentkit.envs", "agentkit.rollout", "agentkit.skillbank", "agentkit.teachers",
            "agentkit.objectives")


def _cli(*args: str, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentkit.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def _vault_server(tiny_model_dir: Path, api_key: str) -> FaultServer:
    """Always answers amber vaults' right exit."""
    from agentkit.rollout.hf_backend import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    answer = tokenizer.encode("<action>go anchor</action>", add_special_tokens=False)
    answer.append(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    return FaultServer(reply=lambda prompt, body: list(answer), api_key=api_key,
                       decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=False))


def _files_holding(marker: bytes, roots: list[Path]) -> tuple[list[Path], list[Path]]:
    """(every file under ``roots``, those whose bytes contain ``marker``)."""
    scanned, leaks = [], []
    for root in roots:
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            scanned.append(path)
            if marker in path.read_bytes():
                leaks.append(path)
    return scanned, leaks


# ---------------------------------------------------------------------------------------------
# the API key


@pytest.mark.slow  # a rollout and a training run through the CLI (about a minute on two cores)
def test_the_api_key_is_used_but_never_written(tiny_model_dir, tmp_path, agentkit_cache):
    pytest.importorskip("openai")
    marker = f"sk-agentkit-marker-{secrets.token_hex(16)}"
    env = dict(os.environ, OPENAI_API_KEY=marker)
    keyless = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    outputs: list[str] = []
    with _vault_server(tiny_model_dir, api_key=marker) as server:
        # a rollout against a server that wants the key
        rollout_dir = tmp_path / "rollout"
        result = _cli("rollout", "--backend", "openai", "--base-url", server.url, "--model", str(tiny_model_dir),
                      "--env", "vaults/vaults-v0", "--env-kwargs", "families=amber", "--env-workers", "0", "--episodes", "2",
                      "--max-turns", "2", "--max-new-tokens", "16", "--out", str(rollout_dir / "t.jsonl"), env=env)
        outputs += [result.stdout, result.stderr]
        assert result.returncode == 0, result.stderr[-3000:]
        # without the key the server refuses, and the error says where the key is read from
        refused = _cli("rollout", "--backend", "openai", "--base-url", server.url, "--model", str(tiny_model_dir),
                       "--env", "vaults/vaults-v0", "--out", str(rollout_dir / "refused.jsonl"), env=keyless)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr
        assert "HTTP 401" in refused.stderr and "$OPENAI_API_KEY only (which is not set)" in refused.stderr
        assert not (rollout_dir / "refused.jsonl").exists()

        # a training run whose teacher is the same server (prompt_logprobs with the key)
        run = tmp_path / "train"
        result = _cli("train", "--objective", "opd", "--teacher", f"openai:{server.url}#tiny", "--env",
                      "vaults/vaults-v0", "--model", str(tiny_model_dir), "--out", str(run), "--steps", "1",
                      "--group-size", "2", "--tasks-per-step", "1", "--quiet", "--set", "env.kwargs={families: amber}",
                      "--set", "env.max_turns=2", "--set", "eval.episodes=1", "--set", "eval.every=0",
                      "--set", "sampling.max_new_tokens=8", "--set", "checkpoint.every=1",
                      "--set", "objective.args.topk=5", env=env)  # a server's prompt_logprobs are its top-k only
        outputs += [result.stdout, result.stderr]
        assert result.returncode == 0, result.stderr[-3000:]
    # the key was in play: every request the server answered carried it
    scoring = [h for _, h, body in server.requests if isinstance(body, dict) and body.get("prompt_logprobs")]
    generation = [h for path, h, body in server.requests if path == "/v1/completions" and body
                  and not body.get("prompt_logprobs")]
    assert scoring and generation
    assert all(h.get("authorization") == f"Bearer {marker}" for h in scoring + generation)

    scanned, leaks = _files_holding(marker.encode(), [tmp_path, agentkit_cache])
    names = {p.name for p in scanned}
    assert {"t.jsonl", "config.yaml", "metrics.jsonl", "model.safetensors", "optimizer.safetensors"} <= names, names
    assert any(p.parent.name == "trajectories" for p in scanned)
    assert not leaks, f"the API key was written to {leaks}"
    assert not [i for i, text in enumerate(outputs) if marker in text], "the API key was printed"
    assert not _checkpoint_problems(run / "checkpoints")


def test_an_error_never_echoes_the_key(tiny_model_dir, monkeypatch):
    """Some servers repeat the key they were sent in their 401 message; the error blanks it out."""
    pytest.importorskip("openai")
    from agentkit.rollout.backend import SamplingParams
    from agentkit.rollout.openai_backend import BackendError, OpenAIBackend

    marker = f"sk-agentkit-marker-{secrets.token_hex(8)}"
    monkeypatch.setenv("AGENTKIT_SECURITY_KEY", marker)
    with FaultServer() as server:
        backend = OpenAIBackend(server.url, tiny_model_dir, api_key_env="AGENTKIT_SECURITY_KEY", max_retries=0)
        server.plan([], then="401_echo")
        with pytest.raises(BackendError, match=r"HTTP 401.*Incorrect API key provided: \*\*\*") as caught:
            backend.generate([[1, 2]], SamplingParams(max_new_tokens=2))
        assert server.requests[-1][1]["authorization"] == f"Bearer {marker}"  # it was sent, and echoed
    assert marker not in str(caught.value) and marker not in backend.name


# ---------------------------------------------------------------------------------------------
# no pickles


def _package_sources() -> list[Path]:
    files: list[Path] = []
    for package in PACKAGES:
        for root in importlib.util.find_spec(package).submodule_search_locations:
            files += [p for p in Path(root).rglob("*.py") if "__pycache__" not in p.parts]
    return sorted(set(files))


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _keyword_is(call: ast.Call, name: str, value: object) -> bool:
    return any(k.arg == name and isinstance(k.value, ast.Constant) and k.value.value is value for k in call.keywords)


UNPICKLERS = {"pickle.load", "pickle.loads", "pickle.Unpickler", "cPickle.load", "cPickle.loads", "dill.load",
              "dill.loads", "joblib.load", "cloudpickle.load", "cloudpickle.loads", "pd.read_pickle",
              "pandas.read_pickle", "shelve.open", "marshal.load", "marshal.loads"}


def _imported_names(tree: ast.AST) -> dict[str, str]:
    """What each name a file imports stands for: ``import pickle as pk`` gives ``pk`` -> ``pickle``,
    ``from torch import load`` gives ``load`` -> ``torch.load`` (whole file, scopes ignored)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update({alias.asname: alias.name for alias in node.names if alias.asname})
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.update({alias.asname or alias.name: f"{node.module}.{alias.name}" for alias in node.names})
    return names


def pickle_loads_in(path: Path) -> list[str]:
    """``file:line: call`` for every call in ``path`` that can unpickle: the pickle family,
    ``torch.load`` without ``weights_only=True``, ``numpy.load`` with ``allow_pickle=True``; under
    any name an import gave them (``import pickle as pk``, ``from torch import load``)."""
    found = []
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    imported = _imported_names(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        first, dot, rest = _dotted(node.func).partition(".")
        name = imported.get(first, first) + dot + rest
        head, last = name.split(".")[0], name.split(".")[-1]
        if name in UNPICKLERS or last in ("read_pickle", "Unpickler"):
            bad = True
        elif name in ("torch.load", "torch.serialization.load") or name.endswith(".torch.load"):
            bad = not _keyword_is(node, "weights_only", True)
        elif last == "load" and head in ("np", "numpy"):
            bad = any(k.arg == "allow_pickle" for k in node.keywords) and not _keyword_is(node, "allow_pickle", False)
        else:
            bad = False
        if bad:
            found.append(f"{path}:{node.lineno}: {ast.unparse(node)[:120]}")
    return found


def test_no_package_code_loads_pickles():
    sources = _package_sources()
    assert len(sources) > 50 and any(p.name == "checkpoint.py" for p in sources)
    found = [hit for path in sources for hit in pickle_loads_in(path)]
    assert not found, ("package code can unpickle (arbitrary code execution from a user file); load safetensors "
                       "or JSON instead, or pass torch.load(..., weights_only=True):\n" + "\n".join(found))


REPOSITORY = Path(__file__).resolve().parents[1]


def test_no_code_in_the_repository_loads_pickles():
    """Benchmarks, examples, scripts and tests too: a user runs them on files they did not write."""
    skip = {".git", "__pycache__", "build", ".venv", "venv", "node_modules", ".hypothesis", "artifacts", "runs"}
    sources = [p for p in REPOSITORY.rglob("*.py") if not skip & set(p.relative_to(REPOSITORY).parts)]
    assert any(p.parts[-2:] == ("benchmarks", "train_step.py") for p in sources)
    found = [hit for path in sources for hit in pickle_loads_in(path)]
    assert not found, "code in the repository can unpickle: use safetensors or JSON instead:\n" + "\n".join(found)


def test_the_train_step_benchmark_keeps_its_batch_in_safetensors(tmp_path):
    import torch
    from agentkit.objectives import TokenBatch

    spec = importlib.util.spec_from_file_location("bench_train_step", REPOSITORY / "benchmarks" / "train_step.py")
    bench = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = torch.arange(12, dtype=torch.float32).reshape(2, 6)
    batch = TokenBatch(input_ids=torch.arange(14).reshape(2, 7), attention_mask=torch.ones(2, 7, dtype=torch.long),
                       response_mask=rows > 3, old_logprobs=-rows / 10, advantages=rows - 5, weights=rows / 11,
                       episode_index=torch.tensor([0, 1]), turn_index=torch.zeros(2, 6, dtype=torch.long),
                       teacher_logprobs=-rows / 7, metrics={"skip_share": 0.25}, signals={"gate": rows.sigmoid()},
                       token_normalizer=8.0)
    path = tmp_path / "batch.safetensors"
    bench.save_batch(batch, path)
    assert not path.read_bytes()[:4].startswith(PICKLE_OR_ZIP)
    back = bench.load_batch(path)
    for name, value in vars(batch).items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(getattr(back, name), value), name
    assert back.ref_logprobs is None and back.metrics == {"skip_share": 0.25} and back.token_normalizer == 8.0
    assert torch.equal(back.signals["gate"], batch.signals["gate"])


def test_the_pickle_check_finds_what_it_looks_for(tmp_path):
    """The scanner itself: each unsafe form is reported with its line, the safe forms are not."""
    sample = tmp_path / "sample.py"
    sample.write_text("import pickle, torch, numpy as np\n"
                      "a = pickle.load(open('x', 'rb'))\n"
                      "b = torch.load('x')\n"
                      "c = torch.load('x', weights_only=True)\n"
                      "d = np.load('x', allow_pickle=True)\n"
                      "e = np.load('x')\n"
                      "f = pickle.loads(b'')\n"
                      "import pickle as pk, json\n"
                      "from pickle import loads as undo\n"
                      "from torch import load\n"
                      "g = pk.load(open('x', 'rb'))\n"
                      "h = undo(b'')\n"
                      "i = load('x')\n"
                      "j = load('x', weights_only=True)\n"
                      "k = json.load(open('x'))\n")
    assert [hit.split(":")[1] for hit in pickle_loads_in(sample)] == ["2", "3", "5", "7", "11", "12", "13"]


ALLOWED_SUFFIXES = {".safetensors", ".json", ".yaml", ".yml"}
ALLOWED_NAMES = {"COMPLETE", "merges.txt", "vocab.txt", "tokenizer.model", "chat_template.jinja"}
PICKLE_OR_ZIP = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05", b"PK\x03\x04")


def _checkpoint_problems(checkpoints: Path) -> list[str]:
    folders = [p for p in checkpoints.iterdir() if p.is_dir()]
    assert folders, f"no checkpoint under {checkpoints}"
    problems = []
    for path in (p for folder in folders for p in folder.rglob("*") if p.is_file()):
        if path.suffix not in ALLOWED_SUFFIXES and path.name not in ALLOWED_NAMES:
            problems.append(f"{path}: not a safetensors/JSON/YAML/tokenizer file")
        elif path.read_bytes()[:4].startswith(PICKLE_OR_ZIP):
            problems.append(f"{path}: pickle or zip (torch.save) content")
    return problems


def test_checkpoints_hold_only_safe_formats(tiny_model_dir, tmp_path):
    from agentkit.train import train
    from agentkit.train.config import load_config

    run = tmp_path / "run"
    cfg = load_config(None, ["env.id=vaults/vaults-v0", "env.max_turns=2", "eval.episodes=1",
                             "eval.every=0", "rollout.tasks_per_step=1", "rollout.group_size=2",
                             "sampling.max_new_tokens=8", "train.steps=1", "checkpoint.every=1",
                             f"model={tiny_model_dir}", f"out={run}"])
    train(cfg, show_progress=False)
    assert (run / "checkpoints" / "step-1" / "model.safetensors").exists()
    problems = _checkpoint_problems(run / "checkpoints")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------------
# URLs and queries


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.org/x", "/srv/retrieve", "javascript:alert(1)",
                                 "http://user:pw@127.0.0.1:8000"])
def test_the_search_env_takes_only_http_retriever_urls(url):
    pytest.importorskip("bm25s")
    from agentkit.envs.search_qa.env import SearchQAEnv

    with pytest.raises(ConfigError, match="http"):
        SearchQAEnv(split="eval", retriever="http", retriever_url=url)


LUCENE_SYNTAX = ['title:Osra AND (x OR y)', '+a -b && c || !d', '{a TO b} [c TO d]', 'x^3 "y" ~2 z* ?w',
                 'back\\slash/and/slash', 'NOT', '\\', ':', '"', '*', '((((']


def test_lucene_syntax_is_plain_words_for_bm25s_and_over_http(tmp_path):
    """Model text full of Lucene operators searches like plain words: the embedded bm25s index and
    our retrieval server answer it without error, and a query's operators do not change its hits."""
    pytest.importorskip("bm25s")
    from agentkit.envs.search_qa.retrieval import BM25sRetriever, HttpRetriever, lucene_query
    from agentkit.envs.search_qa.server import RetrievalServer

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "a", "title": "Osra", "text": "Osra was born in Tallinn."}\n'
                      '{"id": "b", "title": "Vello", "text": "Vello was born in Tartu."}\n')
    retriever = BM25sRetriever(corpus)
    results = retriever.search(LUCENE_SYNTAX, 2)
    assert len(results) == len(LUCENE_SYNTAX)
    assert results[0] and results[0][0].id == "a"
    assert retriever.search(["title:Osra AND (born) || Tallinn~2"], 1)[0][0].id == "a"
    with RetrievalServer(retriever) as server:
        assert HttpRetriever(server.url).search(LUCENE_SYNTAX, 2) == results
    # and what pyserini's QueryParser would receive has every operator escaped
    assert lucene_query('title:Osra AND (x)') == r"title\:Osra and \(x\)"
