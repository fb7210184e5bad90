"""``agentkit view`` in a real headless Chromium, the signals training records for it, and ``agentkit plot``.

The browser tests need Debian's chromium and chromium-driver (scripts/test.sh installs them and sets
AGENTKIT_REQUIRE_BROWSER=1, so CI fails rather than skips without them) and selenium. Screenshots go
to $AGENTKIT_ARTIFACTS (default: artifacts/ in the working directory).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentkit.core.jsonl import TrajectoryWriter, read_trajectories
from agentkit.train import train
from agentkit.train.config import load_config

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
BASE = ["env.id=vaults/vaults-v0", "env.kwargs.families=amber", "env.max_turns=3", "eval.episodes=2", "eval.every=0",
        "rollout.tasks_per_step=2", "rollout.group_size=2", "sampling.temperature=0.5", "sampling.max_new_tokens=12",
        "train.steps=2", "checkpoint.every=2"]


def artifacts() -> Path:
    folder = Path(os.environ.get("AGENTKIT_ARTIFACTS", "artifacts"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def browser():
    missing = [p for p in (CHROMIUM, DRIVER) if not Path(p).exists()]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("selenium")
    if missing:
        if os.environ.get("AGENTKIT_REQUIRE_BROWSER") == "1":
            pytest.fail(f"browser test needs {missing}: apt-get install chromium chromium-driver; pip install selenium")
        pytest.skip(f"no headless browser here ({missing})")
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    driver.quit()


def open_report(driver, path: Path):
    from selenium.webdriver.common.by import By

    driver.get(path.resolve().as_uri())
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors  # the page's script ran without an error
    return By


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentkit.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=600)


@pytest.fixture(scope="module")
def sdar_run(tmp_path_factory, vaults_sft_model):
    out = tmp_path_factory.mktemp("view") / "sdar"
    cfg = load_config(None, [*BASE, "objective.name=sdar", f"model={vaults_sft_model}", f"out={out}", "log.signal_episodes=2"])
    train(cfg, show_progress=False)
    return out


@pytest.fixture(scope="module")
def sage_run(tmp_path_factory, vaults_sft_model, tiny_model_dir):
    out = tmp_path_factory.mktemp("view") / "sage"
    cfg = load_config(None, [*BASE, "objective.name=sage_opd", f"model={vaults_sft_model}", f"out={out}",
                             f"teacher.spec=model:{tiny_model_dir}", "objective.args.judge=oracle",
                             "sampling.temperature=0.1", "log.signal_episodes=3"])
    train(cfg, show_progress=False)
    return out


def test_training_records_token_signals_for_a_sample_of_episodes(sdar_run):
    for step in (1, 2):
        trajectories = {t.id: t for t in read_trajectories(sdar_run / "trajectories" / f"step-{step}.jsonl")}
        lines = (sdar_run / "signals" / f"step-{step}.jsonl").read_text().splitlines()
        assert len(lines) == 2  # the budget: log.signal_episodes=2 of 4 episodes
        for record in map(json.loads, lines):
            trajectory = trajectories[record["id"]]
            assert record["turns"], record
            for turn in record["turns"]:
                n = len(trajectory.turns[turn["turn"]].response_ids)
                for key in ("teacher", "gap", "top1", "gate"):
                    assert len(turn[key]) == n, key  # one value per response token
                assert all(0.0 <= g <= 1.0 for g in turn["gate"]) and all(0.0 <= c <= 1.0 for c in turn["top1"])
                student = trajectory.turns[turn["turn"]].response_logprobs
                assert turn["gap"] == pytest.approx([t - s for t, s in zip(turn["teacher"], student, strict=True)], abs=2e-4)
    # the trajectory files are what they were without signals: no per-token teacher fields in them
    assert "gate" not in (sdar_run / "trajectories" / "step-1.jsonl").read_text()


def test_sage_opd_records_turn_labels(sage_run):
    records = [json.loads(line) for line in (sage_run / "signals" / "step-1.jsonl").read_text().splitlines()]
    turns = [t for r in records for t in r["turns"]]
    assert turns and all(t["label"] in ("skip", "weak", "strong") for t in turns)
    assert all(0.0 <= t["confidence"] <= 1.0 and t["weight"] >= 0.0 for t in turns)


def test_view_of_a_run_in_chromium(sdar_run, tmp_path, browser):
    report = tmp_path / "report.html"
    done = run_cli("view", str(sdar_run), "--out", str(report))
    assert done.returncode == 0, done.stderr
    page = report.read_text()
    assert "<script src" not in page and "http://" not in page and "https://" not in page  # self-contained
    By = open_report(browser, report)
    assert browser.find_element(By.ID, "count").text.startswith("8 of 8 episodes")  # 2 steps x 4 episodes
    from selenium.webdriver.support.ui import Select

    browser.find_element(By.ID, "f-signals").click()
    assert browser.find_element(By.ID, "count").text.startswith("4 of 8")  # 2 recorded episodes per step
    Select(browser.find_element(By.ID, "f-step")).select_by_value("2")
    assert browser.find_element(By.ID, "count").text.startswith("2 of 8")
    browser.find_elements(By.CSS_SELECTOR, ".ep")[0].click()
    turns = browser.find_elements(By.CSS_SELECTOR, ".turn")
    assert turns and "observation" in turns[0].text and "action" in turns[0].text
    for mode in ("gate", "gap", "top1"):
        Select(browser.find_element(By.ID, "mode")).select_by_value(mode)
        tokens = browser.find_elements(By.CSS_SELECTOR, ".tok[data-v]")
        values = [t.get_attribute("data-v") for t in tokens]
        assert values and all(v != "" for v in values), mode  # every response token has its value
        colours = {t.value_of_css_property("background-color") for t in tokens}
        assert len(colours) > 1 and "rgba(0, 0, 0, 0)" not in colours, (mode, colours)  # coloured, not all alike
    assert "skills" in browser.find_element(By.ID, "main").text
    browser.save_screenshot(str(artifacts() / "view-sdar-episode.png"))


def test_view_shows_sage_opd_labels(sage_run, tmp_path, browser):
    report = tmp_path / "sage.html"
    assert run_cli("view", str(sage_run), "--out", str(report)).returncode == 0
    By = open_report(browser, report)
    browser.find_element(By.ID, "f-signals").click()
    browser.find_elements(By.CSS_SELECTOR, ".ep")[0].click()
    labels = browser.find_elements(By.CSS_SELECTOR, ".turn .label")
    assert labels and all(lab.text.split(" ")[0] in ("skip", "weak", "strong") for lab in labels)
    assert all("conf" in lab.text and "weight" in lab.text for lab in labels)
    browser.save_screenshot(str(artifacts() / "view-sage-episode.png"))


def test_view_of_a_large_file_pages_and_filters(sdar_run, tmp_path, browser):
    """3,000 episodes: the list shows one page of 50 at a time and an episode renders on demand."""
    base = read_trajectories(sdar_run / "trajectories" / "step-1.jsonl")
    big = tmp_path / "big.jsonl"
    with TrajectoryWriter(big) as writer:
        for i in range(3000):
            t = base[i % len(base)]
            writer.write(dataclasses.replace(t, id=f"{t.id}|copy{i}", won=i % 3 == 0))
    report = tmp_path / "big.html"
    started = time.perf_counter()
    done = run_cli("view", str(big), "--out", str(report))
    assert done.returncode == 0, done.stderr
    build_s = time.perf_counter() - started
    By = open_report(browser, report)
    started = time.perf_counter()
    assert len(browser.find_elements(By.CSS_SELECTOR, ".ep")) == 50
    assert "page 1 / 60" in browser.find_element(By.ID, "page").text
    browser.find_element(By.ID, "next").click()
    assert "page 2 / 60" in browser.find_element(By.ID, "page").text
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element(By.ID, "f-outcome")).select_by_value("won")
    assert browser.find_element(By.ID, "count").text.startswith("1000 of 3000")
    browser.find_elements(By.CSS_SELECTOR, ".ep")[3].click()
    assert browser.find_elements(By.CSS_SELECTOR, ".turn")
    print(f"3000-episode report: built in {build_s:.1f}s, {report.stat().st_size / 1e6:.1f} MB, "
          f"page/filter/open in {time.perf_counter() - started:.2f}s")


def test_an_episode_address_opens_that_episode(sdar_run, tmp_path, browser):
    """report.html#episode=ID&step=N (``episode_anchor``, as the trackers' tables and ``view --episode``
    give it) opens that episode; picking another puts its address in the location bar."""
    from selenium.webdriver.common.by import By

    from agentkit.report.view import episode_anchor

    report = tmp_path / "report.html"
    assert run_cli("view", str(sdar_run), "--out", str(report)).returncode == 0
    wanted = sorted(t.id for t in read_trajectories(sdar_run / "trajectories" / "step-2.jsonl"))[-1]
    browser.get(report.resolve().as_uri() + "#" + episode_anchor(wanted, 2))
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert browser.find_element(By.ID, "anchor").text == wanted
    assert "step 2" in browser.find_element(By.ID, "main").text
    assert browser.find_element(By.CSS_SELECTOR, ".ep.sel")  # and listed, on the page shown
    browser.find_elements(By.CSS_SELECTOR, ".ep")[0].click()
    address = browser.find_element(By.ID, "anchor").get_attribute("href").split("#", 1)[1]
    assert browser.execute_script("return location.hash") == "#" + address != "#" + episode_anchor(wanted, 2)
    browser.get(report.resolve().as_uri() + "#" + episode_anchor("no-such-episode"))
    assert "no episode no-such-episode in this report" in browser.find_element(By.ID, "main").text


def test_view_rejects_bad_sources(tmp_path):
    missing = run_cli("view", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "r.html"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    empty_dir = tmp_path / "notarun"
    empty_dir.mkdir()
    not_run = run_cli("view", str(empty_dir), "--out", str(tmp_path / "r.html"))
    assert not_run.returncode == 2 and "trajectories/step-N.jsonl" in not_run.stderr
    assert not (tmp_path / "r.html").exists()


def test_plot_overlays_runs_with_every_series(sdar_run, sage_run, tmp_path):
    from PIL import Image

    out = tmp_path / "curves.png"
    done = run_cli("plot", str(sdar_run), str(sage_run), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = Image.open(out)
    image.verify()  # a valid PNG
    drawn = json.loads(Image.open(out).text["Description"])
    for panel in ("success_rate", "return_mean", "loss", "eval success_rate"):
        assert set(drawn[panel]) == {"sdar", "sage"}, panel  # both runs overlaid
    assert drawn["success_rate"]["sdar"] == 2  # two steps
    assert "gate_mean" in drawn and set(drawn["gate_mean"]) == {"sdar"}  # SDAR's diagnostics
    assert "judge_strong_share" in drawn and set(drawn["judge_strong_share"]) == {"sage"}
    shutil.copy(out, artifacts() / "plot-two-runs.png")


HOSTILE_TEXTS = ["<!--<script>", "</script><script>alert(1)</script>", "<!--", "-->", "<!-- -->", "]]>", "<![CDATA[",
                 "a\u2028b\u2029c", "&lt;&amp;", "</SCRIPT >", "<script>", "\\u003c/script>"]


def _embedded(page: str) -> str:
    """The data element's text as a browser reads it: it ends at the first ``</script``, any case."""
    opening = '<script type="application/json" id="data">'
    start = page.index(opening) + len(opening)
    return page[start:page.lower().index("</script", start)]


