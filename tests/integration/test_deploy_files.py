"""The deployment files agree with each other and with the app's settings."""

from __future__ import annotations

import configparser
import re
import runpy

from tests.support.servers import ROOT

UNIT = ROOT / "deploy" / "glassbox@.service"  # a template: one front end per instance (glassbox@1, glassbox@2)


def gunicorn_settings(monkeypatch, **env) -> dict:
    for name in ("GLASSBOX_THREADS", "GLASSBOX_MAX_STREAMS", "GLASSBOX_MAX_FOLLOWER_STREAMS",
                 "GLASSBOX_GRACEFUL_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(str(ROOT / "gunicorn.conf.py"))


def test_gunicorn_runs_one_threaded_worker_with_threads_for_streams_and_pages(monkeypatch):
    conf = gunicorn_settings(monkeypatch)
    assert conf["workers"] == 1 and conf["worker_class"] == "gthread"
    # a thread for each of GLASSBOX_MAX_STREAMS (24) and of GLASSBOX_MAX_FOLLOWER_STREAMS (100), and the pages'
    assert conf["threads"] == 24 + 100 + conf["PAGE_THREADS"]
    assert gunicorn_settings(monkeypatch, GLASSBOX_MAX_STREAMS="4")["threads"] == 4 + 100 + conf["PAGE_THREADS"]
    assert gunicorn_settings(monkeypatch, GLASSBOX_MAX_FOLLOWER_STREAMS="0")["threads"] == 24 + conf["PAGE_THREADS"]
    assert gunicorn_settings(monkeypatch, GLASSBOX_THREADS="9")["threads"] == 9
    assert "%(U)s" in conf["access_log_format"] and "%(q)s" not in conf["access_log_format"]  # no query strings


def test_systemd_gives_gunicorn_its_graceful_timeout_before_killing_it(monkeypatch):
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read(UNIT)
    service = unit["Service"]
    assert service["ExecStart"].endswith("gunicorn -c gunicorn.conf.py wsgi:app")
    assert service["KillSignal"] == "SIGTERM"
    assert int(service["TimeoutStopSec"]) > gunicorn_settings(monkeypatch)["graceful_timeout"]


def test_nginx_keeps_upstream_connections_shorter_than_gunicorn_and_streams_unbuffered(monkeypatch):
    site = (ROOT / "deploy" / "nginx.conf").read_text()
    keepalive = int(re.search(r"keepalive_timeout (\d+)s;", site).group(1))
    assert keepalive < gunicorn_settings(monkeypatch)["keepalive"]
    blocks = re.findall(r"location ~ (\S+) \{([^}]*)\}", site)
    pattern, streams = next((p, body) for p, body in blocks if "stream" in p)
    for directive in ("proxy_buffering off;", "gzip off;", "proxy_read_timeout 1h;"):
        assert directive in streams
    for route in ("/chat/c/x/m/1/stream", "/loops/jobs/x/stream", "/loops/traces/x/replay", "/api/loops/trace"):
        assert re.match(pattern, "/glassbox" + route), route
        others = [p for p, _ in blocks if p != pattern and re.match(p, "/glassbox" + route)]
        assert not others, (route, others)  # nginx takes the first regex that matches


def test_gunicorn_binds_loopback_and_says_when_other_machines_reach_it_without_a_proxy(monkeypatch):
    monkeypatch.delenv("GLASSBOX_BIND", raising=False)
    conf = gunicorn_settings(monkeypatch)
    assert conf["bind"] == ["127.0.0.1:8000"]
    exposure = conf["exposure"]
    for address in ("127.0.0.1:8000", "[::1]:8000", "localhost:8000", "unix:/run/glassbox.sock"):
        assert exposure(address, "127.0.0.1")[0] == "info", address
    for address in ("0.0.0.0:8000", "[::]:8000", "10.0.0.5:8000", ":8000"):
        level, said = exposure(address, "127.0.0.1")  # nothing but loopback is trusted: no proxy in front
        assert level == "warning" and "WITHOUT A PROXY" in said and "deploy/nginx.conf" in said, address
        assert exposure(address, "*")[0] == "warning"  # "*" names no proxy
        assert exposure(address, "10.0.0.2, 127.0.0.1")[0] == "info"  # the proxy in front is named


def test_gunicorn_bounds_what_one_connection_may_hold(monkeypatch):
    conf = gunicorn_settings(monkeypatch)
    assert conf["keepalive"] <= 5  # idle kept-alive connections close
    assert conf["limit_request_line"] <= 4094 and conf["limit_request_fields"] <= 50
    assert conf["limit_request_field_size"] <= 8190


def unit_environment() -> dict[str, str]:
    """Every Environment= line of the unit (configparser keeps only the last of a repeated key)."""
    return dict(re.findall(r"^Environment=(\w+)=(.*)$", UNIT.read_text(), re.M))


def upstream_servers() -> list[str]:
    upstream = re.search(r"upstream glassbox \{(.*?)\}", (ROOT / "deploy" / "nginx.conf").read_text(), re.S).group(1)
    return re.findall(r"^\s*server (unix:\S+)", upstream, re.M)


def test_nginx_reaches_each_front_end_on_the_socket_its_instance_binds_and_no_tcp_peer_is_a_proxy(monkeypatch):
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read(UNIT)
    env = unit_environment()
    servers = upstream_servers()
    assert servers == [env["GLASSBOX_BIND"].replace("%i", name) for name in ("1", "2")]  # glassbox@1, glassbox@2
    assert env["GLASSBOX_FORWARDED_ALLOW_IPS"] == ""  # any local process could connect from 127.0.0.1
    assert unit["Service"]["RuntimeDirectory"] == "glassbox/%i"
    assert all(server.startswith("unix:/run/glassbox/") for server in servers)
    conf = gunicorn_settings(monkeypatch, GLASSBOX_BIND="127.0.0.1:8000," + servers[0])
    assert conf["bind"] == ["127.0.0.1:8000", servers[0]] and conf["umask"] == 0o007
    assert conf["forwarded_allow_ips"] == ""


def test_each_front_end_keeps_its_own_socket_folder_instance_folder_and_settings():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read(UNIT)
    service, env = unit["Service"], unit_environment()
    # its own: a stopping front end removes only its own runtime folder; SQLite's lock is per folder
    assert env["GLASSBOX_BIND"] == "unix:/run/glassbox/%i/gunicorn.sock"
    assert env["GLASSBOX_INSTANCE_PATH"] == "/var/lib/glassbox/%i"
    assert service["StateDirectory"] == "glassbox/%i" and service["ReadWritePaths"] == "/var/lib/glassbox/%i"
    # shared: the database URL and the one secret key every front end signs cookies with; then its own
    files = re.findall(r"^EnvironmentFile=-(\S+)$", UNIT.read_text(), re.M)
    assert files == ["/etc/glassbox/env", "/etc/glassbox/%i.env"]


def test_nginx_sends_each_browser_to_one_front_end_by_its_route_cookie_and_others_anywhere():
    from webapp.web.security import ROUTE_COOKIE
    site = (ROOT / "deploy" / "nginx.conf").read_text()
    upstream = re.search(r"upstream glassbox \{(.*?)\}", site, re.S).group(1)
    key = re.search(r"^\s*hash \$(\w+) consistent;", upstream, re.M).group(1)
    routes = re.search(rf"map \$cookie_{ROUTE_COOKIE} \${key} \{{(.*?)\}}", site, re.S).group(1)
    assert re.search(r'^\s*""\s+\$request_id;', routes, re.M)  # no cookie: a request of its own, anywhere
    assert re.search(rf"^\s*default\s+\$cookie_{ROUTE_COOKIE};", routes, re.M)
    assert len(upstream_servers()) == 2
