#!/usr/bin/env python3
"""Drives headless Chromium through the DevTools protocol against a running
coordinator's dashboard: loads /dashboard/ (expects the login form), logs in
with the admin token through the form, waits (bounded) until the page's own
JavaScript has drawn what the test asks for, checks the DOM, and saves a
screenshot and the DOM to OUT_DIR.

usage: dashboard_browser.py BASE_URL TOKEN_FILE OUT_DIR JOB_ID [--recovery]
The job's members come from /dashboard/api/job (bearer token); the
timeline must show spans for each of them.
Exit 0 when every check passed; 1 with the reason otherwise.
Needs chromium and python3-websocket (Debian packages)."""
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import websocket

TOTAL_S = 150  # the whole run, browser start to screenshot


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


# DevTools answers these while the page navigates (a form submit, a redirect):
# the script ran in a document that is gone. A bounded wait retries them; any
# other error fails the run.
NAVIGATION_ERRORS = ("Inspected target navigated or closed", "Execution context was destroyed",
                     "Cannot find context with specified id")


class NavigationRace(Exception):
    pass


class Page:
    """One page target over a DevTools websocket; every call bounded."""

    def __init__(self, ws_url):
        self.ws = websocket.create_connection(ws_url, timeout=20, suppress_origin=True)
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        deadline = time.time() + 20
        while time.time() < deadline:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    text = str(msg["error"].get("message", ""))
                    if any(e in text for e in NAVIGATION_ERRORS):
                        raise NavigationRace(f"{method}: {msg['error']}")
                    fail(f"{method}: {msg['error']}")
                return msg.get("result", {})
        fail(f"{method}: no answer in 20 s")

    def eval(self, expression):
        # A navigation in flight is retried for up to 5 s (20 tries).
        for attempt in range(20):
            try:
                r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
                break
            except NavigationRace as e:
                if attempt == 19:
                    fail(f"the page kept navigating for 5 s: {e}")
                time.sleep(0.25)
        if "exceptionDetails" in r:
            fail(f"script failed: {expression[:80]}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, what, expression, timeout_s):
        deadline = time.time() + timeout_s
        value = None
        while time.time() < deadline:
            value = self.eval(expression)
            if value:
                return value
            time.sleep(0.25)
        fail(f"{what}: not true within {timeout_s} s (last value {value!r})")


def stop(signum, frame):
    # SIGTERM (timeout, ctest) and the overall alarm: exit through the
    # `finally` below, which stops the browser.
    fail(f"stopped by signal {signum}" if signum != signal.SIGALRM else f"not done within {TOTAL_S} s")


def main():
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGALRM, stop)
    signal.alarm(TOTAL_S)
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    want_recovery = "--recovery" in sys.argv
    if len(args) != 4:
        fail(__doc__)
    base, token_file, out_dir, job_id = args
    token = open(token_file).read().strip()
    req = urllib.request.Request(f"{base}/dashboard/api/job?id={job_id}",
                                 headers={"Authorization": "Bearer " + token})
    job = json.load(urllib.request.urlopen(req, timeout=10))["job"]
    workers = [m["id"] for m in job["members"]]
    if len(workers) < 2:
        fail(f"job {job_id} has members {workers}, want 2")
    os.makedirs(out_dir, exist_ok=True)
    profile = tempfile.mkdtemp(prefix="tandem-chromium-")
    chrome = subprocess.Popen(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
         "--disable-background-networking", "--disable-sync", "--hide-scrollbars", "--mute-audio",
         f"--user-data-dir={profile}", "--remote-debugging-port=0", "--window-size=1280,900", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(out_dir, "chromium.log"), "w"),
        start_new_session=True)
    try:
        port_file = os.path.join(profile, "DevToolsActivePort")
        deadline = time.time() + 30
        while not os.path.exists(port_file) or not open(port_file).read().strip():
            if chrome.poll() is not None:
                fail(f"chromium exited with {chrome.returncode} (see {out_dir}/chromium.log)")
            if time.time() > deadline:
                fail("chromium wrote no DevToolsActivePort in 30 s")
            time.sleep(0.1)
        port = int(open(port_file).read().split()[0])
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
        page = Page(next(t for t in targets if t["type"] == "page")["webSocketDebuggerUrl"])
        page.call("Page.enable")
        page.call("Runtime.enable")

        # Not logged in: the login form, with no data.
        page.call("Page.navigate", url=f"{base}/dashboard/#job={job_id}")
        page.wait_for("login form", "!!document.getElementById('login-form')", 15)
        if page.eval("!!document.getElementById('workers')"):
            fail("the dashboard was shown without a token")
        # A wrong token is refused, the right one logs in (session cookie).
        page.eval("document.getElementById('token').value = 'wrong-token';"
                  "setTimeout(() => document.getElementById('login-form').submit(), 0); true")
        page.wait_for("refusal of a wrong token",
                      "document.getElementById('login-message') && "
                      "document.getElementById('login-message').textContent.includes('wrong token')", 15)
        page.eval(f"document.getElementById('token').value = {json.dumps(token)};"
                  "setTimeout(() => document.getElementById('login-form').submit(), 0); true")
        page.wait_for("dashboard after login", "!!document.getElementById('workers')", 15)
        cookie = page.eval("document.cookie")
        if "tandem_session" in (cookie or ""):
            fail("the session cookie is readable from JavaScript (not HttpOnly)")

        # What the page's JavaScript draws from the JSON endpoints.
        page.wait_for("worker rows", f"document.querySelectorAll('#workers tbody tr').length >= {len(workers)}", 20)
        page.wait_for("job rows", "document.querySelectorAll('#jobs tbody tr').length >= 1", 20)
        for series in ("loss", "reward", "accuracy", "tokens_per_s"):
            page.wait_for(f"chart {series} has points",
                          f"Number(document.querySelector('svg.chart[data-series=\"{series}\"]')"
                          f".getAttribute('data-points') || 0) >= 2 && "
                          f"!!document.querySelector('svg.chart[data-series=\"{series}\"] polyline')", 30)
        for w in workers:
            page.wait_for(f"timeline spans of worker {w}",
                          f"document.querySelectorAll('#timeline g.row[data-worker=\"{w}\"] rect.span').length >= 3",
                          20)
        phases = page.eval("[...new Set([...document.querySelectorAll('#timeline rect.span')]"
                           ".map(r => r.getAttribute('data-phase')))]")
        for p in ("rollout", "score", "update"):
            if p not in phases:
                fail(f"no {p} span in the timeline (phases: {phases})")
        page.wait_for("checkpoint rows", "document.querySelectorAll('#checkpoints tbody tr').length >= 1", 20)
        if want_recovery:
            page.wait_for("a recovery event", "[...document.querySelectorAll('#recoveries li')]"
                          ".some(li => li.textContent.includes('recovered in'))", 20)
            page.wait_for("a recovery band in the timeline", "document.querySelectorAll('#timeline rect.recovery').length >= 1", 20)

        # Full-page screenshot and the DOM as the browser has it.
        height = page.eval("Math.ceil(document.documentElement.scrollHeight)")
        page.call("Emulation.setDeviceMetricsOverride", width=1280, height=min(int(height), 2400),
                  deviceScaleFactor=1, mobile=False)
        time.sleep(0.5)
        shot = page.call("Page.captureScreenshot", format="png")
        with open(os.path.join(out_dir, "dashboard.png"), "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        with open(os.path.join(out_dir, "dashboard.html"), "w") as f:
            f.write(page.eval("document.documentElement.outerHTML"))
        summary = page.eval("JSON.stringify({"
                            "points: [...document.querySelectorAll('svg.chart')].map(s => s.getAttribute('data-series') + '=' + s.getAttribute('data-points')),"
                            "spans: document.querySelectorAll('#timeline rect.span').length,"
                            "workers: document.querySelectorAll('#workers tbody tr').length})")
        print("dashboard ok: " + summary)
    finally:
        signal.alarm(0)
        try:
            os.killpg(chrome.pid, signal.SIGTERM)
            chrome.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(chrome.pid, signal.SIGKILL)
            chrome.wait(timeout=10)
        except ProcessLookupError:
            pass
        # Chromium's helper processes leave after the main one: wait for the
        # whole group (5 s), then kill what is left.
        for _ in range(50):
            try:
                os.killpg(chrome.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            try:
                os.killpg(chrome.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    main()
