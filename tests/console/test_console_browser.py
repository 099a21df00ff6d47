"""The console in a real browser: Debian's chromium, headless, driven by Selenium through
chromedriver (nothing downloaded). A tenant signs in, the stacked chart and the spend chart
are drawn (canvases Chart.js rendered into), the page holds its own rows only, no
Content-Security-Policy violation reaches the console log; then the operator's pools table
refreshes by itself and its chart of each pool's TTFT p50 gains points while streamed
requests run. A tenant creates a key on its page, uses it with the openai client, revokes it
and is refused; an operator sees a canary's gates charted against their thresholds, rolls it
back from the page, and the next requests go to the stable version.

Screenshots go to ``$CONSOLE_SCREENSHOT_DIR`` (default: the test's tmp dir). Skipped when
chromium or chromedriver is missing (``make system-deps`` installs both), except under CI."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.console.conftest import ACME_KEY, ADMIN, GLOBEX_KEY, console_policy, start_console
from tests.helpers import policy, usage_records
from tests.rollouts.traffic import progressive_policy

if TYPE_CHECKING:
    from collections.abc import Iterator

    from gateway.sim.server import SimServer
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


def _painted(driver: Any, canvas: Any) -> bool:
    """Chart.js drew pixels: the canvas is not blank."""
    return bool(driver.execute_script(
        "var c = arguments[0]; var d = c.getContext('2d').getImageData(0, 0, c.width, c.height)"
        ".data; for (var i = 3; i < d.length; i += 4) { if (d[i] !== 0) return true; }"
        " return false;", canvas))


def _full_page_screenshot(driver: Any, path: Path) -> None:
    """The whole page, as tall as it is (the window grown to it, then put back)."""
    width, height = driver.get_window_size()["width"], driver.get_window_size()["height"]
    full = int(driver.execute_script("return document.documentElement.scrollHeight;"))
    driver.set_window_size(width, max(height, full + 120))
    time.sleep(0.3)  # the charts resize to the window
    driver.save_screenshot(str(path))
    driver.set_window_size(width, height)


class _Streams:
    """Streamed chat completions, one after another in a thread, until the block ends (a
    streamed answer's first chunk is what a backend's TTFT is measured on)."""

    def __init__(self, url: str, key: str) -> None:
        self.url, self.key = url, key
        self.statuses: Counter[int] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Streams:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        import httpx

        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                with client.stream("POST", self.url + "/v1/chat/completions",
                                   headers={"Authorization": f"Bearer {self.key}"},
                                   json={"model": "chat-model", "stream": True, "max_tokens": 8,
                                         "messages": [{"role": "user", "content": "hi"}]},
                                   ) as answer:
                    for _ in answer.iter_bytes():
                        pass
                    self.statuses[answer.status_code] += 1
                self._stop.wait(0.2)  # well inside the plan's 600 requests a minute


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
    assert _painted(browser, canvas)
    spend = browser.find_element(By.CSS_SELECTOR, "#spend-chart[data-rendered]")
    assert spend.get_attribute("data-rendered") == "2"  # per day and to date
    assert spend.size["height"] > 100 and spend.size["width"] > 150
    assert _painted(browser, spend)
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
    """The pools table refreshes in place; while streamed requests run, the TTFT chart gains
    points (one per pool and poll) and the backend's row shows its TTFT p50 and p99."""
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
    assert browser.find_element(By.ID, "teams").find_element(
        By.CSS_SELECTOR, 'tr[data-team="labs"]').text.startswith("labs corp globex")
    assert browser.find_elements(By.CSS_SELECTOR, '#organizations tr[data-organization="corp"]')
    chart = browser.find_element(By.CSS_SELECTOR, "#ttft-chart[data-rendered]")
    before = int(chart.get_attribute("data-points"))
    with _Streams(console.url, GLOBEX_KEY) as load:
        WebDriverWait(browser, 40).until(
            lambda d: int(chart.get_attribute("data-points")) >= before + 3)
    assert set(load.statuses) == {200} and load.statuses[200] >= 3
    assert chart.get_attribute("data-rendered") == "1"  # pool chat
    assert _painted(browser, chart)
    backend = next(r for r in table.find_elements(By.CSS_SELECTOR, "tbody tr")
                   if "chat-0" in r.text)
    cells = backend.find_elements(By.TAG_NAME, "td")
    assert float(cells[5].text) > 0 and float(cells[6].text) >= float(cells[5].text)
    _full_page_screenshot(browser, _shots(tmp_path) / "console-operator.png")
    assert _csp_violations(browser) == []


def _chat(url: str, key: str) -> tuple[int, str]:
    """One chat completion with the openai client: (status, the pool that served it)."""
    import openai

    api = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30)
    try:
        answer = api.chat.completions.with_raw_response.create(
            model="chat-model", messages=[{"role": "user", "content": "hi"}], max_tokens=8)
    except openai.APIStatusError as exc:
        return exc.status_code, ""
    return answer.status_code, answer.headers.get("x-gateway-pool", "")


