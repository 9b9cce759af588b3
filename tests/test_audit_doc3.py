"""Code the docs describe rightly and that did otherwise (docs/settings.md)."""

from __future__ import annotations

import pytest
from django.core import checks

from django_delayjobs.conf import delayjobs_settings, describe, validate
from django_delayjobs.exceptions import ConfigurationError


@pytest.mark.parametrize(
    "value", ["rest_framework.permissions.IsAdminUser", ["os.system"], ["no_such_module.Perm"]]
)
def test_a_bad_permission_class_setting_is_named_once_in_its_error(settings, value):
    """settings.md: the check error (E008) and the run-time error say what is wrong. They
    named the setting twice ("DELAYJOBS['API_PERMISSION_CLASSES'] DELAYJOBS[...]: ...")."""
    settings.DELAYJOBS = {"API_PERMISSION_CLASSES": value}
    (error,) = [m for m in checks.run_checks() if m.id == "django_delayjobs.E008"]
    assert error.msg.count("API_PERMISSION_CLASSES") == 1, error.msg
    with pytest.raises(ConfigurationError) as raised:
        delayjobs_settings.PREFIX  # noqa: B018
    assert str(raised.value).count("API_PERMISSION_CLASSES") == 1, raised.value


@pytest.mark.parametrize(("value", "shown"), [(5, "an int"), (["x"], "a list"), (0.5, "a float")])
def test_a_secret_setting_of_the_wrong_type_is_named_by_its_type_in_english(value, shown):
    """settings.md: for the settings that hold secrets the message names the value's type
    only (``must be a list, not a str``). An int read "not a int"."""
    (problem,) = validate({"REDIS_URL": value})[1]
    assert describe(problem).endswith(f"must be a str, not {shown}"), describe(problem)
