"""The page's Label tab in headless Chromium against a real server on the tiny model with a labelling
session: five states labelled with clicks, each saved to the labels file, and the answers on screen
changed by the refit that the fifth label makes possible (3 labelled in the states file + 5 = the 8 a
fit needs); and a state saved or skipped while the tab was asking for the answers again is not shown
again.
Skipped, saying what is missing, without Chromium and its driver.

The tab replaces its nodes as it polls the server, so the tests read it in one script call that
returns plain values (READ_TAB), and click what they find again on each try (Page.click)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.webdriver.chrome.webdriver import WebDriver

from app.labelling.labels import LabelsFile, labels_path
from app.labelling.session import LabellingFiles, read_states
from app.serving.registry import ModelRegistry
from bench.browser import WAIT_S, Page, chromium, find_tools
from tests.support.labelling_states import write_states
from tests.support.live import RunningServer
from tests.support.loading import load_model
from tests.support.settings import tiny_settings
from tests.support.skip_groups import skip

# What the user clicks for the five states the tab shows: every team seen, one urgent ticket.
GIVEN: list[dict[str, Any]] = [
    {"team": "Beta", "urgent": False},
    {"team": "Gamma", "urgent": True},
    {"team": "Alpha", "urgent": False},
    {"team": "Alpha", "urgent": False},
    {"team": "Alpha", "urgent": False},
]
ANSWERING_S = 120  # the session answers every state before the tab shows one
REFIT_S = 120  # a refit, and the answers computed again from it


@pytest.fixture
def driver() -> Iterator[WebDriver]:
    found = find_tools()
    if isinstance(found, str):
        skip("browser", f"the Label tab's browser test needs Chromium: {found}")
    browser = chromium(found)
    try:
        yield browser
    finally:
        browser.quit()


@pytest.fixture
def served(tiny_chat_path: Path, tmp_path: Path) -> Iterator[tuple[RunningServer, Path]]:
    """A server with a labelling session on 24 states, 3 of them labelled in the states file: the server
    and the states file."""
    states = write_states(tmp_path / "states.jsonl", 24, labelled=3)
    files = LabellingFiles(read_states(states), LabelsFile(labels_path(states)))
    settings = tiny_settings(tiny_chat_path, calibration="contextual", calibration_dir=tmp_path / "fits")
    service = load_model(settings)
    server = RunningServer(settings, ModelRegistry.serving(service), labelling=files)
    try:
        yield server, states
    finally:
        server.stop()
        service.close()


# The tab as the user sees it, read in one step: the tab replaces its nodes as it polls the server
# every second (the figures on each poll, the answers after each refit), so a node found in one
# WebDriver call may be gone in the next. Plain values: the state on screen, by question its current
# answer (as the server sent it), that line's text and its off-format warning, the label picked;
# the figures table's cells by question; the refit whose answers the state shows, the last save's count
# of labels and the refit's status.
READ_TAB = """
const text = (node) => (node ? node.innerText : null);
const questions = {};
for (const card of document.querySelectorAll("#label-questions .to-label")) {
  const current = card.querySelector(".current");
  const picked = card.querySelector("input:checked");
  questions[card.dataset.qid] = {
    answer: current ? JSON.parse(current.dataset.answer) : null,
    text: text(current),
    warning: text(current && current.querySelector(".warning")),
    picked: picked ? JSON.parse(picked.dataset.value) : null,
  };
}
const figures = {};
for (const row of document.querySelectorAll("#label-figures tr[data-question]")) {
  figures[row.dataset.question] = [...row.cells].map((cell) => cell.innerText);
}
const card = document.getElementById("label-state");
return {
  shown: !card.hidden,
  state: Number(card.dataset.state),
  questions,
  figures,
  refreshed: card.dataset.refit ?? null,
  saved: document.getElementById("label-saved").dataset.saved ?? null,
  refit: document.getElementById("refit-status").dataset.status ?? "",
};
"""


def tab(page: Page) -> dict[str, Any]:
    read: dict[str, Any] = page.read(READ_TAB)
    return read


def tab_once(page: Page, holds: Callable[[dict[str, Any]], bool], timeout: float = WAIT_S) -> dict[str, Any]:
    """The tab, read again until `holds` is true of what was read."""

    def read_holding() -> dict[str, Any] | None:
        read = tab(page)
        return read if holds(read) else None

    found: dict[str, Any] = page.until(read_holding, timeout)
    return found


def figures_of(read: dict[str, Any], question: str) -> str:
    return " ".join(read["figures"].get(question, []))


def shown_answers(read: dict[str, Any]) -> dict[str, Any]:
    """The current answers on screen, by question id, as the server sent them."""
    return {qid: card["answer"] for qid, card in read["questions"].items() if card["answer"] is not None}


def pick(page: Page, qid: str, value: Any) -> None:
    """Click `value`'s radio in `qid`'s card, found again if a refit re-rendered the card meanwhile."""
    radio = f"input[data-value={json.dumps(json.dumps(value))}]"  # the value's JSON, as a CSS string
    page.click(f'#label-questions .to-label[data-qid="{qid}"] {radio}')


def label_state(page: Page, answers: dict[str, Any], labelled: int) -> int:
    """Pick `answers` for the state on screen and save them, until the tab says `labelled` labels are
    kept: that state's line."""
    line: int = tab(page)["state"]
    for qid, value in answers.items():
        pick(page, qid, value)
    picked = tab(page)
    assert picked["state"] == line  # the picks are on that state
    assert {qid: card["picked"] for qid, card in picked["questions"].items()} == answers
    page.click("#label-save")
    tab_once(page, lambda read: read["saved"] == str(labelled))
    return line


