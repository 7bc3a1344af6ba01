"""Argument types shared by the CLI's flag groups: each names the bad value it refuses."""

from __future__ import annotations

import argparse


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"has value {text!r}; expected an integer >= 0")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"has value {text!r}; expected an integer >= 1")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"has value {text!r}; expected a number >= 0")
    return value
