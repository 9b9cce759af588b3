"""The commands' output, made to outlast its reader.

A command's stdout may be a pipe whose reader has gone (``delayjobs_stats | head -1``, a
log shipper that exited), no stream at all (``>&-``), a full disk, or an encoding that
cannot show a character of an error text (``PYTHONIOENCODING=ascii``). Django's
``OutputWrapper`` lets each of these escape as a traceback: a health probe lost its exit
code, and a worker died before its first job. Here a line that cannot be encoded is
written with backslash escapes, and a stream that fails is dropped: the command goes on
with its work and ends with the exit code it would have had.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, TextIO

from django.core.management.base import BaseCommand


class Stream:
    """A text stream that never raises: written and flushed line by line, so a failure
    shows (and is dropped) at the write, not at the interpreter's exit."""

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream
        self.lost = stream is None

    def write(self, text: str) -> None:
        if self.stream is None or self.lost:
            return
        try:
            try:
                self.stream.write(text)
            except UnicodeEncodeError:  # encoded whole before writing: nothing written yet
                encoding = getattr(self.stream, "encoding", None) or "ascii"
                self.stream.write(text.encode(encoding, "backslashreplace").decode(encoding))
            self.stream.flush()
        except (OSError, ValueError) as exc:  # a closed pipe or file, a full disk
            self.lose(exc)

    def flush(self) -> None:
        if self.stream is None or self.lost:
            return
        try:
            self.stream.flush()
        except (OSError, ValueError) as exc:
            self.lose(exc)

    def isatty(self) -> bool:
        return not self.lost and bool(getattr(self.stream, "isatty", lambda: False)())

    def lose(self, exc: Exception) -> None:
        """Write no more; the process's own stream is pointed at /dev/null, as Python's
        documentation advises, so that the bytes still in its buffer do not fail again
        at exit ("Exception ignored ... BrokenPipeError", exit code 120)."""
        self.lost = True
        if not isinstance(exc, BrokenPipeError):  # a reader that left is no error
            with contextlib.suppress(Exception):
                sys.__stderr__.write(f"output dropped: cannot write to {self.name()}: {exc}\n")  # type: ignore[union-attr]
        if self.stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            with contextlib.suppress(Exception):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, self.stream.fileno())  # type: ignore[union-attr]
                os.close(devnull)

    def name(self) -> str:
        return str(getattr(self.stream, "name", "the output"))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


class SafeOutputCommand(BaseCommand):
    """A ``BaseCommand`` whose ``stdout`` and ``stderr`` are ``Stream``\\ s, and which
    ends a Ctrl-C on the command line without a traceback."""

    def __init__(self, stdout: TextIO | None = None, stderr: TextIO | None = None,
                 no_color: bool = False, force_color: bool = False) -> None:  # fmt: skip
        super().__init__(Stream(stdout or sys.stdout), Stream(stderr or sys.stderr),  # type: ignore[arg-type]
                         no_color, force_color)  # fmt: skip

    def run_from_argv(self, argv: list[str]) -> None:
        """As Django's, but Ctrl-C (a command waiting for a Redis that does not answer)
        ends it with one line and exit code 130, as a shell's, not a traceback. Only
        here, on the command line: ``call_command`` lets the interrupt go on."""
        try:
            super().run_from_argv(argv)
        except KeyboardInterrupt:
            self.stderr.write("interrupted")
            sys.exit(130)

    def execute(self, *args: Any, **options: Any) -> Any:
        for name in ("stdout", "stderr"):  # call_command(stdout=...) replaces them
            if options.get(name) and not isinstance(options[name], Stream):
                options[name] = Stream(options[name])
        return super().execute(*args, **options)
