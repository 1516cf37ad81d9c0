"""The page to try onepass (app/http/static, served at /): first over HTTP, then driven in headless Chromium
against a real server on the tiny model, with every number on the page compared with the same
request made with httpx. The browser tests are skipped, saying what is missing, without Chromium
and its driver (`make test` installs them as root on Debian)."""

from __future__ import annotations

import base64
import json
import re
import shlex
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select
from starlette.testclient import TestClient

from app.answering.service import ModelService
from app.calibration.fit import Fit, FitRecord
from app.calibration.store import question_key
from app.config import Settings
from app.http.page import PAGE_DIRECTORY
from app.http.server import create_app
from app.paths import REPO_ROOT
from app.platform.tiny_gguf import write_tiny_gguf
from app.platform.tiny_images import png
from app.platform.tiny_projector import write_tiny_mmproj
from app.serving.registry import ModelRegistry
from app.serving.specs import ModelsConfig, ModelSpec
from app.wire.contract import SystemOneRequest, label_keys
from bench.browser import Page, Tools, chromium, find_tools
from tests.support.live import RunningServer
from tests.support.loading import load_model
from tests.support.settings import tiny_settings
from tests.support.skip_groups import skip

PAGE_FILES = ("/", "/index.html", "/app.js", "/label.js", "/app.css", "/examples.json")
EXAMPLES: dict[str, Any] = json.loads((PAGE_DIRECTORY / "examples.json").read_text())

# What the browser test types into the form: three questions of the three types, and an option
# name that would be markup if the page ever rendered text as HTML.
TRICKY = "<b>Técnico</b> ✓"
TYPED: dict[str, Any] = {
    "model": "tiny-chat",
    "state": "Playground test: I was charged twice for March and want my money back.",
    "questions": {
        "refund": {"type": "noul", "instructions": "Does the customer ask for money back?"},
        "team": {
            "type": "choice",
            "instructions": "Which team handles it?",
            "criteria": {"Billing": "Payments and refunds", TRICKY: None, "Ventas": "New purchases"},
        },
        "anger": {
            "type": "score",
            "instructions": "How frustrated is the customer?",
            "criteria": ["Calm", "Annoyed", "Furious"],
        },
    },
}


# --- over HTTP --------------------------------------------------------------------------------


