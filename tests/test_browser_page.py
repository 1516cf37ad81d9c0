"""bench/browser.py's Page in headless Chromium, on pages of a few lines: a wait treats an element that the
page replaced as "not yet", a click waits until its element can be clicked, and a read returns plain values
in one step. The page and label tab tests rely on these: both pages replace nodes as they re-render.
Skipped, saying what is missing, without Chromium and its driver."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import quote

import pytest
from selenium.webdriver.chrome.webdriver import WebDriver

from bench.browser import Page, chromium, find_tools
from tests.support.skip_groups import skip

# Replaces the paragraph #line with a new node that says "replaced", as a re-render does.
REPLACE = (
    "const node = Object.assign(document.createElement('p'), { id: 'line', textContent: 'replaced' });"
    "document.getElementById('line').replaceWith(node);"
)


@pytest.fixture(scope="module")
def driver() -> Iterator[WebDriver]:
    found = find_tools()
    if isinstance(found, str):
        skip("browser", f"the browser helper's tests need Chromium: {found}")
    browser = chromium(found)
    try:
        yield browser
    finally:
        browser.quit()


def opened(driver: WebDriver, html: str) -> Page:
    driver.get("data:text/html;charset=utf-8," + quote(html))
    return Page(driver, "")


def test_a_condition_whose_element_the_page_replaced_is_tried_again(driver: WebDriver) -> None:
    page = opened(driver, '<p id="line">first</p>')
    tries = 0

    def replaced_on_first_try() -> bool:
        nonlocal tries
        tries += 1
        found = page.one("#line")
        if tries == 1:  # between the find and the read, as a poll that re-renders would
            page.read(REPLACE)
        return found.text == "replaced"

    assert page.until(replaced_on_first_try, timeout=30)
    assert tries == 2


def test_a_click_waits_until_its_element_can_be_clicked(driver: WebDriver) -> None:
    # the button shows itself a moment after the page loads, as the page's own work would
    page = opened(
        driver,
        '<button id="go" hidden onclick="this.textContent = \'clicked\'">go</button>'
        "<script>setTimeout(() => { document.getElementById('go').hidden = false; }, 300);</script>",
    )
    page.click("#go", timeout=30)
    assert page.read("return document.getElementById('go').textContent") == "clicked"


def test_a_click_is_not_needed_once_what_it_asks_for_is_done(driver: WebDriver) -> None:
    page = opened(driver, '<button id="go" hidden>go</button><p id="line">done</p>')
    page.click("#go", done=lambda: page.one("#line").text == "done", timeout=30)  # never shown: not clicked


def test_a_read_returns_plain_values_in_one_step(driver: WebDriver) -> None:
    page = opened(driver, '<ul><li data-n="1">a</li><li data-n="2">b</li></ul>')
    script = "return [...document.querySelectorAll('li')].map((li) => [li.textContent, Number(li.dataset.n)])"
    assert page.read(script) == [["a", 1], ["b", 2]]
