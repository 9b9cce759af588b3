#!/usr/bin/env python3
"""The example shop's manage.py: ``python example_project/manage.py <command>``.

Works from any directory. When it sits in a checkout of django-delayjobs, that checkout's
``django_delayjobs`` is the one imported (installed or not), so the example always shows
the code next to it.
"""

import os
import sys
from pathlib import Path


def main() -> None:
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here)]
    if (here.parent / "django_delayjobs" / "__init__.py").is_file():
        sys.path.insert(1, str(here.parent))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shopsite.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
