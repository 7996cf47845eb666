"""The dashboard's access rules against a real store: token off loopback, Host checks, no path escapes,
record text always escaped, SQL only through the locked-down rollout connection, one-line errors."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from fastapi.testclient import TestClient
from starlette.routing import Route

from reprorl import DashboardServer, Store, create_dashboard
from reprorl.dashboard.app import ROUTERS
from reprorl.hashing import content_hash
from reprorl.store import RunRecord
from reprorl.store.rollouts import RolloutWriter
from reprorl.types import Message, Role, Split, Task, TaskSet
from rollout_records import batch

XSS = '<script>window.__xss = 1</script><img src=x onerror="alert(1)">'
SECRET = "top-secret-outside-the-store"
HOSTILE = (
    "..",
    "../..",
    "../../etc/passwd",
    "/etc/passwd",
    "..%2F..%2Fetc%2Fpasswd",
    "%2Fetc%2Fpasswd",
    "a\\..\\b",
    "x\x00y",
)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with one run: rollouts of every failure shape, one on a task whose prompt is markup."""
    tmp = tmp_path_factory.mktemp("dash-security")
    (tmp / "secret.txt").write_text(SECRET)
    store = Store(tmp / "home")
    try:
        tasks = TaskSet(
            name="hostile",
            tasks=tuple(
                Task(
                    id=f"calc-{i}",
                    family="calculator",
                    prompt=(Message(role=Role.USER, content=f"{XSS} {i}"),),
                    split=Split.TRAIN,
                )
                for i in range(7)
            ),
        )
        (tmp / "hostile.jsonl").write_bytes(tasks.to_jsonl())
        version = store.add("hostile", tmp / "hostile.jsonl", kind="taskset")
        spec = {"name": XSS, "model": {"base": XSS}}
        record = RunRecord.create(
            store,
            spec=spec,
            spec_hash=content_hash(spec),
            name=XSS,
            seeds={"run": 1},
            inputs={"data.train": version.hash},
        )
        trajectories = batch(0, 6, record.run_id)
        by_id = {t.id: t for t in tasks.tasks}
        trajectories = [
            t.model_copy(update={"task_hash": by_id[t.task_id].content_hash}) for t in trajectories
        ]
        RolloutWriter(record).write(0, trajectories)
        record.set_status("succeeded")
    finally:
        store.close()
    return tmp / "home"


@pytest.fixture
def client(home: Path) -> Iterator[TestClient]:
    store = Store(home)
    yield TestClient(create_dashboard(store, decode_tokens=False), base_url="http://127.0.0.1")
    store.close()


def run_id(home: Path) -> str:
    (run,) = [p.name for p in (home / "runs").iterdir() if not p.name.startswith(".")]
    return run


def test_off_loopback_every_request_needs_the_token(home: Path) -> None:
    store = Store(home)
    try:
        with DashboardServer(store, host="0.0.0.0", decode_tokens=False) as server:
            token = server.access.token
            assert token and len(token) >= 24
            local = server.url.replace("0.0.0.0", "127.0.0.1")
            for path in ("/", f"/runs/{run_id(home)}", "/api/runs", "/static/dashboard.js", "/artifacts"):
                refused = httpx.get(local + path, timeout=10)
                assert refused.status_code == 401, path
                assert "token" in refused.text and SECRET not in refused.text
            assert (
                httpx.get(
                    local + "/api/runs", headers={"Authorization": "Bearer wrong"}, timeout=10
                ).status_code
                == 401
            )
            assert (
                httpx.get(
                    local + "/api/runs", headers={"Authorization": f"Bearer {token}"}, timeout=10
                ).status_code
                == 200
            )
            # The URL it prints carries the token once; the cookie it sets carries it after.
            assert server.open_url.endswith(f"/?token={token}")
            first = httpx.get(local + f"/?token={token}", timeout=10)
            assert first.status_code == 200
            cookie = first.headers["set-cookie"]
            assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
            cookie_name = f"reprorl_dashboard_{server.access.port}"
            assert cookie.startswith(f"{cookie_name}={token};")
            again = httpx.get(local + "/api/runs", cookies={cookie_name: token}, timeout=10)
            assert again.status_code == 200 and again.json()[0]["run_id"] == run_id(home)
            # A wrong token in the URL sets nothing, even beside a right one elsewhere.
            auth = {"Authorization": f"Bearer {token}"}
            mixed = httpx.get(local + "/?token=x%3BDomain%3Devil.example", headers=auth, timeout=10)
            assert mixed.status_code == 200 and "set-cookie" not in mixed.headers
            assert httpx.get(local + "/", cookies={"reprorl_dashboard": token}, timeout=10).status_code == 401
    finally:
        store.close()


