"""``agentkit view``: one self-contained HTML report of trajectories, with the teacher's token signals.

The report is a single static file (inline CSS, JS and data; no server, no network). It lists the
episodes with filters (won/lost, environment, task type, training step, a text search), a page at a
time, and renders an episode's turns only when it is opened: observation, response, action, reward,
validity, and the retrieved skills. When the run recorded token signals (``signals/step-N.jsonl``,
written by ``agentkit train`` for a sample of episodes per step, see ``TrainConfig.log``), each
response token can be coloured by the teacher-student gap, the SDAR gate, the teacher's top-1
confidence or the student's own logprob, and each turn shows its SAGE-OPD label, confidence and
weight. Without signals, tokens are coloured by the student's sampling logprob.

A source is a trajectory file (JSONL) or a run folder (its ``trajectories/step-N.jsonl`` and
``signals/step-N.jsonl``). Token texts come from the run's tokenizer (``--model``, else the run's
latest checkpoint or configured model, else the trajectories' model folder, else none: the
response text is shown whole).

An episode has an address in the report: ``report.html#episode=ID`` (``&step=N`` in a run's report),
ID the trajectory's id, URL-encoded (``episode_anchor``). Opening it shows that episode; picking
an episode puts its address in the location bar. ``agentkit view SOURCE --episode ID`` prints it.
The episode tables of the experiment trackers (``agentkit.report.trackers``) carry that command.
"""

from __future__ import annotations

import html
import json
import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import quote

from agentkit.core import runs
from agentkit.core.errors import ConfigError
from agentkit.core.jsonl import iter_trajectories, step_files
from agentkit.core.trajectory import Trajectory
from agentkit.rollout.export import is_dataset, read_source

SIGNAL_KEYS = ("gap", "gate", "top1", "student", "teacher")


def read_signals(path: Path) -> dict[str, dict[str, Any]]:
    """A ``signals/step-N.jsonl`` file: trajectory id -> its recorded signals."""
    out = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            out[str(record["id"])] = record
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ConfigError(f"{path}:{lineno}: not a signals record ({err}).") from err
    return out


def _tokenizer_folder(source: Path, trajectories: list[Trajectory], model: str | None) -> Path | None:
    candidates: list[Path] = []
    if model:
        candidates.append(Path(model))
    if source.is_dir():
        candidates += [runs.checkpoint_dir(source, step) for step in reversed(runs.checkpoints(source))]
        config = runs.config_file(source)
        if config.exists():
            import yaml

            configured = (yaml.safe_load(config.read_text()) or {}).get("model")
            if configured:
                candidates.append(Path(str(configured)))
    candidates += [Path(t.model) for t in trajectories[:1] if t.model]
    for folder in candidates:
        if (folder / "tokenizer.json").exists() or (folder / "tokenizer_config.json").exists():
            return folder
    if model:
        raise ConfigError(f"--model {model}: no tokenizer there (no tokenizer.json).")
    return None


def task_type(trajectory: Trajectory) -> str:
    """The task's type as the environment recorded it (ALFWorld's six types, ScienceWorld's task
    names), else the environment id."""
    return str(trajectory.task_type or trajectory.env)


def _round(values: list[float] | None, digits: int = 3) -> list[float] | None:
    return None if values is None else [round(float(v), digits) for v in values]


