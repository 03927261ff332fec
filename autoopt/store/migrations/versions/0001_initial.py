"""Initial autoopt schema: runs, trials (keyed by Optuna trial_id), throughput, samples, buckets,
costs, environments, diagnoses.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""
from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: Union[str, None] = None
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def _trial_fk() -> sa.ForeignKey:
    return sa.ForeignKey("autoopt_trials.trial_id", ondelete="CASCADE")


def upgrade() -> None:
    op.create_table(
        "autoopt_runs",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("study_name", sa.String(512), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("stop_reason", sa.Text(), nullable=True),
        sa.Column("command_line", sa.Text(), nullable=False),
        sa.Column("space_name", sa.String(256), nullable=True),
        sa.Column("space_sha256", sa.String(64), nullable=True),
        sa.Column("target", sa.String(256), nullable=True),
        sa.Column("preset", sa.String(256), nullable=True),
        sa.Column("seed", sa.Integer(), nullable=True),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("host", sa.String(256), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("autoopt_version", sa.String(64), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
    )
    op.create_index("ix_autoopt_runs_study_name", "autoopt_runs", ["study_name"])

    op.create_table(
        "autoopt_environments",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("fingerprint", sa.JSON(), nullable=False),
        sa.Column("first_seen_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("sha256"),
    )

    op.create_table(
        "autoopt_trials",
        sa.Column("trial_id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("study_name", sa.String(512), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("autoopt_runs.id"), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("is_baseline", sa.Boolean(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("objective_name", sa.String(64), nullable=True),
        sa.Column("objective", sa.Float(), nullable=True),
        sa.Column("objective_ci_low", sa.Float(), nullable=True),
        sa.Column("objective_ci_high", sa.Float(), nullable=True),
        sa.Column("decision_source", sa.String(128), nullable=True),
        sa.Column("decision_reason", sa.Text(), nullable=True),
        sa.Column("expected_gain", sa.Float(), nullable=True),
        sa.Column("expected_gain_sd", sa.Float(), nullable=True),
        sa.Column("expected_cost_s", sa.Float(), nullable=True),
        sa.Column("decision_extra", sa.JSON(), nullable=True),
        sa.Column("failure_kind", sa.String(32), nullable=True),
        sa.Column("failure_reason", sa.Text(), nullable=True),
        sa.Column("stderr_tail", sa.Text(), nullable=True),
        sa.Column("environment_id", sa.Integer(), sa.ForeignKey("autoopt_environments.id"),
                  nullable=True),
        sa.Column("peak_memory_bytes", sa.BigInteger(), nullable=True),
        sa.Column("bucket_coverage", sa.Float(), nullable=True),
        sa.Column("kernel_count", sa.Integer(), nullable=True),
        sa.Column("measurement_rest", sa.JSON(), nullable=True),
        sa.Column("extra", sa.JSON(), nullable=True),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.UniqueConstraint("study_name", "number", name="uq_autoopt_trials_study_number"),
    )
    op.create_index("ix_autoopt_trials_study_name", "autoopt_trials", ["study_name"])
    op.create_index("ix_autoopt_trials_run_id", "autoopt_trials", ["run_id"])
    op.create_index("ix_autoopt_trials_state", "autoopt_trials", ["state"])

    op.create_table(
        "autoopt_throughput",
        sa.Column("trial_id", sa.Integer(), _trial_fk(), primary_key=True),
        sa.Column("concurrency", sa.Integer(), primary_key=True),
        sa.Column("median", sa.Float(), nullable=False),
        sa.Column("ci_low", sa.Float(), nullable=False),
        sa.Column("ci_high", sa.Float(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("mbu", sa.Float(), nullable=True),
    )
    op.create_table(
        "autoopt_samples",
        sa.Column("trial_id", sa.Integer(), _trial_fk(), primary_key=True),
        sa.Column("concurrency", sa.Integer(), primary_key=True),
        sa.Column("idx", sa.Integer(), primary_key=True),
        sa.Column("step_s", sa.Float(), nullable=False),
    )
    op.create_table(
        "autoopt_buckets",
        sa.Column("trial_id", sa.Integer(), _trial_fk(), primary_key=True),
        sa.Column("bucket", sa.String(128), primary_key=True),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("ms", sa.Float(), nullable=False),
    )
    op.create_table(
        "autoopt_costs",
        sa.Column("trial_id", sa.Integer(), _trial_fk(), primary_key=True),
        sa.Column("phase", sa.String(64), primary_key=True),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
    )
    op.create_table(
        "autoopt_diagnoses",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("trial_id", sa.Integer(), _trial_fk(), nullable=False),
        sa.Column("against_number", sa.Integer(), nullable=True),
        sa.Column("verdict", sa.Text(), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_autoopt_diagnoses_trial_id", "autoopt_diagnoses", ["trial_id"])


def downgrade() -> None:
    op.drop_index("ix_autoopt_diagnoses_trial_id", table_name="autoopt_diagnoses")
    for table in ("autoopt_diagnoses", "autoopt_costs", "autoopt_buckets", "autoopt_samples",
                  "autoopt_throughput"):
        op.drop_table(table)
    for index in ("ix_autoopt_trials_state", "ix_autoopt_trials_run_id", "ix_autoopt_trials_study_name"):
        op.drop_index(index, table_name="autoopt_trials")
    op.drop_table("autoopt_trials")
    op.drop_table("autoopt_environments")
    op.drop_index("ix_autoopt_runs_study_name", table_name="autoopt_runs")
    op.drop_table("autoopt_runs")