def test_five_states_labelled_in_the_tab_and_the_refit_changes_the_answers_shown(
    driver: WebDriver, served: tuple[RunningServer, Path], tmp_path: Path
) -> None:
    server, states = served
    page = Page(driver, server.base_url)
    driver.get(server.base_url + "/#label")
    shown = tab_once(page, lambda read: read["shown"], timeout=ANSWERING_S)
    assert not page.one("#ask-view").is_displayed()
    assert page.one("#label-status").get_attribute("data-answering") == "done"
    assert page.one("#labels-file").text == str(labels_path(states))
    assert "no fit yet (3 of 8 labels)" in figures_of(shown, "team")
    labelled = []
    before: dict[int, Any] = {}
    for n, answers in enumerate(GIVEN):
        shown = tab(page)
        answered = shown_answers(shown)
        assert set(answered) == {"team", "urgent"} and "x_calibration" not in answered["team"]  # no fit yet
        team = shown["questions"]["team"]
        assert "no set" in team["text"]
        # the tiny model's random weights put a share far below one half on the labels: said so
        share = math.floor(answered["team"]["x_label_mass"] * 100 + 0.5)  # as Math.round
        assert f"off format: {share}% of the next token on the labels" in team["warning"]
        if n == len(GIVEN) - 1:  # every state's answers before the label that makes a fit possible
            offered = httpx.get(server.base_url + "/v1/labelling/next?count=50", timeout=30).json()["states"]
            before = {s["state"]: s["answers"] for s in offered}
        labelled.append(label_state(page, answers, labelled=4 + n))
        assert labelled[-1] == shown["state"]
    kept = LabelsFile(labels_path(states)).lines()
    assert [kept[line]["answers"] for line in labelled] == GIVEN

    # the refit after the fifth label: the answers on screen are the fit's now
    fitted = tab_once(page, lambda read: "x_calibration" in shown_answers(read).get("team", {}), REFIT_S)
    line = fitted["state"]
    now = {
        s["state"]: s["answers"]
        for s in httpx.get(server.base_url + "/v1/labelling/next?count=50", timeout=30).json()["states"]
    }
    assert shown_answers(fitted) == now[line] and now[line] != before[line]
    assert "x_calibration" not in before[line]["team"] and "x_set" in now[line]["team"]
    current = fitted["questions"]["team"]["text"]
    assert f"fit {now[line]['team']['x_calibration']['method']}" in current and "set at 90%: {" in current
    figures = tab_once(page, lambda read: "no fit yet" not in figures_of(read, "team"))
    cells = figures["figures"]["team"]
    assert cells[1] == "8" and cells[2] == now[line]["team"]["x_calibration"]["method"]
    assert figures["refit"].startswith("done")
    page.screenshot(tmp_path / "label-tab.png")


def skip_state(page: Page, line: int) -> dict[str, Any]:
    """Skip the state on screen (`line`): the tab once it shows another one, or none."""
    page.click("#label-skip")
    return tab_once(page, lambda read: not read["shown"] or read["state"] != line)


# Holds every reply to the tab's "the answers again, after a refit" request (all 50 states), once the
# server has sent it, until the test lets it through: window.heldReplies[i]() lets the i-th one through.
HOLD_REFRESHES = """
const send = window.fetch;
window.heldReplies = [];
window.fetch = async (...args) => {
  const response = await send(...args);
  if (!String(args[0]).includes("v1/labelling/next?count=50")) return response;
  const body = await response.text();
  await new Promise((letThrough) => window.heldReplies.push(letThrough));
  return new Response(body, { status: response.status, statusText: response.statusText, headers: response.headers });
};
"""


def test_a_state_saved_while_the_tab_asked_for_the_answers_again_is_not_shown_again(
    driver: WebDriver, served: tuple[RunningServer, Path]
) -> None:
    """A refit ends, and the tab asks for every state's answers again; the user saves a label and skips a
    state before the reply comes. The reply lists both as states to label, as they were when the server
    answered; the tab must not offer them again. Skipping through the tab then shows every other
    unlabelled state once."""
    server, _ = served
    page = Page(driver, server.base_url)
    driver.get(server.base_url + "/#label")
    tab_once(page, lambda read: read["shown"], timeout=ANSWERING_S)
    page.read(HOLD_REFRESHES)
    first = label_state(page, GIVEN[0], labelled=4)  # its refit ends and the tab asks for the answers again
    page.until(lambda: page.read("return window.heldReplies.length") >= 1, timeout=REFIT_S)
    second = label_state(page, GIVEN[1], labelled=5)  # saved while the server's reply lists it unlabelled
    skipped = tab(page)["state"]
    skip_state(page, skipped)  # skipped while the reply lists it too
    page.read("window.heldReplies[0]()")  # the other replies stay held: no later one hides what this one did
    read = tab_once(page, lambda read: read["refreshed"] is not None)

    seen = []
    while read["shown"]:
        seen.append(read["state"])
        read = skip_state(page, read["state"])
    assert not {first, second, skipped} & set(seen)
    assert len(seen) == len(set(seen)) == 24 - 3 - 2 - 1  # every other unlabelled state, once
