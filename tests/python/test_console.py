"""The web console in headless Chromium (Debian's `chromium`, driven by
Playwright): log in, create a queue, publish, watch the depth change, get
the message, purge, see depth 0; a wrong password shows the error. Also
how the assets are served (content types, cache and security headers, no
auth for assets, auth for every API call).

Starts its own berth with the HTTP API on a free port. The whole test has
a fixed time budget (CONSOLE_TEST_BUDGET_S). A screenshot of the queue
page is saved to target/test-artifacts/console.png."""

import json
import os

import pytest
import requests

from conftest import ROOT, BerthProcess, external_uri

CHROMIUM = "/usr/bin/chromium"
CONSOLE_TEST_BUDGET_S = 90
# Each browser wait gives up after this long.
STEP_TIMEOUT_MS = 10_000
ARTIFACTS = os.path.join(ROOT, "target", "test-artifacts")


@pytest.fixture(scope="module")
def console_berth():
    if external_uri():
        pytest.skip("starts its own berth with --http-listen")
    p = BerthProcess(["--http-listen", "127.0.0.1:0"])
    try:
        yield p.broker
    finally:
        p.stop()


@pytest.fixture
def browser_page():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: tests/python/run.sh installs Debian's chromium package")
    from playwright.sync_api import sync_playwright
    # The console's CSP forbids eval, so waits use selectors and expect(),
    # never wait_for_function with a string.
    with sync_playwright() as pw:
        # --no-sandbox: the test runs as root in a container.
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(STEP_TIMEOUT_MS)
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            # Purge and delete ask first; the test says yes.
            page.on("dialog", lambda d: d.accept())
            yield page
            assert not errors, f"JavaScript errors in the console: {errors}"
        finally:
            browser.close()


def test_assets_are_served_with_types_cache_and_security_headers(console_berth):
    base = f"http://127.0.0.1:{console_berth.http_port}"
    index = requests.get(base + "/", timeout=10)
    assert index.status_code == 200
    assert index.headers["content-type"] == "text/html; charset=utf-8"
    assert index.headers["cache-control"] == "no-cache"
    assert "frame-ancestors 'none'" in index.headers["content-security-policy"]
    assert index.headers["x-content-type-options"] == "nosniff"
    for path, ctype in (("/console/console.js", "text/javascript; charset=utf-8"),
                        ("/console/pages.js", "text/javascript; charset=utf-8"),
                        ("/console/console.css", "text/css; charset=utf-8"),
                        ("/console/favicon.svg", "image/svg+xml")):
        r = requests.get(base + path, timeout=10)
        assert r.status_code == 200 and r.headers["content-type"] == ctype, path
        etag = r.headers["etag"]
        again = requests.get(base + path, headers={"If-None-Match": etag}, timeout=10)
        assert again.status_code == 304 and not again.content, path
    assert requests.get(base + "/console/nope.js", timeout=10).status_code == 404
    assert requests.get(base + "/queues", timeout=10).status_code == 404
    # The API still needs credentials; the console's calls get no browser
    # password dialog (no challenge), other clients get the challenge.
    plain = requests.get(base + "/api/overview", timeout=10)
    assert plain.status_code == 401 and plain.headers["www-authenticate"].startswith("Basic")
    quiet = requests.get(base + "/api/overview", headers={"X-Requested-With": "berth-console"},
                         timeout=10)
    assert quiet.status_code == 401 and "www-authenticate" not in quiet.headers


