"""Errors a user can act on. The CLI prints them as one line and exits with code 2.

A failed *trial* is never an exception: it is a `Measurement` with status "failed". These are for
infrastructure problems (unreadable space file, unknown knob, unreachable database, unknown trial).
"""
from __future__ import annotations


class UserError(Exception):
    """Bad input or an unusable environment; the message names the file/key and what was expected."""

    exit_code = 2


class StoreError(UserError):
    """The trial database cannot be opened, migrated or queried."""


class SpaceError(UserError):
    """A search-space file is invalid."""
