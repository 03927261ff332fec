"""Profiles: Chrome traces read into per-bucket time (trace), the regex rules that name a kernel's
bucket (rules), and the verdict of two profiles side by side (diff)."""
