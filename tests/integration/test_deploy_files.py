"""The deployment files agree with each other and with the app's settings."""

from __future__ import annotations

import configparser
import re
import runpy

from tests.support.servers import ROOT


def gunicorn_settings(monkeypatch, **env) -> dict:
    for name in ("GLASSBOX_THREADS", "GLASSBOX_MAX_STREAMS", "GLASSBOX_GRACEFUL_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(str(ROOT / "gunicorn.conf.py"))


def test_gunicorn_runs_one_threaded_worker_with_threads_for_streams_and_pages(monkeypatch):
    conf = gunicorn_settings(monkeypatch)
    assert conf["workers"] == 1 and conf["worker_class"] == "gthread"
    assert conf["threads"] == 24 + conf["PAGE_THREADS"]  # GLASSBOX_MAX_STREAMS' default is 24
    assert gunicorn_settings(monkeypatch, GLASSBOX_MAX_STREAMS="4")["threads"] == 4 + conf["PAGE_THREADS"]
    assert gunicorn_settings(monkeypatch, GLASSBOX_THREADS="9")["threads"] == 9
    assert "%(U)s" in conf["access_log_format"] and "%(q)s" not in conf["access_log_format"]  # no query strings


def test_systemd_gives_gunicorn_its_graceful_timeout_before_killing_it(monkeypatch):
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read(ROOT / "deploy" / "glassbox.service")
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


def test_nginx_reaches_gunicorn_on_the_socket_the_unit_binds_and_no_tcp_peer_is_a_proxy(monkeypatch):
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read(ROOT / "deploy" / "glassbox.service")
    # every Environment= line (configparser keeps only the last of a repeated key)
    env = dict(re.findall(r"^Environment=(\w+)=(.*)$", (ROOT / "deploy" / "glassbox.service").read_text(), re.M))
    upstream = re.search(r"upstream glassbox \{\s*server (unix:\S+);", (ROOT / "deploy" / "nginx.conf").read_text())
    assert upstream and env["GLASSBOX_BIND"] == upstream.group(1)
    assert env["GLASSBOX_FORWARDED_ALLOW_IPS"] == ""  # any local process could connect from 127.0.0.1
    assert unit["Service"]["RuntimeDirectory"] == "glassbox" and upstream.group(1).startswith("unix:/run/glassbox/")
    conf = gunicorn_settings(monkeypatch, GLASSBOX_BIND="127.0.0.1:8000," + upstream.group(1))
    assert conf["bind"] == ["127.0.0.1:8000", upstream.group(1)] and conf["umask"] == 0o007
    assert conf["forwarded_allow_ips"] == ""
