"""The two main screens: the studies list and a study's trials table with the detail pane.

The first paint is the table: the detail pane of the trial under the cursor is rendered right after
it (a trial's detail is a dozen rich tables, as long to lay out as the rest of the screen), and the
screens pushed from here (autoopt.cli.browse.panels) are imported when first pushed."""
from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from autoopt.cli.browse import views
from autoopt.cli.render_history import objective_text, value_label
from autoopt.cli.browse.data import StudySource, list_studies
from autoopt.cli.browse.filters import SORTS, TrialFilter, sort_rows

TRIAL_COLUMNS = ("#", "state", "objective [95% CI]", "speed-up", "cost", "source", "what changed")


class StudiesScreen(Screen):
    BINDINGS = [Binding("enter", "open", "Open study"), Binding("?", "app.help", "Help"),
                Binding("q", "app.quit", "Quit")]

    def compose(self) -> ComposeResult:
        yield Static(id="head")
        yield DataTable(id="studies", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        studies = list_studies(self.app.store)
        self.query_one("#head", Static).update(Text.assemble(
            ("studies", "bold"), f" in {self.app.db_label}: {len(studies)}  (enter opens one)"))
        table = self.query_one("#studies", DataTable)
        table.add_columns("study", "trials", "states", "first started", "last finished")
        for s in studies:
            states = ", ".join(f"{n} {state}" for state, n in sorted(s.counts.items()))
            table.add_row(Text(s.name), Text(str(s.total)), Text(states), views.txt(s.first_started_at),
                          views.txt(s.last_finished_at), key=s.name)
        table.focus()

    def action_open(self) -> None:
        table = self.query_one("#studies", DataTable)
        if table.row_count:
            key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
            self.app.open_study(str(key))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.app.open_study(str(event.row_key.value))


class TrialsScreen(Screen):
    BINDINGS = [
        Binding("s", "sort", "Sort"), Binding("r", "reverse", "Reverse sort", show=False),
        Binding("f", "filter", "Filter"), Binding("x", "failed", "Failed"),
        Binding("m,space", "mark", "Mark"), Binding("d", "diff", "Diff"),
        Binding("enter", "open", "Open the trial full screen", show=False),
        Binding("p", "plot", "Plot"), Binding("e", "effects", "Knob effects", show=False),
        Binding("b", "best", "Go to the best trial", show=False),
        Binding("o", "baseline", "Go to the baseline", show=False),
        Binding("g", "refresh", "Re-read the whole study now", show=False), Binding("?", "app.help", "Help"),
        Binding("escape", "back", "Back to the studies", show=False), Binding("q", "app.quit", "Quit"),
    ]
    CSS = """
    TrialsScreen #trials { height: 1fr; }
    TrialsScreen #pane { height: 45%; border-top: solid $accent; }
    TrialsScreen #head { height: auto; }
    """

    def __init__(self, source: StudySource, poll_s: float) -> None:
        super().__init__()
        self.source = source
        self.poll_s = poll_s
        self.sort_key, self.sort_reverse = "number", False
        self.filter = TrialFilter()
        self.marked: list[int] = []
        self.message = ""
        self.polls = 0
        self._shown: tuple[Any, Any] = (None, None)
        self._painted = False  # the detail pane waits for the first paint of the table

    def compose(self) -> ComposeResult:
        yield Static(id="head")
        yield DataTable(id="trials", cursor_type="row", zebra_stripes=True)
        with VerticalScroll(id="pane"):
            yield Static(id="detail")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#trials", DataTable)
        table.add_columns(*(f"{value_label(self.source.objective_unit)} [95% CI]" if c == TRIAL_COLUMNS[2] else c
                            for c in TRIAL_COLUMNS))  # the objective's own unit: tok/s, or e.g. time ms
        self.rebuild()
        table.focus()
        self.set_interval(self.poll_s, self.poll)
        self.call_after_refresh(self._first_paint_done)

    def _first_paint_done(self) -> None:
        self._painted = True
        self.show_detail()

    # ---- table -------------------------------------------------------------------------------
    def visible_rows(self) -> list[dict[str, Any]]:
        rows = [r for r in self.source.rows.values() if self.filter.matches(r)]
        return sort_rows(rows, self.sort_key, self.sort_reverse)

    def current_number(self) -> int | None:
        table = self.query_one("#trials", DataTable)
        if not table.row_count:
            return None
        return int(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)

    def rebuild(self, keep: int | None = None) -> None:
        """Refill the table from the rows (filter and sort applied), the cursor kept on its trial."""
        table = self.query_one("#trials", DataTable)
        keep = self.current_number() if keep is None else keep
        best, unit = self.source.best_number(), self.source.objective_unit
        table.clear()
        rows = self.visible_rows()
        for r in rows:
            table.add_row(*views.row_cells(r, best, r["number"] in self.marked, unit), key=str(r["number"]))
        numbers = [r["number"] for r in rows]
        if keep in numbers:
            table.move_cursor(row=numbers.index(keep))
        self.show_head()
        self.show_detail()

    def show_head(self) -> None:
        src, head = self.source, self.source.head
        counts = ", ".join(f"{n} {s}" for s, n in sorted((head.get("counts") or {}).items()))
        shown = self.query_one("#trials", DataTable).row_count
        baselines = head.get("baselines") or []
        bases = (f"baselines {', '.join(f'#{n}' for n in baselines)}" if len(baselines) > 1 else
                 f"baseline #{src.baseline_number if src.baseline_number is not None else '-'}")
        line1 = Text.assemble((src.study, "bold cyan"), f"  {len(src.rows)} trials ({counts or 'none'})  {bases}"
                              f"  best #{src.best_number() if src.best_number() is not None else '-'}")
        objective = Text(f"objective {objective_text({**head, 'objective_unit': src.objective_unit})}"
                         + ("; each trial against its own run's baseline" if len(baselines) > 1 else ""))
        direction = "reversed" if self.sort_reverse else "natural"
        line3 = Text(f"sort {self.sort_key} ({direction})  filter: {self.filter.text() or 'none'}  "
                     f"showing {shown}  marked {', '.join(map(str, self.marked)) or '-'}", style="dim")
        if self.message:
            line3.append(f"  {self.message}", style="bold yellow")
        self.query_one("#head", Static).update(Text("\n").join([line1, objective, line3]))

    def show_detail(self) -> None:
        number = self.current_number()
        pane = self.query_one("#detail", Static)
        if not self._painted:
            pane.update(Text("reading the trial ...", style="dim"))
            return
        if number is None:
            pane.update(Text("no trial matches the filter" if self.source.rows else "no trials yet"))
            self._shown = (None, None)
            return
        doc, best = self.source.detail(number), self.source.best_number()
        if doc is not self._shown[0] or best != self._shown[1]:  # a rebuild's cursor event repeats it
            self._shown = (doc, best)
            pane.update(views.detail(doc, best, self.source.objective_unit))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "trials":
            self.show_detail()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open()

    def poll(self) -> None:
        """Called every poll_s: read what is new and redraw only when something changed."""
        self.polls += 1
        changed = self.source.poll()
        if changed:
            self.rebuild()

    def say(self, message: str) -> None:
        self.message = message
        self.show_head()

    # ---- actions -----------------------------------------------------------------------------
    def action_sort(self) -> None:
        self.sort_key = SORTS[(SORTS.index(self.sort_key) + 1) % len(SORTS)]
        self.message = ""
        self.rebuild()

    def action_reverse(self) -> None:
        self.sort_reverse = not self.sort_reverse
        self.rebuild()

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        by_column = dict(zip(range(len(TRIAL_COLUMNS)), ("number", "state", "objective", "speedup", "cost",
                                                         "source", None)))
        key = by_column.get(event.column_index)
        if key:
            self.sort_reverse = not self.sort_reverse if key == self.sort_key else False
            self.sort_key = key
            self.rebuild()

    def action_failed(self) -> None:
        self.apply_filter(self.filter.toggled_failed())

    def action_filter(self) -> None:
        from autoopt.cli.browse.panels import FilterScreen

        self.app.push_screen(FilterScreen(self.filter.text(), self.source.knobs()), self.apply_filter)

    def apply_filter(self, new: TrialFilter | None) -> None:
        if new is not None:
            self.filter = new
            self.message = ""
            self.rebuild()

    def action_mark(self) -> None:
        number = self.current_number()
        if number is None:
            return
        if number in self.marked:
            self.marked.remove(number)
        else:
            self.marked = (self.marked + [number])[-2:]
        self.message = "press d to diff the two marked trials" if len(self.marked) == 2 else ""
        self.rebuild(keep=number)

    def action_diff(self) -> None:
        pair = list(self.marked)
        if len(pair) == 1 and self.current_number() not in (None, pair[0]):
            pair.append(self.current_number())
        if len(pair) != 2:
            self.say("mark two trials with m (or one, and put the cursor on the other) to diff them")
            return
        from autoopt.cli.browse.panels import DiffScreen

        self.app.push_screen(DiffScreen(self.source.diff(pair[0], pair[1])))

    def action_open(self) -> None:
        number = self.current_number()
        if number is not None:
            from autoopt.cli.browse.panels import DetailScreen

            self.app.push_screen(DetailScreen(self.source.detail(number), self.source.best_number(),
                                              self.source.objective_unit))

    def action_plot(self) -> None:
        from autoopt.cli.browse.panels import ConvergenceScreen

        self.app.push_screen(ConvergenceScreen(self.source))

    def action_effects(self) -> None:
        from autoopt.cli.browse.panels import EffectsScreen

        self.app.push_screen(EffectsScreen(self.source))

    def _go_to(self, number: int | None, what: str) -> None:
        numbers = [r["number"] for r in self.visible_rows()]
        if number is None or number not in numbers:
            self.say(f"the {what} is not in the table" + (" (clear the filter)" if number is not None else ""))
            return
        self.query_one("#trials", DataTable).move_cursor(row=numbers.index(number))

    def action_best(self) -> None:
        self._go_to(self.source.best_number(), "best trial")

    def action_baseline(self) -> None:
        self._go_to(self.source.baseline_number, "baseline")

    def action_refresh(self) -> None:
        self.source.load()
        self.rebuild()

    def action_back(self) -> None:
        if len(self.app.screen_stack) > 2:
            self.app.pop_screen()
