"""The documentation site (mkdocs.yml, docs/) as a reader sees it: built with --strict as
`make test` builds it, served over HTTP on 127.0.0.1, and opened in a real headless Chromium.
Its navigation lists the pages, and a click on one shows that page with its title."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
from starlette.staticfiles import StaticFiles

from tests.helpers import HANG_S, ROOT, chromium, serve

pytestmark = pytest.mark.e2e

MKDOCS = ROOT / ".venv" / "bin" / "mkdocs"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    built = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(built)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with serve(StaticFiles(directory=built, html=True)) as url:
        yield url


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    with chromium(tmp_path / "chromium") as driver:
        yield driver


def visible_texts(driver: webdriver.Chrome, selector: str) -> list[str]:
    return [
        element.text.strip()
        for element in driver.find_elements(By.CSS_SELECTOR, selector)
        if element.is_displayed()
    ]


def test_the_site_opens_with_its_navigation_and_a_click_shows_a_page(
    site: str, browser: webdriver.Chrome
) -> None:
    # Given the site's home page
    browser.get(f"{site}/")
    wait = WebDriverWait(browser, HANG_S)
    wait.until(lambda driver: visible_texts(driver, ".md-tabs__link"))
    assert browser.find_element(By.CSS_SELECTOR, ".md-content h1").text == "llmtasks"
    # Its tabs name the sections of the nav
    tabs = visible_texts(browser, ".md-tabs__link")
    assert tabs == ["Home", "Getting started", "Using it", "Operating", "Internals"], tabs

    # When the reader opens "Using it", its first page shows and the sidebar lists the section's pages
    browser.find_element(By.LINK_TEXT, "Using it").click()
    wait.until(lambda driver: driver.find_element(By.CSS_SELECTOR, ".md-content h1").text == "The HTTP API")
    pages = visible_texts(browser, ".md-sidebar--primary .md-nav__link")
    for page in ("HTTP API", "SDK and CLI", "OpenAI surface", "Batches", "Webhooks", "Keys and budgets"):
        assert page in pages, pages

    # And a click on one of them shows that page, with its title and its own table of contents
    next(
        link
        for link in browser.find_elements(By.CSS_SELECTOR, ".md-sidebar--primary a.md-nav__link")
        if link.is_displayed() and link.text.strip() == "Webhooks"
    ).click()
    wait.until(lambda driver: driver.find_element(By.CSS_SELECTOR, ".md-content h1").text == "Webhooks")
    assert browser.current_url.rstrip("/").endswith("/webhooks")
    assert "Retries and the DLQ" in visible_texts(browser, ".md-sidebar--secondary .md-nav__link")
    assert browser.title.startswith("Webhooks")
