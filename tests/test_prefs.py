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