def test_a_tenant_creates_uses_and_revokes_a_key(console: GatewayProcess, browser: Any,
                                                 tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    _sign_in(browser, console.url, "tenant-login", ACME_KEY)
    WebDriverWait(browser, 20).until(lambda d: d.current_url.endswith("/console/tenants/acme"))
    browser.find_element(By.ID, "key-name").send_keys("from the browser")
    browser.find_element(By.ID, "key-days").send_keys("7")
    browser.find_element(By.CSS_SELECTOR, "#create-key button[type=submit]").click()
    field = WebDriverWait(browser, 20).until(lambda d: d.find_element(By.ID, "new-key"))
    key, key_id = field.get_attribute("value"), browser.find_element(By.ID, "new-key-id").text
    assert key.startswith("sk-gw-") and key not in browser.current_url
    browser.save_screenshot(str(_shots(tmp_path) / "console-new-key.png"))
    assert _chat(console.url, key)[0] == 200
    browser.find_element(By.ID, "back-to-keys").click()
    row = f'#key-list tr[data-key-id="{key_id}"]'
    WebDriverWait(browser, 20).until(lambda d: d.find_elements(By.CSS_SELECTOR, row))
    assert key not in browser.page_source  # shown once
    browser.find_element(By.CSS_SELECTOR, f"{row} form.revoke button").click()
    WebDriverWait(browser, 20).until(
        lambda d: d.find_element(By.CSS_SELECTOR, f"{row} td.state").text.startswith("revoked"))
    deadline = time.monotonic() + 5
    while _chat(console.url, key)[0] != 401 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _chat(console.url, key)[0] == 401
    assert _csp_violations(browser) == []


@pytest.fixture()
def canary(sim: SimServer, tmp_path: Path) -> Iterator[GatewayProcess]:
    """A console gateway whose model ``chat-model`` is a progressive canary at 50% (v2, pool
    ``canary``) over v1 (pool ``stable``), held there for an hour."""
    data = console_policy(sim, tmp_path)
    data["pools"] = policy({"stable": [sim.url], "canary": [sim.url]})["pools"]
    progressive_policy(data, steps=[50, 100], hold="1h", min_requests=1_000_000)
    gw = start_console(sim, tmp_path, data)
    try:
        yield gw
    finally:
        gw.stop()


def _phase(url: str) -> str:
    import httpx

    answer = httpx.get(url + "/admin/rollouts/chat-model", timeout=30,
                       headers={"Authorization": f"Bearer {ADMIN}"})
    assert answer.status_code == 200, answer.text
    return str(answer.json()["phase"])


def test_an_operator_rolls_a_canary_back(canary: GatewayProcess, browser: Any,
                                         tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    deadline = time.monotonic() + 20
    while _phase(canary.url) != "progressing" and time.monotonic() < deadline:
        time.sleep(0.2)
    pools = {_chat(canary.url, GLOBEX_KEY)[1] for _ in range(24)}
    assert pools == {"stable", "canary"}  # 50% each way: both served
    _sign_in(browser, canary.url, "operator-login", ADMIN)
    WebDriverWait(browser, 20).until(lambda d: d.current_url.endswith("/console/operator"))
    row = '#rollout-list tr[data-model="chat-model"]'
    assert browser.find_element(By.CSS_SELECTOR, f"{row} td.phase").text == "progressing"
    assert browser.find_element(By.CSS_SELECTOR, f"{row} td.share").text == "50.0%"
    gates = WebDriverWait(browser, 20).until(lambda d: d.find_element(
        By.CSS_SELECTOR, '#rollout-list tr[data-chart-of="chat-model"] canvas[data-rendered]'))
    assert int(gates.get_attribute("data-rendered")) >= 1  # a bar group per gate and class
    assert _painted(browser, gates)
    browser.execute_script("document.getElementById('rollouts').scrollIntoView();")
    browser.save_screenshot(str(_shots(tmp_path) / "console-rollouts.png"))
    browser.find_element(By.CSS_SELECTOR, f'{row} button[data-action="abort"]').click()
    WebDriverWait(browser, 20).until(
        lambda d: d.find_element(By.CSS_SELECTOR, f"{row} td.phase").text == "aborted")
    assert _phase(canary.url) == "aborted"
    since = int(time.time() * 1000)
    served = [_chat(canary.url, GLOBEX_KEY) for _ in range(12)]
    assert served == [(200, "stable")] * 12
    deadline = time.monotonic() + 10
    while True:
        after = [r for r in usage_records(canary.url, ADMIN)
                 if r["ts_ms"] >= since and r["model"] == "chat-model"]
        if len(after) >= 12 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(after) >= 12 and {r["version"] for r in after} == {"v1"}
    browser.get(canary.url + "/console/operator/audit")
    assert "rollout chat-model abort -> aborted" in browser.find_element(By.ID, "audit").text
    assert _csp_violations(browser) == []
