"""The `trtbuild` console script and `python -m trtbuild`. A `build` whose inputs are all as its
last no-op run found them is replayed from that run's record (trtbuild.replay) before click, the
planner or pydantic are imported; any other command, or any change, runs trtbuild.cli."""

import sys


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["build"]:
        from trtbuild import replay

        code = replay.replay(argv)
        if code is not None:
            sys.exit(code)
        replay.arm(argv)
    from trtbuild.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
