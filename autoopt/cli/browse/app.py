"""BrowseApp: the studies list (or straight to one study's trials with --study), the trials table
with its detail pane, and the screens pushed from there (autoopt.cli.browse.panels, imported when
first pushed: the first screen needs none of them)."""
from __future__ import annotations

from typing import Any

from textual.app import App

from autoopt.cli.browse.data import StudySource
from autoopt.cli.browse.screens import StudiesScreen, TrialsScreen

POLL_S = 2.0


class BrowseApp(App):
    """`store`: an open study database (autoopt.store.reading.open_for_reading or a Store; the
    caller closes it). `study`: open that study's trials
    at once (UserError from the store if the database has no such study). `poll_s`: how often the
    trials table re-reads the database."""

    TITLE = "autoopt browse"
    ENABLE_COMMAND_PALETTE = False

    def __init__(self, store: Any, study: str | None = None, poll_s: float = POLL_S) -> None:
        super().__init__()
        self.store = store
        self.db_label = store.shown_url()
        self.poll_s = poll_s
        self.initial_study = store.resolve_study(study) if study is not None else None
        self.sources: dict[str, StudySource] = {}

    def on_mount(self) -> None:
        if self.initial_study is not None:
            self.open_study(self.initial_study)
        else:
            self.push_screen(StudiesScreen())

    def open_study(self, name: str) -> None:
        if name not in self.sources:
            self.sources[name] = StudySource(self.store, name)
        self.push_screen(TrialsScreen(self.sources[name], self.poll_s))

    def action_help(self) -> None:
        from autoopt.cli.browse.panels import (ConvergenceScreen, DetailScreen, DiffScreen, EffectsScreen,
                                               FilterScreen, HelpScreen)

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen([StudiesScreen, TrialsScreen, DetailScreen, DiffScreen, ConvergenceScreen,
                                         EffectsScreen, FilterScreen]))
