"""Recorded tables (CSV, JSON lines, Kernel Tuner caches) answered on a simulated clock."""
