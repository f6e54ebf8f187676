"""The `trtbuild` command line: the group and its commands, one module per command group
(plan, build, deploy, cache, lock, report); each command parses its options, calls one function of
the layer below and prints a table or JSON.

Heavy modules are imported inside the commands, so `trtbuild --help` stays fast and never imports
torch, transformers or ModelOpt.
"""

from __future__ import annotations

import click

from trtbuild import __version__
from trtbuild.errors import TrtbuildError


class _Group(click.Group):
    """Turns TrtbuildError, and a full disk or read-only folder (trtbuild.fsfaults), into its lines
    on stderr and its exit code, never a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except TrtbuildError as exc:
            self._fail(exc)
        except OSError as exc:
            from trtbuild.fsfaults import user_error

            error = user_error(exc)
            if error is None:
                raise
            self._fail(error)

    @staticmethod
    def _fail(exc: TrtbuildError):
        for line in exc.messages:
            click.echo(line, err=True)
        raise click.exceptions.Exit(exc.exit_code) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", prog_name="trtbuild")
def cli() -> None:
    """Turn model checkpoints into validated, cached, ready-to-serve TensorRT-LLM artifacts.

    A YAML recipe names a source model and a matrix of quantization variants, parallelism and GPU
    architectures. `trtbuild plan` expands it and checks every target before any GPU time is spent.
    """


def _register() -> None:
    from trtbuild.cli import bench, build, cache, deploy, lock, plan, report

    for command in (plan.plan, plan.schema, build.build, build.explain, build.path_of, deploy.push, deploy.pull,
                    deploy.ls, deploy.check, cache.cache, lock.lock_group, report.report, bench.bench):
        cli.add_command(command)


_register()
