"""Is the model's uncertainty honest? Measured online, from the run's own history.

Every agent decision carries its prediction: the log objective over the baseline's (`pred_log`) and
its sd (`pred_sd`), as the model gave them when it chose the trial. When the trial is measured, the
miss in sds, z = (measured - predicted) / sd, says how the model did. Two uses:

  - widening: the model's sd is scaled by `scale()`, the factor that would have put 90% of the
    recent misses inside the 90% interval (never below 1, at most MAX_SCALE): a model that learned a
    landscape's scale wrong (every knob moving a GPU kernel by 10x, where a decode step moves by
    percents) is corrected by what it got wrong, not by a constant for the table;
  - the stop rule's licence: `calibrated()` only when at least MIN_SCORED predictions were scored
    and at least TARGET_INSIDE of the last WINDOW measured gains fell inside their predicted 95%
    interval. An uncalibrated model's "nothing is worth it" is not evidence.
"""
from __future__ import annotations

import math

import numpy as np

from autoopt.search.run_types import Z95  # the run summary's and bench-search's count use the same interval

Z90 = 1.645
WINDOW = 20
SCALE_WINDOW = 40
MIN_SCORED = 10
TARGET_INSIDE = 0.8
MAX_SCALE = 20.0
MIN_FOR_SCALE = 6  # 3 widened a misled warm start's run too early (tests/test_agent_warmstart.py), though the
                   # live H200 run's first two misses (26 and 18 sd) argue for sooner: not settled


class Calibration:
    def __init__(self) -> None:
        self.z: list[float] = []  # misses of the predictions as made (their sd already widened)
        self.z_raw: list[float] = []  # the same misses against the model's own sd (before widening)

    def add(self, predicted: float, sd: float, measured: float, scale_then: float = 1.0) -> float:
        """One scored prediction (log units); returns its miss in sds."""
        sd = max(sd, 1e-9)
        z = (measured - predicted) / sd
        self.z.append(z)
        self.z_raw.append(z * max(scale_then, 1e-9))
        return z

    @property
    def scored(self) -> int:
        return len(self.z)

    def inside_share(self, window: int = WINDOW) -> float | None:
        """Share of the last `window` predictions whose measurement fell inside their 95% interval."""
        recent = self.z[-window:]
        return sum(abs(z) <= Z95 for z in recent) / len(recent) if recent else None

    def calibrated(self) -> bool:
        share = self.inside_share()
        return self.scored >= MIN_SCORED and share is not None and share >= TARGET_INSIDE

    def scale(self) -> float:
        """The widening of the model's sd that would have covered the recent misses."""
        recent = np.abs(np.array(self.z_raw[-SCALE_WINDOW:]))
        if len(recent) < MIN_FOR_SCALE:
            return 1.0
        q90 = float(np.quantile(recent, 0.9))
        return float(min(MAX_SCALE, max(1.0, q90 / Z90))) if math.isfinite(q90) else MAX_SCALE

    def text(self) -> str:
        share = self.inside_share()
        if share is None:
            return "calibration: nothing scored yet"
        return (f"calibration: {100 * share:.0f}% of the last {min(WINDOW, self.scored)} measured gains "
                f"inside their predicted 95% interval (sd x{self.scale():.1f})")
