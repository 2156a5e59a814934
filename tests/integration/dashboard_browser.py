#!/usr/bin/python3
"""Looks at the coordinator's web dashboard, over HTTPS, in a real headless Chromium.

Run by dashboard_cluster_test (tests/integration/dashboard_cluster_test.cc) against a
live secure cluster whose job JOB is RUNNING on two ranks; it can be run by hand the
same way. With Debian's chromium and chromium-driver, through python3-selenium:

  dashboard_browser.py --url https://127.0.0.1:PORT --job JOB --token-file viewer.token
                       --ca ca.pem --screenshot OUT.png

Chromium trusts the test CA (--ca) as a browser trusts any CA: it is added to an NSS
certificate database (certutil, Debian's libnss3-tools) in a HOME of the script's own,
where Chromium on Linux reads its trusted roots; the system's trust store is left
alone, and no certificate error is ignored. The HTTP checks verify against --ca too.

What it checks (each failure is printed and makes the exit status 1):
  1. without a token the page and the API are refused (401), in the browser too, and
     the page links to the login form; a token in the address is neither taken nor
     echoed (303 to the path alone, in any spelling);
  2. the login form, filled in and posted, sets an HttpOnly, SameSite=Strict, Secure
     cookie and lands on the job's page;
  3. the rank table shows rank 0 and rank 1 with their workers (and no GPU memory or
     utilization: they train on the CPU), and its step and loss cells change between
     two reads a few seconds apart (the page redraws);
  4. both charts draw a line for each rank; the attempts table and the output appear;
  5. the front page lists the job and both workers;
  6. the page's Log out button clears the cookie: the pages are refused again.
It prints one JSON object (what it saw) on stdout and saves a screenshot of the job
page. Exit 77: chromium, chromedriver or selenium is missing (skipped).
"""
import argparse
import base64
import hashlib
import http.client
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

SKIP = 77


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def trusting_home(ca_file):
    """A fresh HOME whose NSS database (~/.pki/nssdb, where Chromium on Linux reads
    trusted roots) trusts `ca_file` for TLS servers."""
    home = tempfile.mkdtemp(prefix="ddp-chromium-home-")
    db = "sql:" + os.path.join(home, ".pki", "nssdb")
    os.makedirs(os.path.join(home, ".pki", "nssdb"))
    subprocess.run(["certutil", "-d", db, "-N", "--empty-password"], check=True,
                   capture_output=True)
    subprocess.run(["certutil", "-d", db, "-A", "-n", "ddp test CA", "-t", "C,,", "-i",
                    ca_file], check=True, capture_output=True)
    return home


