"""docs/cli.md, generated from the click commands: `python -m trtbuild.cli.docs > docs/cli.md`.

Every command's `--help`, as click formats it, at a fixed width (so the page does not depend on
the terminal that made it). tests/test_docs_generated.py keeps the committed page equal to this
output, so the page never says what `--help` does not.
"""

from __future__ import annotations

import sys

import click

WIDTH = 100  # the root group's max_content_width: what `--help` shows on a wide terminal


def _contexts(command: click.Command, name: str, parent: click.Context | None = None):
    """(context, command) for COMMAND and every subcommand below it, depth first, in name order."""
    ctx = click.Context(command, info_name=name, parent=parent, terminal_width=WIDTH,
                        **{k: v for k, v in command.context_settings.items() if k != "terminal_width"})
    yield ctx, command
    if isinstance(command, click.Group):
        for sub_name in command.list_commands(ctx):
            sub = command.get_command(ctx, sub_name)
            if sub is not None and not sub.hidden:
                yield from _contexts(sub, sub_name, ctx)


def render() -> str:
    from trtbuild.cli import cli

    lines = ["# Command line reference", "",
             "Generated from the click commands by `python -m trtbuild.cli.docs > docs/cli.md`; do not",
             "edit by hand. Each section is that command's `--help`.", ""]
    for ctx, _command in _contexts(cli, "trtbuild"):
        path = ctx.command_path
        lines += [f"## {path}", "", "```", ctx.get_help().rstrip(), "```", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render())
