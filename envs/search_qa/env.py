"""Search-QA in the Search-R1 format: search a corpus with ``<search>``, finish with ``<answer>``.

Each ``reset(seed=s)`` asks question ``s`` of the split. The model's whole response is the action:
this environment parses its own tags (its registered action format, ``agentkit.envs.SEARCH_ANSWER``,
has no parser, asks for these tags and stops generation after them). The *last complete*
``<search>query</search>`` or ``<answer>text</answer>`` in the response counts (models restate
earlier attempts; a tag opened inside another of its kind is read from the innermost opening):

- a search returns the top-k passages as ``<information>Doc 1(Title: "T") text ...</information>``,
  Search-R1's layout, and the episode goes on;
- an answer ends the episode with reward 1.0 on an exact match with any golden answer after
  Search-R1's normalization (lowercase, no punctuation, no articles, single spaces), else 0.0;
  ``info["f1"]`` holds the best token F1 over the golden answers;
- a response with neither tag, an empty one, an over-long query, or a search past
  ``max_searches`` is an invalid action (``action_valid=False``, reward 0): the observation says
  why and the episode goes on (a ``TurnLimit`` wrapper ends episodes that never answer).

Departures from Search-R1: the observation after an invalid action is our own wording; the
episode never raises on model text; ``info["expert_plan"]`` is recomputed every step (searches for
the hops whose supporting passage has not been shown yet, then the answer).
"""

from __future__ import annotations

import bisect
import os
import re
import string
from collections import Counter
from pathlib import Path
from typing import Any

from agentkit.envs.gym import TextEnv
from agentkit.envs.protocol import task_index
from agentkit.envs.search_qa.corpus import (
    CORPUS_FILE,
    DEFAULT_NUM_PASSAGES,
    EVAL_FILE,
    SPLITS,
    QAItem,
    generated_dir,
    read_corpus_records,
    read_qa,
)
from agentkit.envs.search_qa.retrieval import MAX_K, RETRIEVERS, Passage, Retriever, make_retriever

from agentkit.core.errors import ConfigError, EnvError, did_you_mean

MAX_QUERY_CHARS = 1000
DEFAULT_MAX_SEARCHES = 4

INSTRUCTIONS = (
    "Answer the question below. You may reason first. To look something up, write <search>your query</search>; "
    "the top results come back between <information> and </information>. You can search up to {max_searches} "
    "times. When you know the answer, write it between <answer> and </answer>, as a few words with no "
    "explanation, for example <answer>Paris</answer>.\n\nQuestion: {question}"
)
FORMAT_HELP = (
    "Invalid action: {reason} To search, put the query between <search> and </search>; to give the final "
    "answer, put it between <answer> and </answer>."
)


