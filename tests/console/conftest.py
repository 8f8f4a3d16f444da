"""The console as a real process (uvicorn) in front of the session's server, and a headless
Chromium driven by playwright. The console's tests run on one backend (SQLite): the console
only speaks gRPC, and the server's rules are tested on both backends elsewhere."""

from __future__ import annotations

import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from effect_ledger_client import Ledger

# Found as scripts/test.sh finds it (`command -v chromium`), Debian's path when it is not on PATH.
CHROMIUM = os.environ.get("EFFECT_LEDGER_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# Set by scripts/test.sh: a missing browser then fails the browser tests instead of skipping them.
REQUIRE_BROWSER = os.environ.get("EFFECT_LEDGER_REQUIRE_BROWSER") == "1"
AXE_SCRIPT = Path(__file__).resolve().parents[1] / "fixtures" / "axe-core" / "axe.min.js"
START_TIMEOUT_SECONDS = 20.0


@pytest.fixture(scope="session")
def backend() -> str:
    return "sqlite"


@dataclass
class ConsoleProcess:
    server_target: str
    extra_args: tuple[str, ...] = ()
    # With --tls-cert: the CA (PEM file) the console's certificate is checked against, over HTTPS.
    tls_ca: str | None = None
    process: subprocess.Popen | None = None
    port: int = 0
    log_path: Path | None = None

    def start(self) -> ConsoleProcess:
        folder = Path(tempfile.mkdtemp(prefix="el-console-"))
        port_file, self.log_path = folder / "port", folder / "console.log"
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "effect_ledger_client.console",
                "--listen",
                "127.0.0.1:0",
                "--server",
                self.server_target,
                "--port-file",
                str(port_file),
                *self.extra_args,
            ],
            stdout=self.log_path.open("ab"),
            stderr=subprocess.STDOUT,
            cwd=folder,
        )
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the console exited with {self.process.returncode}:\n{self.log()}")
            if port_file.exists() and port_file.read_text().strip():
                self.port = int(port_file.read_text())
                try:
                    if httpx.get(f"{self.url}/sign-in", timeout=1.0, verify=self.verify).status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"the console did not start in time:\n{self.log()}")

    @property
    def url(self) -> str:
        return f"{'https' if self.tls_ca else 'http'}://127.0.0.1:{self.port}"

    @property
    def verify(self) -> ssl.SSLContext | bool:
        return ssl.create_default_context(cafile=self.tls_ca) if self.tls_ca else True

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path else ""

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture(scope="module")
def console(server):
    running = ConsoleProcess(server.target).start()
    yield running
    running.stop()


@pytest.fixture
def ledgers(server, tenant):
    """The tenant's principals as clients of the client distribution, by principal id."""
    clients = {principal: Ledger(server.target, token) for principal, token in tenant.tokens.items()}
    yield clients
    for client in clients.values():
        client.close()


def csrf_token_of(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found, "no CSRF token in the page"
    return found.group(1)


def sign_in_http(client: httpx.Client, token: str) -> httpx.Response:
    """Signs in through the console's form, as a browser would, without following the redirect."""
    page = client.get("/sign-in")
    return client.post("/sign-in", data={"csrf_token": csrf_token_of(page.text), "token": token})


# --- the browser ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        missing = f"no Chromium at {CHROMIUM} (apt-get install chromium)"
        if REQUIRE_BROWSER:
            pytest.fail(f"{missing}, and EFFECT_LEDGER_REQUIRE_BROWSER=1", pytrace=False)
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture(scope="session")
def screenshot_folders(tmp_path_factory) -> list[Path]:
    """Where each page's screenshot goes: under pytest's tmp dir, and EFFECT_LEDGER_SCREENSHOTS."""
    folders = [tmp_path_factory.mktemp("console-screenshots")]
    extra = os.environ.get("EFFECT_LEDGER_SCREENSHOTS")
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        folders.append(Path(extra))
    return folders


class Browsing:
    """One signed-in browser context on the console, with the checks every page gets."""

    def __init__(
        self, browser, console: ConsoleProcess, screenshot_folders: list[Path], javascript: bool = True
    ) -> None:
        self.context = browser.new_context(viewport={"width": 1200, "height": 900}, java_script_enabled=javascript)
        self.page = self.context.new_page()
        self.console = console
        self.screenshot_folders = screenshot_folders
        self.console_errors: list[str] = []
        self.page.on("console", lambda message: message.type == "error" and self.console_errors.append(message.text))

    def open(self, path: str) -> None:
        self.page.goto(f"{self.console.url}{path}")

    def sign_in(self, token: str) -> None:
        self.open("/sign-in")
        self.page.get_by_label("Bearer token").fill(token)
        self.page.get_by_role("button", name="Sign in").click()
        self.page.wait_for_url("**/approvals")

    def screenshot(self, name: str) -> None:
        image = self.page.screenshot(full_page=True)
        for folder in self.screenshot_folders:
            (folder / f"{name}.png").write_bytes(image)

    def check_accessibility(self) -> None:
        """axe-core on the page as it is: no serious or critical violation. The script is
        evaluated through the DevTools protocol: an injected <script> (add_script_tag) would be
        refused by the console's Content-Security-Policy, as it should be."""
        self.page.evaluate(AXE_SCRIPT.read_text())
        result = self.page.evaluate("async () => await axe.run(document)")
        serious = [
            f"{violation['id']} ({violation['impact']}): {violation['help']} at "
            + ", ".join(
                node["target"][0] if isinstance(node["target"][0], str) else str(node["target"])
                for node in violation["nodes"][:3]
            )
            for violation in result["violations"]
            if violation["impact"] in ("serious", "critical")
        ]
        assert not serious, f"{self.page.url}: " + "; ".join(serious)

    def visit(self, name: str) -> None:
        """The checks of every page: screenshot, accessibility, nothing blocked by the CSP."""
        self.screenshot(name)
        self.check_accessibility()
        assert not [e for e in self.console_errors if "Content Security Policy" in e], self.console_errors

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def browsing(browser, console, screenshot_folders):
    """A factory of signed-out browser contexts on the console, closed after the test."""
    opened: list[Browsing] = []

    def open_browsing(javascript: bool = True) -> Browsing:
        opened.append(Browsing(browser, console, screenshot_folders, javascript))
        return opened[-1]

    yield open_browsing
    for each in opened:
        each.close()
