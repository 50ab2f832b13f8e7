"""Typed errors. Library code raises these; the CLI turns them into one-line messages.

Exit codes (ARCHITECTURE.md): 2 for bad input (the user can fix the file), 1 for a runtime
failure (the server would not start, a model would not load).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input: where (file and field path), what, and how to fix it."""

    file: str
    path: str
    message: str
    fix: str = ""

    def __str__(self) -> str:
        where = f"{self.file}: {self.path}" if self.path else self.file
        text = f"{where}: {self.message}"
        return f"{text} (fix: {self.fix})" if self.fix else text


class KitError(Exception):
    """Base class; `exit_code` is what the CLI exits with."""

    exit_code = 1


class InputError(KitError):
    """The user's input is wrong. Carries every problem found, not just the first."""

    exit_code = 2

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class ServerError(KitError):
    """tritonserver could not start, stopped, or refused a model."""


def input_error(file: str, path: str, message: str, fix: str = "") -> InputError:
    return InputError([Problem(file, path, message, fix)])


def flag_problem(flag: str, fix: str) -> Problem:
    """A command-line value the type it fills refuses (the type names its own flag and fix)."""
    return Problem("command line", flag, "missing or invalid", fix)


def raise_flag_problems(checks: list[tuple[str, bool, str]]) -> None:
    """(flag, ok, fix) per rule: one InputError naming every flag that breaks its rule."""
    problems = [flag_problem(flag, fix) for flag, ok, fix in checks if not ok]
    if problems:
        raise InputError(problems)