def test_the_embedded_data_holds_no_markup_and_reads_back():
    """No browser needed: whatever the texts (and the source path in the title), the page has the
    template's elements and no more, the data holds no ``<``, ``>``, ``&``, U+2028 or U+2029 (so
    nothing can end its element or enter the double-escaped state of ``<!--<script``), and the data
    JSON-decodes back to the originals. The title is filled in the same pass, so a ``__DATA__`` in
    the path stays text."""
    from agentkit.report.view import render

    data = {"source": "runs/<!--<script>/</title>/__DATA__.jsonl", "truncated": False, "max_episodes": 10, "tokenizer": None,
            "episodes": [{"id": f"e{i}", "task": text, "turns": [{"observation": text, "response_text": text}]}
                         for i, text in enumerate(HOSTILE_TEXTS)]}
    page = render(data)
    embedded = _embedded(page)
    assert not set("<>&\u2028\u2029") & set(embedded)
    assert json.loads(embedded) == data
    plain = render({**data, "source": "runs/plain.jsonl", "episodes": []})
    for markup in ("<script", "</script", "<!--", "-->", "<title", "</title"):
        assert page.lower().count(markup) == plain.lower().count(markup), markup
    assert "<title>agentkit view: runs/&lt;!--&lt;script&gt;/&lt;/title&gt;/__DATA__.jsonl</title>" in page


