"""`autoopt browse`: a full-screen terminal app (Textual) over one trial database.

    data.py      StudySource: the history / show / diff documents of autoopt.store.reports, plus a
                 cheap poll that reads only the trials added or finished since the last look
    plots.py     what the plots show, computed from the documents (shared with `autoopt report`)
    textplot.py  those plots drawn with characters (no mouse, no graphics protocol: works over SSH)
    views.py     documents -> rich Text (user data never parsed as markup)
    screens.py   the studies list and the trials table with its detail pane
    panels.py    the pushed screens: detail, diff, plots, help, filter
    app.py       BrowseApp

Nothing here imports torch, triton or optuna (tests/test_browse_app.py checks it).
"""