def episode_record(trajectory: Trajectory, step: int | None, signals: dict[str, Any] | None, pieces) -> dict[str, Any]:
    """What the page needs of one episode (compact keys keep big reports small)."""
    by_turn = {int(t["turn"]): t for t in (signals or {}).get("turns", [])}
    turns = []
    for index, turn in enumerate(trajectory.turns):
        sig = by_turn.get(index, {})
        record: dict[str, Any] = {
            "o": turn.observation, "r": turn.response_text, "a": turn.action, "v": turn.action_valid,
            "rw": turn.reward, "f": turn.feedback, "e": turn.error,
            "tk": pieces(turn.response_ids) if pieces else None,
            "s": {"student": _round(turn.response_logprobs)},
        }
        for key in SIGNAL_KEYS:
            if key in sig and key != "student":
                record["s"][key] = _round(sig[key])
        for key in ("label", "confidence", "weight"):
            if key in sig:
                record[key] = sig[key]
        turns.append(record)
    return {
        "id": trajectory.id, "env": trajectory.env, "task": trajectory.task, "type": task_type(trajectory),
        "step": step, "split": trajectory.split, "won": trajectory.won, "ret": round(trajectory.episode_return, 4),
        "score": trajectory.score, "skills": list(trajectory.skills), "err": trajectory.error,
        "signals": bool(signals), "turns": turns,
    }


def collect(source: Path, *, model: str | None = None, max_episodes: int = 20_000) -> dict[str, Any]:
    """Read a trajectory file or a run folder into the report's data."""
    source = Path(source)
    if not source.exists():
        raise ConfigError(f"{source} does not exist: give a trajectory file (.jsonl) or a run folder.")
    dataset = is_dataset(source) and not runs.trajectories_dir(source).is_dir()  # agentkit export's
    if source.is_dir() and not dataset:
        files = step_files(runs.trajectories_dir(source))
        if not files:
            raise ConfigError(f"{source} has no trajectories/step-N.jsonl: is it a run folder of `agentkit train`?")
        signal_files = dict(step_files(runs.signals_dir(source)))
    else:
        files, signal_files = [(None, source)], {}
    loaded: list[tuple[int | None, Trajectory, dict | None]] = []
    truncated = False
    for step, path in files:
        signals = read_signals(signal_files[step]) if step in signal_files else {}
        for trajectory in read_source(path) if dataset else iter_trajectories(path):
            if len(loaded) >= max_episodes:
                truncated = True
                break
            loaded.append((step, trajectory, signals.get(trajectory.id)))
    tokenizer_dir = _tokenizer_folder(source, [t for _, t, _ in loaded], model)
    pieces = None
    if tokenizer_dir is not None:
        from agentkit.rollout.hf_backend import load_tokenizer

        tokenizer, cache = load_tokenizer(tokenizer_dir), {}

        def pieces(ids: list[int]) -> list[str]:
            out = []
            for i in ids:
                if i not in cache:
                    cache[i] = tokenizer.decode([i])
                out.append(cache[i])
            return out

    episodes = [episode_record(t, step, sig, pieces) for step, t, sig in loaded]
    return {"source": str(source), "episodes": episodes, "truncated": truncated, "max_episodes": max_episodes,
            "tokenizer": str(tokenizer_dir) if tokenizer_dir else None}