def test_no_text_changes_how_the_page_parses(sdar_run, tmp_path, browser):
    """Texts that would end the data's script element or put the parser in a comment state: every
    episode is still shown, and the data reads back exactly (``render`` used to escape only ``</``)."""
    [first, *_] = read_trajectories(sdar_run / "trajectories" / "step-1.jsonl")
    source = tmp_path / "hostile.jsonl"
    with TrajectoryWriter(source) as writer:
        for i, text in enumerate(HOSTILE_TEXTS):
            turns = [dataclasses.replace(first.turns[0], observation=text, feedback=text, response_text=text)]
            writer.write(dataclasses.replace(first, id=f"hostile|{i}", task=text, turns=turns))
    report = tmp_path / "hostile.html"
    done = run_cli("view", str(source), "--out", str(report))
    assert done.returncode == 0, done.stderr
    embedded = _embedded(report.read_text(encoding="utf-8"))
    assert not set("<>&") & set(embedded)
    assert [e["task"] for e in json.loads(embedded)["episodes"]] == HOSTILE_TEXTS
    By = open_report(browser, report)
    assert browser.find_element(By.ID, "count").text.startswith(f"{len(HOSTILE_TEXTS)} of {len(HOSTILE_TEXTS)} episodes")
    browser.find_elements(By.CSS_SELECTOR, ".ep")[1].click()
    assert "</script><script>alert(1)</script>" in browser.find_element(By.ID, "main").text