def test_loopback_answers_only_loopback_hosts_and_no_cross_site_work(client: TestClient, home: Path) -> None:
    assert client.get("/").status_code == 200
    assert client.get("/", headers={"host": "localhost:8765"}).status_code == 200
    rebound = client.get("/", headers={"host": "evil.example:8765"})
    assert rebound.status_code == 421
    run = run_id(home)
    target = f"/api/runs/{run}/replay?id={quote(run + '/r0001', safe='')}"
    forged = client.post(target)  # what a form on another site can send
    assert forged.status_code == 403 and "x-reprorl-request" in forged.text
    # Another site's page may link here, but not fetch data or run a query in the user's name.
    cross = {"sec-fetch-site": "cross-site", "sec-fetch-mode": "no-cors"}
    assert client.get(f"/api/runs/{run}/rollouts", headers=cross).status_code == 403
    linked = {"sec-fetch-site": "cross-site", "sec-fetch-mode": "navigate"}
    assert client.get(f"/runs/{run}", headers=linked).status_code == 200
    headers = client.get("/").headers
    assert "script-src 'self'" in headers["content-security-policy"]
    assert "'unsafe-inline'" not in headers["content-security-policy"].split("script-src")[1].split(";")[0]
    assert headers["x-frame-options"] == "DENY" and headers["x-content-type-options"] == "nosniff"


def _filled(path: str, value: str) -> str:
    return re.sub(r"\{[^}]+\}", value, path)


def test_no_path_parameter_escapes_the_store(client: TestClient, home: Path) -> None:
    every = [*client.app.routes, *(r for router in ROUTERS for r in router.routes)]  # type: ignore[attr-defined]
    routes = [r for r in every if isinstance(r, Route) and "{" in r.path]
    assert len(routes) >= 6, [r.path for r in routes]
    for route in routes:
        method = "POST" if "POST" in (route.methods or ()) else "GET"
        for value in HOSTILE:
            # Dots escaped too, so that the client sends `..` as it is instead of resolving it.
            encoded = (value if "%" in value else quote(value, safe="")).replace(".", "%2E")
            url = _filled(route.path, encoded) + "?id=x"  # the other parameters present: this one is checked
            reply = client.request(method, url, headers={"x-reprorl-request": "1"})
            assert reply.status_code in (400, 404), (url, reply.status_code, reply.text[:200])
            assert SECRET not in reply.text and "root:" not in reply.text, url
    # Parameters in the query that name records are held to the same rules.
    run = run_id(home)
    for url in (
        "/lineage?run=../../secret.txt",
        "/lineage?run=/etc/passwd",
        "/lineage?hash=../../secret.txt",
        "/artifacts?name=../secret",
        "/artifacts?name=%2Fetc%2Fpasswd",
        "/compare?runs=..,../..",
        f"/runs/{run}/rollout?id=../../secret.txt",
    ):
        reply = client.get(url)
        assert reply.status_code in (400, 404), (url, reply.status_code)
        assert SECRET not in reply.text, url
    assert client.get("/static/..%2F..%2Fpyproject.toml").status_code in (400, 404)


def test_a_link_in_the_store_does_not_lead_out_of_it(home: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "run.json").write_text(json.dumps({"name": SECRET}))
    planted = home / "runs" / "20990101T000000000000Z-abcdef"
    planted.symlink_to(outside, target_is_directory=True)
    store = Store(home)
    try:
        client = TestClient(create_dashboard(store, decode_tokens=False), base_url="http://127.0.0.1")
        for url in (
            f"/runs/{planted.name}",
            f"/api/runs/{planted.name}/rollouts",
            f"/lineage?run={planted.name}",
        ):
            reply = client.get(url)
            assert reply.status_code == 400 and "outside the store" in reply.text, (url, reply.text[:200])
            assert SECRET not in reply.text
    finally:
        planted.unlink()
        store.close()


def test_record_text_is_shown_as_text(client: TestClient, home: Path) -> None:
    run = run_id(home)
    escaped = "&lt;script&gt;window.__xss = 1&lt;/script&gt;&lt;img src=x onerror=&quot;alert(1)&quot;&gt;"
    pages = [
        "/",
        f"/runs/{run}",
        f"/runs/{run}/rollouts",
        f"/runs/{run}/rollout?id={quote(run + '/r0001', safe='')}",
        f"/lineage?run={run}",
        f"/api/runs/{run}/sections",  # the HTML the run page's script places
        f"/compare?runs={run}",
        "/artifacts",
        "/artifacts?name=hostile",
    ]
    for url in pages:
        reply = client.get(url)
        assert reply.status_code == 200, (url, reply.status_code)
        html = (
            reply.text
            if not url.startswith("/api/")
            else "".join(x["html"] for x in reply.json()["sections"])
        )
        assert "<script>window.__xss" not in html and 'onerror="alert' not in html, url
    detail = client.get(pages[3]).text
    assert escaped in detail  # the task prompt, readable as written
    assert escaped in client.get("/").text  # the run's name
    # Every script the pages load comes from this origin; no page holds an inline script.
    for url in pages[:5]:
        html = client.get(url).text
        for tag in re.findall(r"<script\b[^>]*>", html):
            assert 'src="/static/' in tag or 'type="application/json"' in tag, (url, tag)


