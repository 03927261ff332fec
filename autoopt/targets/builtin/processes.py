"""One configuration measured in two worker processes, and the two figures made one whose 95 % CI
covers the scatter between processes.

Why two processes: the same configuration timed in fresh workers on the 2-core CPU VM read 688 and
555 tok/s, while each worker's own CI (about ten steps) said ±1 %; on the H200 a confirmation in
another process measured a configuration 41 % faster than its trial had. What differs from process
to process (memory placement, thread placement, allocator and clock state, a neighbour's load) is
invisible inside one, so a CI from one process overstates what is known. Part of the H200's scatter
between processes was of our making: the first worker runs the profiles, and until CUPTI was torn
down after each (autoopt.targets.builtin.client) it read 8-20 % below its twin on every later trial;
with the teardown the two read within 1 % (live run 8).

Why not interleaved A/B rounds against the incumbent in one worker instead: they cancel drift over
time, but both sides share the one process, so its own offset stays in every ratio; and they need
the incumbent built beside the candidate, twice the memory of a build, within the same process.
Two workers cost a second worker start once per run (seconds on a CPU, the CUDA context and
compiles on a GPU), and every transition and measurement twice; the guard and the profile run in
the first only. On a GPU both workers share the device one after the other (never at once), each
holding its own copy of the weights: the flash and pro slices fit the H200 twice over. A space's
`measurement: {processes: 1}` turns it off (a single process, recorded as such). A card that cannot
hold two copies turns it off too, recorded with the figures (`too_crowded`): on an 80 GiB H100 the
flash slice's baseline peaked at 39 GiB in each worker, and every later build in the first worker ran
out of memory beside its idle twin (92 of 94 trials of a 10-minute run).

The merged figure per concurrency: the mean of the two medians, its CI from the lower of the two CI
low ends to the higher of the two high ends (it contains both processes' intervals), n and samples
pooled. What was done is recorded in what_ran["measure.processes"].
"""
from __future__ import annotations

from autoopt.measurement import Measurement, Throughput
from autoopt.targets.builtin.limits import GIB

KEY = "measure.processes"


def merged(first: Measurement, second: Measurement, pids: tuple[object, object]) -> Measurement:
    """`first` with its figures widened by `second` (the same configuration in another worker)."""
    if second.status == "failed" or not second.tok_per_s:
        f = second.failure
        first.what_ran[KEY] = (f"1 worker process (pid {pids[0]}): the second (pid {pids[1]}) failed"
                               f"{f': ' + f.kind + ': ' + f.reason.splitlines()[0][:200] if f else ''}; "
                               "the CI is within one process only")
        return first
    lines = []
    for c, a in first.tok_per_s.items():
        b = second.tok_per_s.get(c)
        if b is None:
            continue
        first.tok_per_s[c] = Throughput(median=(a.median + b.median) / 2, ci_low=min(a.ci_low, b.ci_low),
                                        ci_high=max(a.ci_high, b.ci_high), n=a.n + b.n,
                                        samples_step_s=list(a.samples_step_s) + list(b.samples_step_s))
        if c in first.mbu and c in second.mbu:
            first.mbu[c] = (first.mbu[c] + second.mbu[c]) / 2
        lines.append(f"C={c}: {a.median:.4g} / {b.median:.4g} tok/s")
    for phase, seconds in second.costs_s.items():
        first.costs_s[phase] = first.costs_s.get(phase, 0.0) + seconds
    first.what_ran[KEY] = (f"2 worker processes (pids {pids[0]}, {pids[1]}), one after the other: "
                           + ", ".join(lines) + "; figure = mean of the two medians, CI = from the lower "
                           "CI low end to the higher CI high end (covers both processes)")
    return first


TWO_FIT_SHARE = 0.8  # two workers' peaks must fit in this share of the card: a switch briefly holds the
                     # old build beside the new one, and the allocator's blocks do not pack perfectly


def too_crowded(peak_bytes: int | None, device_bytes: int | None) -> str | None:
    """Why the card cannot hold a second worker beside the first (None: it can, or it is not known)."""
    if not peak_bytes or not device_bytes or 2 * peak_bytes <= TWO_FIT_SHARE * device_bytes:
        return None
    return (f"one worker at a time fits the card: a configuration peaked at {peak_bytes / GIB:.1f} GiB of its "
            f"{device_bytes / GIB:.1f} GiB, and a second worker holds a copy of its own (two must fit in "
            f"{100 * TWO_FIT_SHARE:.0f} % of it)")


def single(m: Measurement, pid: object, why: str) -> Measurement:
    m.what_ran.setdefault(KEY, f"1 worker process (pid {pid}): {why}; the CI is within one process only")
    return m
