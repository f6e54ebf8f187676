"""Errors that reach the user as one clear line each, with the exit code the CLI returns."""

from __future__ import annotations


class TrtbuildError(Exception):
    """An error the CLI prints as one line per message (no traceback) and exits with `exit_code`."""

    exit_code = 1

    def __init__(self, *messages: str) -> None:
        super().__init__(*messages)
        self.messages = [m for m in messages if m]

    def __str__(self) -> str:
        return "\n".join(self.messages)


class InvalidInput(TrtbuildError):
    """The user's input (a recipe, a config file, a command-line value) is wrong: exit code 2."""

    exit_code = 2


class Unreachable(TrtbuildError):
    """A service the command needs (the Hugging Face Hub) cannot be reached: exit code 1, as for any
    failure that is not the input's fault (trtbuild/store/s3_client.py words an unreachable S3 service the same).
    A build stops at once, before anything is stored: every target needs what it could not reach."""
