"""The console in a real browser: Debian's chromium, headless, driven by Selenium through
chromedriver (nothing downloaded). A tenant signs in, the stacked chart is drawn (a canvas
Chart.js rendered into), the page holds its own rows only, no Content-Security-Policy
violation reaches the console log; then the operator's pools table refreshes by itself.

Screenshots go to ``$CONSOLE_SCREENSHOT_DIR`` (default: the test's tmp dir). Skipped when
chromium or chromedriver is missing (``make system-deps`` installs both), except under CI."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.console.conftest import ACME_KEY, ADMIN

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.helpers import GatewayProcess

pytestmark = [pytest.mark.browser, pytest.mark.process]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1280,1400")


@pytest.fixture()
def browser(tmp_path: Path) -> Iterator[Any]:
    if not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)):
        if os.environ.get("CI") == "true":
            pytest.fail("chromium and chromium-driver are not installed (make system-deps)")
        pytest.skip("chromium or chromedriver not installed (make system-deps installs them)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=DRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _shots(tmp_path: Path) -> Path:
    directory = Path(os.environ.get("CONSOLE_SCREENSHOT_DIR") or tmp_path)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _sign_in(driver: Any, url: str, form: str, secret: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(url + "/console/login")
    field = driver.find_element(By.CSS_SELECTOR, f"#{form} input[name=secret]")
    field.send_keys(secret)
    driver.find_element(By.CSS_SELECTOR, f"#{form} button[type=submit]").click()


def _csp_violations(driver: Any) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser")
            if "Content Security Policy" in entry["message"] or "Refused to" in entry["message"]]


def test_a_tenant_sees_its_chart_and_only_its_rows(console: GatewayProcess, browser: Any,
                                                    tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    _sign_in(browser, console.url, "tenant-login", ACME_KEY)
    WebDriverWait(browser, 20).until(lambda d: d.current_url.endswith("/console/tenants/acme"))
    canvas = WebDriverWait(browser, 20).until(
        lambda d: d.find_element(By.CSS_SELECTOR, "#usage-chart[data-rendered]"))
    assert canvas.get_attribute("data-rendered") == "9"  # every series drawn
    assert canvas.size["height"] > 100 and canvas.size["width"] > 300
    # Chart.js drew pixels: the canvas is not blank
    painted = browser.execute_script(
        "var c = arguments[0]; var d = c.getContext('2d').getImageData(0, 0, c.width, c.height)"
        ".data; for (var i = 3; i < d.length; i += 4) { if (d[i] !== 0) return true; }"
        " return false;", canvas)
    assert painted
    assert browser.find_element(By.ID, "tenant").text == "acme"
    body = browser.find_element(By.TAG_NAME, "body").text
    assert "globex" not in body and "initech" not in body
    rows = browser.find_elements(By.CSS_SELECTOR, "#by-day tbody tr")
    assert rows
    browser.save_screenshot(str(_shots(tmp_path) / "console-tenant.png"))
    assert _csp_violations(browser) == []
    # another tenant's page by URL: refused
    browser.get(console.url + "/console/tenants/globex")
    assert "another tenant" in browser.find_element(By.ID, "error").text
    # sign out: back to the sign-in form, and the page is gone
    browser.get(console.url + "/console/tenants/acme")
    browser.find_element(By.CSS_SELECTOR, "form.logout button").click()
    WebDriverWait(browser, 20).until(lambda d: d.current_url.endswith("/console/login"))
    browser.get(console.url + "/console/tenants/acme")
    assert browser.current_url.endswith("/console/login")
    assert _csp_violations(browser) == []


def test_the_operators_pools_refresh_without_a_reload(console: GatewayProcess, browser: Any,
                                                      tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    _sign_in(browser, console.url, "operator-login", ADMIN)
    WebDriverWait(browser, 20).until(lambda d: d.current_url.endswith("/console/operator"))
    browser.execute_script("window.__same_page = true;")
    table = browser.find_element(By.ID, "pools")
    first = WebDriverWait(browser, 20).until(lambda d: table.get_attribute("data-refreshed"))
    WebDriverWait(browser, 20).until(lambda d: table.get_attribute("data-refreshed") != first)
    assert browser.execute_script("return window.__same_page === true;")  # no reload
    assert "chat-0" in table.text
    browser.save_screenshot(str(_shots(tmp_path) / "console-operator.png"))
    assert _csp_violations(browser) == []