@pytest.mark.timeout(CONSOLE_TEST_BUDGET_S)
def test_console_logs_in_creates_publishes_gets_and_purges_a_queue(console_berth, browser_page):
    from playwright.sync_api import expect
    expect.set_options(timeout=STEP_TIMEOUT_MS)
    page = browser_page
    base = f"http://127.0.0.1:{console_berth.http_port}"
    page.goto(base + "/")

    # A wrong password shows the server's refusal and keeps the form.
    page.fill("#login-user", "guest")
    page.fill("#login-password", "wrong")
    page.click("#login-submit")
    page.wait_for_selector("#login-error:has-text('Login failed')")
    assert "401 Login failed" in page.text_content("#login-error")
    assert page.is_visible("#login-form") and not page.is_visible("#nav")

    page.fill("#login-password", "guest")
    page.click("#login-submit")
    page.wait_for_selector("#total-queues")
    assert "guest" in page.text_content("#whoami")
    assert "guest" not in page.url  # credentials never in a URL
    assert page.evaluate("sessionStorage.getItem('berth.auth')") == "Z3Vlc3Q6Z3Vlc3Q="

    # Create a queue from the queues page.
    page.click("nav a[href='#/queues']")
    page.fill("#add-queue input[name=name]", "console-q")
    page.click("#add-queue button[type=submit]")
    page.wait_for_selector("#queues a:has-text('console-q')")
    page.click("#queues a:has-text('console-q')")
    page.wait_for_selector("#queue-messages")
    assert page.text_content("#queue-messages") == "0"

    # Publish a message: the depth becomes 1.
    page.fill("#publish textarea[name=payload]", "hello from the console")
    page.click("#publish button[type=submit]")
    page.wait_for_selector("#publish-result:has-text('Message published.')")
    expect(page.locator("#queue-messages")).to_have_text("1")

    # Get it (requeued): the payload shows, the depth stays 1.
    page.click("#get-messages button[type=submit]")
    page.wait_for_selector("#got-messages pre:has-text('hello from the console')")
    expect(page.locator("#queue-messages")).to_have_text("1")
    os.makedirs(ARTIFACTS, exist_ok=True)
    page.screenshot(path=os.path.join(ARTIFACTS, "console.png"), full_page=True)

    # Purge: depth 0, as the API says too.
    page.click("#purge")
    expect(page.locator("#queue-messages")).to_have_text("0")
    r = requests.get(base + "/api/queues/%2F/console-q", auth=("guest", "guest"), timeout=10)
    assert r.json()["messages"] == 0

    # The policies page shows what the server has, or its error text.
    page.click("nav a[href='#/policies']")
    page.wait_for_selector("#policies, #policies-error")
    r = requests.get(base + "/api/policies", auth=("guest", "guest"), timeout=10)
    if r.status_code == 200:
        assert page.is_visible("#policies")
    else:
        assert r.json()["reason"] in page.text_content("#policies-error")

    # Every other page renders without an error (and without JavaScript
    # errors, which the fixture checks).
    for hash_, selector in (("#/", "#chart-rates"), ("#/connections", "#connections"),
                            ("#/channels", "#channels"), ("#/exchanges", "#exchanges"),
                            ("#/exchanges/%2F/amq.direct", "#exchange-bindings"),
                            ("#/users", "#users"), ("#/vhosts", "#vhosts"),
                            ("#/definitions", "#export")):
        page.goto(base + "/" + hash_)
        page.wait_for_selector(selector)
        assert not page.is_visible("#page-error"), (hash_, page.text_content("#page-error"))

    # Definitions: the export downloads as a file, an import uploads one.
    with page.expect_download() as download:
        page.click("#export")
    exported = json.loads(open(download.value.path()).read())
    assert "console-q" in [q["name"] for q in exported["queues"]]
    assert "guest" in [u["name"] for u in exported["users"]]
    defs = {"queues": [{"name": "from-upload", "vhost": "/", "durable": True,
                        "auto_delete": False, "arguments": {}}]}
    page.set_input_files("#import-file", files=[{
        "name": "defs.json", "mimeType": "application/json", "buffer": json.dumps(defs).encode()}])
    page.click("#import")
    expect(page.locator("#import-result")).to_contain_text('"queues": 1')
    r = requests.get(base + "/api/queues/%2F/from-upload", auth=("guest", "guest"), timeout=10)
    assert r.status_code == 200

    # Logging out forgets the credentials.
    page.click("#logout")
    page.wait_for_selector("#login-form")
    assert page.evaluate("sessionStorage.getItem('berth.auth')") is None