def test_sql_goes_through_the_locked_down_connection(client: TestClient, home: Path, tmp_path: Path) -> None:
    run = run_id(home)
    secret = home.parent / "secret.txt"
    for where in (
        f"(SELECT count(*) FROM read_csv('{secret}')) > 0",
        "true) UNION SELECT * FROM duckdb_settings() WHERE (true",
        "1=1; COPY rollouts TO '/tmp/x.csv'",
        "list_contains(tool_outcomes, 'tool_timeout'",
    ):
        for url in (f"/runs/{run}/rollouts", f"/api/runs/{run}/rollouts"):
            reply = client.get(url, params={"where": where})
            assert reply.status_code == 400, (where, reply.status_code, reply.text[:300])
            assert SECRET not in reply.text
            if url.startswith("/api/"):
                assert reply.json()["error"].startswith("where: ")
    ok = client.get(f"/api/runs/{run}/rollouts", params={"where": "termination = 'tool_timeout'"}).json()
    assert ok["total"] == 1 and ok["rows"][0]["termination"] == "tool_timeout"
    quick = client.get(
        f"/api/runs/{run}/rollouts", params={"failure": "tool_timeout", "split": "train"}
    ).json()
    assert {r["rollout_id"].rsplit("/", 1)[1] for r in quick["rows"]} == {"r0001", "r0002"}
    family = client.get(f"/api/runs/{run}/rollouts", params={"family": "calculator"}).json()
    assert family["total"] == 6
    assert client.get(f"/api/runs/{run}/rollouts", params={"family": "sql"}).json()["total"] == 0


def test_a_query_that_runs_too_long_is_stopped_and_refused(home: Path) -> None:
    store = Store(home)
    try:
        client = TestClient(create_dashboard(store, query_timeout_s=0.5), base_url="http://127.0.0.1")
        run = run_id(home)
        heavy = "(SELECT count(*) FROM range(100000000000)) > 0"
        reply = client.get(f"/api/runs/{run}/rollouts", params={"where": heavy})
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"] == "where: the query ran past its 0.5 s limit; narrow the condition"
        assert client.get(f"/api/runs/{run}/rollouts").json()["total"] == 6  # and the next one runs
    finally:
        store.close()


def test_bad_requests_get_one_line_naming_the_field(client: TestClient, home: Path) -> None:
    run = run_id(home)
    cases = {
        "step": {"step": "abc"},
        "per_page": {"per_page": "100000"},
        "termination": {"termination": "exploded"},
        "failure": {"failure": "<b>"},
        "reward_min": {"reward_min": "nan"},
        "page": {"page": "0"},
    }
    for field, params in [*cases.items(), ("page", {"page": str(2**62)})]:  # past any table's last page
        reply = client.get(f"/api/runs/{run}/rollouts", params=params)
        assert reply.status_code == 400, (field, reply.status_code)
        error = reply.json()["error"]
        assert error.startswith(f"{field}: ") and "\n" not in error, error
    html = client.get(f"/runs/{run}/rollouts", params={"failure": "<b>"})
    assert html.status_code == 400 and "&lt;b&gt;" in html.text and "<b>'" not in html.text
    assert client.get("/runs/20990101T000000000000Z-abcdef").status_code == 404
    assert client.get("/runs/not-a-run").status_code == 400


def test_a_damaged_part_is_named_not_shown(home: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "home"
    shutil.copytree(home, copy)
    (part,) = list((copy / "runs").glob("*/rollouts/step=*/part-*.parquet"))
    part.chmod(0o644)
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    store = Store(copy)
    try:
        client = TestClient(create_dashboard(store, decode_tokens=False), base_url="http://127.0.0.1")
        run = run_id(copy)
        reply = client.get(f"/api/runs/{run}/rollouts")
        assert reply.status_code == 422 and part.name[:20] in reply.json()["error"], reply.text
        assert client.get(f"/runs/{run}").status_code == 200  # the run page still opens
        sections = client.get(f"/api/runs/{run}/sections").json()
        assert sections["status"] == "succeeded" and json.dumps(sections)
    finally:
        store.close()
