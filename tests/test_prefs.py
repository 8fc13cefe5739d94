"""The colour theme each browser chose (webapp/web/prefs.py): kept in its session, only ever sent back to a
page of this site."""

import pytest

from tests.conftest import csrf_of


@pytest.mark.parametrize("back, expected", [("/loops/?x=1", "/loops/?x=1"), ("https://evil.example/", "/"),
                                            ("//evil.example/", "/"), ("/\\evil.example", "/"), ("", "/")])
def test_the_theme_is_remembered_and_the_form_goes_back_only_to_this_site(loop_app, back, expected):
    client = loop_app.test_client()
    assert 'data-theme="auto"' in client.get("/loops/").get_data(as_text=True)
    csrf = csrf_of(client, "/loops/")
    response = client.post("/prefs/theme", data={"csrf_token": csrf, "theme": "dark", "next": back})
    assert response.status_code == 303 and response.headers["Location"] == expected
    page = client.get("/").get_data(as_text=True)
    assert 'data-theme="dark"' in page and 'value="light"' in page  # the button offers the next theme
    client.post("/prefs/theme", data={"csrf_token": csrf})  # no choice: the next one in turn
    assert 'data-theme="light"' in client.get("/").get_data(as_text=True)
    assert client.post("/prefs/theme", data={"theme": "dark"}).status_code == 403  # CSRF, as every form


def test_presentation_mode_is_remembered_like_the_theme_and_goes_back_only_to_this_site(loop_app):
    client = loop_app.test_client()
    page = client.get("/loops/").get_data(as_text=True)
    assert "data-present" not in page and 'name="present" value="on" aria-pressed="false"' in page
    csrf = csrf_of(client, "/loops/")
    response = client.post("/prefs/present", data={"csrf_token": csrf, "present": "on", "next": "/chat/"})
    assert response.status_code == 303 and response.headers["Location"] == "/chat/"
    page = client.get("/").get_data(as_text=True)
    assert 'data-present="on"' in page and 'name="present" value="off" aria-pressed="true"' in page
    away = client.post("/prefs/present", data={"csrf_token": csrf, "present": "off", "next": "//evil.example/"})
    assert away.headers["Location"] == "/" and "data-present" not in client.get("/").get_data(as_text=True)
    assert client.post("/prefs/present", data={"present": "on"}).status_code == 403  # CSRF, as every form
