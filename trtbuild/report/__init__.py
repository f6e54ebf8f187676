"""Accuracy reports people look at: a self-contained HTML page of the build matrix and an accuracy-vs-size plot."""