def test_the_page_is_served_at_the_root_with_a_policy_that_keeps_it_on_this_server(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script src="app.js"' in page.text
    for path in PAGE_FILES:
        response = client.get(path)
        assert response.status_code == 200, path
        policy = response.headers["content-security-policy"]
        assert "default-src 'none'" in policy and "connect-src 'self'" in policy and "script-src 'self'" in policy
        assert response.headers["x-content-type-options"] == "nosniff"


def test_the_page_names_no_address_outside_the_server() -> None:
    for path in PAGE_DIRECTORY.iterdir():
        assert not re.search(r"(https?:)?//\w[\w.-]*\.\w", path.read_text()), path.name


def test_the_api_answers_as_before_beside_the_page(client: TestClient) -> None:
    assert client.get("/v1/systemone").status_code == 405  # a known route with another method
    assert client.get("/nope").json() == {"detail": {"error_type": "not_found", "message": "Not Found"}}
    assert client.post("/").json()["detail"]["error_type"] == "method_not_allowed"
    assert client.get("/health/live").json() == {"status": "ok"}
    assert client.get("/v1/models").status_code == 200


def test_with_an_api_key_the_page_is_served_without_it_and_the_api_still_needs_it(
    tiny_service: ModelService, tiny_chat_path: Path
) -> None:
    app = create_app(tiny_settings(tiny_chat_path, api_key="s3cret"), registry=ModelRegistry.serving(tiny_service))
    with TestClient(app) as secured:
        for path in PAGE_FILES:
            assert secured.get(path).status_code == 200, path
        assert "s3cret" not in secured.get("/").text + secured.get("/app.js").text
        assert secured.get("/v1/models").status_code == 401


def test_no_ui_serves_the_api_only(tiny_service: ModelService, tiny_chat_path: Path) -> None:
    app = create_app(tiny_settings(tiny_chat_path, no_ui=True), registry=ModelRegistry.serving(tiny_service))
    with TestClient(app) as api_only:
        for path in PAGE_FILES:
            assert api_only.get(path).json()["detail"]["error_type"] == "not_found", path
        assert api_only.get("/v1/models").status_code == 200


def test_the_examples_are_valid_requests_and_the_ticket_is_the_readme_s() -> None:
    for example in EXAMPLES.values():
        SystemOneRequest.model_validate(example["request"])
    assert EXAMPLES["ticket"]["request"] == json.loads((REPO_ROOT / "examples" / "ticket.json").read_text())
    states = [type(example["request"]["state"]) for example in EXAMPLES.values()]
    assert str in states and dict in states  # a text state and a structured one


# --- in a browser -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tools() -> Tools:
    found = find_tools()
    if isinstance(found, str):
        skip("browser", f"the page's browser tests need Chromium: {found}")
    return found


@pytest.fixture(scope="module")
def driver(tools: Tools) -> Iterator[WebDriver]:
    browser = chromium(tools)
    try:
        yield browser
    finally:
        browser.quit()


@pytest.fixture
def page(driver: WebDriver, live_url: str) -> Page:
    return Page(driver, live_url)


# The model picker's entries as shown, read in one step.
MODEL_OPTIONS = "return [...document.querySelectorAll('#model option')].map((option) => option.text)"


def fill(field: WebElement, text: str) -> None:
    field.clear()
    field.send_keys(text)


def type_question(page: Page, qid: str, question: dict[str, Any]) -> None:
    """Add a question card and fill it in as a person would."""
    page.one("#add-question").click()
    card = page.all("#questions .question")[-1]
    fill(page.one(".qid", card), qid)
    Select(page.one(".qtype", card)).select_by_value(question["type"])
    fill(page.one(".instructions", card), question["instructions"])
    if question["type"] == "choice":
        items: list[tuple[str, str | None]] = list(question["criteria"].items())
        row_selector, add = ".option", ".add-option"
    elif question["type"] == "score":
        items = [("", level) for level in question["criteria"]]
        row_selector, add = ".level", ".add-level"
    else:
        return
    while len(page.all(row_selector, card)) < len(items):
        page.one(add, card).click()
    for row, (name, description) in zip(page.all(row_selector, card), items, strict=True):
        if name:
            fill(page.one(".name", row), name)
        fill(page.one(".desc", row), description or "")


def type_request(page: Page, body: dict[str, Any]) -> None:
    """The page opened, its example questions removed, and `body`'s state, questions and model typed in."""
    page.open()
    for remove in page.all("#questions .remove"):
        remove.click()
    fill(page.one("#state"), body["state"])
    for qid, question in body["questions"].items():
        type_question(page, qid, question)
    Select(page.one("#model")).select_by_value(body["model"])


def shown(card: WebElement, selector: str) -> tuple[str, float]:
    """A number on the page: (its text, the exact value in its data-value)."""
    node = card.find_element("css selector", selector)
    return node.text, float(node.get_attribute("data-value") or "nan")


def assert_shows(text: str, exact: float, expected: float, digits: int = 3) -> None:
    assert exact == expected  # data-value carries the number the server sent, bit for bit
    assert abs(float(text) - expected) <= 0.5 * 10**-digits + 1e-12 and len(text.split(".")[1]) == digits


def bars(card: WebElement, selector: str = ".bars") -> dict[str, tuple[str, float]]:
    rows = card.find_element("css selector", selector).find_elements("css selector", ".bar")
    return {row.get_attribute("data-key") or "": shown(row, ".num") for row in rows}


def assert_bars(found: dict[str, tuple[str, float]], expected: dict[str, float]) -> None:
    assert list(found) == list(expected)
    for key, (text, exact) in found.items():
        assert_shows(text, exact, expected[key])


def assert_page_shows(page: Page, answers: dict[str, Any]) -> None:
    cards = {card.get_attribute("data-qid"): card for card in page.all("#answers .answer")}
    assert list(cards) == list(answers)
    for qid, answer in answers.items():
        card = cards[qid]
        assert card.get_attribute("data-type") == answer["type"]
        if answer["type"] == "noul":
            assert_shows(*shown(card, ".noul"), answer["noul"])
            probabilities = {"true": answer["noul"], "false": 1 - answer["noul"]}
            raw = {"true": answer["x_raw"], "false": 1 - answer["x_raw"]}
        else:
            probabilities, raw = answer["probabilities"], answer["x_raw"]
            assert_shows(*shown(card, ".confidence"), answer["confidence"])
        if answer["type"] == "choice":
            assert page.one(".choice", card).text == answer["choice"]
        if answer["type"] == "score":
            assert_shows(*shown(card, ".score"), answer["score"])
            labels = [label.text for label in card.find_elements("css selector", ":scope > .bars .label")]
            assert labels == [f"{key} {level}" for key, level in answer["legend"].items()]
        assert_bars(bars(card), probabilities)
        assert_shows(*shown(card, ".mass"), answer["x_label_mass"])
        assert page.all(".warning", card) if answer["x_label_mass"] < 0.5 else not page.all(".warning", card)
        page.one(".raw summary", card).click()  # the uncalibrated numbers, on demand
        assert_bars(bars(card, ".raw .bars"), raw)


def snippet(page: Page, button: str, kind: str) -> str:
    """The code the page hands over after a click on `button`: once the box shows the `kind` asked for
    (after one kind, the box is already shown with the other)."""
    page.click(button)

    def handed_over() -> str | None:
        box = page.one("#snippet")
        return box.get_attribute("value") if box.is_displayed() and box.get_attribute("data-kind") == kind else None

    code: str = page.until(handed_over)
    return code


def test_three_questions_typed_into_the_page_get_the_api_s_numbers_and_a_hit_the_second_time(
    page: Page, live_url: str, tmp_path: Path
) -> None:
    type_request(page, TYPED)
    page.ask()
    assert page.one("#request").get_attribute("data-cache") == "miss" and len(page.all("#request .stack-row")) == 1
    api = httpx.post(live_url + "/v1/systemone", json=TYPED, timeout=60).json()
    assert_page_shows(page, api["answers"])
    assert page.one("#request").get_attribute("data-input-tokens") == str(api["usage"]["input_tokens"])
    assert TRICKY in page.one('#answers .bar[data-key="<b>Técnico</b> ✓"] .label').text  # as text, not markup
    assert not page.all("#answers b")

    ActionChains(page.driver).key_down(Keys.CONTROL).send_keys(Keys.ENTER).key_up(Keys.CONTROL).perform()
    page.until(lambda: page.completed() == 2)
    assert page.one("#request").get_attribute("data-cache") == "hit"
    assert [row.text.split()[:2] for row in page.all("#request .stack-row")] == [["this", "request"], ["state", "new"]]
    assert re.fullmatch(r"Cache hit: .* when this state was new: .* saved \(-?\d+%\)\.", page.one(".saved").text)
    assert_page_shows(page, api["answers"])
    page.screenshot(tmp_path / "playground-tiny.png")

    # Handing over to code: the curl command posts exactly the request on screen...
    words = shlex.split(snippet(page, "#copy-curl", "curl").replace("\\\n", ""))
    assert words[:3] == ["curl", "-s", live_url + "/v1/systemone"]
    assert words[3:5] == ["-H", "Content-Type: application/json"]
    assert words[5] == "-d" and json.loads(words[6]) == TYPED and len(words) == 7
    # ...and the Python runs with the official SDK and gets the same answers.
    namespace: dict[str, Any] = {}
    exec(snippet(page, "#copy-python", "Python"), namespace)
    sdk_answers = namespace["result"].answers
    assert sdk_answers["refund"].noul == api["answers"]["refund"]["noul"]
    assert sdk_answers["team"].probabilities == api["answers"]["team"]["probabilities"]
    assert sdk_answers["anger"].score == api["answers"]["anger"]["score"]


def test_the_page_loads_nothing_from_outside_the_server(page: Page, live_url: str) -> None:
    page.requested()  # what earlier tests left
    page.open()
    page.ask()
    requested = page.requested()
    origin = urlsplit(live_url)
    assert {(urlsplit(url).scheme, urlsplit(url).netloc) for url in requested} == {(origin.scheme, origin.netloc)}
    paths = {urlsplit(url).path for url in requested}
    assert paths == {"/", "/app.js", "/label.js", "/app.css", "/examples.json", "/v1/models", "/v1/systemone"}


def test_an_example_fills_the_form_in_one_click_and_a_json_state_is_sent_as_json(page: Page, live_url: str) -> None:
    page.open()
    page.one('#examples button[data-example="moderation"]').click()
    example = {**EXAMPLES["moderation"]["request"], "model": "tiny-chat"}
    assert page.one("#state-json").is_selected()
    assert json.loads(page.one("#state").get_attribute("value") or "") == example["state"]
    page.ask()
    api = httpx.post(live_url + "/v1/systemone", json=example, timeout=60).json()
    assert_page_shows(page, api["answers"])
    assert page.one("#request").get_attribute("data-input-tokens") == str(api["usage"]["input_tokens"])


def test_an_invalid_form_shows_the_server_s_422_at_the_field(page: Page, live_url: str) -> None:
    page.open()
    anger = next(c for c in page.all("#questions .question") if page.one(".qid", c).get_attribute("value") == "anger")
    for remove in page.all(".level .remove-item", anger)[1:]:
        remove.click()
    page.one("#ask").click()

    box = page.error("422")
    one_level = {**EXAMPLES["ticket"]["request"], "model": page.one("#model").get_attribute("value")}
    one_level["questions"] = {
        **one_level["questions"],
        "anger": {**one_level["questions"]["anger"], "criteria": ["Calm"]},
    }
    detail = httpx.post(live_url + "/v1/systemone", json=one_level, timeout=60).json()["detail"]
    assert [item["loc"] for item in detail] == [["body", "questions", "anger", "score", "criteria"]]
    assert page.one(".field-error", anger).text == detail[0]["msg"]
    assert "body → questions → anger → score → criteria: " + detail[0]["msg"] in box.text
    assert page.all(".invalid", anger)

    # A JSON state that does not parse is caught by the page itself, before anything is sent.
    page.one("#state-json").click()
    page.one("#ask").click()
    page.error("form")
    assert page.one("#state + .field-error").text.startswith("not valid JSON")


def test_a_model_that_is_gone_shows_the_404_with_the_server_s_list(page: Page, live_url: str) -> None:
    page.open()
    page.ask()
    assert "stale" not in (page.one("#results").get_attribute("class") or "")
    # as if a config reload had removed the model after the page listed it
    page.driver.execute_script(
        "const s = document.getElementById('model'); s.add(new Option('gone')); s.value = 'gone';"
    )
    page.one("#ask").click()
    box = page.error("404")
    gone = {**EXAMPLES["ticket"]["request"], "model": "gone"}
    detail = httpx.post(live_url + "/v1/systemone", json=gone, timeout=60).json()["detail"]
    assert f"model_not_found: {detail['message']}" in box.text and "tiny-chat" in detail["message"]
    listed = ["tiny-chat", "jev-latest → tiny-chat"]  # listed again, as the server has them now
    page.until(lambda: page.read(MODEL_OPTIONS) == listed)  # read in one step: the reload replaces the options
    assert "stale" in (page.one("#results").get_attribute("class") or "")  # the answers shown are the last ones


def test_while_the_model_loads_the_page_shows_the_503_and_retries(driver: WebDriver, tiny_chat_path: Path) -> None:
    release = threading.Event()

    def slow_loader(settings: Settings) -> ModelRegistry:
        registry = ModelRegistry.serving(load_model(settings))  # the app owns (and closes) what it loads
        assert release.wait(60), "the test never let the model load"
        return registry

    server = RunningServer(tiny_settings(tiny_chat_path), loader=slow_loader)
    try:
        page = Page(driver, server.base_url)
        page.open(models=False)
        box = page.error("503")
        assert "overloaded: the model is still loading" in box.text and "Retry-After: 5 s" in box.text
        assert not page.all("#model option") and not page.one("#ask").is_enabled()
        release.set()

        def listed() -> bool:
            return bool(page.all("#model option")) and page.one("#ask").is_enabled()

        # "retry now"; the page's own retry after Retry-After may replace the button first, or list the models
        page.click("#error .retry", done=listed)
        page.until(listed)
        assert not page.one("#error").is_displayed()
    finally:
        release.set()
        server.stop()


def test_with_auth_on_the_page_asks_for_the_key_and_keeps_it_in_the_browser(
    driver: WebDriver, tiny_service: ModelService, tiny_chat_path: Path
) -> None:
    server = RunningServer(tiny_settings(tiny_chat_path, api_key="s3cret"), ModelRegistry.serving(tiny_service))
    try:
        page = Page(driver, server.base_url)
        page.open(models=False)

        def prompt() -> bool:
            return page.one("#key-prompt").is_displayed()

        page.until(prompt)
        assert "authentication_error" in page.error("401").text and not page.one("#ask").is_enabled()

        fill(page.one("#key"), "wrong")
        page.one("#key-prompt button").click()
        page.until(lambda: page.one("#key-status").is_displayed() and prompt() and page.one("#error").is_displayed())
        assert page.error("401") and not page.all("#model option")

        fill(page.one("#key"), "s3cret")
        page.one("#key-prompt button").click()
        page.until(lambda: page.all("#model option") and not prompt())
        assert driver.execute_script("return localStorage.getItem('onepass.apiKey')") == "s3cret"
        page.ask()
        assert page.all("#answers .answer")
        curl = snippet(page, "#copy-curl", "curl")
        assert '-H "Authorization: Bearer $ONEPASS_API_KEY"' in curl and "s3cret" not in curl

        page.one("#forget-key").click()
        page.until(prompt)
        assert driver.execute_script("return localStorage.getItem('onepass.apiKey')") is None
    finally:
        server.stop()


def test_an_answer_read_from_the_state_alone_shows_its_numbers_and_fit_without_a_readout(
    driver: WebDriver, tiny_chat_path: Path, tmp_path: Path
) -> None:
    """A state probe fit answers from the state's mean vector: the answer has no x_raw and no
    x_label_mass. The page shows its numbers and the fit that gave them, and neither the label mass
    line nor the uncalibrated bars; the question beside it, read out, keeps both."""
    settings = tiny_settings(tiny_chat_path, calibration="contextual", calibration_dir=tmp_path)
    service = load_model(settings)
    request = SystemOneRequest.model_validate(TYPED)
    refund = request.questions["refund"]
    width = service.engine.n_embd
    rng = np.random.default_rng(0)
    fit = Fit(
        "state_probe",
        tuple(label_keys(refund)),
        bias=(0.3, -0.3),
        centre=(0.0,) * width,
        spread=(1.0,) * width,
        weights=tuple(tuple(float(w) for w in rng.normal(0.0, 0.05, width)) for _ in range(2)),
        conformity=tuple(sorted(float(x) for x in rng.uniform(0.0, 0.7, 30))),  # held-out answers: sets at 90%
    )
    assert service.calibration.store is not None
    service.calibration.store.put(
        FitRecord(question_key(refund), refund.model_dump(mode="json"), "state_probe/0.001", fit, 60)
    )
    server = RunningServer(settings, ModelRegistry.serving(service))
    try:
        asked = {**TYPED, "questions": {qid: TYPED["questions"][qid] for qid in ("refund", "team")}}
        page = Page(driver, server.base_url)
        type_request(page, asked)
        page.ask()
        api = httpx.post(server.base_url + "/v1/systemone", json=asked, timeout=60).json()["answers"]
        assert "x_raw" not in api["refund"] and "x_label_mass" not in api["refund"]
        assert api["refund"]["x_calibration"]["method"] == "state_probe/0.001"
        cards = {card.get_attribute("data-qid"): card for card in page.all("#answers .answer")}
        assert list(cards) == ["refund", "team"]
        assert_shows(*shown(cards["refund"], ".noul"), api["refund"]["noul"])
        assert_bars(bars(cards["refund"]), {"true": api["refund"]["noul"], "false": 1 - api["refund"]["noul"]})
        assert page.one(".fit-line", cards["refund"]).text == "calibrated by your fit state_probe/0.001 (60 examples)"
        labels = ", ".join("yes" if label else "no" for label in api["refund"]["x_set"]["labels"])
        check = "" if len(api["refund"]["x_set"]["labels"]) == 1 else " not one label: check this answer"
        assert page.one(".set-line", cards["refund"]).text == f"answer set at 90%: {{{labels}}}{check}"
        assert not page.all(".set-line", cards["team"])  # no fit: no set
        assert not page.all(".mass-line", cards["refund"]) and not page.all(".raw", cards["refund"])
        assert_shows(*shown(cards["team"], ".mass"), api["team"]["x_label_mass"])
        assert page.all(".raw", cards["team"]) and not page.all(".fit-line", cards["team"])
    finally:
        server.stop()
        service.close()


def png_asset(data: bytes) -> dict[str, str]:
    return {"type": "image", "format": "png", "data_base64": base64.b64encode(data).decode()}


def drop_file(page: Page, name: str, data: bytes, mime: str) -> None:
    """`data` dropped on the page's image area as a file dragged from the desktop would be."""
    page.driver.execute_script(
        "const [name, b64, mime] = arguments;"
        "const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));"
        "const transfer = new DataTransfer();"
        "transfer.items.add(new File([bytes], name, { type: mime }));"
        "const area = document.getElementById('images');"
        "for (const kind of ['dragover', 'drop'])"
        "  area.dispatchEvent(new DragEvent(kind, { dataTransfer: transfer, bubbles: true, cancelable: true }));",
        name,
        base64.b64encode(data).decode(),
        mime,
    )


def test_an_image_attached_on_the_page_is_answered_and_a_hit_the_second_time(driver: WebDriver, tmp_path: Path) -> None:
    """A model with a vision projector and one without: the page offers images for the first only; a
    PNG picked in the file input shows its thumbnail and is answered as the API answers it, a hit the
    second time; a dropped file that is not an image shows the server's 422 at its thumbnail."""
    text = write_tiny_gguf(tmp_path / "text.gguf")
    eyes = ModelSpec("eyes", text, settings=tiny_settings(text, mmproj=write_tiny_mmproj(tmp_path / "mmproj.gguf")))
    blind = ModelSpec("blind", text, settings=tiny_settings(text))
    registry = ModelRegistry(ModelsConfig((eyes, blind), "eyes", 2))
    server = RunningServer(eyes.settings, registry)
    photo = tmp_path / "photo.png"
    photo.write_bytes(png(40, 30, seed=5))
    try:
        page = Page(driver, server.base_url)
        page.open()
        picker, note = page.one("#image-input"), page.one("#image-note")
        Select(page.one("#model")).select_by_value("blind")
        assert not picker.is_enabled() and "blind takes no images" in note.text and "--mmproj" in note.text
        Select(page.one("#model")).select_by_value("eyes")
        assert picker.is_enabled()

        fill(page.one("#state"), "The paper on the table.")
        picker.send_keys(str(photo))
        page.until(lambda: page.all("#thumbnails .thumbnail"))
        assert page.one("#thumbnails .thumbnail code").text == "<image-1>"
        page.until(lambda: page.read("return arguments[0].naturalWidth", page.one("#thumbnails .thumbnail img")) == 40)
        assert page.one("#state").get_attribute("value") == "<image-1> The paper on the table."

        page.ask()
        assert page.one("#request").get_attribute("data-cache") == "miss"
        body = {**EXAMPLES["ticket"]["request"], "model": "eyes", "state": "<image-1> The paper on the table."}
        body["assets"] = {"<image-1>": png_asset(photo.read_bytes())}
        api = httpx.post(server.base_url + "/v1/systemone", json=body, timeout=60).json()
        assert api["x_cache"] == "hit"  # the page's request was this one
        assert_page_shows(page, api["answers"])
        assert page.one("#request").get_attribute("data-input-tokens") == str(api["usage"]["input_tokens"])
        page.ask()
        assert page.one("#request").get_attribute("data-cache") == "hit"
        assert page.one(".saved").text.startswith("Cache hit: ")
        assert_page_shows(page, api["answers"])
        page.screenshot(tmp_path / "playground-image.png")

        namespace: dict[str, Any] = {}  # the Python handed over sends the image with the SDK
        exec(snippet(page, "#copy-python", "Python"), namespace)
        assert namespace["result"].answers["refund"].noul == api["answers"]["refund"]["noul"]

        drop_file(page, "notes.txt", b"not a picture", "text/plain")
        page.until(lambda: len(page.all("#thumbnails .thumbnail")) == 2)
        page.one("#ask").click()
        box = page.error("422")
        bad = png_asset(b"not a picture")  # the page sends a file of another type as png: the bytes decide
        refused = {**body, "state": "<image-2> " + body["state"], "assets": {**body["assets"], "<image-2>": bad}}
        detail = httpx.post(server.base_url + "/v1/systemone", json=refused, timeout=60).json()["detail"]
        assert [item["type"] for item in detail] == ["image_format"]
        assert detail[0]["loc"][:3] == ["body", "assets", "<image-2>"]
        assert detail[0]["msg"] in box.text
        second = page.all("#thumbnails .thumbnail")[1]
        assert page.one(".field-error", driver.find_element("css selector", "#thumbnails")).text == detail[0]["msg"]
        assert "invalid" in (second.get_attribute("class") or "")

        page.one(".remove-image", second).click()  # the refused file removed, its placeholder with it
        assert page.one("#state").get_attribute("value") == "<image-1> The paper on the table."
        page.ask()
        assert page.one("#request").get_attribute("data-cache") == "hit"
        page.one('#examples button[data-example="ticket"]').click()  # another request: no image in it
        assert not page.all("#thumbnails .thumbnail")
    finally:
        server.stop()
        registry.close()