def http_status(url, context, headers=None):
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def raw_get(url, context, target):
    """One GET of `target`, redirects not followed: (status, Location, whole answer)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=10, context=context)
    try:
        conn.request("GET", target)
        r = conn.getresponse()
        body = r.read().decode(errors="replace")
        return r.status, r.getheader("Location"), str(r.headers) + body
    finally:
        conn.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--token-file", required=True)
    p.add_argument("--ca", required=True, help="the CA that signed the dashboard's certificate")
    p.add_argument("--screenshot", required=True)
    args = p.parse_args()

    chromium, driver_bin = find_chromium(), shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        from selenium.webdriver.common.by import By
    except ImportError:
        webdriver = None
    if not chromium or not driver_bin or webdriver is None or not shutil.which("certutil"):
        print("skipped: the browser test needs chromium, chromium-driver, python3-selenium "
              "and certutil (libnss3-tools) (scripts/install_deps.sh installs them)",
              file=sys.stderr)
        return SKIP

    token = open(args.token_file).read().strip()
    base = args.url.rstrip("/")
    job_url = base + "/jobs/" + args.job
    failures = []
    seen = {}

    def check(ok, what):
        if not ok:
            failures.append(what)
            print("FAILED: " + what, file=sys.stderr)

    context = ssl.create_default_context(cafile=args.ca)

    # 1. No token: refused, with a message saying how to pass one.
    status, body = http_status(job_url, context)
    seen["no_token_page_status"] = status
    check(status == 401, f"GET {job_url} without a token answered {status}, not 401")
    check("/login?next=" in body, "the 401 page does not link to the login form")
    status, _ = http_status(base + "/api/jobs/" + args.job, context)
    seen["no_token_api_status"] = status
    check(status == 401, f"the API without a token answered {status}, not 401")
    status, _ = http_status(base + "/api/jobs/" + args.job, context,
                            {"Authorization": "Bearer " + token})
    seen["bearer_api_status"] = status
    check(status == 200, f"the API with the viewer token answered {status}, not 200")
    # A token in the address: never taken, never echoed, whatever its spelling.
    seen["token_in_address"] = []
    for query in ("token=", "x=1&%74oken=", "TOKEN="):
        target = "/jobs/" + args.job + "?" + query + token
        status, location, answer = raw_get(base, context, target)
        seen["token_in_address"].append([query, status, location])
        check(status == 303 and location == "/jobs/" + args.job and token not in answer,
              "%s answered %s to %s, or echoed the token" % (query, status, location))

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    # The test CA trusted as a browser trusts a CA: Chromium (started by chromedriver,
    # which passes its environment on) reads the NSS database of this HOME.
    home = trusting_home(args.ca)
    os.environ["HOME"] = home
    options.add_argument("--user-data-dir=" + os.path.join(home, "profile"))
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1400,1700", "--hide-scrollbars", "--force-device-scale-factor=1"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_bin), options=options)
    try:
        driver.set_page_load_timeout(30)
        driver.get(job_url)
        text = driver.find_element(By.TAG_NAME, "body").text
        seen["no_token_browser"] = text[:200]
        check("401" in text and "requires authentication" in text,
              "the browser without a token was not shown the 401 page: " + text[:200])
        check(driver.execute_script("return location.protocol") == "https:",
              "the page is not served over HTTPS: " + driver.current_url)

        # 2. The login form: the 401 page's link, the token typed in, posted once.
        driver.find_element(By.LINK_TEXT, "Log in").click()
        seen["login_url"] = driver.current_url
        check("/login?next=" in driver.current_url, "the link does not lead to the login form")
        field = driver.find_element(By.NAME, "token")
        field.send_keys(token)
        driver.find_element(By.CSS_SELECTOR, "form.login button").click()
        wait_url = time.time() + 15
        while time.time() < wait_url and not driver.current_url.endswith("/jobs/" + args.job):
            time.sleep(0.1)
        seen["url_after_login"] = driver.current_url
        check(driver.current_url == job_url,
              "the login did not land on the job's page: " + driver.current_url)
        cookies = {c["name"]: c for c in driver.get_cookies()}
        cookie = cookies.get("ddp_token", {})
        seen["cookie"] = {k: cookie.get(k) for k in ("httpOnly", "sameSite", "secure", "path")}
        check(cookie.get("httpOnly") is True, "the token cookie is not HttpOnly")
        check(cookie.get("sameSite") == "Strict", "the token cookie is not SameSite=Strict")
        check(cookie.get("secure") is True, "the token cookie is not Secure")

        # 3. The rank table: both ranks, and it redraws as steps arrive.
        # Tables are read in one script call: the page replaces its rows every second,
        # so element handles held across calls would go stale.
        def table(selector):
            return driver.execute_script(
                "return [...document.querySelectorAll(arguments[0] + ' tbody tr')]"
                ".map(tr => [...tr.cells].map(td => td.textContent))", selector)

        def rows():
            # RANK WORKER STATE EPOCH STEP LOSS SAMPLES/S STEP-MS COMM-MS GPU-MEM GPU-UTIL UPDATED
            return {cells[0]: cells for cells in table("#ranks") if len(cells) == 12}

        def wait(pred, timeout=30):
            end = time.time() + timeout
            while time.time() < end:
                value = pred()
                if value:
                    return value
                time.sleep(0.25)
            return None

        first = wait(lambda: (lambda r: r if {"0", "1"} <= set(r) and all(
            r[k][4] != "-" for k in ("0", "1")) else None)(rows()))
        check(first is not None, "the rank table never showed ranks 0 and 1 with steps: %s" % rows())
        first = first or {}
        seen["first"] = first
        if first:
            check({first["0"][1], first["1"][1]} == {"w1", "w2"},
                  "the ranks' workers are not w1 and w2: %s" % first)
            check(first["0"][2] == "running" and first["1"][2] == "running",
                  "the ranks are not shown running: %s" % first)
            check(all(first[k][9] == "-" and first[k][10] == "-" for k in ("0", "1")),
                  "CPU ranks show GPU memory or utilization: %s" % first)
        time.sleep(3)
        second = wait(lambda: (lambda r: r if {"0", "1"} <= set(r) and any(
            (r[k][3], r[k][4], r[k][5]) != (first.get(k, [""] * 12)[3], first.get(k, [""] * 12)[4],
                                            first.get(k, [""] * 12)[5]) for k in ("0", "1"))
            else None)(rows()), timeout=20)
        seen["second"] = second
        check(second is not None, "the rank table did not change in 20 s: %s" % rows())

        # 4. Charts, attempts, output.
        def js(script, *args):
            return driver.execute_script(script, *args)

        for chart in ("chart-loss", "chart-speed"):
            def drawn():
                return js("return [...document.querySelectorAll('#' + arguments[0] + ' polyline')]"
                          ".map(p => p.getAttribute('data-rank'))", chart)
            ranks = wait(lambda: set(drawn()) >= {"0", "1"} or None, timeout=15)
            seen[chart] = sorted(set(drawn()))
            check(ranks is not None, "%s does not draw both ranks: %s" % (chart, seen[chart]))
        # The job's newest checkpoint and what a preemption now would lose (it
        # checkpoints every 5 steps and moves at its next one: nothing).
        meta = wait(lambda: (lambda t: t if "checkpoint step" in t else None)(
            js("return document.getElementById('job-meta').textContent")), timeout=20)
        seen["job_meta"] = meta
        check(meta is not None and "a preemption now loses nothing" in meta,
              "the job's line does not show its checkpoint and preemption loss: %s" % meta)
        # Where each step went: the STEP MS cell's tooltip (the built-in trainer on
        # the CPU measures its phases).
        phases = wait(lambda: (lambda t: t if t and "compute" in t else None)(
            js("const td = document.querySelector('#ranks tbody tr td:nth-child(8)');"
               " return td ? td.title : null")), timeout=15)
        seen["step_phases"] = phases
        check(phases is not None and "data " in phases and "optimizer " in phases,
              "the step's phases are not shown: %s" % phases)
        attempts = table("#attempts")
        seen["attempts"] = attempts
        check(len(attempts) >= 1 and attempts[0][1] == "RUNNING", "no RUNNING attempt shown")
        logs = wait(lambda: (lambda t: t if t not in ("", "(no output yet)") else None)(
            js("return document.getElementById('logs').textContent")), timeout=15)
        seen["logs_lines"] = len((logs or "").splitlines())
        check(logs is not None, "the output is empty")
        error = js("const e = document.getElementById('error'); return e.hidden ? null : e.textContent")
        check(error is None, "the page shows an error: %s" % error)
        driver.execute_script("window.scrollTo(0, 0)")
        time.sleep(1.2)  # One more redraw with the newest step, for the picture.
        driver.save_screenshot(args.screenshot)
        seen["screenshot"] = args.screenshot

        # 5. The front page, through the cookie.
        driver.get(base + "/")
        listed = wait(lambda: [r for r in table("#jobs") if r and r[0] == args.job] or None)
        seen["listed"] = listed
        check(listed is not None and listed[0][1] == "RUNNING",
              "the front page does not list the job as RUNNING: %s" % listed)
        workers = wait(lambda: (lambda names: names if {"w1", "w2"} <= names else None)(
            {r[0] for r in table("#workers") if r}))
        seen["workers"] = sorted(workers or [])
        check(workers is not None, "the front page does not list w1 and w2")

        # 6. Log out: the cookie goes, and the pages are refused again.
        driver.find_element(By.CSS_SELECTOR, "form.logout button").click()
        wait_url = time.time() + 15
        while time.time() < wait_url and "/login" not in driver.current_url:
            time.sleep(0.1)
        seen["url_after_logout"] = driver.current_url
        check("/login" in driver.current_url, "logging out did not lead to the login form")
        check("ddp_token" not in {c["name"] for c in driver.get_cookies()},
              "the token cookie is still there after logging out")
        driver.get(base + "/")
        text = driver.find_element(By.TAG_NAME, "body").text
        check("401" in text, "the front page is still shown after logging out: " + text[:200])
    finally:
        driver.quit()
        shutil.rmtree(home, ignore_errors=True)

    seen["failures"] = failures
    print(json.dumps(seen))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
