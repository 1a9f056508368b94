"""The allocation policies shipped with pbs_power: ``power-aware`` and ``first-fit``."""
