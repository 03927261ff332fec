"""Screens pushed over the trials table: one trial, a diff, the plots, the filter prompt, help."""
from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Input, Static

from autoopt.cli.browse import plots, textplot, views
from autoopt.cli.browse.data import StudySource
from autoopt.cli.browse.filters import TrialFilter, parse_filter

BACK = [Binding("escape,q", "app.pop_screen", "Back"), Binding("?", "app.help", "Help")]


class ScrollScreen(Screen):
    """A title line and one scrollable renderable (arrows, page up/down, home/end scroll it)."""

    BINDINGS = BACK
    CSS = "ScrollScreen #title { height: 1; background: $accent; }"

    def __init__(self, title: str, body: Any) -> None:
        super().__init__()
        self.title_text, self.body = title, body

    def compose(self) -> ComposeResult:
        yield Static(Text(self.title_text, style="bold"), id="title")
        with VerticalScroll(id="scroll"):
            yield Static(self.body, id="body")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#scroll", VerticalScroll).focus()


class DetailScreen(ScrollScreen):
    def __init__(self, doc: dict[str, Any], best: int | None, unit: dict[str, Any]) -> None:
        super().__init__(f"trial {doc['number']} (esc: back)", views.detail(doc, best, unit))


class DiffScreen(ScrollScreen):
    def __init__(self, doc: dict[str, Any]) -> None:
        super().__init__(f"diff: B = trial {doc['b']['number']} against A = trial {doc['a']['number']}",
                         views.diff(doc))


class ConvergenceScreen(Screen):
    """Each trial and the best so far against wall time; redrawn to the terminal's size."""

    BINDINGS = [Binding("e", "effects", "Effects"), *BACK]
    CSS = "ConvergenceScreen { overflow: hidden; } ConvergenceScreen #plot { text-wrap: nowrap; }"

    def __init__(self, source: StudySource) -> None:
        super().__init__()
        self.source = source
        rows = list(source.rows.values())
        self.conv = plots.convergence(rows, plots.restart_classes(source.details()), source.objective)

    def compose(self) -> ComposeResult:
        yield Static(id="plot")
        yield Footer()

    def on_mount(self) -> None:
        self.draw()

    def on_resize(self) -> None:
        self.draw()

    def draw(self) -> None:
        width, height = self.size.width, max(self.size.height - 1, 6)
        if not self.conv.points:
            self.query_one("#plot", Static).update(Text("no successful trial with a speed-up yet: nothing to plot"))
            return
        self.query_one("#plot", Static).update(Text("\n").join(textplot.convergence_lines(self.conv, width, height)))

    def action_effects(self) -> None:
        self.app.switch_screen(EffectsScreen(self.source))


class EffectsScreen(ScrollScreen):
    BINDINGS = [Binding("p", "plot", "Convergence"), *BACK]

    def __init__(self, source: StudySource) -> None:
        self.source = source
        self.groups = plots.effects(list(source.rows.values()))
        super().__init__("per-knob effects: median speed-up over the baseline of the trials with each value", "")

    def on_mount(self) -> None:
        super().on_mount()
        self.draw()

    def on_resize(self) -> None:
        self.draw()

    def draw(self) -> None:
        lines = textplot.effect_lines(self.groups, max(self.size.width - 2, 40))
        self.query_one("#body", Static).update(Text("\n").join(lines))

    def action_plot(self) -> None:
        self.app.switch_screen(ConvergenceScreen(self.source))


class FilterScreen(ModalScreen[TrialFilter]):
    """Type a filter (see autoopt.cli.browse.filters); enter applies it, esc keeps the old one."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    CSS = """
    FilterScreen { align: center middle; }
    FilterScreen > Vertical { width: 90%; height: auto; border: thick $accent; background: $surface; }
    FilterScreen #error { color: $error; height: auto; }
    """

    def __init__(self, current: str, knobs: dict[str, list[Any]]) -> None:
        super().__init__()
        self.current, self.knobs = current, knobs

    def compose(self) -> ComposeResult:
        hint = ("words, all must hold: state=ok  source=profile  KNOB=VALUE  failed   (empty: no filter)\n"
                f"knobs: {', '.join(sorted(self.knobs)[:10])}{' ...' if len(self.knobs) > 10 else ''}")
        with Vertical():
            yield Static(Text(hint, style="dim"))
            yield Input(value=self.current, placeholder="e.g. state=ok glue=triton", id="filter")
            yield Static(id="error")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        try:
            self.dismiss(parse_filter(event.value, self.knobs))
        except ValueError as exc:
            self.query_one("#error", Static).update(Text(f"error: {exc}"))

    def action_cancel(self) -> None:
        self.dismiss(None)


def help_body(screens: list[type]) -> Group:
    """Every key of every screen, read from the screens' own bindings (so the list stays true)."""
    parts: list[Any] = [Text("autoopt browse: keys", style="bold"),
                        Text("arrows / page up / page down / home / end move and scroll everywhere; "
                             "tab moves the focus (table <-> detail pane).", style="dim")]
    for screen in screens:
        t = views.table(("key", "left"), ("what it does", "left"))
        for b in screen.BINDINGS:
            if isinstance(b, Binding):
                t.add_row(Text(b.key.replace(",", " / ")), Text(b.description or b.action))
        parts += [views.heading(screen.__name__.removesuffix("Screen").lower() + " screen"), t]
    parts.append(Text("\nIn the trials table: ● marked, ★ best (autoopt best's rule), b baseline, * faster than "
                      "the baseline outside the noise. The table re-reads the database every few seconds.",
                      style="dim"))
    return Group(*parts)


class HelpScreen(ScrollScreen):
    BINDINGS = [Binding("escape,q,?", "app.pop_screen", "Back")]

    def __init__(self, screens: list[type]) -> None:
        super().__init__("help (esc: back)", help_body(screens))