def render(data: dict[str, Any]) -> str:
    """The self-contained page."""
    # no <, > or & at all in the embedded JSON (JSON.parse reads the escapes back): no text can close
    # the script element or open a comment in it (``<!--<script>`` would), whatever it holds
    payload = json.dumps(data, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    payload = payload.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    fill = {"__TITLE__": html.escape(f"agentkit view: {data['source']}"), "__DATA__": payload}
    return re.sub("__TITLE__|__DATA__", lambda m: fill[m.group()], _PAGE)  # one pass: neither fills the other


def episode_anchor(episode_id: str, step: int | None = None) -> str:
    """The report's URL fragment (after ``#``) that opens episode ``episode_id`` (of ``step``, in a run's report)."""
    return "episode=" + quote(episode_id, safe="") + ("" if step is None else f"&step={step}")


def view_command(source: Path, episode_id: str) -> str:
    """The shell command that writes the report of ``source`` and prints the link that opens the episode."""
    return f"agentkit view {shlex.quote(str(source))} --out report.html --episode {shlex.quote(episode_id)}"


def write_report(source: Path, out: Path, *, model: str | None = None, max_episodes: int = 20_000,
                 episode: str | None = None) -> tuple[Path, int]:
    """Write the report; return (its path, episodes in it). ``episode``: an id the report must hold
    (refused before anything is written when it does not)."""
    out = Path(out)
    if out.is_dir():
        raise ConfigError(f"--out {out} is a directory; give a file name such as {out / 'report.html'}.")
    data = collect(source, model=model, max_episodes=max_episodes)
    if episode is not None and not any(e["id"] == episode for e in data["episodes"]):
        raise ConfigError(f"--episode {episode!r}: no episode with that id in {source}"
                          + (f" (its first {max_episodes} read; raise --max-episodes)" if data["truncated"] else "")
                          + "; the ids are the trajectories' \"id\" fields.")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(render(data), encoding="utf-8")
    tmp.replace(out)
    return out, len(data["episodes"])


_PAGE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222;display:flex;height:100vh}
#side{width:38%;min-width:320px;border-right:1px solid #ccc;display:flex;flex-direction:column}
#filters{padding:8px;border-bottom:1px solid #ddd;display:flex;flex-wrap:wrap;gap:6px;align-items:center}
#filters select,#filters input{font:inherit}
#list{overflow:auto;flex:1}
.ep{padding:5px 8px;border-bottom:1px solid #eee;cursor:pointer}
.ep:hover{background:#f4f7fb}.ep.sel{background:#e3ecf8}
.won{color:#1a7f37;font-weight:600}.lost{color:#b42318;font-weight:600}
.muted{color:#777;font-size:12px}
#pager{padding:6px 8px;border-top:1px solid #ddd;display:flex;gap:8px;align-items:center}
#main{flex:1;overflow:auto;padding:10px 16px}
.turn{border:1px solid #ddd;border-radius:6px;margin:10px 0;padding:8px}
.turn h4{margin:0 0 6px 0;font-size:13px}
pre{white-space:pre-wrap;margin:4px 0;font:12px/1.4 ui-monospace,monospace;background:#fafafa;padding:6px;border-radius:4px}
.tokens{font:13px/1.9 ui-monospace,monospace;white-space:pre-wrap;word-break:break-word}
.tok{border-radius:2px;padding:1px 0}
.label{display:inline-block;padding:0 6px;border-radius:8px;font-size:12px;margin-left:6px}
.label-strong{background:#d1f0d9}.label-weak{background:#fff1c2}.label-skip{background:#eee}
.bad{color:#b42318}.ok{color:#1a7f37}
#legend{font-size:12px;margin:4px 0 8px 0}
.skill{display:inline-block;background:#eef;border-radius:8px;padding:0 6px;margin:2px;font-size:12px}
</style></head>
<body>
<div id="side">
 <div id="filters">
  <select id="f-outcome" title="outcome"><option value="">won and lost</option><option value="won">won</option><option value="lost">lost</option></select>
  <select id="f-env" title="environment"><option value="">every env</option></select>
  <select id="f-type" title="task type"><option value="">every task type</option></select>
  <select id="f-step" title="training step"><option value="">every step</option></select>
  <label><input type="checkbox" id="f-signals"> with signals</label>
  <input id="f-text" placeholder="search task / id" size="16">
  <span id="count" class="muted"></span>
 </div>
 <div id="list"></div>
 <div id="pager"><button id="prev">&lt; prev</button><span id="page" class="muted"></span><button id="next">next &gt;</button></div>
</div>
<div id="main"><p class="muted">Pick an episode on the left.</p></div>
<script type="application/json" id="data">__DATA__</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);
const EPS = DATA.episodes, PAGE = 50;
let shown = [], page = 0, current = null, mode = null;
const $ = id => document.getElementById(id);
const esc = s => String(s == null ? "" : s).replace(/[&<>"]/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;"}[c]));
function fill(id, values) {
  const sel = $(id);
  [...new Set(values)].filter(v => v !== null && v !== undefined).sort((a, b) => a > b ? 1 : a < b ? -1 : 0)
    .forEach(v => { const o = document.createElement("option"); o.value = String(v); o.textContent = String(v); sel.appendChild(o); });
}
fill("f-env", EPS.map(e => e.env)); fill("f-type", EPS.map(e => e.type)); fill("f-step", EPS.map(e => e.step));
function applyFilters() {
  const out = $("f-outcome").value, env = $("f-env").value, type = $("f-type").value, step = $("f-step").value;
  const sig = $("f-signals").checked, text = $("f-text").value.toLowerCase();
  shown = EPS.filter(e => (!out || (out === "won") === e.won) && (!env || e.env === env) && (!type || e.type === type)
    && (!step || String(e.step) === step) && (!sig || e.signals)
    && (!text || (e.task + " " + e.id).toLowerCase().includes(text)));
  page = 0; drawList();
}
function drawList() {
  const pages = Math.max(1, Math.ceil(shown.length / PAGE));
  page = Math.min(page, pages - 1);
  $("count").textContent = shown.length + " of " + EPS.length + " episodes" + (DATA.truncated ? " (first " + DATA.max_episodes + " read)" : "");
  $("page").textContent = "page " + (page + 1) + " / " + pages;
  const rows = shown.slice(page * PAGE, (page + 1) * PAGE).map((e, i) =>
    '<div class="ep' + (e === current ? " sel" : "") + '" data-i="' + (page * PAGE + i) + '">' +
    '<span class="' + (e.won ? "won" : "lost") + '">' + (e.won ? "won" : "lost") + "</span> " + esc(e.task || e.id).slice(0, 90) +
    '<div class="muted">' + esc(e.env) + " · " + esc(e.type) + (e.step != null ? " · step " + e.step : "") + " · " + e.turns.length + " turns · return " + e.ret +
    (e.signals ? " · signals" : "") + "</div></div>");
  $("list").innerHTML = rows.join("");
}
$("list").addEventListener("click", ev => { const el = ev.target.closest(".ep"); if (el) { current = shown[+el.dataset.i]; drawList(); drawEpisode(); history.replaceState(null, "", "#" + anchorOf(current)); } });
// an episode's address: #episode=ID (URL-encoded) and, in a run's report, &step=N (agentkit.report.view.episode_anchor)
function anchorOf(e) { return "episode=" + encodeURIComponent(e.id) + (e.step != null ? "&step=" + e.step : ""); }
function openAnchor() {
  const params = new URLSearchParams(location.hash.slice(1)), id = params.get("episode"), step = params.get("step");
  if (id === null) return;
  const e = EPS.find(x => x.id === id && (step === null || String(x.step) === step)) || EPS.find(x => x.id === id);
  if (!e) { $("main").innerHTML = '<p class="bad">no episode ' + esc(id) + " in this report</p>"; return; }
  const at = shown.indexOf(e);
  if (at >= 0) page = Math.floor(at / PAGE);
  current = e; drawList(); drawEpisode();
}
window.addEventListener("hashchange", openAnchor);
$("prev").onclick = () => { page = Math.max(0, page - 1); drawList(); };
$("next").onclick = () => { page += 1; drawList(); };
["f-outcome", "f-env", "f-type", "f-step", "f-signals"].forEach(id => $(id).addEventListener("change", applyFilters));
$("f-text").addEventListener("input", applyFilters);
const MODES = {
  gap: {name: "teacher - student logprob", lo: -3, hi: 3, diverging: true},
  gate: {name: "SDAR gate", lo: 0, hi: 1},
  top1: {name: "teacher top-1 confidence", lo: 0, hi: 1},
  teacher: {name: "teacher logprob", lo: -6, hi: 0},
  student: {name: "student logprob (at sampling)", lo: -6, hi: 0},
};
function colour(m, v) {
  if (v === undefined || v === null) return "transparent";
  const spec = MODES[m];
  let t = (v - spec.lo) / (spec.hi - spec.lo); t = Math.max(0, Math.min(1, t));
  if (spec.diverging) {  // red: the teacher disagrees (lower), green: the teacher prefers the token
    return t < 0.5 ? "rgba(220,50,47," + (1 - 2 * t).toFixed(2) + ")" : "rgba(38,162,105," + (2 * t - 1).toFixed(2) + ")";
  }
  return "rgba(38,110,220," + t.toFixed(2) + ")";
}
function modesOf(e) { const found = new Set(); e.turns.forEach(t => Object.keys(t.s).forEach(k => { if (t.s[k]) found.add(k); })); return Object.keys(MODES).filter(k => found.has(k)); }
function drawEpisode() {
  const e = current, modes = modesOf(e);
  if (!mode || !modes.includes(mode)) mode = modes[0];
  const picker = modes.map(m => '<option value="' + m + '"' + (m === mode ? " selected" : "") + ">" + MODES[m].name + "</option>").join("");
  let out = "<h3>" + esc(e.task || e.id) + "</h3>" +
    '<div class="muted"><a id="anchor" href="#' + esc(anchorOf(e)) + '" title="this episode\'s address">' + esc(e.id) + "</a>" + " · " + esc(e.env) + " · " + esc(e.split) + (e.step != null ? " · step " + e.step : "") +
    ' · <span class="' + (e.won ? "won" : "lost") + '">' + (e.won ? "won" : "lost") + "</span> · return " + e.ret + " · score " + e.score + "</div>";
  if (e.err) out += '<p class="bad">error: ' + esc(e.err) + "</p>";
  out += "<p>skills: " + (e.skills.length ? e.skills.map(s => '<span class="skill">' + esc(s) + "</span>").join("") : '<span class="muted">none retrieved</span>') + "</p>";
  out += '<div id="legend">colour tokens by <select id="mode">' + picker + "</select> " + legend(mode) + "</div>";
  e.turns.forEach((t, i) => {
    const lab = t.label ? '<span class="label label-' + esc(t.label) + '">' + esc(t.label) +
      (t.confidence != null ? " · conf " + (+t.confidence).toFixed(2) : "") + (t.weight != null ? " · weight " + (+t.weight).toFixed(2) : "") + "</span>" : "";
    out += '<div class="turn" data-turn="' + i + '"><h4>turn ' + (i + 1) + lab + ' <span class="muted">reward ' + t.rw + "</span> " +
      (t.v ? '<span class="ok">valid</span>' : '<span class="bad">invalid</span>') + "</h4>" +
      '<div class="muted">observation</div><pre>' + esc(t.o) + "</pre>" +
      '<div class="muted">response</div><div class="tokens">' + tokens(t) + "</div>" +
      '<div class="muted">action: <b>' + esc(t.a == null ? "(none parsed)" : t.a) + "</b></div>" +
      (t.e ? '<div class="bad">' + esc(t.e) + "</div>" : "") + "</div>";
  });
  $("main").innerHTML = out;
  $("mode").onchange = ev => { mode = ev.target.value; drawEpisode(); };
}
function legend(m) { if (!m) return ""; const s = MODES[m]; return '<span class="tok" style="background:' + colour(m, s.lo) + '">&nbsp;' + s.lo + "&nbsp;</span> … " + '<span class="tok" style="background:' + colour(m, s.hi) + '">&nbsp;' + s.hi + "&nbsp;</span>"; }
function tokens(t) {
  if (!t.tk) return "<pre>" + esc(t.r) + "</pre>";
  const values = mode ? t.s[mode] : null;
  return t.tk.map((p, j) => { const v = values ? values[j] : undefined;
    return '<span class="tok" data-v="' + (v === undefined ? "" : v) + '" title="' + (mode ? MODES[mode].name + ": " + v : "") + '" style="background:' + (mode ? colour(mode, v) : "transparent") + '">' + esc(p) + "</span>"; }).join("");
}
applyFilters();
openAnchor();
</script></body></html>
"""
