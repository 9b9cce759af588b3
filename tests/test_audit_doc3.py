"""Code the docs describe rightly and that did otherwise (docs/settings.md)."""

from __future__ import annotations

import pytest
from django.core import checks

from django_delayjobs.conf import delayjobs_settings
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