# ---------------------------------------------------------------------------------------------
# scoring (the SQuAD / Search-R1 conventions)

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """Lowercase, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, golden_answers: list[str] | tuple[str, ...]) -> bool:
    """Whether the normalized prediction equals any normalized golden answer."""
    pred = normalize_answer(prediction)
    return any(pred == normalize_answer(gold) for gold in golden_answers)


def token_f1(prediction: str, golden_answers: list[str] | tuple[str, ...]) -> float:
    """The best token-level F1 of the prediction against the golden answers (after normalization).

    When either side has no tokens, F1 is 1.0 if both are empty, else 0.0 (SQuAD v2's rule).
    """
    pred = normalize_answer(prediction).split()
    best = 0.0
    for gold_text in golden_answers:
        gold = normalize_answer(gold_text).split()
        if not pred or not gold:
            best = max(best, float(pred == gold))
            continue
        common = sum((Counter(pred) & Counter(gold)).values())
        if common:
            precision, recall = common / len(pred), common / len(gold)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


# ---------------------------------------------------------------------------------------------
# parsing

_CLOSING = re.compile(r"</(search|answer)\s*>", flags=re.IGNORECASE)
_OPENING = {tag: re.compile(rf"<{tag}\s*>", flags=re.IGNORECASE) for tag in ("search", "answer")}
_ANY_TAG = re.compile(r"</?(?:search|answer|information|think)\s*>", flags=re.IGNORECASE)


def parse_action(text: Any) -> tuple[str, str] | None:
    """The last complete ``<search>``/``<answer>`` of model text as (tag, content), or None.

    "Last complete" is the last closing tag that has an opening tag of its kind before it; the
    content runs from the nearest such opening tag. Tags left inside the content are removed and
    whitespace is collapsed; the content may be empty (the caller decides what that means).
    """
    if not isinstance(text, str):
        return None
    # one pass per pattern (no rescanning per closing tag, so adversarial text stays linear)
    opening_ends = {tag: [m.end() for m in pattern.finditer(text)] for tag, pattern in _OPENING.items()}
    for closing in reversed(list(_CLOSING.finditer(text))):
        tag = closing.group(1).lower()
        ends = opening_ends[tag]
        i = bisect.bisect_right(ends, closing.start())
        if i:
            content = text[ends[i - 1]:closing.start()]
            content = "".join(ch for ch in _ANY_TAG.sub(" ", content) if ch.isprintable() or ch.isspace())
            return tag, " ".join(content.split())
    return None


def format_passages(passages: list[Passage]) -> str:
    """Search-R1's layout: ``Doc i(Title: "title") text`` per line, inside ``<information>``."""
    if not passages:
        return "<information>No passages matched the query.</information>"
    lines = [f'Doc {i}(Title: "{p.title}") {" ".join(p.text.split())}' for i, p in enumerate(passages, 1)]
    return "<information>" + "\n".join(lines) + "</information>"


# ---------------------------------------------------------------------------------------------


def _resolve(path: str | os.PathLike | None, default_folder: Path, filename: str) -> Path:
    """A file path, or ``folder/filename`` when given a folder; the generated file when None."""
    if path is None:
        return default_folder / filename
    path = Path(path).expanduser()
    if path.is_dir():
        path = path / filename
    if not path.is_file():
        raise ConfigError(f"No such file: {path}")
    return path


def _split_questions(split: str, qa: str | os.PathLike | None, eval_qa: str | os.PathLike | None,
                     eval_fraction: float | None, generated: Path | None) -> tuple[Path, list[QAItem]]:
    """The QA file of ``split`` and its questions (see ``SearchQAEnv``'s ``qa``, ``eval_qa``,
    ``eval_fraction``): train and eval never share a question unless two files repeat one."""
    single = qa is not None and not Path(qa).expanduser().is_dir()
    if eval_fraction is not None:
        if isinstance(eval_fraction, bool) or not isinstance(eval_fraction, (int, float)) or not 0 < eval_fraction < 1:
            raise ConfigError(f"eval_fraction must be a number between 0 and 1 (exclusive), got {eval_fraction!r}.")
        if not single or eval_qa is not None:
            raise ConfigError("eval_fraction holds out part of a single qa file; give qa=FILE and no eval_qa "
                              f"(got qa={qa!r}, eval_qa={eval_qa!r}).")
    if split == "eval" and eval_qa is not None:
        path = _resolve(eval_qa, None, EVAL_FILE)
        return path, read_qa(path)
    path = _resolve(qa, generated, f"{split}.jsonl")
    if not single:
        return path, read_qa(path)
    if eval_fraction is None:
        if split == "eval":
            raise ConfigError(f"Search-QA split 'eval' with qa={path} (one file, the train questions): give the "
                              "held-out questions with eval_qa=FILE, or hold out a share of this file with "
                              "eval_fraction=0.1 (train then plays the rest), or qa=FOLDER with train.jsonl and eval.jsonl.")
        return path, read_qa(path)
    questions = read_qa(path)
    held_out = max(1, round(len(questions) * eval_fraction))
    if held_out >= len(questions):
        raise ConfigError(f"eval_fraction={eval_fraction} of the {len(questions)} questions in {path} leaves none to "
                          "train on; lower it or add questions.")
    return path, questions[-held_out:] if split == "eval" else questions[:-held_out]


class SearchQAEnv(TextEnv):
    """Search-R1-style question answering over a corpus, with a retrieval backend.

    Args:
        split: "train" or "eval" (disjoint questions).
        retriever: "bm25s" (embedded, default), "pyserini" (Lucene, Java 21+) or "http" (a Search-R1
            retrieval server at ``retriever_url``).
        retriever_url: the server's base URL, for ``retriever="http"`` only.
        corpus: a corpus JSONL (or a folder holding ``corpus.jsonl``); default: the generated one.
        qa: a folder holding ``train.jsonl`` and ``eval.jsonl`` (read by ``split``), or one QA
            JSONL: the train questions, with the eval ones in ``eval_qa`` or held out of it by
            ``eval_fraction``; default: the generated split.
        eval_qa: the eval split's QA JSONL (held-out questions), whatever ``qa`` is.
        eval_fraction: with ``qa`` a single file, the share of its questions (its last ones) that
            form the eval split; train plays the rest.
        corpus_seed: seed of the generated corpus.
        num_passages: size of the generated corpus.
        top_k: passages returned per search.
        max_searches: searches allowed per episode; later ones are invalid actions.
        retriever_options: extra keyword arguments for the backend (``timeout_s``, ``retries``,
            ``index_dir``, ``java_home``...).
    """

    def __init__(self, split: str = "train", retriever: str = "bm25s", retriever_url: str | None = None,
                 corpus: str | os.PathLike | None = None, qa: str | os.PathLike | None = None,
                 eval_qa: str | os.PathLike | None = None, eval_fraction: float | None = None,
                 corpus_seed: int = 0, num_passages: int = DEFAULT_NUM_PASSAGES, top_k: int = 3,
                 max_searches: int = DEFAULT_MAX_SEARCHES, retriever_options: dict[str, Any] | None = None) -> None:
        if split not in SPLITS:
            raise ConfigError(f"split must be one of {list(SPLITS)}, got {split!r}.")
        if retriever not in RETRIEVERS:
            raise ConfigError(
                f"Unknown retriever {retriever!r}; expected one of {list(RETRIEVERS)}.{did_you_mean(str(retriever), RETRIEVERS)}"
            )
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= MAX_K:
            raise ConfigError(f"top_k must be an integer from 1 to {MAX_K}, got {top_k!r}.")
        if isinstance(max_searches, bool) or not isinstance(max_searches, int) or max_searches < 0:
            raise ConfigError(f"max_searches must be a non-negative integer, got {max_searches!r}.")
        # the generated corpus is the default, except that an http server with our own questions
        # brings its own corpus (then supporting passages are not available for the teacher)
        own_questions = eval_qa if split == "eval" and eval_qa is not None else qa
        remote_only = retriever == "http" and corpus is None and own_questions is not None
        generated = None if remote_only or (corpus is not None and own_questions is not None) \
            else generated_dir(corpus_seed, num_passages)
        self.corpus_path = None if remote_only else _resolve(corpus, generated, CORPUS_FILE)
        self.split, self.top_k, self.max_searches = split, top_k, max_searches
        self.qa_path, self.questions = _split_questions(split, qa, eval_qa, eval_fraction, generated)
        wanted = {pid for q in self.questions for pid in q.supporting_ids}
        self._support: dict[str, tuple[str, str]] = {}
        if wanted and self.corpus_path is not None:
            self._support = {i: (t, x) for i, t, x in read_corpus_records(self.corpus_path) if i in wanted}
        self.retriever: Retriever | None = make_retriever(
            retriever, corpus=None if retriever == "http" else self.corpus_path, url=retriever_url, **(retriever_options or {})
        )
        self._item: QAItem | None = None
        self._done = True
        self._searches = 0
        self._shown: set[str] = set()
        self._won = False
        self._score = 0.0

    @property
    def num_tasks(self) -> int:
        """Questions in this split (valid reset seeds are 0 .. num_tasks - 1)."""
        return len(self.questions)

    # -- protocol ----------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        if self.retriever is None:
            raise EnvError("reset() after close(); build a new SearchQAEnv.")
        seed = self.task_seed(seed, len(self.questions))
        index = task_index(seed, len(self.questions), family="Search-QA", split=self.split)
        self._item = self.questions[index]
        self._done, self._searches, self._shown, self._won, self._score = False, 0, set(), False, 0.0
        obs = INSTRUCTIONS.format(max_searches=self.max_searches, question=self._item.question)
        return obs, self._info(action_valid=True)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._item is None or self._done or self.retriever is None:
            raise EnvError("step() called before reset(), after the episode ended or after close(); call reset() first.")
        parsed = parse_action(action)
        if parsed is None:
            return self._invalid("no complete <search>...</search> or <answer>...</answer> tag found.")
        tag, content = parsed
        if not content:
            return self._invalid(f"the <{tag}> tag is empty.")
        if tag == "answer":
            return self._answer(content)
        if len(content) > MAX_QUERY_CHARS:
            return self._invalid(f"the search query is longer than {MAX_QUERY_CHARS} characters.")
        if self._searches >= self.max_searches:
            return self._invalid(f"the search limit ({self.max_searches}) is used up; give your final answer now.")
        self._searches += 1
        passages = self.retriever.search([content], self.top_k)[0]
        self._shown.update(p.id for p in passages)
        info = self._info(action_valid=True)
        info["retrieved_ids"] = [p.id for p in passages]
        return format_passages(passages), 0.0, False, False, info

    def close(self) -> None:
        if self.retriever is not None:
            self.retriever.close()
            self.retriever = None

    # -- helpers -----------------------------------------------------------------------------

    def _answer(self, answer: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        golden = self._item.golden_answers
        self._won = exact_match(answer, golden)
        f1 = token_f1(answer, golden)
        self._done = True
        reward = 1.0 if self._won else 0.0
        self._score += reward
        info = self._info(action_valid=True)
        info["f1"], info["answer"] = f1, answer
        verdict = "correct" if self._won else f"not an exact match (token F1 {f1:.2f})"
        return f"Final answer recorded: {verdict}.", reward, True, False, info

    def _invalid(self, reason: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return FORMAT_HELP.format(reason=reason), 0.0, False, False, self._info(action_valid=False)

    def expert_plan(self) -> list[str]:
        """Searches for the hops whose supporting passage has not been shown yet, then the answer."""
        item = self._item
        if item is None or self._done:
            return []
        hops = item.hop_queries or (item.question,)
        if len(item.supporting_ids) == len(hops):
            pending = [query for query, pid in zip(hops, item.supporting_ids, strict=True) if pid not in self._shown]
        else:  # no passage per hop to check: the hops not searched yet
            pending = list(hops[self._searches:])
        pending = pending[: max(0, self.max_searches - self._searches)]
        return [*(f"<search>{query}</search>" for query in pending), f"<answer>{item.golden_answers[0]}</answer>"]

    def _privileged(self) -> str:
        item = self._item
        lines = ["Gold answer: " + " | ".join(item.golden_answers)]
        passages = [(pid, self._support[pid]) for pid in item.supporting_ids if pid in self._support]
        if passages:
            lines.append("Supporting passages:")
            lines.extend(f'({pid}) "{title}" {" ".join(text.split())}' for pid, (title, text) in passages)
        return "\n".join(lines)

    def _info(self, *, action_valid: bool) -> dict[str, Any]:
        item = self._item
        return {
            "task": item.question,
            "admissible_actions": None,
            "action_valid": action_valid,
            "won": self._won,
            "score": self._score,
            "privileged": self._privileged(),
            "expert_plan": self.expert_plan(),
            "f1": None,
            "searches": self._searches,
            "question_id": item.id,
            "question_type": item.type,
        }
