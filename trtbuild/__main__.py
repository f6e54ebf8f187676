"""The `trtbuild` console script and `python -m trtbuild`: trtbuild.cli, every time (a no-op build
runs in full; nothing replays an earlier run's answer)."""


def main() -> None:
    from trtbuild.cli.entry import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
