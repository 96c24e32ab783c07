"""Request bodies (schemas.py): JSON, LibreTranslate's forms, and JSON sent as a form."""

import pytest

from nmt_cli.serve.schemas import BadRequest, read_body

FORM = "application/x-www-form-urlencoded"


def test_a_form_is_read_a_field_given_twice_a_list():
    assert read_body(b"q=a+b&q=c&source=en&api_key=", FORM) == {"q": ["a b", "c"], "source": "en", "api_key": ""}
    assert read_body(b'{"text": ["a"]}', FORM) == {"text": ["a"]}  # JSON sent as a form (curl -d, urllib)
    assert read_body(b' [1]', "application/json; charset=utf-8") == [1]


def test_a_body_that_cannot_be_read_is_one_line():
    with pytest.raises(BadRequest, match="^the form is not UTF-8$"):
        read_body(b"q=\xff", FORM)
    with pytest.raises(BadRequest, match="^the body is not JSON$"):
        read_body(b"q=a", "application/json")
