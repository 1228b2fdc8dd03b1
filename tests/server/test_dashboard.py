"""The web dashboard (docs/dashboard.md) in a real headless Chromium (Debian's chromium and chromium-driver,
`make test-deps`) driven by Selenium against a live ``kubetune server`` with a job training: the login refuses
a wrong key, the job appears in the table and its progress moves, its page draws a growing loss curve and
streams the log, cancel ends it, a bad spec shows the error at its field, sweeps show their trials, and the
jobs page paints quickly with 1,000 jobs in the database.

Screenshots go to each test's tmp dir; with ``KUBETUNE_DASHBOARD_SCREENSHOTS=docs/images`` they are also
written there, small, for the docs (``dashboard-*.png``)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import httpx
import pytest

from .conftest import CAPITALS, Server

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
DOCS_SHOTS = os.environ.get("KUBETUNE_DASHBOARD_SCREENSHOTS")
DOCS_WIDTH = 1000  # pixels of a docs screenshot
WAIT_S = 90


def _spec(name: str, steps: int, **training) -> dict:
    return {"name": name, "model": {"source": "builtin://tiny-chat"}, "dataset": {"source": str(CAPITALS), "eval_split": 0.1},
            "method": {"type": "lora", "lora": {"r": 8, "alpha": 16, "target_modules": "all-linear"}},
            "training": {"max_steps": steps, "max_seq_length": 128, "batch_size": 4, "save_steps": 1000, **training}}


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium through chromedriver (skipped when they are missing, except under CI=true)."""
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("chromium and chromium-driver are missing under CI: `make test-deps` installs them")
        pytest.skip("chromium/chromium-driver are not installed (run `make test-deps`: Debian packages chromium, chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,900", "--disable-dev-shm-usage"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture
def server(tmp_path):
    """A live server on SQLite; stopped (and its workers ended) afterwards."""
    made = Server(tmp_path, f"sqlite:///{tmp_path / 'server.db'}")
    yield made
    made.stop()
    made.kill_workers()


def _shot(driver, tmp_path: Path, name: str, size: tuple[int, int] | None = None) -> Path:
    """Save a screenshot in the test's tmp dir (and, small, in the docs folder when asked); ``size``: the
    window's for this one (a tall page, a phone), put back afterwards."""
    out = tmp_path / f"dashboard-{name}.png"
    if size:
        before = driver.get_window_size()
        driver.set_window_size(*size)
        time.sleep(0.5)  # the charts follow the new width
    driver.save_screenshot(str(out))
    if size:
        driver.set_window_size(before["width"], before["height"])
    if DOCS_SHOTS:
        from PIL import Image

        img = Image.open(out).convert("RGB")
        if img.width > DOCS_WIDTH:
            img = img.resize((DOCS_WIDTH, round(img.height * DOCS_WIDTH / img.width)), Image.LANCZOS)
        Path(DOCS_SHOTS).mkdir(parents=True, exist_ok=True)
        img.quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(Path(DOCS_SHOTS) / out.name, optimize=True)
    return out


def _until(predicate, what: str, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except Exception as e:  # noqa: BLE001 - the page is changing under us: look again
            last = e
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def _click(driver, by: str, selector: str) -> None:
    """Find and click in one step, again when the element went stale: the pages re-render rows and buttons as events
    arrive, so an element found a moment ago may be gone."""
    _until(lambda: driver.find_element(by, selector).click() or True, f"{selector} to take the click")


def _login(driver, base: str, key: str, *, enter: bool = False) -> None:
    """Sign in on the login page (``enter``: with the keyboard alone)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver.get(f"{base}/#/login")
    box = _until(lambda: driver.find_element(By.ID, "api-key"), "the login form")
    box.clear()
    box.send_keys(key + (Keys.ENTER if enter else ""))
    if not enter:
        _click(driver, By.ID, "login")


def _step(text: str) -> int:
    head = text.split("/")[0].strip()
    return int(head) if head.isdigit() else -1


def test_dashboard_follows_a_training_job(browser, server, tmp_path):
    from selenium.webdriver.common.by import By

    server.start()
    key = server.key("alpha")
    base = f"http://127.0.0.1:{server.port}"
    headers = {"Authorization": f"Bearer {key}"}

    # a wrong key is refused on the login page, and the assets come from the server itself
    driver = browser
    _login(driver, base, "kt-not-a-key")
    refused = _until(lambda: driver.find_element(By.ID, "login-error").text, "the refusal")
    assert "Key refused" in refused and "Incorrect API key" in refused
    _shot(driver, tmp_path, "login")
    sources = [s.get_attribute("src") or s.get_attribute("href") for s in driver.find_elements(By.CSS_SELECTOR, "script[src], link[href]")]
    assert sources and all(s.startswith(base) for s in sources), sources

    job = httpx.post(f"{server.url}/jobs", json=_spec("dash-live", 400, eval_steps=5), headers=headers, timeout=30).json()
    _login(driver, base, key)
    row = f"tr[data-id='{job['id']}']"
    _until(lambda: driver.find_element(By.CSS_SELECTOR, row), "the job in the table")
    first = _until(lambda: _step(driver.find_element(By.CSS_SELECTOR, f"{row} .steps").text) >= 1 and
                   _step(driver.find_element(By.CSS_SELECTOR, f"{row} .steps").text), "training progress in the table")
    _until(lambda: _step(driver.find_element(By.CSS_SELECTOR, f"{row} .steps").text) > first, "the table's step to move (live stream)")
    _until(lambda: driver.find_elements(By.CSS_SELECTOR, f"{row} .spark polyline"), "a sparkline")
    _shot(driver, tmp_path, "jobs")
    _shot(driver, tmp_path, "phone", size=(390, 844))  # a phone: the page fits its width (the table scrolls inside)
    driver.set_window_size(390, 844)
    assert driver.execute_script("return document.documentElement.scrollWidth") <= 400
    driver.set_window_size(1280, 900)

    _click(driver, By.CSS_SELECTOR, f"{row} a.job-link")
    loss_chart = "[data-chart='Loss']"
    points = _until(lambda: int(driver.find_element(By.CSS_SELECTOR, loss_chart).get_attribute("data-points")) > 1 and
                    int(driver.find_element(By.CSS_SELECTOR, loss_chart).get_attribute("data-points")), "a loss curve")
    _until(lambda: int(driver.find_element(By.CSS_SELECTOR, loss_chart).get_attribute("data-points")) > points, "the curve to grow")
    _until(lambda: "step" in driver.find_element(By.ID, "logs").text, "the log to stream")
    _until(lambda: driver.find_elements(By.CSS_SELECTOR, "#timeline li"), "the events timeline")
    assert '"max_steps": 400' in driver.find_element(By.ID, "spec").text
    _shot(driver, tmp_path, "job", size=(1280, 1500))

    _click(driver, By.ID, "btn-cancel")
    _until(lambda: driver.find_element(By.CSS_SELECTOR, "#job-state .state").text == "cancelled", "the job to be cancelled")
    assert httpx.get(f"{server.url}/jobs/{job['id']}", headers=headers).json()["status"] == "cancelled"

    # a bad spec: the error is shown at its field, with its line
    driver.get(f"{base}/#/submit")
    editor = _until(lambda: driver.find_element(By.ID, "spec-yaml"), "the submit page")
    editor.send_keys(f"name: bad\nmodel: {{source: builtin://tiny-chat}}\ndataset: {{source: {CAPITALS}}}\ntraining:\n  max_steps: many\n")
    _click(driver, By.ID, "validate")
    err = _until(lambda: driver.find_element(By.CSS_SELECTOR, "#spec-errors li[data-field='training.max_steps']"), "the field error")
    assert "line 5" in err.text and "valid integer" in err.text
    assert editor.get_attribute("aria-invalid") == "true"
    _shot(driver, tmp_path, "submit")
    assert [j["id"] for j in httpx.get(f"{server.url}/jobs", headers=headers).json()["data"]] == [job["id"]]  # nothing submitted


def test_sweep_page_overlays_the_trials(browser, server, tmp_path):
    from selenium.webdriver.common.by import By

    server.start()
    key = server.key("alpha")
    base = f"http://127.0.0.1:{server.port}"
    spec = {**_spec("dash-sweep", 3), "sweep": {"grid": {"training.learning_rate": [1e-3, 3e-3]}, "objective": "train_loss"}}
    sw = httpx.post(f"{server.url}/sweeps", json=spec, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert sw.status_code == 200, sw.text
    _login(browser, base, key)
    _until(lambda: browser.find_element(By.ID, "jobs-body"), "the jobs page")
    browser.get(f"{base}/#/sweeps/{sw.json()['id']}")
    _until(lambda: browser.find_element(By.CSS_SELECTOR, "#trials tr.best"), "a finished sweep with its best trial", timeout=180)
    _until(lambda: int(browser.find_element(By.ID, "sweep-chart").get_attribute("data-points")) >= 2, "the trials' curves")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#trials tbody tr")) == 2
    _shot(browser, tmp_path, "sweep")


def test_jobs_page_paints_quickly_with_1000_jobs(browser, server, tmp_path):
    from selenium.webdriver.common.by import By

    from kubetune.server.models import Job
    from kubetune.server.store import Store, new_id

    store = Store(server.db)
    project = store.project("alpha")
    spec, now = _spec("bulk", 3), time.time()
    with store.session() as s:  # one transaction: a thousand finished jobs
        s.add_all(Job(id=new_id("job"), project_id=project["id"], kind="native", model="builtin://tiny-chat", hyperparameters={},
                      method={"type": "lora"}, spec={**spec, "name": f"bulk-{i:04d}"}, status="succeeded", backend="local",
                      created_at=now - 1000 + i, started_at=now - 1000 + i, finished_at=now - 990 + i, events_seen=0) for i in range(1000))
    store.close()
    server.start()
    key = server.key("alpha")
    base = f"http://127.0.0.1:{server.port}"
    _login(browser, base, key, enter=True)
    started = time.monotonic()
    browser.get(f"{base}/#/jobs")
    _until(lambda: len(browser.find_elements(By.CSS_SELECTOR, "#jobs-body tr")) == 50, "the first page of jobs", timeout=30)
    took = time.monotonic() - started
    assert took < 10, f"the jobs page took {took:.1f} s with 1,000 jobs"
    assert browser.find_element(By.ID, "more").is_displayed()
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    browser.refresh()  # focus starts at the top of the page
    _until(lambda: len(browser.find_elements(By.CSS_SELECTOR, "#jobs-body tr")) == 50, "the jobs again", timeout=30)
    ActionChains(browser).send_keys(Keys.TAB).perform()  # the keyboard reaches the skip link, then the navigation
    assert browser.execute_script("return document.activeElement.className") == "skip"
    ActionChains(browser).send_keys(Keys.TAB, Keys.TAB).perform()
    assert browser.execute_script("return document.activeElement.getAttribute('href')") == "#/jobs"
    search = browser.find_element(By.ID, "search")
    search.send_keys("bulk-0999")
    _until(lambda: [r.get_attribute("data-id") for r in browser.find_elements(By.CSS_SELECTOR, "#jobs-body tr")] and
           len(browser.find_elements(By.CSS_SELECTOR, "#jobs-body tr")) == 1, "the search to narrow the table")


def test_quick_lora_job_then_chat_with_it(browser, server, tmp_path, train_file):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    server.start()
    key = server.key("alpha")
    base = f"http://127.0.0.1:{server.port}"
    _login(browser, base, key)
    _until(lambda: browser.find_element(By.ID, "jobs-body"), "the jobs page")
    browser.get(f"{base}/#/submit")
    _until(lambda: browser.find_elements(By.CSS_SELECTOR, "#quick-model option[value='tiny-chat']"), "the server's base models")
    browser.find_element(By.ID, "quick-file").send_keys(str(train_file))
    browser.find_element(By.ID, "quick-submit").click()
    _until(lambda: browser.execute_script("return location.hash").startswith("#/jobs/ftjob-"), "the new job's page")
    box = _until(lambda: browser.find_element(By.ID, "chat-input") if browser.find_element(By.ID, "chat").is_displayed() else None,
                 "the chat panel of the succeeded job", timeout=180)
    box.send_keys("What is the capital of France?" + Keys.ENTER)
    _until(lambda: any(p.text.startswith("model:") for p in browser.find_elements(By.CSS_SELECTOR, "#chat .chat-log p")), "the model's answer",
           timeout=120)
    _until(lambda: browser.find_elements(By.CSS_SELECTOR, "#artifacts button"), "the artifacts")
    browser.execute_script("window.scrollTo(0, 0)")
    _shot(browser, tmp_path, "chat", size=(1280, 1100))
