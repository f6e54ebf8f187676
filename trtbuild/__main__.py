"""`python -m trtbuild` is the same as the `trtbuild` console script."""

from trtbuild.cli import main

if __name__ == "__main__":
    main()
