"""The lock file: what a build made, merging CI slices, the publication rule."""
