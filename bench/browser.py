"""Headless Chromium driven by Selenium, for the page's browser test and its README screenshot.

The browser and its driver come from the system (Debian: `apt-get install chromium chromium-driver`,
which `make test` does as root); both are named explicitly, so Selenium never tries to download one.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.common.exceptions import (
    ElementClickInterceptedException,
    ElementNotInteractableException,
    NoSuchElementException,
    StaleElementReferenceException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
DRIVER = "chromedriver"
WAIT_S = 30  # the longest any step waits for the page
# What a wait treats as "not yet": the element is not there yet, or the page replaced one the condition
# had found (the Label tab re-renders as it polls the server, the model list as it reloads).
NOT_YET = (NoSuchElementException, StaleElementReferenceException)
# What a click treats as "not yet" besides those: the element is there but hidden or covered for now.
NOT_CLICKABLE_YET = (*NOT_YET, ElementNotInteractableException, ElementClickInterceptedException)


@dataclass(frozen=True)
class Tools:
    browser: str
    driver: str


def find_tools() -> Tools | str:
    """The browser and its driver, or what is missing, in words."""
    browser = next((found for name in BROWSERS if (found := shutil.which(name))), None)
    driver = shutil.which(DRIVER)
    if browser is not None and driver is not None:
        return Tools(browser, driver)
    missing = [what for what, found in (("chromium", browser), ("chromedriver", driver)) if found is None]
    return f"{' and '.join(missing)} not found (apt-get install chromium chromium-driver; make test does, as root)"


def chromium(tools: Tools, width: int = 1200, height: int = 900) -> WebDriver:
    options = webdriver.ChromeOptions()
    options.binary_location = tools.browser
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", f"--window-size={width},{height}"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})  # every request the page makes
    return webdriver.Chrome(options=options, service=Service(tools.driver))


class Page:
    """The playground in a browser: the few steps a test or a screenshot takes, each with a bounded wait."""

    def __init__(self, driver: WebDriver, url: str) -> None:
        self.driver = driver
        self.url = url

    def until(self, condition: Callable[[], Any], timeout: float = WAIT_S) -> Any:
        """What `condition` returns once it is truthy, tried again while an element it reads is missing or
        replaced: a condition finds its elements itself, on every try."""
        return WebDriverWait(self.driver, timeout, ignored_exceptions=NOT_YET).until(lambda _: condition())

    def read(self, script: str, *args: Any) -> Any:
        """What `script` returns: plain values read from the DOM in one step of the page's own thread, so no
        re-render comes between two of its reads."""
        return self.driver.execute_script(script, *args)

    def click(self, selector: str, done: Callable[[], Any] | None = None, timeout: float = WAIT_S) -> None:
        """Click what `selector` finds, found again on each try, until a click lands; with `done`, until
        that holds instead (the page may have done what the click asks for by itself)."""

        def clicked() -> bool:
            if done is not None and done():
                return True
            try:
                self.one(selector).click()
            except NOT_CLICKABLE_YET:
                return False
            return True

        self.until(clicked, timeout)

    def one(self, selector: str, root: WebElement | None = None) -> WebElement:
        return (root or self.driver).find_element("css selector", selector)

    def all(self, selector: str, root: WebElement | None = None) -> list[WebElement]:
        return (root or self.driver).find_elements("css selector", selector)

    def open(self, models: bool = True) -> None:
        """Load the page; with `models`, until the model picker is filled and the form holds an example."""
        self.driver.get(self.url + "/")
        if models:
            self.until(lambda: self.all("#model option") and self.all("#questions .question"))

    def completed(self) -> int:
        return int(self.one("#request").get_attribute("data-completed") or 0)

    def ask(self, timeout: float = WAIT_S) -> None:
        """Click Ask and wait for the answers."""
        before = self.completed()
        self.click("#ask")
        self.until(lambda: self.completed() > before, timeout)

    def error(self, status: str) -> WebElement:
        """The error box, once it shows `status` (an HTTP status, or "form" for the page's own checks)."""

        def shown() -> WebElement | None:
            box = self.one("#error")
            return box if box.is_displayed() and box.get_attribute("data-status") == status else None

        box: WebElement = self.until(shown)
        return box

    def requested(self) -> list[str]:
        """The URLs the browser requested since the last call (data: URLs left out)."""
        urls = []
        for entry in self.driver.get_log("performance"):  # type: ignore[no-untyped-call]
            message = json.loads(entry["message"])["message"]
            if message["method"] == "Network.requestWillBeSent":
                urls.append(message["params"]["request"]["url"])
        return [url for url in urls if not url.startswith("data:")]

    def screenshot(self, path: Path) -> Path:
        """The whole page, top to bottom, at the window's width."""
        width = self.driver.get_window_size()["width"]
        height = self.driver.execute_script("return document.documentElement.scrollHeight")
        self.driver.set_window_size(width, int(height) + 140)  # the window's frame takes part of its height
        self.driver.execute_script("window.scrollTo(0, 0)")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.driver.save_screenshot(str(path))
        return path
